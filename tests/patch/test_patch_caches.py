"""diffusers' block caches on a patched model, in either order: `sagegen.patch` swaps fusable blocks for a
subclass, and diffusers' cache hooks look blocks up by exact class in ``TransformerBlockRegistry`` (FirstBlockCache
raised "Model class ... not registered" when the patch came first). The fused subclass carries its base's entry.
Checked on tiny Wan and Flux transformers: the cached calls run, match the same cache on the stock model within
the quantized attention's error, and unpatching leaves the cache hooks in place with stock outputs again."""

from __future__ import annotations

import copy

import pytest
import torch

import sagegen
from tests.support.dispatch_models import tiny_flux, tiny_wan
from tests.support.patching import rel_l1

MODELS = {"wan": tiny_wan, "flux": tiny_flux}
TOL = 0.05  # rel. L1 of a tiny patched transformer against stock (quantized attention; ~0.01-0.03 seen)


def _two_calls(model, inputs, context: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A full call, then one the cache serves from the first block (the threshold lets every change through)."""
    with torch.no_grad(), model.cache_context(context):
        return model(**inputs)[0].clone(), model(**inputs)[0].clone()


def _cache_config():
    from diffusers.hooks import FirstBlockCacheConfig

    return FirstBlockCacheConfig(threshold=1e9)


@pytest.mark.parametrize("order", ["patch_then_cache", "cache_then_patch"])
@pytest.mark.parametrize("family", sorted(MODELS))
def test_first_block_cache_on_a_patched_model(family, order):
    from diffusers.hooks import HookRegistry

    model, inputs = MODELS[family]()
    stock = copy.deepcopy(model)
    stock.enable_cache(_cache_config())
    expected = _two_calls(stock, inputs, "cond")
    if order == "patch_then_cache":
        sagegen.patch(model)
        model.enable_cache(_cache_config())
    else:
        model.enable_cache(_cache_config())
        sagegen.patch(model)
    assert sagegen.patch_info(model)["fused_blocks"] > 0  # the swapped classes are what the cache must accept
    got = _two_calls(model, inputs, "cond")
    for g, e in zip(got, expected):
        assert torch.isfinite(g).all() and rel_l1(g, e) < TOL, rel_l1(g, e)
    assert not torch.equal(got[0], expected[0])  # sagegen's attention ran

    sagegen.unpatch(model)
    hooks = set(HookRegistry.check_if_exists_or_initialize(model.transformer_blocks[0] if family == "flux"
                                                           else model.blocks[0]).hooks)
    assert hooks, "unpatch removed the cache's block hooks"
    again = _two_calls(model, inputs, "after_unpatch")
    for g, e in zip(again, expected):
        assert torch.equal(g, e)


def test_fused_subclass_shares_its_base_registry_entry():
    from diffusers.hooks._helpers import TransformerBlockRegistry
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    model, _ = tiny_wan()
    with sagegen.patched(model):
        sub = type(model.blocks[0])
        assert sub is not WanTransformerBlock and issubclass(sub, WanTransformerBlock)
        assert TransformerBlockRegistry.get(sub) is TransformerBlockRegistry.get(WanTransformerBlock)
        assert TransformerBlockRegistry.get(sub)._cls is WanTransformerBlock  # its forward's signature is read


def _other_caches():
    from diffusers.hooks import MagCacheConfig, PyramidAttentionBroadcastConfig, TaylorSeerCacheConfig

    return {
        "taylorseer": lambda: TaylorSeerCacheConfig(cache_interval=2),
        "magcache": lambda: MagCacheConfig(num_inference_steps=4, mag_ratios=[1.0] * 4),
        "pab": lambda: PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2,
                                                       spatial_attention_timestep_skip_range=(0, 1000),
                                                       current_timestep_callback=lambda: 500),
    }


@pytest.mark.parametrize("order", ["patch_then_cache", "cache_then_patch"])
@pytest.mark.parametrize("cache", ["taylorseer", "magcache", "pab"])
@pytest.mark.parametrize("family", sorted(MODELS))
def test_other_diffusers_caches_on_a_patched_model(family, cache, order):
    """Three calls (a computed one, then ones the cache may serve), against the same cache on the stock model;
    unpatched (and the caches reset, as a pipeline does after each call), the model gives the stock outputs.
    (FasterCache needs a batched CFG call and SeaCache a pipeline's step metadata: tests/patch/
    test_patch_pipeline_caches.py runs them on tiny pipelines.)"""
    config = _other_caches()[cache]
    model, inputs = MODELS[family]()
    stock = copy.deepcopy(model)
    stock.enable_cache(config())

    def three(m, context):
        with torch.no_grad(), m.cache_context(context):
            return [m(**inputs)[0].clone() for _ in range(3)]

    expected = three(stock, "cond")
    if order == "patch_then_cache":
        sagegen.patch(model)
        model.enable_cache(config())
    else:
        model.enable_cache(config())
        sagegen.patch(model)
    for g, e in zip(three(model, "cond"), expected):
        assert torch.isfinite(g).all() and rel_l1(g, e) < TOL, rel_l1(g, e)
    sagegen.unpatch(model)
    for m in (model, stock):  # what a pipeline does after each generation: the cached values start over
        m._reset_stateful_cache()
    for g, e in zip(three(model, "after_unpatch"), three(stock, "fresh")):
        assert torch.equal(g, e)
