"""Reading and writing run-directory files safely (used by ``sagegen.runs.directory``, which re-exports all of it).

Writes are atomic (a temporary file in the same folder, fsync, ``os.replace``): nothing is moved into place
unless it was fully written, and a full disk, a read-only folder or a missing permission becomes a
:class:`WriteError` that names the file and what to do. Reads of JSON records (manifest.json, sample.json)
tell a damaged file (:class:`DamagedFile`) from a missing one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def _umask_mode() -> int:
    """The mode a plainly created file gets (mkstemp's temporary files are 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically: a temporary file in the same folder, fsync, then `os.replace`."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    return atomic_write_file(path, write)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write `obj` as indented UTF-8 JSON, atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


class WriteError(OSError):
    """A file could not be written (disk full, read-only, no permission); the message names the file and
    what to do. Keeps the original ``errno``."""


# No option is named here: these files are written by commands with different options (eval and report have
# no --out); the CLI adds where each command can write instead (sagegen.cli.errors.WRITE_ELSEWHERE).
_WRITE_HINTS = {
    errno.ENOSPC: "no space left on device: free some space, then run the command again (finished work is kept)",
    errno.EDQUOT: "disk quota exceeded: free some space, then run the command again (finished work is kept)",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied: fix the folder's permissions",
    errno.EPERM: "operation not permitted: fix the folder's permissions",
}
WRITE_ERRNOS = frozenset(_WRITE_HINTS)


def write_error(path: str | os.PathLike, exc: OSError) -> OSError:
    """``exc`` as a WriteError naming ``path`` when it is a disk-full / read-only / permission error, else
    ``exc`` itself."""
    if isinstance(exc, WriteError) or exc.errno not in _WRITE_HINTS:
        return exc
    err = WriteError(f"could not write {path}: {_WRITE_HINTS[exc.errno]}")
    err.errno = exc.errno
    return err


def atomic_write_file(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    """Atomically create `path` with `writer(tmp_path)` (for encoders that want a file name, e.g. MP4).

    The temporary name keeps `path`'s suffix so encoders that look at the extension still work. Nothing is
    moved into place unless `writer` returned normally; a full disk, a read-only folder or a missing
    permission raises :class:`WriteError` naming `path`.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}", dir=path.parent)
        os.close(fd)
        writer(Path(tmp))
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise write_error(path, e) from e
    except BaseException:
        _discard(tmp)
        raise
    return path


def _discard(tmp: str | None) -> None:
    if tmp is not None:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class DamagedFile(ValueError):
    """A run-directory file that exists but is not what it must be (not JSON, or not a JSON object)."""


def read_record(path: str | os.PathLike) -> dict:
    """A JSON object from `path` (manifest.json, sample.json); DamagedFile when it is not valid JSON or not
    an object (e.g. truncated by a full disk, or edited by hand)."""
    try:
        obj = read_json(path)
    except UnicodeDecodeError as e:
        raise DamagedFile(f"{path} is damaged (not UTF-8 text: {e})") from e
    except json.JSONDecodeError as e:
        raise DamagedFile(f"{path} is damaged (not valid JSON: {e})") from e
    if not isinstance(obj, dict):
        raise DamagedFile(f"{path} is damaged (a JSON {type(obj).__name__}, where an object is expected)")
    return obj


def is_intact(path: Path) -> bool:
    """True when `path` holds a JSON object (a finished sample's sample.json); False when missing or damaged."""
    try:
        read_record(path)
    except (OSError, DamagedFile):
        return False
    return True
