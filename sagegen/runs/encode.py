"""H.264 MP4 encoding through the ffmpeg binary that imageio-ffmpeg ships, checked before anything is kept.

ffmpeg can fail half-way (a full disk, a killed process) and still leave a file behind; a pipe to a dead
ffmpeg raises BrokenPipeError, which says nothing about why. :func:`encode_mp4_file` therefore checks the
exit status, that the file is not empty and that it decodes to as many frames as were sent, and raises
:class:`EncodeError` naming the file and ffmpeg's own message otherwise. Callers write to a temporary name
and move it into place only after this returns (see ``sagegen.runs.directory.atomic_write_file``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterable

import numpy as np


class EncodeError(RuntimeError):
    """ffmpeg did not produce a complete video; the message names the file and what to do. ``disk_problem``:
    the disk was full or not writable (the CLI then says where its command can write instead)."""

    disk_problem = False


def ffmpeg_exe() -> str:
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def find_ffmpeg() -> tuple[str | None, str | None]:
    """(path, None) when imageio-ffmpeg's ffmpeg is usable here, else (None, what went wrong)."""
    try:
        return ffmpeg_exe(), None
    except (ImportError, RuntimeError, OSError) as e:
        return None, f"{type(e).__name__}: {e}"


def count_frames(path: str | os.PathLike) -> int:
    """Frames in a video, counted by decoding it with the same ffmpeg."""
    import imageio_ffmpeg

    return int(imageio_ffmpeg.count_frames_and_secs(str(path))[0])


def _disk_problem(err: str) -> bool:
    low = err.lower()
    return any(s in low for s in ("no space left", "disk quota", "read-only", "permission denied"))


def _hint(err: str) -> str:
    """What to do, naming no option (the CLI adds where its command can write instead)."""
    low = err.lower()
    if "no space left" in low or "disk quota" in low:
        return "the disk is full: free some space, then run the command again"
    if "read-only" in low or "permission denied" in low:
        return "the folder is not writable"
    return "run the command again; if it keeps failing, check the disk and ffmpeg's message"


def _encode_error(message: str, err: str) -> EncodeError:
    exc = EncodeError(f"{message}; {_hint(err)}")
    exc.disk_problem = _disk_problem(err)
    return exc


def encode_mp4_file(frames: Iterable[np.ndarray], dest: str | os.PathLike, fps: float, *, crf: int = 18,
                    pad_to_even: bool = False, final: str | os.PathLike | None = None) -> int:
    """Encode uint8 HxWx3 frames (all one size) into ``dest`` as H.264 yuv420p; returns the frame count.

    yuv420p needs even sizes: ``pad_to_even`` adds a black row/column where needed, otherwise an odd size
    is a ValueError. ``final`` is the name the file will get once moved into place (for messages)."""
    dest = Path(dest)
    shown = Path(final) if final is not None else dest
    frames = iter(frames)
    first = np.ascontiguousarray(next(frames), dtype=np.uint8)
    h, w = first.shape[:2]
    if (h % 2 or w % 2) and not pad_to_even:
        raise ValueError(f"H.264 yuv420p needs even frame sizes, got {w}x{h}")
    cmd = [ffmpeg_exe(), "-y", "-loglevel", "error",
           "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-r", f"{fps:g}", "-i", "-", "-an"]
    if h % 2 or w % 2:
        cmd += ["-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2"]
    cmd += ["-c:v", "libx264", "-preset", "medium", "-crf", str(crf), "-pix_fmt", "yuv420p",
            "-movflags", "+faststart", "-f", "mp4", str(dest)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stderr is not None
    sent, broken = 0, False
    try:
        proc.stdin.write(first.tobytes())
        sent += 1
        for f in frames:
            if f.shape[:2] != (h, w):
                raise ValueError(f"frame size changed from {w}x{h} to {f.shape[1]}x{f.shape[0]}")
            proc.stdin.write(np.ascontiguousarray(f, dtype=np.uint8).tobytes())
            sent += 1
    except BrokenPipeError:  # ffmpeg died; its stderr says why
        broken = True
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        try:
            proc.stdin.close()
        except BrokenPipeError:
            broken = True
    err = proc.stderr.read().decode(errors="replace").strip()
    code = proc.wait()
    if code != 0 or broken:
        detail = err.splitlines()[-1] if err else f"exit status {code}"
        raise _encode_error(f"could not write {shown}: ffmpeg failed ({detail})", err)
    size = dest.stat().st_size if dest.exists() else 0
    got = count_frames(dest) if size else 0
    if got != sent:
        raise _encode_error(f"could not write {shown}: ffmpeg reported success but the file holds {got} of {sent} "
                            f"frames ({size} bytes)", err)
    return sent
