"""A fake pipeline for CLI tests: `sagegen run/compare` end to end in milliseconds (no model, no patcher)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sagegen.jobs import generate
from sagegen.models.loading import Loaded


class FakePipe:
    """Returns random frames of the requested size; drives `progress_bar` like the diffusers pipelines.

    `frame_step` mimics the video VAEs: a frame count that is not ``k * frame_step + 1`` comes out rounded
    down to one."""

    def __init__(self, frame_step: int | None = None):
        self.frame_step = frame_step
        self.calls: list[dict] = []

    def __call__(self, prompt=None, num_inference_steps=1, guidance_scale=1.0, height=16, width=16,
                 num_frames=None, generator=None, output_type="np", **kw):
        self.calls.append(dict(prompt=prompt, steps=num_inference_steps, num_frames=num_frames, **kw))
        with self.progress_bar(total=num_inference_steps) as bar:
            for _ in range(num_inference_steps):
                bar.update()
        if num_frames is not None and self.frame_step:
            num_frames = (num_frames - 1) // self.frame_step * self.frame_step + 1
        shape = (1, num_frames, 8, 8, 3) if num_frames else (1, 8, 8, 3)
        x = torch.rand(shape, generator=generator).numpy()
        return SimpleNamespace(frames=x) if num_frames else SimpleNamespace(images=x)


@pytest.fixture
def fake_model(monkeypatch):
    """Every load returns one FakePipe (yielded); patching records its calls in ``pipe.patches``."""
    pipe = FakePipe()
    pipe.patches = []
    loads = []

    def loader(job, device):
        loads.append(job.preset.name)
        pipe.frame_step = job.preset.frame_step if job.preset.is_video else None
        return Loaded(pipe=pipe, source="fake", load_s=0.0)

    def fake_patch(p, config, **kw):
        pipe.patches.append(kw)

    monkeypatch.setattr(generate, "default_loader", loader)
    monkeypatch.setattr(generate, "_patcher", lambda: (fake_patch, lambda p: None))
    pipe.loads = loads
    yield pipe


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No real HF cache, no network, runs under tmp, no debug from the outside."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAGEGEN_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("SAGEGEN_DEBUG", raising=False)
    # full-size --random-weights runs on the CPU are refused where their weights do not fit (`estimate`): the
    # tests' fake models need no memory, so the check sees a large machine unless a test says otherwise
    from sagegen.cli import estimate

    monkeypatch.setattr(estimate, "available_bytes", lambda: 2**40)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
