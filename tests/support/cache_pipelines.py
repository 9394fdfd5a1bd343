"""Tiny pipelines the step-cache tests share (built once per process), and their 4-step latents."""

from __future__ import annotations

import functools

import torch

STEPS = 4


@functools.lru_cache(maxsize=None)
def pipeline(family: str):
    """(pipe, call kwargs) for "wan" (Wan2.1), or a `sagegen.models.tiny` family ("flux", "cogvideox", ...)."""
    if family == "wan":
        from sagegen.models.tiny_video import TINY_VIDEO_CALL_DEFAULTS, build_tiny_video_pipeline

        pipe, kwargs = build_tiny_video_pipeline("wan2.1"), TINY_VIDEO_CALL_DEFAULTS["wan2.1"]
    else:
        from sagegen.models.tiny import TINY_CALL_DEFAULTS, build_tiny_pipeline

        pipe, kwargs = build_tiny_pipeline(family), TINY_CALL_DEFAULTS[family]
    pipe.set_progress_bar_config(disable=True)
    return pipe, {**kwargs, "num_inference_steps": STEPS}


def latents(family: str) -> torch.Tensor:
    """One generation of `pipeline(family)` (seed 0) as fp32 latents."""
    pipe, kwargs = pipeline(family)
    out = pipe(prompt="a cat", generator=torch.Generator().manual_seed(0), output_type="latent", **kwargs)
    return (out.frames if hasattr(out, "frames") else out.images).float()
