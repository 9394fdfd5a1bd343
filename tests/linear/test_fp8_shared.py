"""One FP8 copy per activation (`sagegen.linear.shared`): inside a sharing scope (each attention-processor
call of a patched model), projections of the same tensor reuse its quantization, with the same result as
quantizing again; anything else (another tensor at any address, an in-place change, a freed tensor, a column
scale or GELU prologue, calls outside a scope) quantizes anew."""

from __future__ import annotations

import gc

import pytest
import torch

import sagegen
from sagegen.linear import FP8Linear, LinearPolicy
from sagegen.linear import module as fp8_module
from sagegen.linear import ops as fp8_ops
from sagegen.linear import stacked
from sagegen.linear.shared import SharedActivations, shared, sharing
from sagegen.models import arch as archs


def _counting(monkeypatch):
    calls = []
    real = fp8_module.quantize_eager

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(fp8_module, "quantize_eager", counted)
    monkeypatch.setattr(stacked, "quantize_eager", counted)
    return calls


def test_cache_matches_only_the_same_unchanged_tensor():
    cache = SharedActivations()
    x = torch.randn(6, 8)
    cache.put(x.reshape(-1, 8), "per_token", False, "q")
    assert cache.get(x.view(6, 8), "per_token", False) == "q"          # another view of the same tensor
    assert cache.get(x.reshape(-1, 8), "per_block", False) is None      # another granularity
    assert cache.get(x.clone(), "per_token", False) is None              # equal values, another tensor
    assert cache.get(x[1:], "per_token", False) is None                  # another view shape
    x.add_(1.0)                                                          # changed in place: version bump
    assert cache.get(x.reshape(-1, 8), "per_token", False) is None
    cache.put(x, "per_token", False, "q2")
    del x
    gc.collect()
    assert cache._entry is None  # the source is gone: so is its copy, and no new tensor can match


def test_projections_of_one_input_quantize_once_with_identical_results(monkeypatch, seed):
    lin = [torch.nn.Linear(64, 32, dtype=torch.bfloat16) for _ in range(3)]
    fp8 = [FP8Linear(m, min_rows=1) for m in lin]
    x = torch.randn(2, 20, 64, dtype=torch.bfloat16)
    fresh = [fp8_ops.fp8_linear_eager(x.reshape(-1, 64), f.w_q, f.w_scale, m.bias, None, "per_token", False)
             .reshape(2, 20, 32) for f, m in zip(fp8, lin)]
    calls = _counting(monkeypatch)
    with torch.no_grad(), sharing():
        got = [f(x) for f in fp8]
        assert len(calls) == 1
        fp8[0](x.clone())      # another tensor: quantized anew
        fp8[1](x + 0)
        assert len(calls) == 3
    assert all(torch.equal(g, w) for g, w in zip(got, fresh))
    assert shared() is None
    with torch.no_grad():      # outside a scope: every call quantizes
        [f(x) for f in fp8]
    assert len(calls) == 6
    with torch.inference_mode(), sharing():  # inference tensors (no version counter) share within the scope
        xi = torch.randn(2, 20, 64, dtype=torch.bfloat16)
        [f(xi) for f in fp8]
        cache = shared()
    assert len(calls) == 7 and cache._entry is None  # emptied when the scope ended


def test_prologue_and_column_scale_layers_do_not_share(monkeypatch, seed):
    a, b = (FP8Linear(torch.nn.Linear(64, 16, dtype=torch.bfloat16), min_rows=1) for _ in range(2))
    b.prologue = "gelu_tanh"
    x = torch.randn(10, 64, dtype=torch.bfloat16)
    calls = _counting(monkeypatch)
    with torch.no_grad(), sharing():
        a(x)
        b(x)   # GELU(x) is another activation
        a(x)   # (b did not replace the plain entry)
    assert len(calls) == 2


@pytest.mark.parametrize("name", ["flux.1-dev", "sd3.5-medium"])
def test_patched_model_output_is_unchanged_by_sharing(monkeypatch, name):
    """A tiny model's step with FP8 linears everywhere, under inference_mode as pipelines run: with and without
    sharing, the same bits; fewer quantizations with it (Q/K/V of the image and text streams)."""
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cpu", seed=1, height=64, width=64,
                                  text_tokens=archs.smoke_text_tokens(name))
    sagegen.patch(model, backend="reference", linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
    calls = _counting(monkeypatch)
    with torch.inference_mode():
        model(**inputs)
    n_stacked = len(calls)  # Q/K/V as one GEMM: no quantization more (Flux's single blocks reuse proj_mlp's)
    monkeypatch.setattr(stacked, "ENABLED", False)  # (stacked Q/K/V quantize once with or without sharing)
    calls.clear()
    with torch.inference_mode():
        shared_out = model(**inputs)[0]
    n_shared = len(calls)
    assert n_stacked == n_shared, (n_stacked, n_shared)
    monkeypatch.setattr(SharedActivations, "get", lambda self, *a: None)
    calls.clear()
    with torch.inference_mode():
        plain_out = model(**inputs)[0]
    sagegen.unpatch(model)
    assert torch.equal(shared_out, plain_out)
    assert n_shared < len(calls) * 0.75, (n_shared, len(calls))
