"""CogVideoX's fused blocks (`patch.fused_blocks_cogvideox`) against diffusers' own block forward: the route,
the output within bf16 rounding of intermediates (no further from an fp32 run than diffusers' bf16 ops), unpatch
bit for bit, the passes counted, and blocks without affine norms left alone."""

from __future__ import annotations

import torch

from tests.support.fused import DEVICE, assert_fused_like_stock, fp32_reference_and_half, half, stock_unfused_fused
from sagegen.models.arch import example_inputs
from sagegen.models.tiny import build_tiny_transformer
from sagegen.patch.fusion import blocks as fused_blocks
from sagegen.patch.families import cogvideox as fused_blocks_cogvideox


def _model(seed):
    model = build_tiny_transformer("cogvideox", seed=seed).to(DEVICE)
    inputs = example_inputs(model, batch=2, height=32, width=32, frames=9, text_tokens=13, dtype=torch.float32,
                            device=DEVICE, seed=seed)
    with torch.no_grad():  # LayerNorm weights away from their init (ones, zeros), so a wrong one shows
        for block in model.transformer_blocks:
            for ln in (block.norm1.norm, block.norm2.norm):
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.uniform_(-0.3, 0.3)
    return model, inputs


def test_fused_cogvideox_blocks_match_the_stock_blocks(seed, monkeypatch):
    model32, inputs32 = _model(seed % 100)
    want, model, inputs = fp32_reference_and_half(model32, inputs32)
    blocks = model.transformer_blocks
    cls = type(blocks[0])
    assert all(map(fused_blocks_cogvideox.fusable, blocks))
    r = stock_unfused_fused(model, inputs, monkeypatch)
    assert type(blocks[0]) is cls
    assert_fused_like_stock(r, want, blocks=len(blocks), passes=6 * len(blocks))  # three passes per stream


def test_blocks_without_affine_norms_keep_diffusers_forward(seed):
    model, _ = half(*_model(seed % 100))
    block = model.transformer_blocks[0]
    dim = block.norm1.norm.normalized_shape[0]
    block.norm2.norm = torch.nn.LayerNorm(dim, elementwise_affine=False).to(DEVICE, torch.bfloat16)
    assert not fused_blocks_cogvideox.fusable(block)
    assert fused_blocks.install(model) == len(model.transformer_blocks) - 1
    fused_blocks.remove(model)
