"""Side-by-side MP4s (baseline | sagegen, labelled) through the ffmpeg binary that imageio-ffmpeg ships."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from sagegen.runs.encode import encode_mp4_file, ffmpeg_exe  # noqa: F401 (ffmpeg_exe re-exported)
from sagegen.runs.directory import atomic_write_file

from sagegen.report.frames import BASELINE_LABEL, CANDIDATE_LABEL, even, side_by_side


def encode_mp4(frames: Iterable[np.ndarray], path: str | Path, fps: float, crf: int = 18) -> Path:
    """Encode uint8 HxWx3 frames (all the same, even size) as H.264 yuv420p MP4, atomically: the file is
    moved into place only once ffmpeg succeeded and it decodes to every frame (EncodeError otherwise)."""
    return atomic_write_file(path, lambda tmp: encode_mp4_file(frames, tmp, fps, crf=crf, final=path))


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
