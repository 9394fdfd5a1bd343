"""Flux's fused blocks (`patch.fused_blocks_flux`) against diffusers' own forwards: the route, the output within
bf16 rounding of intermediates (no further from an fp64 run than diffusers' bf16 ops), unpatch bit for bit, the
passes counted, and one FP8 quantization of the single block's normed input for proj_mlp and Q/K/V."""

from __future__ import annotations

import copy

import torch

import sagegen
from tests.support.fused import DEVICE, assert_fused_like_stock, stock_unfused_fused
from tests.support.patching import rel_l1
from sagegen.linear import LinearPolicy
from sagegen.models import arch as archs
from sagegen.patch import patch_info
from sagegen.patch.fusion import blocks as fused_blocks
from sagegen.patch.families import flux as fused_blocks_flux


def _tiny(seed=0, double=2, single=2):
    overrides = dict(archs.smoke_overrides("flux.1-dev"), num_layers=double, num_single_layers=single)
    model = archs.build_transformer("flux.1-dev", dtype=torch.bfloat16, device=DEVICE, seed=seed,
                                    config_overrides=overrides)
    inputs = archs.example_inputs("flux.1-dev", batch=1, dtype=torch.bfloat16, device=DEVICE, seed=seed + 1,
                                  height=64, width=64, text_tokens=archs.smoke_text_tokens("flux.1-dev"))
    return model, inputs


def _as_double(inputs):
    return {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}


def test_fused_flux_blocks_match_the_stock_blocks(seed, monkeypatch):
    """Exact attention on both sides (an override): the only difference is the fused element-wise work."""
    model, inputs = _tiny(seed=seed % 100)
    oracle = copy.deepcopy(model).double()
    double_cls, single_cls = type(model.transformer_blocks[0]), type(model.single_transformer_blocks[0])
    assert all(map(fused_blocks_flux.double_fusable, model.transformer_blocks))
    assert all(map(fused_blocks_flux.single_fusable, model.single_transformer_blocks))
    with torch.no_grad():
        want = oracle(**_as_double(inputs))[0]
    r = stock_unfused_fused(model, inputs, monkeypatch)
    assert type(model.transformer_blocks[0]) is double_cls and type(model.single_transformer_blocks[0]) is single_cls
    # three passes per stream in a double block, two in a single one
    assert_fused_like_stock(r, want, blocks=4, passes=2 * 6 + 2 * 2, apart=1e-2)


def test_one_block_of_each_kind_against_the_stock_forward_and_fp64(seed):
    model, _ = _tiny(seed=seed % 100, double=1, single=1)
    dim = model.transformer_blocks[0].norm2.normalized_shape[0]
    torch.manual_seed(seed)
    x = (torch.randn(1, 16, dim, device=DEVICE) * 2).to(torch.bfloat16)
    c = torch.randn(1, 8, dim, device=DEVICE).to(torch.bfloat16)
    temb = torch.randn(1, dim, device=DEVICE).to(torch.bfloat16)
    for block in (model.transformer_blocks[0], model.single_transformer_blocks[0]):
        cls = type(block)
        with torch.no_grad():
            stock = block(x, c, temb)
            ref = block.double()(x.double(), c.double(), temb.double())
            block.to(torch.bfloat16)
            fused_blocks.install(model)
            assert type(block) is not cls
            fused = block(x, c, temb)
            fused_blocks.remove(model)
        assert type(block) is cls
        for got, base, want in zip(fused, stock, ref):
            assert got.shape == base.shape and got.dtype == base.dtype
            err_fused, err_stock = rel_l1(got.double(), want), rel_l1(base.double(), want)
            assert err_fused <= 1.1 * err_stock + 1e-4, (cls.__name__, err_fused, err_stock)
            assert rel_l1(got, base) < 1e-2


def test_affine_or_other_norms_run_the_stock_forward(seed):
    model, _ = _tiny(seed=seed % 100, double=1, single=1)
    double, single = model.transformer_blocks[0], model.single_transformer_blocks[0]
    dim = double.norm2.normalized_shape[0]
    double.norm2 = torch.nn.LayerNorm(dim, eps=1e-6).to(DEVICE, torch.bfloat16)   # affine: not what the pass does
    single.norm.norm = torch.nn.RMSNorm(dim).to(DEVICE, torch.bfloat16)
    assert not fused_blocks_flux.double_fusable(double) and not fused_blocks_flux.single_fusable(single)
    assert fused_blocks.install(model) == 0


def test_single_block_quantizes_its_normed_input_once_for_four_projections(seed, monkeypatch):
    """With FP8 linears (the emulation on CPU), proj_mlp, to_q, to_k and to_v of a fused single block read one
    FP8 copy of the normed input."""
    from sagegen.linear import module as fp8_module
    from sagegen.linear import stacked

    model, inputs = _tiny(seed=seed % 100, double=1, single=3)
    calls = []
    real = fp8_module.quantize_eager
    for where in (fp8_module, stacked):  # (the double block's image Q/K/V run stacked: one GEMM)
        monkeypatch.setattr(where, "quantize_eager",
                            lambda x, *a, **k: calls.append(tuple(x.shape)) or real(x, *a, **k))
    with torch.no_grad():
        sagegen.patch(model, backend="reference", linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
        model(**inputs)
        info = patch_info(model)["linear"]
        fp8_outputs = patch_info(model)["stats"].get("routed_fp8_out", 0)
        sagegen.unpatch(model)
    layers = info["layers"]
    single = [n for n in layers if n.startswith("single_transformer_blocks.")]
    assert {n.split(".", 2)[2] for n in single} == {"norm.linear", "proj_mlp", "attn.to_q", "attn.to_k", "attn.to_v",
                                                   "proj_out"}
    assert sum(layers[n]["calls"] for n in single) == 3 * 6
    # shared quantizations: Q/K/V and the text stream's add_q/k/v in the double block (2 + 2 saved), and
    # proj_mlp + Q/K/V in each single block (3 saved each); the double block's to_out takes the attention's
    # FP8 output (none)
    assert fp8_outputs == 1
    assert len(calls) == info["fp8_calls"] - 4 - 3 * 3 - fp8_outputs
