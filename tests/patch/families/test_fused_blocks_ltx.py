"""LTX-Video's fused blocks (`patch.fused_blocks_ltx`, `residual_norm` in RMSNorm mode) against diffusers' own
block forward: the route, the output within bf16 rounding of intermediates (no further from an fp32 run than
diffusers' bf16 ops), per-token modulation, unpatch bit for bit, the passes counted, and the fallbacks."""

from __future__ import annotations

import torch

from tests.support.dispatch_models import tiny_ltx
from tests.support.fused import (DEVICE, assert_fused_like_stock, fp32_reference_and_half, half, on_device,
                                 stock_unfused_fused)
from tests.support.patching import rel_l1
from sagegen.kernels.triton_residual_norm import residual_norm
from sagegen.patch.fusion import blocks as fused_blocks
from sagegen.patch.families import ltx as fused_blocks_ltx


def _model(seed):
    return on_device(*tiny_ltx(seed))


def test_fused_ltx_block_matches_the_stock_block(seed, monkeypatch):
    model32, inputs32 = _model(seed % 100)
    want, model, inputs = fp32_reference_and_half(model32, inputs32)
    cls = type(model.transformer_blocks[0])
    assert fused_blocks_ltx.fusable(model.transformer_blocks[0])
    r = stock_unfused_fused(model, inputs, monkeypatch)
    assert type(model.transformer_blocks[0]) is cls
    assert r["calls"] == [True, None, True, None]  # two RMSNorm passes, two residual-only passes
    assert_fused_like_stock(r, want, blocks=1, passes=4)


def test_one_block_with_per_token_modulation_against_fp32(seed):
    """Image-to-video gives the first frame's tokens their own timestep: temb [B, S, 6C]."""
    model, _ = _model(seed % 100)
    block = model.transformer_blocks[0]
    C = block.scale_shift_table.shape[1]
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(2, 24, C, generator=g) * 2 + 0.5).to(DEVICE)
    ctx = torch.randn(2, 6, C, generator=g).to(DEVICE)
    temb = (torch.randn(2, 24, 6 * C, generator=g) * 0.3).to(DEVICE)
    with torch.no_grad():
        want = block(x, ctx, temb).double()
        block.to(torch.bfloat16)
        args = (x.to(torch.bfloat16), ctx.to(torch.bfloat16), temb.to(torch.bfloat16))
        stock = block(*args)
        fused_blocks.install(model)
        fused = block(*args)
        fused_blocks.remove(model)
    assert fused.dtype == stock.dtype == torch.bfloat16
    err_fused, err_stock = rel_l1(fused.double(), want), rel_l1(stock.double(), want)
    assert err_fused <= 1.1 * err_stock + 1e-4, (err_fused, err_stock)
    assert rel_l1(fused, stock) < 2e-2


def test_blocks_it_cannot_reproduce_run_the_stock_forward(seed):
    """A modulation the stock forward would promote to fp32, or of a shape the passes do not broadcast, goes to
    diffusers' forward with every argument; norms with weights are not fused at all."""
    model, _ = half(*_model(seed % 100))
    block = model.transformer_blocks[0]
    C = block.scale_shift_table.shape[1]
    x = torch.randn(2, 24, C, device=DEVICE).to(torch.bfloat16)
    ctx = torch.randn(2, 6, C, device=DEVICE).to(torch.bfloat16)
    for temb in (torch.randn(2, 1, 6 * C, device=DEVICE),                          # fp32: promotes the stream
                 torch.randn(2, 5, 6 * C, device=DEVICE).to(torch.bfloat16)):      # 5 rows for 24 tokens
        seen = []
        out = fused_blocks_ltx.fused_forward(block, lambda *a: seen.append(a) or "stock", lambda t: True,
                                             residual_norm, x, ctx, temb, "rope", "mask")
        assert out == "stock" and seen[0][0] is block and seen[0][1:] == (x, ctx, temb, "rope", "mask")
    from diffusers.models.normalization import RMSNorm

    block.norm2 = RMSNorm(C, eps=1e-6, elementwise_affine=True).to(DEVICE, torch.bfloat16)  # weights: not fused
    assert not fused_blocks_ltx.fusable(block) and fused_blocks.install(model) == 0
