"""diffusers' step caches stacked on sagegen's other levers: FP8 linears (every block, every row quantized) and
block-sparse attention, in either order of patch and cache, on the tiny Wan2.1 pipeline with the `--cache` specs
(`cache_spec.apply`). Outputs against the same cache on the stock pipeline within the lever's usual error; the
lever's own calls counted (FP8 GEMMs, sparse attention calls) so a stack that fell back to bf16 or dense fails;
`sagegen.unpatch` then leaves the cache as set (the stock cached output again, exactly). FasterCache and SeaCache
(pipeline-level hooks) and cache-dit have their own files; context parallelism with a cache is not covered here."""

from __future__ import annotations

import functools
import json

import pytest
import torch

import sagegen
from sagegen.linear import LinearPolicy
from sagegen.patch import cache_spec, reset_stats
from sagegen.sparse.sparse_config import SparseConfig
from tests.support.cache_pipelines import latents as _run
from tests.support.cache_pipelines import pipeline as _pipeline
from tests.support.helpers import rel_l1

FP8_TOL = 0.15      # rel. L1 of a tiny pipeline with every linear in FP8 (emulated) against stock
SPARSE_TOL = 0.06   # cdf=1.0 keeps every block: the dense patch's error (PIPELINE_TOL)
STACKS = {
    "fp8": dict(linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1)),
    # every step and block sparse: a first-block cache computes block 0 alone, which stays dense by default
    "sparse": dict(sparse=SparseConfig(mode="cdf", value=1.0, min_tokens=0, dense_blocks=(), dense_steps=0.0)),
}
SPECS = ["fbcache=1e9", "taylorseer=interval:2,warmup:1", "pab=2", "magcache"]


def _spec(text: str, tmp_path_factory) -> cache_spec.CacheSpec:
    if text == "magcache":  # ratios of 1: every step after the first within MagCache's error budget
        path = tmp_path_factory.mktemp("magcache") / "ratios.json"
        path.write_text(json.dumps([1.0] * 4))
        text = f"magcache={path}"
    return cache_spec.parse(text)


@functools.lru_cache(maxsize=None)
def _stock_cached(text: str, spec: cache_spec.CacheSpec) -> torch.Tensor:
    pipe, _ = _pipeline("wan")
    applied = cache_spec.apply(pipe, spec)
    try:
        return _run("wan")
    finally:
        cache_spec.remove(applied)


@functools.lru_cache(maxsize=None)
def _stock() -> torch.Tensor:
    return _run("wan")


@pytest.mark.parametrize("order", ["patch_then_cache", "cache_then_patch"])
@pytest.mark.parametrize("stack", sorted(STACKS))
@pytest.mark.parametrize("text", SPECS)
def test_cache_on_a_pipeline_patched_with_fp8_or_sparse(text, stack, order, tmp_path_factory):
    pipe, _ = _pipeline("wan")
    spec = _spec(text, tmp_path_factory)
    want = _stock_cached(text, spec)
    assert not torch.equal(want, _stock())  # the cache changed something on these 4 steps
    applied = None
    try:
        if order == "patch_then_cache":
            sagegen.patch(pipe, backend="reference", **STACKS[stack])
            applied = cache_spec.apply(pipe, spec)
        else:
            applied = cache_spec.apply(pipe, spec)
            sagegen.patch(pipe, backend="reference", **STACKS[stack])
        reset_stats(pipe)
        got = _run("wan")
        info = sagegen.patch_info(pipe)
        if stack == "fp8":
            assert info["linear"]["fp8_layer_count"] > 0 and info["linear"]["fp8_calls"] > 0, info["linear"]
        else:
            assert info["stats"].get("sparse_calls", 0) > 0, info["stats"]
        err = rel_l1(got, want)
        assert torch.isfinite(got).all() and err < (FP8_TOL if stack == "fp8" else SPARSE_TOL), err
        assert not torch.equal(got, want)  # the lever ran
        sagegen.unpatch(pipe)
        assert torch.equal(_run("wan"), want)  # the cache as the user set it, on stock attention again
    finally:
        sagegen.unpatch(pipe)
        if applied is not None:
            cache_spec.remove(applied)
