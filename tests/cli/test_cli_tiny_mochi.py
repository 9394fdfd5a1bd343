"""Issue 22: the tiny-mochi smoke run is cheap (7 frames, a float32 VAE) and shows no diffusers autocast warning."""

import warnings

import torch

from sagegen.models import tiny
from sagegen.models.loading import load
from sagegen.models.presets import resolve


def test_tiny_mochi_is_small_and_its_vae_stays_float32():
    p = resolve("tiny-mochi")
    assert p.frames == 7 == tiny.TINY_CALL_DEFAULTS["mochi"]["num_frames"] and (p.frames - 1) % p.frame_step == 0
    pipe = tiny.build_tiny_pipeline("mochi", dtype=torch.bfloat16)
    assert pipe.transformer.dtype == torch.bfloat16 and pipe.vae.dtype == torch.float32


def test_tiny_mochi_generates_without_the_autocast_warning(monkeypatch):
    monkeypatch.setattr(warnings, "filters", list(warnings.filters))  # undo the filter this installs
    loaded = load(resolve("tiny-mochi"), dtype="bfloat16", device=torch.device("cpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        from sagegen.models.loading import ignore_known_warnings

        ignore_known_warnings()
        out = loaded.pipe("a fox", num_inference_steps=2, height=32, width=32, num_frames=7,
                          generator=torch.Generator().manual_seed(0), output_type="np")
    assert out.frames.shape[:2] == (1, 7)
    autocast = [w for w in caught if "autocast" in str(w.message)]
    assert autocast == [], [str(w.message) for w in autocast]
