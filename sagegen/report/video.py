"""Side-by-side MP4s (baseline | sagegen, labelled) through the ffmpeg binary that imageio-ffmpeg ships."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

import numpy as np

from .frames import BASELINE_LABEL, CANDIDATE_LABEL, even, side_by_side


def ffmpeg_exe() -> str:
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def encode_mp4(frames: Iterable[np.ndarray], path: str | Path, fps: float, crf: int = 18) -> Path:
    """Encode uint8 HxWx3 frames (all the same, even size) as H.264 yuv420p MP4, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = iter(frames)
    first = next(frames)
    h, w = first.shape[:2]
    if h % 2 or w % 2:
        raise ValueError(f"H.264 yuv420p needs even frame sizes, got {w}x{h}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".mp4", dir=path.parent)
    os.close(fd)
    cmd = [
        ffmpeg_exe(), "-y", "-loglevel", "error",
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-r", f"{fps:g}", "-i", "-",
        "-an", "-c:v", "libx264", "-preset", "medium", "-crf", str(crf), "-pix_fmt", "yuv420p",
        "-movflags", "+faststart", tmp,
    ]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdin is not None
        try:
            proc.stdin.write(np.ascontiguousarray(first).tobytes())
            for f in frames:
                if f.shape[:2] != (h, w):
                    raise ValueError(f"frame size changed from {w}x{h} to {f.shape[1]}x{f.shape[0]}")
                proc.stdin.write(np.ascontiguousarray(f).tobytes())
        finally:
            proc.stdin.close()
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.wait() != 0:
            raise RuntimeError(f"ffmpeg failed: {err.strip()[-500:]}")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a shared report should be readable like any file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def side_by_side_frames(
    base: np.ndarray, cands: list[np.ndarray], labels: list[str] | None = None
) -> Iterable[np.ndarray]:
    labels = labels or [BASELINE_LABEL] + [CANDIDATE_LABEL] * len(cands)
    for t in range(base.shape[0]):
        yield even(side_by_side([base[t]] + [c[t] for c in cands], labels))


def write_side_by_side_mp4(
    base: np.ndarray, cands: list[np.ndarray], path: str | Path, fps: float, labels: list[str] | None = None
) -> Path:
    """``base`` and each candidate: TxHxWx3 uint8 with the same T."""
    for c in cands:
        if c.shape[0] != base.shape[0]:
            raise ValueError(f"frame counts differ: baseline {base.shape[0]} vs candidate {c.shape[0]}")
    return encode_mp4(side_by_side_frames(base, cands, labels), path, fps)


def probe_frames(path: str | Path) -> tuple[int, int, int]:
    """(frames, width, height) of a video, decoded with the same ffmpeg (for tests and sanity checks)."""
    import imageio.v2 as imageio

    r = imageio.get_reader(str(path), format="FFMPEG")
    try:
        n = 0
        shape = None
        for f in r:
            n += 1
            shape = f.shape
    finally:
        r.close()
    assert shape is not None
    return n, shape[1], shape[0]
