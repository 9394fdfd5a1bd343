"""cache-dit (``cache_dit.enable_cache(pipe, cache_config=DBCacheConfig(...))``) on a sagegen-patched tiny Wan and
Flux pipeline, in either order, with and without FP8 linears: cache-dit accepts the fused block classes (their
``forward`` keeps the stock signature, which its forward-pattern check reads), caches the same steps as on the
stock pipeline, and the outputs match cache-dit on the stock pipeline within the patch's usual error. Taking
either off first (``cache_dit.disable_cache``, `sagegen.unpatch`) leaves the other exactly as it was."""

from __future__ import annotations

import functools

import pytest
import torch

import sagegen
from sagegen.linear import LinearPolicy
from sagegen.patch import cache_spec, cachedit
from sagegen.patch.cache_schedule import ScheduleRecorder
from tests.support import cache_pipelines
from tests.support.helpers import rel_l1

if cachedit.installed_version() is None:
    pytest.skip(f"cache-dit is not installed ({cachedit.INSTALL})", allow_module_level=True)
if cachedit.release(__import__("diffusers").__version__) < (0, 36):
    pytest.skip("cache-dit needs diffusers >= 0.36", allow_module_level=True)
cache_dit = pytest.importorskip("cache_dit")

PIPELINE_TOL = 0.06  # rel. L1 of a tiny patched pipeline's latents vs stock (tests/support/diffusers_compat.py)
FP8_TOL = 0.15  # ... with FP8 linears too (whole-model bound of tests/patch/test_patch_linear.py)
EVERYWHERE = LinearPolicy(keep_blocks=(), min_rows=1)  # the tiny models' few blocks all in FP8
STEPS = cache_pipelines.STEPS
CACHED = [1, 2, 3]  # warm-up 1 and a threshold every change passes: every later step served from the cache


_pipeline, _run = cache_pipelines.pipeline, cache_pipelines.latents


def _config():
    return cache_dit.DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=1e9,
                                   max_warmup_steps=1)


def _cached_steps(pipe) -> list[list[int]]:
    return [c["cached_steps"] for c in cachedit.cached_steps(pipe)]


def _patch_kwargs(linear: str | None) -> dict:
    return dict(backend="reference", linear="fp8", linear_policy=EVERYWHERE) if linear else dict(backend="reference")


@functools.lru_cache(maxsize=None)
def _references(family: str, linear: str | None) -> dict[str, torch.Tensor]:
    """Stock, sagegen uncached, and cache-dit on the stock pipeline (whose cached steps are checked here)."""
    pipe, _ = _pipeline(family)
    refs = {"stock": _run(family)}
    sagegen.patch(pipe, **_patch_kwargs(linear))
    refs["sage"] = _run(family)
    sagegen.unpatch(pipe)
    cache_dit.enable_cache(pipe, cache_config=_config())
    try:
        refs["stock_cached"] = _run(family)
        assert _cached_steps(pipe) == [CACHED]
    finally:
        cache_dit.disable_cache(pipe)
    assert torch.equal(_run(family), refs["stock"])
    return refs


# every order of putting on and taking off; with FP8 linears, both orders on and each teardown once (kept short)
CASES = [(order, teardown, None) for order in ("patch_then_cache", "cache_then_patch")
         for teardown in ("unpatch_first", "disable_first")]
CASES += [("patch_then_cache", "disable_first", "fp8"), ("cache_then_patch", "unpatch_first", "fp8")]


@pytest.mark.parametrize("order,teardown,linear", CASES)
@pytest.mark.parametrize("family", ["wan", "flux"])
def test_cache_dit_on_a_patched_pipeline(family, order, teardown, linear):
    pipe, _ = _pipeline(family)
    refs = _references(family, linear)
    try:
        if order == "patch_then_cache":
            sagegen.patch(pipe, **_patch_kwargs(linear))
            cache_dit.enable_cache(pipe, cache_config=_config())
        else:
            cache_dit.enable_cache(pipe, cache_config=_config())
            sagegen.patch(pipe, **_patch_kwargs(linear))
        info = sagegen.patch_info(pipe)
        assert info["fused_blocks"] > 0  # the swapped classes are what cache-dit must accept
        got = _run(family)
        assert _cached_steps(pipe) == [CACHED]  # the same schedule as on stock
        assert torch.isfinite(got).all()
        err = rel_l1(got, refs["stock_cached"])
        assert err < (FP8_TOL if linear else PIPELINE_TOL), err
        assert not torch.equal(got, refs["stock_cached"])  # sagegen's attention ran
        if linear:
            assert sagegen.patch_info(pipe)["linear"]["fp8_calls"] > 0

        if teardown == "unpatch_first":
            sagegen.unpatch(pipe)
            assert torch.equal(_run(family), refs["stock_cached"])  # cache-dit as the user set it
            cache_dit.disable_cache(pipe)
        else:
            cache_dit.disable_cache(pipe)
            assert torch.equal(_run(family), refs["sage"])  # the patch as the user set it
            sagegen.unpatch(pipe)
        assert torch.equal(_run(family), refs["stock"])
    finally:
        if getattr(pipe, "_context_manager", None) is not None:
            cache_dit.disable_cache(pipe)
        sagegen.unpatch(pipe)


def test_fused_blocks_pass_cache_dits_forward_pattern_check():
    """cache-dit reads each block's ``forward`` signature (its inputs and the number of tensors it returns) before
    it caches a pipeline that has not run yet; the fused subclass's forward takes ``*args`` but carries the stock
    signature."""
    from cache_dit import BlockAdapter, ForwardPattern

    pipe, _ = _pipeline("wan")
    with sagegen.patched(pipe, backend="reference"):
        blocks = pipe.transformer.blocks
        assert type(blocks[0]).__module__.startswith("sagegen")
        assert BlockAdapter.match_blocks_pattern(blocks, ForwardPattern.Pattern_2, logging=False)


@pytest.mark.parametrize("order", ["patch_then_cache", "cache_then_patch"])
def test_cachedit_spec_records_a_fixed_schedule(order):
    """``--cache cachedit=...`` through `cache_spec.apply`: a 0/1 mask with the static policy is a fixed schedule
    (what random weights need); the recorder sees the skipped blocks and cache-dit reports the same steps."""
    pipe, _ = _pipeline("wan")
    spec = cache_spec.bind_steps(cache_spec.parse("cachedit=Fn:1,Bn:0,warmup:0,mask:1101,policy:static"), STEPS)
    recorder = ScheduleRecorder([pipe.transformer])
    applied = None
    try:
        if order == "patch_then_cache":
            sagegen.patch(pipe, backend="reference")
            applied = cache_spec.apply(pipe, spec)
        else:
            applied = cache_spec.apply(pipe, spec)
            sagegen.patch(pipe, backend="reference")
        _run("wan")
        summary = recorder.summary()
        full = summary["blocks_per_call"]
        assert summary["calls"] == 2 * STEPS  # guidance in two calls
        assert summary["blocks"] == [full, full, full, full, 1, 1, full, full], summary  # step 2 (0-based) cached
        assert applied.cached_steps() == [{"context": applied.cached_steps()[0]["context"], "cached_steps": [2],
                                           "cfg_cached_steps": [2]}]
    finally:
        if applied is not None:
            cache_spec.remove(applied)
        recorder.remove()
        sagegen.unpatch(pipe)
    assert torch.equal(_run("wan"), _references("wan", None)["stock"])


def test_cachedit_spec_checks_the_block_count():
    pipe, _ = _pipeline("flux")
    with pytest.raises(ValueError, match=r"cachedit Fn:8 is more blocks than FluxTransformer2DModel's .* \(1\)"):
        cache_spec.apply(pipe, cache_spec.parse("cachedit=0.1"))
    assert getattr(pipe, "_context_manager", None) is None
