"""`FP8Linear.requantize`: after the wrapped bf16 weight changed in place (a LoRA merged into it), the FP8 codes
and scales are those of the new weight, written into the same buffers (so Q/K/V stack views and captured graphs
read them), the parked bias copy follows, and outlier handling calibrates again."""

from __future__ import annotations

import pytest
import torch

from sagegen.linear import FP8Linear, quantize_weight
from sagegen.linear.stacked import stack, stacked


def _linear(seed: int, n: int = 64, k: int = 32) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(k, n).to(torch.bfloat16)


@pytest.mark.parametrize("granularity", ["per_channel", "per_block"])
def test_requantize_writes_the_new_weight_into_the_same_buffers(granularity):
    lin = _linear(0, 256, 256)
    act = "per_token" if granularity == "per_channel" else "per_block"
    layer = FP8Linear(lin, park=True, weight_granularity=granularity, act_granularity=act, min_rows=1)
    buffers = {k: layer._buffers[k] for k in ("w_q", "w_scale", "w_scale_gemm", "bias_copy")}
    with torch.no_grad():
        lin.weight.data += 0.5 * torch.randn_like(lin.weight)  # as peft's merge does
        lin.bias.data += 1.0
    layer.requantize()
    w_q, w_s = quantize_weight(lin.weight.detach(), granularity)
    assert all(layer._buffers[k] is v for k, v in buffers.items())
    assert torch.equal(layer.w_q.view(torch.uint8), w_q.view(torch.uint8)) and torch.equal(layer.w_scale, w_s)
    assert torch.equal(layer.bias_copy, lin.bias.detach()) and layer.requantized == 1
    x = torch.randn(8, 256, dtype=torch.bfloat16)
    assert torch.equal(layer(x), FP8Linear(lin, park=True, weight_granularity=granularity, act_granularity=act,
                                           min_rows=1)(x))


def test_requantize_keeps_a_qkv_stack():
    layers = [FP8Linear(_linear(s), park=True, min_rows=1) for s in range(3)]
    assert stack(layers) and stacked(layers) is not None
    with torch.no_grad():
        layers[1].linear.weight.data *= 3
    layers[1].requantize()
    assert stacked(layers) is not None  # still views of the stack's buffers
    w_q, _ = quantize_weight(layers[1].linear.weight.detach(), "per_channel")
    assert torch.equal(stacked(layers).w_q[64:128].view(torch.uint8), w_q.view(torch.uint8))


def test_requantize_recalibrates_outliers_and_refuses_dropped_weights():
    lin = _linear(1)
    layer = FP8Linear(lin, outliers="smooth", min_rows=1)
    layer(torch.randn(4, 32, dtype=torch.bfloat16))
    assert layer.calibrated and layer.col_scale is not None
    layer.requantize()
    assert not layer.calibrated and layer.col_scale is None
    w_q, _ = quantize_weight(lin.weight.detach(), "per_channel")
    assert torch.equal(layer.w_q.view(torch.uint8), w_q.view(torch.uint8))
    layer(torch.randn(4, 32, dtype=torch.bfloat16))
    assert layer.calibrated and layer.col_scale is not None

    dropped = FP8Linear(_linear(2), park=True)
    dropped.linear.to("meta")
    with pytest.raises(RuntimeError, match="bf16_copies='drop'"):
        dropped.requantize()
