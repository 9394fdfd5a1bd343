"""The fused blocks' norms hand their FP8 copy to the projections that read them (`fused_blocks.NORM_FP8`):
with FP8 linears (the emulation on CPU, the blocks' kernels in the interpreter) a patched step is bit for bit
the same with and without, and quantizes fewer activations with; the kernel's copy equals the quantizer's."""

from __future__ import annotations

import pytest
import torch

import sagegen
from sagegen.kernels.fp8_quant import quantize_fp8_rows
from sagegen.kernels.triton_residual_norm import residual_norm
from sagegen.linear import FP8Linear, LinearPolicy
from sagegen.linear import module as fp8_module
from sagegen.linear.numerics import quantize_activations
from sagegen.models import arch as archs
from sagegen.patch import fused_blocks, patch_info


@pytest.mark.parametrize("kind", ["layer", "rms", "affine"])
def test_norm_kernel_fp8_copy_equals_the_quantizer(seed, kind):
    B, S, C = 2, 9, 200  # C not a power of two: masked lanes must not reach the amax
    x, y = (torch.randn(B, S, C) * 3).to(torch.bfloat16), torch.randn(B, S, C).to(torch.bfloat16)
    gate = torch.randn(B, 1, C)
    kwargs = {"layer": dict(scale=torch.randn(B, 1, C) * 0.2, shift=torch.randn(B, 1, C) * 0.2),
              "rms": dict(rms=True), "affine": dict(weight=torch.randn(C), bias=torch.randn(C) + 5)}[kind]
    h, n, (q, s) = residual_norm(x, y, gate, fp8=True, **kwargs)
    h0, n0 = residual_norm(x, y, gate, **kwargs)
    assert torch.equal(h, h0) and torch.equal(n, n0)
    for q_ref, s_ref in (quantize_fp8_rows(n.reshape(-1, C)), quantize_activations(n.reshape(-1, C))):
        assert torch.equal(s, s_ref) and torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    with pytest.raises(ValueError, match="needs norm=True"):
        residual_norm(x, y, gate, norm=False, fp8=True)


def test_takes_shared_follows_what_the_layer_would_quantize():
    lin = torch.nn.Linear(32, 8, dtype=torch.bfloat16)
    x = torch.randn(4, 16, 32, dtype=torch.bfloat16)
    assert FP8Linear(lin, min_rows=64).takes_shared(x)
    assert not FP8Linear(lin, min_rows=65).takes_shared(x)           # too few rows: the bf16 layer runs
    assert not FP8Linear(lin, min_rows=1).takes_shared(x.float())    # another dtype: the bf16 layer runs
    assert not FP8Linear(lin, min_rows=1, act_granularity="per_block", weight_granularity="per_block").takes_shared(x)
    assert not FP8Linear(lin, min_rows=1, outliers="smooth").takes_shared(x)  # calibrates a channel scale first
    gelu = FP8Linear(lin, min_rows=1)
    gelu.prologue = "gelu_tanh"
    assert not gelu.takes_shared(x)


# (model, norms a fused block hands a copy to): Wan's Q/K/V, cross-attention Q and FFN input; the joint blocks'
# image and text Q/K/V and MLP inputs
@pytest.mark.parametrize("name, sites", [("wan2.1-t2v-1.3b", 3), ("sd3.5-large", 4), ("qwen-image", 4)])
def test_patched_step_is_identical_with_the_norms_fp8_copies(name, sites, monkeypatch):
    overrides = dict(archs.smoke_overrides(name), num_layers=2)  # SD3's last block (context only) stays unfused
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0, config_overrides=overrides)
    arch = archs.get_arch(name)
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cpu", seed=1, height=32, width=32,
                                  **({"frames": 5} if arch.frames else {}))
    calls = []
    real = fp8_module.quantize_eager
    monkeypatch.setattr(fp8_module, "quantize_eager", lambda x, *a, **k: calls.append(1) or real(x, *a, **k))
    outputs, counts = {}, {}
    with torch.inference_mode():
        sagegen.patch(model, backend="reference", linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
        fused = patch_info(model)["fused_blocks"]
        assert fused > 0
        for on in (False, True):
            monkeypatch.setattr(fused_blocks, "NORM_FP8", on)
            calls.clear()
            outputs[on] = model(**inputs)[0]
            counts[on] = len(calls)
        sagegen.unpatch(model)
    assert torch.equal(outputs[True], outputs[False])
    assert counts[False] - counts[True] == sites * fused, (counts, fused)
