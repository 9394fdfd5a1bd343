"""diffusers' cache hooks that need a whole pipeline, on a patched one in either order: FasterCache (a batched
guidance call and the pipeline's current timestep: tiny CogVideoX) and SeaCache (the scheduler's step and sigma
that the pipeline passes to ``cache_context``: tiny Wan2.1). Outputs against the same hook on the stock pipeline
within the patch's usual error; `sagegen.unpatch` leaves the hook as set (the stock hooked output again, exactly),
``disable_cache`` leaves the patch (sagegen's uncached output again). The ``--cache`` specs through
`cache_spec.apply` skip what the recorder then counts."""

from __future__ import annotations

import functools

import diffusers
import pytest
import torch

import sagegen
from sagegen.patch import cache_spec
from sagegen.patch.cache_schedule import ScheduleRecorder
from tests.support import cache_pipelines
from tests.support.helpers import rel_l1

PIPELINE_TOL = 0.06  # rel. L1 of a tiny patched pipeline's latents vs stock (tests/support/diffusers_compat.py)
STEPS = cache_pipelines.STEPS
FAMILY = {"fastercache": "cogvideox", "seacache": "wan"}
# each hook's first diffusers (cache_spec.NEEDS_DIFFUSERS); FasterCache is in every supported diffusers
NEEDS = {"fastercache": ("FasterCacheConfig", "0.35"), "seacache": ("SeaCacheConfig", "0.41")}


def _needs(kind: str):
    name, version = NEEDS[kind]
    return pytest.mark.skipif(not hasattr(diffusers, name), reason=f"{name} needs diffusers >= {version} (this is "
                                                                    f"{diffusers.__version__})")


_pipeline, _run = cache_pipelines.pipeline, cache_pipelines.latents


def _config(kind: str, pipe):
    """Settings that skip on these few steps: every timestep in range, the shortest intervals."""
    if kind == "fastercache":
        return diffusers.FasterCacheConfig(spatial_attention_block_skip_range=2, unconditional_batch_skip_range=2,
                                           spatial_attention_timestep_skip_range=(-1, 1001),
                                           unconditional_batch_timestep_skip_range=(-1, 1001),
                                           current_timestep_callback=lambda: pipe.current_timestep,
                                           tensor_format="BFCHW")
    return diffusers.SeaCacheConfig(threshold=10.0, retention_steps=1, cache_end_steps=1, max_consecutive_cached=0)


@functools.lru_cache(maxsize=None)
def _references(kind: str) -> dict[str, torch.Tensor]:
    family = FAMILY[kind]
    pipe, _ = _pipeline(family)
    refs = {"stock": _run(family)}
    with sagegen.patched(pipe, backend="reference"):
        refs["sage"] = _run(family)
    pipe.transformer.enable_cache(_config(kind, pipe))
    try:
        refs["stock_cached"] = _run(family)
    finally:
        pipe.transformer.disable_cache()
    assert not torch.equal(refs["stock_cached"], refs["stock"])  # the hook skipped something
    return refs


@pytest.mark.parametrize("teardown", ["unpatch_first", "disable_first"])
@pytest.mark.parametrize("order", ["patch_then_cache", "cache_then_patch"])
@pytest.mark.parametrize("kind", [pytest.param(k, marks=_needs(k)) for k in ("fastercache", "seacache")])
def test_pipeline_cache_hooks_on_a_patched_pipeline(kind, order, teardown):
    family = FAMILY[kind]
    pipe, _ = _pipeline(family)
    refs = _references(kind)
    model = pipe.transformer
    try:
        if order == "patch_then_cache":
            sagegen.patch(pipe, backend="reference")
            model.enable_cache(_config(kind, pipe))
        else:
            model.enable_cache(_config(kind, pipe))
            sagegen.patch(pipe, backend="reference")
        assert sagegen.patch_info(pipe)["fused_blocks"] > 0
        got = _run(family)
        assert torch.isfinite(got).all()
        assert rel_l1(got, refs["stock_cached"]) < PIPELINE_TOL, rel_l1(got, refs["stock_cached"])
        assert not torch.equal(got, refs["stock_cached"])  # sagegen's attention ran
        if teardown == "unpatch_first":
            sagegen.unpatch(pipe)
            assert torch.equal(_run(family), refs["stock_cached"])
            model.disable_cache()
        else:
            model.disable_cache()
            assert torch.equal(_run(family), refs["sage"])
            sagegen.unpatch(pipe)
        assert torch.equal(_run(family), refs["stock"])
    finally:
        if getattr(model, "_diffusers_hook", None) is not None and model.is_cache_enabled:
            model.disable_cache()
        sagegen.unpatch(pipe)


@pytest.mark.parametrize("text,counted", [
    pytest.param("fastercache=spatial:2,uncond:2", "attention", marks=_needs("fastercache")),
    pytest.param("seacache=threshold:10,warmup:1,end:1,max_consecutive:0", "block", marks=_needs("seacache")),
])
def test_spec_skips_what_the_recorder_counts(text, counted):
    spec = cache_spec.parse(text)
    pipe, _ = _pipeline(FAMILY[spec.kind])
    recorder = ScheduleRecorder([pipe.transformer])
    sagegen.patch(pipe, backend="reference")
    applied = cache_spec.apply(pipe, spec)
    try:
        _run(FAMILY[spec.kind])
    finally:
        cache_spec.remove(applied)
        sagegen.unpatch(pipe)
        recorder.remove()
    summary = recorder.summary()
    assert summary["calls"] == (STEPS if spec.kind == "fastercache" else 2 * STEPS)  # batched / two-call guidance
    assert summary[f"{counted}_work"] < 1.0, summary
    assert applied.cached_steps() is None


@_needs("fastercache")
def test_fastercache_spec_refuses_a_model_without_batched_guidance():
    pipe, _ = _pipeline("wan")
    with pytest.raises(ValueError, match="fastercache needs a denoiser that takes guidance as one batched call"):
        cache_spec.apply(pipe, cache_spec.parse("fastercache=2"))
    assert not pipe.transformer.is_cache_enabled
