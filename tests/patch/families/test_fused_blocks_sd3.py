"""SD3's fused joint blocks (`patch.fused_blocks_sd3`) against diffusers' own block forward: the route, the
output within bf16 rounding of intermediates, unpatch bit for bit, and the blocks it leaves alone (the last,
context-only block; dual attention; a chunked feed-forward)."""

from __future__ import annotations

import copy

import torch

import sagegen
from tests.support.fused import assert_fused_like_stock, stock_unfused_fused
from tests.support.patching import rel_l1
from sagegen.kernels import triton_residual_norm as kernel
from sagegen.kernels.triton_residual_norm import residual_norm
from sagegen.models import arch as archs
from sagegen.patch import patch_info
from sagegen.patch.fusion import blocks as fused_blocks
from sagegen.patch.families import sd3 as fused_blocks_sd3

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the Triton kernel runs in the interpreter


def _tiny(name="sd3.5-large", layers=3, seed=0):
    overrides = dict(archs.smoke_overrides(name), num_layers=layers)
    model = archs.build_transformer(name, dtype=torch.bfloat16, device=DEVICE, seed=seed, config_overrides=overrides)
    inputs = archs.example_inputs(name, batch=2, dtype=torch.bfloat16, device=DEVICE, seed=seed + 1, height=64,
                                  width=64, text_tokens=archs.smoke_text_tokens(name))
    return model, inputs


def _count_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(kernel, "residual_norm", lambda *a, **k: calls.append(1) or residual_norm(*a, **k))
    return calls


def test_fused_sd3_blocks_match_the_stock_blocks(seed, monkeypatch):
    """Exact attention on both sides (an override), so the only difference is the fused element-wise work. The
    stock bf16 ops round every intermediate and the pass rounds once, so the two differ by ~0.5% at the output of
    this random model; what decides is that the fused model is no further from an fp64 run of the same model."""
    model, inputs = _tiny(seed=seed % 100)
    oracle = copy.deepcopy(model).double()
    blocks = model.transformer_blocks
    cls = type(blocks[0])
    assert [fused_blocks_sd3.fusable(b) for b in blocks] == [True, True, False]  # the last is context_pre_only
    with torch.no_grad():
        want = oracle(**{k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                         for k, v in inputs.items()})[0]
    r = stock_unfused_fused(model, inputs, monkeypatch)
    assert type(blocks[0]) is cls
    assert_fused_like_stock(r, want, blocks=2, passes=6 * 2, apart=1e-2)  # three passes per stream


def test_one_fused_block_against_the_stock_forward_and_fp64(seed):
    """One block, both streams: the fused outputs are at least as close to an fp64 evaluation of the block as
    diffusers' bf16 ops are (they round every intermediate; the pass rounds once)."""
    model, inputs = _tiny(seed=seed % 100, layers=2)
    block = model.transformer_blocks[0]
    torch.manual_seed(seed)
    x = torch.randn(2, 16, block.norm2.normalized_shape[0], device=DEVICE).to(torch.bfloat16)
    c = torch.randn(2, 8, block.norm2.normalized_shape[0], device=DEVICE).to(torch.bfloat16)
    temb = torch.randn(2, block.norm2.normalized_shape[0], device=DEVICE).to(torch.bfloat16)
    cls = type(block)
    with torch.no_grad():
        stock_c, stock_x = block(x, c, temb)
        ref = block.double()
        ref_c, ref_x = ref(x.double(), c.double(), temb.double())
        block.to(torch.bfloat16)
        fused_blocks.install(model)
        fused_c, fused_x = block(x, c, temb)
        fused_blocks.remove(model)
    assert type(block) is cls
    for fused, stock, want in ((fused_x, stock_x, ref_x), (fused_c, stock_c, ref_c)):
        err_fused, err_stock = rel_l1(fused.double(), want), rel_l1(stock.double(), want)
        assert err_fused <= 1.1 * err_stock + 1e-4, (err_fused, err_stock)
        assert rel_l1(fused, stock) < 1e-2


def test_blocks_it_cannot_reproduce_run_the_stock_forward(seed, monkeypatch):
    model, inputs = _tiny("sd3.5-medium", layers=3, seed=seed % 100)  # block 0 has dual attention
    blocks = model.transformer_blocks
    assert blocks[0].use_dual_attention and not fused_blocks_sd3.fusable(blocks[0])
    assert fused_blocks_sd3.fusable(blocks[1])
    with torch.no_grad():
        sagegen.patch(model, backend="reference")
        assert patch_info(model)["fused_blocks"] == 1
        calls = _count_kernel(monkeypatch)
        model(**inputs)
        assert len(calls) == 6
        blocks[1]._chunk_size, blocks[1]._chunk_dim = 1, 1  # diffusers' chunked feed-forward: the stock forward
        calls.clear()
        chunked = model(**inputs)[0]
        assert calls == []
        # the same patched, chunked model with diffusers' block classes back (the Q/K prologues stay fused:
        # fuse_prologue=False would also change their rounding)
        fused_blocks.remove(model)
        unfused = model(**inputs)[0]
    sagegen.unpatch(model)
    assert torch.equal(chunked, unfused)
