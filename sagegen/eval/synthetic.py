"""Synthetic run directories (moving shapes, no model) in the run-directory layout, for tests and demos of
``sagegen eval`` / ``sagegen report`` without model weights."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import numpy as np

from .rundata import atomic_write_json


def synthetic_clip(frames: int, height: int, width: int, seed: int) -> np.ndarray:
    """A moving disc over a colour gradient: TxHxWx3 uint8."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    c0, c1 = rng.uniform(40, 215, size=(2, 3))
    out = np.empty((frames, height, width, 3), np.uint8)
    r = 0.22 * min(height, width)
    for t in range(frames):
        g = (xx / max(width - 1, 1))[..., None]
        img = c0 * (1 - g) + c1 * g
        cx = width * (0.25 + 0.5 * t / max(frames - 1, 1))
        cy = height * (0.5 + 0.2 * np.sin(2 * np.pi * t / max(frames, 1) + seed))
        disc = ((xx - cx) ** 2 + (yy - cy) ** 2) < r * r
        img[disc] = (255 - c0) * 0.9
        out[t] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def perturb(clip: np.ndarray, sigma: float, seed: int) -> np.ndarray:
    """The clip plus Gaussian noise of ``sigma`` (in 0..255 units), as a stand-in for the quantized variant."""
    if sigma == 0:
        return clip.copy()
    rng = np.random.default_rng(seed)
    return np.clip(clip.astype(np.float32) + rng.normal(0, sigma, clip.shape), 0, 255).astype(np.uint8)


def write_sample(run: Path, variant: str, sid: str, frames: np.ndarray, timing: dict | None = None) -> Path:
    from PIL import Image

    d = run / "samples" / variant / sid
    (d / "frames").mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(frames):
        Image.fromarray(f).save(d / "frames" / f"{i:05d}.png")
    if len(frames) == 1:
        Image.fromarray(frames[0]).save(d / "image.png")
    atomic_write_json(d / "sample.json", {"id": sid, "variant": variant, "frames": len(frames), **(timing or {})})
    return d


def make_synthetic_run(
    run: str | Path,
    prompts: list[str] | None = None,
    frames: int = 8,
    height: int = 64,
    width: int = 96,
    kind: str = "video",
    sigma: float = 3.0,
    fps: int = 8,
    variants: tuple[str, str] = ("sdpa", "sage"),
) -> Path:
    """Write a finished run directory with one sample per prompt; the candidate is the baseline plus noise."""
    run = Path(run)
    prompts = prompts or ["a red ball rolling across a table", "a sailboat on a calm lake at sunset"]
    if kind == "image":
        frames = 1
    samples, timings = [], {v: {} for v in variants}
    for i, p in enumerate(prompts):
        sid = f"p{i:03d}-s0"
        samples.append({"id": sid, "prompt": p, "seed": 0})
        base = synthetic_clip(frames, height, width, seed=i)
        for j, v in enumerate(variants):
            clip = base if j == 0 else perturb(base, sigma, seed=100 + i)
            t = {"total_s": 2.0 - 0.6 * j + 0.01 * i, "denoise_s": 1.6 - 0.6 * j, "decode_s": 0.4}
            timings[v][sid] = t
            write_sample(run, v, sid, clip, t)
    manifest = {
        "schema": 1,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": ["sagegen", "compare", "--synthetic"],
        "model": {"name": "synthetic", "family": "synthetic", "hub_id": None, "kind": kind, "fps": fps},
        "settings": {"steps": 0, "frames": frames, "height": height, "width": width, "guidance": None},
        "attention": {"sage": {"note": "synthetic: candidate = baseline + Gaussian noise", "sigma": sigma},
                      "policy": {}},
        "variants": list(variants),
        "samples": samples,
        "timings": timings,
        "versions": {},
        "gpu": None,
    }
    atomic_write_json(run / "manifest.json", manifest)
    return run


if __name__ == "__main__":  # python -m sagegen.eval.synthetic OUT_DIR
    import sys

    print(make_synthetic_run(sys.argv[1] if len(sys.argv) > 1 else "runs/synthetic"))
    json.dumps({})
