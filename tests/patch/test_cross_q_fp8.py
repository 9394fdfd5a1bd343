"""Cross-attention Q projections fed by the pass that produces their input, in FP8, on the CPU: Wan's norm
(`residual_norm(fp8_out=True)`, `fused_wan.cross_attention_fp8`) and LTX-Video's residual add (the sum's copy,
`fp8_out.offer`). The kernel's FP8 rows against the per-token quantizer of its own bf16 rows (bit for bit,
interpreter), against the emulation and against an fp64 norm; tiny patched Wan models (2.1, 2.2 TI2V,
SkyReels-V2) and LTX-Video whose fused blocks take the route give the very output of the bf16 rows plus the
projection's own quantization, and every case that could differ steps aside (GPU: tests/linear/test_gpu_fp8.py)."""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.conftest import interpreted
from tests.support.patching import cross_q_on_and_off
from sagegen.kernels.fp8_quant import quantize_fp8_rows
from sagegen.kernels.triton_residual_norm import residual_norm
from sagegen.linear import FP8Linear, LinearPolicy, numerics
from sagegen.models.tiny_video import build_tiny_wan_transformer
from sagegen.patch import patch_info, reset_stats
from sagegen.patch import fp8_handoff as fp8_out

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the kernel runs in the interpreter


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@interpreted
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,S,C,gated,affine,mod", [
    (2, 5, 100, True, True, None),        # Wan's norm2: gated residual, weight and bias
    (1, 7, 33, False, False, "token"),   # odd width, plain add, per-token modulation
    (3, 3, 256, True, False, "sample"),  # a power of two: no masked lanes
])
def test_fp8_rows_are_the_quantizer_of_the_bf16_rows(seed, dtype, B, S, C, gated, affine, mod):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, s=1.0: (torch.randn(*shape, generator=g) * s).to(DEVICE)
    x = (rnd(B, S, C, s=3.0) + 0.5).to(dtype)
    y = rnd(B, S, C).to(dtype)
    x[0, 0] = 0.0  # a row whose residual is y alone
    gate = rnd(B, 1, C, s=0.5) if gated else None
    weight, bias = (rnd(C, s=0.3) + 1, rnd(C, s=0.2)) if affine else (None, None)
    shape = {"sample": (B, 1, C), "token": (B, S, C), None: None}[mod]
    scale, shift = (rnd(*shape, s=0.2), rnd(*shape, s=0.2)) if shape else (None, None)
    kw = dict(weight=weight, bias=bias, eps=1e-6, scale=scale, shift=shift)
    h, n = residual_norm(x, y, gate, **kw)
    h8, (n8, ns) = residual_norm(x, y, gate, fp8_out=True, **kw)
    assert torch.equal(h8, h)
    assert n8.dtype == torch.float8_e4m3fn and n8.shape == x.shape and ns.shape == (B * S, 1)
    q, s = quantize_fp8_rows(n.reshape(-1, C))
    assert torch.equal(_bits(n8.reshape(-1, C)), _bits(q)) and torch.equal(ns, s)
    q_emu, s_emu = numerics.quantize_activations(n.reshape(-1, C))
    assert torch.equal(_bits(n8.reshape(-1, C)), _bits(q_emu)) and torch.equal(ns, s_emu)
    # without the norm: the residual sum, and its copy (LTX-Video's cross-attention Q)
    h9, (c8, cs) = residual_norm(x, y, gate, norm=False, fp8_out=True)
    q, s = quantize_fp8_rows(h.reshape(-1, C))
    assert torch.equal(h9, h) and torch.equal(_bits(c8.reshape(-1, C)), _bits(q)) and torch.equal(cs, s)
    # against an fp64 norm: within half an e4m3 step of each value (plus the bf16 rounding before it)
    d = h.double()
    n64 = (d - d.mean(-1, keepdim=True)) / torch.sqrt(d.var(-1, unbiased=False, keepdim=True) + 1e-6)
    if affine:
        n64 = n64 * weight.double() + bias.double()
    if scale is not None:
        n64 = n64 * (1 + scale.double()) + shift.double()
    got, n64 = n8.double().reshape(-1, C) * ns.double(), n64.reshape(-1, C)
    step = torch.maximum(n64.abs() * 2.0 ** -4, ns.double() * 2.0 ** -9) + n64.abs() * 2.0 ** -7
    assert ((got - n64).abs() <= step * 1.001).all()


def test_fp8_out_needs_the_norm_or_a_residual():
    x = torch.zeros(1, 2, 16, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="fp8_out=True .* needs norm=True or y"):
        residual_norm(x, None, norm=False, fp8_out=True)


def _model(kind="wan2.1"):
    """A tiny Wan denoiser (2 blocks, 128 channels) and inputs of 16 token rows: the interpreter runs a program
    per row."""
    ti2v = kind == "wan2.2-ti2v"
    model = build_tiny_wan_transformer(dtype=torch.bfloat16, seed=0, in_channels=48 if ti2v else 16).to(DEVICE)
    c = model.config
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(2, c.in_channels, 2, 4, 4, generator=gen)
    timestep = torch.full((2,), 500.0)
    if ti2v:  # one timestep per token (expand_timesteps), the first frame's at 0
        timestep = torch.full((2, 8), 500.0)
        timestep[:, :4] = 0.0
    inputs = dict(hidden_states=latents.to(DEVICE, torch.bfloat16), timestep=timestep.to(DEVICE),
                  encoder_hidden_states=torch.randn(2, 12, c.text_dim, generator=gen).to(DEVICE, torch.bfloat16),
                  return_dict=False)
    return model, inputs


def _blocks(model):
    return [m for m in model.modules() if getattr(type(m), "_sage_fused_block", False)]


@interpreted
@pytest.mark.parametrize("kind", ["wan2.1", "wan2.2-ti2v"])
def test_patched_wan_cross_q_takes_the_norms_fp8_rows(kind):
    """Each fused block's cross-attention Q runs on the norm's FP8 rows: the output is bit-identical to the
    bf16 norm with the projection's own quantization, with the same FP8 calls; unpatch restores stock."""
    model, inputs = _model(kind)
    with torch.no_grad():
        stock = model(**inputs)[0]
        sagegen.patch(model, backend="reference", linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
        blocks = _blocks(model)
        assert blocks and all(isinstance(b.attn2.to_q, FP8Linear) for b in blocks)
        taken = model(**inputs)[0]
        stats = dict(patch_info(model)["stats"])
        calls = [b.attn2.to_q.fp8_calls for b in blocks]
        reset_stats(model)
        saved, fp8_out.CROSS_Q_FP8 = fp8_out.CROSS_Q_FP8, False
        try:
            plain = model(**inputs)[0]
        finally:
            fp8_out.CROSS_Q_FP8 = saved
        stats_plain = dict(patch_info(model)["stats"])
        calls_plain = [b.attn2.to_q.fp8_calls for b in blocks]
        sagegen.unpatch(model)
        again = model(**inputs)[0]
    assert stats.get("cross_q_from_norm") == len(blocks) and "cross_q_from_norm" not in stats_plain
    assert stats["processor_calls"] == stats_plain["processor_calls"]
    assert stats["fused_qk_prologue"] == stats_plain["fused_qk_prologue"]
    assert calls == [1] * len(blocks) and calls_plain == calls
    assert torch.equal(taken, plain)
    assert torch.equal(again, stock)


@interpreted
def test_skyreels_blocks_take_it_too():
    from sagegen.models.tiny_classes import build_tiny_class

    model = build_tiny_class("skyreels_v2", dtype=torch.bfloat16, seed=0).to(DEVICE)
    inputs = _skyreels_inputs(model)
    with torch.no_grad():
        sagegen.patch(model, backend="reference", linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
        taken = model(**inputs)[0]
        stats = dict(patch_info(model)["stats"])
        fp8_out.CROSS_Q_FP8 = False
        try:
            plain = model(**inputs)[0]
        finally:
            fp8_out.CROSS_Q_FP8 = True
        sagegen.unpatch(model)
    assert stats.get("cross_q_from_norm") == len(_blocks_of(model))
    assert torch.equal(taken, plain)


def _blocks_of(model):
    return list(model.blocks)


def _skyreels_inputs(model):
    c = model.config
    gen = torch.Generator().manual_seed(3)
    latents = torch.randn(2, c.in_channels, 2, 4, 4, generator=gen)
    return dict(hidden_states=latents.to(DEVICE, torch.bfloat16), timestep=torch.full((2,), 500.0, device=DEVICE),
                encoder_hidden_states=torch.randn(2, 12, c.text_dim, generator=gen).to(DEVICE, torch.bfloat16),
                return_dict=False)


def _taken(model, inputs) -> int:
    reset_stats(model)
    with torch.no_grad():
        model(**inputs)
    return patch_info(model)["stats"].get("cross_q_from_norm", 0)


@interpreted
def test_cases_that_could_differ_step_aside():
    """Hooks on the cross-attention or its Q projection (its own or a global one), a layer kept in full precision,
    outlier handling, a Q projection kept bf16, no FP8 linears: the block calls the module as before (and the
    hooks run)."""
    model, inputs = _model()
    sagegen.patch(model, backend="reference", linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
    blocks = _blocks(model)
    assert _taken(model, inputs) == len(blocks)
    seen = []
    for module in (blocks[0].attn2, blocks[0].attn2.to_q):
        handle = module.register_forward_pre_hook(lambda m, a: seen.append(type(m).__name__))
        assert _taken(model, inputs) == len(blocks) - 1
        handle.remove()
    assert len(seen) == 2  # each hook ran: block 0 called its module as before
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None)
    try:
        assert _taken(model, inputs) == 0
    finally:
        handle.remove()
    sagegen.unpatch(model)

    sagegen.patch(model, backend="reference", linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1),
                  policy=sagegen.PrecisionPolicy(blocks=(0,)))
    assert _taken(model, inputs) == len(blocks) - 1
    sagegen.unpatch(model)

    sagegen.patch(model, backend="reference", linear="fp8",
                  linear_policy=LinearPolicy(keep_blocks=(), min_rows=1, outliers="smooth"))
    assert _taken(model, inputs) == 0
    sagegen.unpatch(model)

    sagegen.patch(model, backend="reference", linear="fp8",
                  linear_policy=LinearPolicy(keep_blocks=(0,), min_rows=1))
    assert _taken(model, inputs) == len(blocks) - 1  # block 0's linears stay bf16
    sagegen.unpatch(model)

    sagegen.patch(model, backend="reference")  # no FP8 linears: nothing to feed
    assert _taken(model, inputs) == 0
    sagegen.unpatch(model)


@interpreted
def test_ltx_cross_q_takes_the_residual_adds_fp8_copy(monkeypatch):
    """LTX-Video: the residual add before cross-attention also writes the sum's FP8 copy, and the Q projection
    takes it instead of quantizing (one quantization fewer a block); the output is bit-identical."""
    from sagegen.models.tiny_classes import build_tiny_class, tiny_class_inputs

    model = build_tiny_class("ltx", dtype=torch.bfloat16, seed=0).to(DEVICE)
    inputs = {k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in tiny_class_inputs("ltx", model).items()}
    r = cross_q_on_and_off(model, inputs, monkeypatch)
    assert r["blocks"] == len(model.transformer_blocks)
    assert r["quantized_taken"] == r["quantized_plain"] - r["blocks"]
    assert torch.equal(r["taken"], r["plain"]) and torch.equal(r["again"], r["stock"])
