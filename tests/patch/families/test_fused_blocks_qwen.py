"""Qwen-Image's fused blocks (`patch.fused_blocks_qwen`) against diffusers' own block forward: the route, the
output within bf16 rounding of intermediates (no further from an fp32 run of the same model than diffusers'
bf16 ops are), unpatch bit for bit, the passes counted, and Qwen-Image-Edit's per-token modulation left alone."""

from __future__ import annotations

import torch

from tests.support.dispatch_models import tiny_qwenimage
from tests.support.fused import (DEVICE, assert_fused_like_stock, fp32_reference_and_half, half, on_device,
                                 stock_unfused_fused)
from sagegen.kernels.triton_residual_norm import residual_norm
from sagegen.patch.fusion import blocks as fused_blocks
from sagegen.patch.families import qwenimage as fused_blocks_qwen


def _model(seed):
    return on_device(*tiny_qwenimage(seed))


def test_fused_qwen_blocks_match_the_stock_blocks(seed, monkeypatch):
    """Exact attention on both sides (an override): what differs is the fused element-wise work."""
    model32, inputs32 = _model(seed % 100)
    want, model, inputs = fp32_reference_and_half(model32, inputs32)
    cls = type(model.transformer_blocks[0])
    assert all(map(fused_blocks_qwen.fusable, model.transformer_blocks))
    r = stock_unfused_fused(model, inputs, monkeypatch)
    assert type(model.transformer_blocks[0]) is cls
    assert_fused_like_stock(r, want, blocks=2, passes=2 * 6)  # three passes per stream and block


def test_per_token_modulation_and_affine_norms_run_the_stock_forward(seed):
    model, inputs = half(*_model(seed % 100))
    block = model.transformer_blocks[0]
    block.zero_cond_t = True  # Qwen-Image-Edit-2511's conditioning layout: not what the passes do
    assert not fused_blocks_qwen.fusable(block) and fused_blocks_qwen.fusable(model.transformer_blocks[1])
    block.zero_cond_t = False
    block.img_norm2 = torch.nn.LayerNorm(block.dim, eps=1e-6).to(DEVICE, torch.bfloat16)
    assert not fused_blocks_qwen.fusable(block)
    assert fused_blocks.install(model) == 1
    fused_blocks.remove(model)


def test_modulate_index_takes_the_stock_forward(seed):
    """A call with ``modulate_index`` (Qwen-Image-Edit's per-token choice between two modulations) goes to
    diffusers' forward with every argument, whatever the block."""
    model, _ = half(*_model(seed % 100))
    block = model.transformer_blocks[0]
    seen = []
    x = torch.randn(1, 12, block.dim, device=DEVICE).to(torch.bfloat16)
    args = (x, x[:, :5], None, x[:, 0], "rope", {"k": 1}, [0, 1])
    out = fused_blocks_qwen.fused_forward(block, lambda *a: seen.append(a) or "stock", lambda t: True,
                                          residual_norm, *args)
    assert out == "stock" and seen[0][0] is block and seen[0][1:] == args
