"""GPU twin of tests/patch/families/test_patch_hunyuanvideo15.py (skipped without CUDA): the patch's key-mask path for
HunyuanVideo-1.5's main blocks on the Triton kernel gives the stock processor call's output bit for bit, and
no longer allocates the [B, 1, S, S] mask (peak memory of one forward)."""

from __future__ import annotations

import torch

import sagegen
from tests.conftest import gpu
from sagegen.models.tiny_classes import build_tiny_class, tiny_class_inputs
from sagegen.patch import dispatch_route as backend_route

pytestmark = gpu


def _forward_and_peak(model, inputs):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        out = model(**inputs)[0]
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated() - base


def test_key_mask_on_triton_equals_stock_call_and_saves_the_square_mask(monkeypatch):
    model = build_tiny_class("hunyuanvideo15").cuda()
    inputs = tiny_class_inputs("hunyuanvideo15", model, batch=1)
    mask = inputs["encoder_attention_mask"]
    mask[0, 9:] = 0                                    # three padding text tokens
    g = torch.Generator().manual_seed(0)               # 8 x 32 x 64 = 16,384 video tokens
    inputs["hidden_states"] = torch.randn(1, 9, 8, 32, 64, generator=g).to(torch.bfloat16)
    inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    s = 8 * 32 * 64 + 12 + 6 + 5
    sagegen.patch(model, backend="triton")
    out, peak = _forward_and_peak(model, inputs)
    sagegen.unpatch(model)
    monkeypatch.setattr(backend_route, "call_for", backend_route.call_function)  # the stock processor call
    sagegen.patch(model, backend="triton")
    stock, stock_peak = _forward_and_peak(model, inputs)
    sagegen.unpatch(model)
    assert torch.equal(out, stock)
    assert stock_peak >= s * s                         # the stock call's bool [1, 1, S, S] mask (~270 MB)
    # no S x S mask on our side (the first H100 run: 93 MB of activations vs 702 MB for the stock call)
    assert peak < s * s // 2 and stock_peak - peak >= 0.9 * s * s, (peak, stock_peak)
