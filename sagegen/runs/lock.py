"""An advisory lock on a run directory, so that two `sagegen run`/`compare` processes do not write one
``--out`` at once (the ranks of one torchrun/accelerate job share it: rank 0 holds the lock for them).

The lock is an ``fcntl.flock`` on ``RUN_DIR/.sagegen-run.lock``, which also records who holds it (pid, host,
start time, command). The kernel drops a flock when its process dies, however it dies, so a lock file left
by a killed run is stale by construction and is simply taken over. The file is removed on release.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Iterator

LOCK_FILE = ".sagegen-run.lock"


class RunDirBusy(RuntimeError):
    """Another live process holds the run directory's lock."""


def _owner(path: Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
        if isinstance(data, dict):
            return data
    return {}


def _describe(owner: dict) -> str:
    if not owner:
        return "another process"
    parts = [f"pid {owner.get('pid', '?')}"]
    if owner.get("host"):
        parts.append(f"on {owner['host']}")
    if owner.get("started"):
        parts.append(f"since {owner['started']}")
    text = "another sagegen process (" + " ".join(parts) + ")"
    if owner.get("command"):
        text += f" running `{' '.join(owner['command'])}`"
    return text


@contextlib.contextmanager
def hold(run_dir: str | os.PathLike, command: list[str] | None = None) -> Iterator[Path]:
    """Hold the lock of `run_dir` (created if needed) for the duration; RunDirBusy when another live process
    holds it. Yields the lock file's path."""
    import fcntl

    from sagegen.runs.files import write_error  # a full or read-only disk: an error naming the file and what to do

    run_dir = Path(run_dir)
    path = run_dir / LOCK_FILE
    for _ in range(5):  # the holder may remove the file between our open and our flock: then try again
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise write_error(path, e) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirBusy(f"{_describe(_owner(path))} is writing into {run_dir}; wait for it to finish, or use "
                             f"another --out (the lock is {path}; it goes away when that process ends)") from None
        except OSError:  # a file system without flock (some network mounts): go on unlocked, as before
            os.close(fd)
            yield path
            return
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    else:  # pragma: no cover - five races in a row
        raise RunDirBusy(f"could not lock {run_dir}: its lock file keeps changing; is another sagegen running?")
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": list(command or []),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(info).encode())
        except OSError as e:
            raise write_error(path, e) from e
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # before unlocking: a waiter then retries on a fresh file
        os.close(fd)
