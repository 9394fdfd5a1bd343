"""Synthetic run directories (moving shapes, no model) in the run-directory layout, for tests and demos of
``sagegen eval`` / ``sagegen report`` without model weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np



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
    from sagegen.runs.integrity import fingerprint, sample_identity
    from sagegen.runs.directory import RunDir, now_iso

    rd = RunDir(run)
    prompts = prompts or ["a red ball rolling across a table", "a sailboat on a calm lake at sunset"]
    if kind == "image":
        frames = 1
    samples = [{"id": f"p{i:03d}-s0", "prompt": p, "seed": 0} for i, p in enumerate(prompts)]
    manifest = {
        "schema": 1,
        "created": now_iso(),
        "command": ["python", "-m", "sagegen.testing.run_dirs"],
        "model": {"name": "synthetic", "family": "synthetic", "hub_id": None, "kind": kind,
                  "fps": fps if kind == "video" else None, "source": "synthetic frames (no model)"},
        "settings": {"steps": 0, "frames": frames, "height": height, "width": width, "guidance": None},
        "attention": {"sage": {"note": "synthetic: candidate = baseline + Gaussian noise", "sigma": sigma},
                      "policy": {}},
        "variants": list(variants),
        "samples": samples,
        "versions": {},
        "gpu": None,
    }
    rd.update_manifest(lambda _m: manifest)
    for i, s in enumerate(samples):
        base = synthetic_clip(frames, height, width, seed=i)
        for j, v in enumerate(variants):
            clip = base if j == 0 else perturb(base, sigma, seed=100 + i)
            t = {"total_s": round(2.0 - 0.6 * j + 0.01 * i, 3), "encode_s": 0.1,
                 "denoise_s": round(1.5 - 0.6 * j + 0.01 * i, 3), "decode_s": 0.4}
            made_with = fingerprint(sample_identity(manifest, v, s))
            rd.write_sample(v, dict(s, fingerprint=made_with, timings=t), clip, kind=kind,
                            fps=fps if kind == "video" else None)
    rd.refresh_manifest()
    return Path(run)


if __name__ == "__main__":  # python -m sagegen.testing.run_dirs OUT_DIR
    import sys

    print(make_synthetic_run(sys.argv[1] if len(sys.argv) > 1 else "runs/synthetic"))
