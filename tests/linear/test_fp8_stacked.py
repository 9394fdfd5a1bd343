"""Q/K/V as one FP8 GEMM (`sagegen.linear.stacked`) on the CPU (emulation): stacking adds no memory and changes
no layer's own output, the stacked product equals the layers' own products column block by column block, it
stops applying when a layer gets buffers of its own (and then holds nothing), and every family's fused processor
takes it inside a patched tiny model with the same output as the three separate GEMMs."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import sagegen
from tests.conftest import interpreted
from sagegen.linear import FP8Linear, LinearPolicy
from sagegen.linear import stacked as stacked_module
from sagegen.linear.stacked import stack, stacked, stacked_forward
from sagegen.models import arch as archs
from sagegen.patch import patch_info
from sagegen.patch.fusion import prologue as fused_common


def _layers(seed: int, widths=(48, 32, 40), k: int = 64, bias=True, **kw) -> list[FP8Linear]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in widths:
        lin = torch.nn.Linear(k, n, bias=bias, dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n, k, generator=g) / k ** 0.5)
            if bias:
                lin.bias.copy_(torch.randn(n, generator=g))
        out.append(FP8Linear(lin, min_rows=4, **kw))
    return out


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("bias", [True, False])
def test_stacked_product_equals_each_layers_own(seed, bias, mode):
    layers = _layers(seed, bias=bias)
    x = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(seed + 1)).to(torch.bfloat16)
    with getattr(torch, mode)():
        before = [lay(x) for lay in layers]
        weights = [lay.w_q.clone() for lay in layers]
        assert stack(layers)
        group = stacked(layers)
        assert group is not None and group.w_q.shape == (sum(group.widths), 64)
        # each layer's buffers are views of the shared ones, holding the same values
        for lay, w in zip(layers, weights):
            assert lay.w_q.untyped_storage().data_ptr() == group.w_q.untyped_storage().data_ptr()
            assert torch.equal(lay.w_q.view(torch.uint8), w.view(torch.uint8))
        after = [lay(x) for lay in layers]
        together = stacked_forward(layers, x)
    assert all(torch.equal(a, b) for a, b in zip(after, before))
    assert together is not None and [t.shape for t in together] == [b.shape for b in before]
    for t, b in zip(together, before):  # one fp32 matmul against three: the same sums up to fp32 rounding
        assert (t.float() - b.float()).abs().max() <= 2 ** -7 * b.float().abs().max(), (t - b).abs().max()
    assert [lay.fp8_calls for lay in layers] == [3, 3, 3]


def test_stacked_product_is_refused_where_it_does_not_apply(seed):
    layers = _layers(seed)
    x = torch.randn(16, 64).to(torch.bfloat16)
    assert stacked_forward(layers, x) is None  # not stacked
    assert stack(layers)
    assert stacked_forward(layers, x[:3]) is None  # fewer rows than min_rows: the layers run bf16
    assert stacked_forward(layers, x.float()) is None  # another dtype than the weights'
    assert stacked_forward([layers[0], layers[2], layers[1]], x) is None  # another order
    assert stacked_forward(layers[:2], x) is None
    group_buffer = weakref.ref(stacked(layers).w_q)
    with torch.no_grad():
        before = [lay(x) for lay in layers]
    layers[1]._apply(lambda t: t.clone())  # (what `.to()` onto another device does): its own buffers now
    assert stacked(layers) is None and stacked_forward(layers, x) is None
    assert stacked_forward(layers, x[:3]) is None
    # once every layer has moved, nothing holds the stacked buffers (CPU offload must not keep a copy behind)
    for lay in (layers[0], layers[2]):
        lay._apply(lambda t: t.clone())
    gc.collect()
    assert group_buffer() is None
    with torch.no_grad():  # each layer still runs its own FP8 product
        assert all(torch.equal(lay(x), b) for lay, b in zip(layers, before))


def test_stack_refuses_layers_it_cannot_serve_with_one_gemm(seed):
    assert not stack(_layers(seed)[:1])
    mixed = _layers(seed)[:2] + _layers(seed, widths=(8,), bias=False)
    assert not stack(mixed)
    assert not stack(_layers(seed)[:2] + _layers(seed, widths=(8,), k=32))
    assert not stack(_layers(seed, outliers="smooth"))
    blockwise = _layers(seed, act_granularity="per_block", weight_granularity="per_block")
    assert not stack(blockwise)
    assert not stack([*_layers(seed)[:2], torch.nn.Linear(64, 8)])


def test_bias_changed_in_place_is_seen(seed):
    layers = _layers(seed)
    x = torch.randn(8, 64).to(torch.bfloat16)
    assert stack(layers)
    with torch.no_grad():
        stacked_forward(layers, x)
        layers[2].linear.bias.add_(100.0)
        got = stacked_forward(layers, x)[2]
        want = layers[2](x)
    assert torch.allclose(got.float(), want.float(), rtol=2 ** -7, atol=0.5)
    assert got.float().mean() > 50


MODELS = ["wan2.1-t2v-1.3b", "flux.1-dev", "sd3.5-medium", "hunyuanvideo", "cogvideox-2b", "mochi-1"]


@interpreted  # (GPU: test_gpu_fp8.py)
@pytest.mark.parametrize("name", MODELS)
def test_fused_processors_run_qkv_as_one_gemm(name):
    """Patched tiny models of every family with a fused processor: Q/K/V stacked and taken as one GEMM (Flux's
    single blocks too, reusing the quantization proj_mlp made), with the output of the three separate GEMMs."""
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cpu", seed=1, height=32, width=32,
                                  text_tokens=archs.smoke_text_tokens(name))
    taken = []
    real = fused_common.stacked_forward

    def counting(layers, x):
        out = real(layers, x)
        taken.append(out is not None)
        return out

    with torch.no_grad():
        sagegen.patch(model, backend="reference", linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
        assert patch_info(model)["linear"]["qkv_stacked_modules"] > 0
        q_layers = [m.to_q for m in model.modules() if isinstance(getattr(m, "to_q", None), FP8Linear)]
        fused_common.stacked_forward = counting
        try:
            together = model(**inputs)[0]
        finally:
            fused_common.stacked_forward = real
        assert q_layers and all(q.fp8_calls == 1 for q in q_layers)  # a stacked call counts for each layer
        stacked_module.ENABLED = False
        try:
            apart = model(**inputs)[0]
        finally:
            stacked_module.ENABLED = True
        assert all(q.fp8_calls == 2 for q in q_layers)
        sagegen.unpatch(model)
    assert taken and all(taken), taken
    assert (together.float() - apart.float()).abs().max() <= 1e-2 * apart.float().abs().max()


def test_call_paths_read_no_module_attribute_through_getattr(seed, monkeypatch):
    """Eager FP8 image steps wait on the host (lab/NOTES.md v7.7): `FP8Linear.forward`, `cat_gelu`,
    `forward_fp8` and `stacked_forward` read buffers, the wrapped linear and its parameters from their dicts and
    count calls without writing a module attribute (nn.Module.__getattr__ / __setattr__: ~0.5-6 us each, ~180
    FP8 GEMMs a Flux step). An outlier-split layer reads the same way."""
    layers = _layers(seed, bias=True)
    split = FP8Linear(torch.nn.Linear(64, 16, dtype=torch.bfloat16), min_rows=4, outliers="split")
    x = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(seed + 1)).to(torch.bfloat16)
    x[..., 3] *= 200  # an outlier channel for the split layer
    with torch.no_grad():
        assert stack(layers)
        split(x)  # calibrates (sets buffers: not a call path)
        assert split.outlier_idx is not None and split.outlier_idx.numel() > 0
        x8, scale = torch.zeros(18, 64, dtype=torch.float8_e4m3fn), torch.ones(18, 1)
        seen = {"getattr": [], "setattr": []}
        getattr_, setattr_ = torch.nn.Module.__getattr__, torch.nn.Module.__setattr__
        monkeypatch.setattr(torch.nn.Module, "__getattr__",
                            lambda self, name: seen["getattr"].append(name) or getattr_(self, name))
        monkeypatch.setattr(torch.nn.Module, "__setattr__",
                            lambda self, name, value: seen["setattr"].append(name) or setattr_(self, name, value))
        outs = [lay(x) for lay in layers] + [split(x), layers[0].cat_gelu(x[..., :32], x[..., 32:])]
        together = stacked_forward(layers, x)
        assert layers[0].takes_fp8_input(18)
        outs.append(layers[0].forward_fp8(x8, scale, torch.bfloat16))
        monkeypatch.undo()
    assert together is not None and all(o is not None for o in outs)
    assert seen == {"getattr": [], "setattr": []}, seen
    assert [lay.fp8_calls for lay in layers] == [4, 2, 2] and split.fp8_calls == 2
