"""The FP8 attention output (kernels/fp8_out.py, `sagegen.api.sageattn_fp8_out`) on the CPU: the emulation's
e4m3 output against its own bf16 output (within one e4m3 rounding), the bound that sets the scale (never
saturates, even where one key takes all the weight), the scale launch against its emulation bit for bit, the
portable Triton kernel against the emulation (interpreter), `FP8Linear.forward_fp8`, and tiny patched models
whose output projections take the FP8 output (GPU: tests/patch/test_gpu_fp8_out.py)."""

from __future__ import annotations

import pytest
import torch
from tests.support.helpers import rel_l1

import sagegen
from tests.conftest import interpreted
from sagegen.api import sageattn_fp8_out
from sagegen.kernels import fp8_out as fp8_out_kernel
from sagegen.kernels.reference import fp8_out_scale
from sagegen.kernels.spec import FP8_MAX, FP8_OUT_MARGIN
from sagegen.linear import FP8Linear, LinearPolicy, numerics
from sagegen.models import arch as archs
from sagegen.patch import patch_info
from sagegen.patch import fp8_handoff as fp8_out

CFG = sagegen.DIFFUSION_CONFIG


def _inputs(B, Hq, Hkv, Nq, Nk, D, layout):
    shape = (lambda h, n: (B, h, n, D)) if layout == "HND" else (lambda h, n: (B, n, h, D))
    q = torch.randn(*shape(Hq, Nq), dtype=torch.bfloat16)
    k = torch.randn(*shape(Hkv, Nk), dtype=torch.bfloat16)
    spread = torch.logspace(-1, 1, D) * torch.logspace(0, 1, Hkv)[:, None]  # channels and heads apart
    v = (torch.randn(*shape(Hkv, Nk)) * (spread[:, None, :] if layout == "HND" else spread)).to(torch.bfloat16)
    return q, k, v


def _e4m3_close(g: torch.Tensor, w: torch.Tensor, apart: torch.Tensor) -> None:
    """Codes ``g`` within ``apart`` (the unrounded values' distance, in e4m3 units) plus one e4m3 step of ``w``."""
    step = torch.maximum(torch.maximum(g.abs(), w.abs()) * 2.0 ** -3, torch.full_like(w, 2.0 ** -9))
    bad = (g - w).abs() > apart + step * 1.001
    assert not bad.any(), (g[bad][:5], w[bad][:5])


@pytest.mark.parametrize("smooth_v", [True, False])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_emulated_fp8_output_is_the_bf16_output_rounded_to_e4m3(seed, layout, smooth_v):
    cfg = CFG.replace(smooth_v=smooth_v)
    q, k, v = _inputs(2, 4, 2, 77, 150, 64, layout)
    out, row_scale = sageattn_fp8_out(q, k, v, tensor_layout=layout, config=cfg)  # CPU: the emulation
    want = sagegen.sageattn(q, k, v, tensor_layout=layout, config=cfg)
    assert out.dtype == torch.float8_e4m3fn and out.shape == q.shape and out.stride() == q.stride()
    n = q.shape[2] if layout == "HND" else q.shape[1]
    assert row_scale.shape == (2 * n, 1) and torch.equal(row_scale, row_scale[:1].expand_as(row_scale))
    s = row_scale[0]
    # the scale: V's range (its FP8 scale x 448, plus |mean| with smoothing) over every head and channel
    vf = v.float() if layout == "HND" else v.float().transpose(1, 2)
    mean = vf[:, :, :: max(1, vf.shape[2] // 1024)].mean(2, keepdim=True) if smooth_v else 0.0
    bound = (vf - mean).abs().amax(2, keepdim=True) + (mean.abs() if smooth_v else 0.0)
    assert torch.allclose(s, bound.amax() * FP8_OUT_MARGIN / FP8_MAX, rtol=1e-5)
    g = out.float()
    # the emulation's own bf16 output, converted with that scale: apart by its bf16 rounding only
    _e4m3_close(g, want.float() / s, 2.0 ** -8 * want.float().abs() / s)
    assert g.abs().max() < FP8_MAX


def test_the_bound_holds_where_one_key_takes_all_the_weight():
    """Each query attends (almost) only to the key whose value holds V's largest magnitude, so the output
    reaches V's range itself: it must still fit (the margin covers e4m3 P), not saturate."""
    torch.manual_seed(0)
    B, H, N, D = 1, 2, 130, 64
    q = torch.zeros(B, H, N, D)
    q[..., 0] = 40.0
    k = torch.zeros(B, H, N, D)
    k[..., 7, 0] = 40.0                                  # key 7 wins every softmax by a wide margin
    v = torch.randn(B, H, N, D)
    v[..., 7, :] = torch.linspace(-30.0, 30.0, D)        # and holds the channels' extremes
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    for cfg in (CFG, CFG.replace(smooth_v=False)):
        out, row_scale = sageattn_fp8_out(q, k, v, config=cfg)
        g = out.float() * row_scale[0]
        assert torch.isfinite(g).all() and out.float().abs().max() < FP8_MAX
        assert out.float().abs().max() > FP8_MAX / 2  # (the case reaches the top of the range)
        assert rel_l1(g, v[..., 7:8, :].float().expand_as(g)) < 0.05


def test_scale_launch_matches_its_emulation_bit_for_bit(seed):
    """The Triton scale launch (every program takes the bound; padded channels, which hold scale 1, left
    out; NaN kept) against `reference.fp8_out_scale`."""
    B, H, d, d_pad, rows = 2, 3, 96, 128, 2 * 1500 + 7
    for smooth in (True, False):
        v_scale = torch.rand(B, H, d_pad) * torch.logspace(-3, 0, d_pad)
        v_scale[..., d:] = 1.0
        v_mean = torch.randn(B, H, d_pad) if smooth else None
        buf = torch.empty(rows + 1)
        inv = fp8_out_kernel.out_scale(v_scale, v_mean, d, buf)
        want, want_inv = fp8_out_scale(v_scale[..., :d], v_mean[..., :d] if smooth else None)
        assert torch.equal(buf[:-1], want.expand(rows)) and torch.equal(inv, want_inv)
    v_scale[1, 2, 5] = float("nan")
    fp8_out_kernel.out_scale(v_scale, None, d, buf)
    assert buf.isnan().all()


CASES = [  # (B, Hq, Hkv, Nq, Nk, D, layout, mask, smooth_v)
    (1, 2, 2, 70, 200, 64, "HND", None, True),
    (2, 4, 2, 65, 129, 96, "NHD", "prefix", True),
    (1, 2, 1, 128, 70, 64, "HND", "middle", False),
    (1, 2, 2, 130, 256, 64, "NHD", "blocks", True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_triton_kernel_fp8_output_matches_the_emulation(seed, case):
    """The portable Triton kernel (interpreter): odd sizes, a padded head dim, GQA, both layouts, key-padding
    masks, and a block-sparse mask with an empty q-block (zeros)."""
    B, Hq, Hkv, Nq, Nk, D, layout, kind, smooth_v = case
    cfg = CFG.replace(smooth_v=smooth_v)
    q, k, v = _inputs(B, Hq, Hkv, Nq, Nk, D, layout)
    kw = {}
    if kind in ("prefix", "middle"):
        keep = torch.ones(B, Nk, dtype=torch.bool)
        keep[:, Nk - 50:] = False if kind == "prefix" else True
        if kind == "middle":
            keep[:, Nk // 3:Nk // 2] = False
        kw["attn_mask"] = keep[:, None, None, :]
    elif kind == "blocks":
        counts = torch.tensor([[[2, 0, 1]]], dtype=torch.int32)
        indices = torch.tensor([[[[0, 1], [0, 0], [1, 0]]]], dtype=torch.int32)
        kw["block_mask"] = sagegen.BlockSparse(counts, indices, 64, 128)
    got, got_scale = sageattn_fp8_out(q, k, v, tensor_layout=layout, config=cfg, backend="triton", **kw)
    want, want_scale = sageattn_fp8_out(q, k, v, tensor_layout=layout, config=cfg, backend="reference", **kw)
    assert torch.allclose(got_scale, want_scale, rtol=1e-6, atol=0)
    t = sagegen.sageattn(q, k, v, tensor_layout=layout, config=cfg, backend="triton", **kw).float()
    r = sagegen.sageattn(q, k, v, tensor_layout=layout, config=cfg, backend="reference", **kw).float()
    s = want_scale[0]
    _e4m3_close(got.float(), want.float(), ((t - r).abs() + 2.0 ** -8 * (t.abs() + r.abs())) / s)
    if kind == "blocks":  # q-block 1 (rows 64-127) lists no key block: zeros, as in the bf16 output
        rows = got[:, :, 64:128] if layout == "HND" else got[:, 64:128]
        assert (rows.float() == 0).all()


def test_calls_that_would_not_run_sagegen_return_none():
    q, k, v = _inputs(1, 2, 2, 40, 40, 64, "HND")
    assert sageattn_fp8_out(q, k, v, config=CFG.replace(pv_precision="fp16")) is None  # no FP8 V range
    with pytest.raises(ValueError, match="tensor_layout"):
        sageattn_fp8_out(q, k, v, tensor_layout="BHSD")


def test_fp8_linear_takes_fp8_input_only_where_its_numerics_allow():
    lin = torch.nn.Linear(64, 32, dtype=torch.bfloat16)
    assert FP8Linear(lin, min_rows=10).takes_fp8_input(10)
    assert not FP8Linear(lin, min_rows=10).takes_fp8_input(9)                     # bf16 below min_rows
    assert not FP8Linear(lin, outliers="smooth", min_rows=1).takes_fp8_input(10)  # column scale, calibration
    assert not FP8Linear(lin, outliers="split", min_rows=1).takes_fp8_input(10)
    assert not FP8Linear(lin, act_granularity="per_block", min_rows=1).takes_fp8_input(10)
    gelu = FP8Linear(lin, min_rows=1)
    gelu.prologue = "gelu_tanh"
    assert not gelu.takes_fp8_input(10)


def test_forward_fp8_is_the_product_of_the_dequantized_input(seed):
    lin = torch.nn.Linear(64, 32, dtype=torch.bfloat16)
    layer = FP8Linear(lin, min_rows=1)
    x8 = (torch.randn(2, 9, 64) * 50).clamp(-448, 448).to(torch.float8_e4m3fn)
    row_scale = torch.full((30, 1), 0.0123)                    # more rows than used: the first 18 are read
    got = layer.forward_fp8(x8, row_scale, torch.bfloat16)
    w = numerics.dequantize_weight(layer.w_q, layer.w_scale)
    want = (x8.float() * 0.0123).reshape(-1, 64) @ w.t() + lin.bias.float()
    assert got.shape == (2, 9, 32) and got.dtype == torch.bfloat16
    assert torch.allclose(got.float().reshape(-1, 32), want, rtol=2 ** -7, atol=1e-3)
    assert layer.fp8_calls == 1


MODELS = ["sd3.5-medium", "flux.1-dev", "wan2.1-t2v-1.3b", "ltx-video", "hunyuanvideo-1.5", "mochi-1"]


@interpreted  # (GPU: tests/patch/test_gpu_fp8_out.py)
@pytest.mark.parametrize("name", MODELS)
def test_patched_output_projections_take_the_fp8_attention_output(name):
    """SD3 (image rows of a batch of 2: not one strided block), Flux (text first), Wan (self- and
    cross-attention), Mochi (text padding), and LTX-Video and HunyuanVideo-1.5 (the backend route): the FP8
    output is taken, and the step stays as close to stock as with the bf16 output and the projection's own
    quantization."""
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    inputs = archs.example_inputs(name, batch=2, dtype=torch.bfloat16, device="cpu", seed=1, height=64, width=64,
                                  text_tokens=archs.smoke_text_tokens(name))
    first = next(m for m in model.modules() if type(m).__name__ in ("Attention", "AttentionModuleMixin")
                 or hasattr(m, "to_out") and hasattr(m, "processor"))
    seen = []
    hook = first.register_forward_hook(lambda m, a, out: seen.append(out if isinstance(out, tuple) else (out,)))
    with torch.no_grad():
        stock = model(**inputs)[0]
        sagegen.patch(model, backend="reference", linear="fp8",
                      linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
        fused = model(**inputs)[0]
        routed = patch_info(model)["stats"].get("routed_fp8_out", 0)
        with fp8_out.disabled():
            plain = model(**inputs)[0]
        sagegen.unpatch(model)
        again = model(**inputs)[0]
    hook.remove()
    assert routed > 0
    assert torch.equal(again, stock)
    err_fused, err_plain = rel_l1(fused, stock), rel_l1(plain, stock)
    assert err_fused <= err_plain * 1.15 + 1e-3, (err_fused, err_plain)
    # The first attention module saw the same inputs in both runs: each of its outputs' token rows (image and
    # text stream) agrees up to FP8 rounding (~3% of a row), where a row from the wrong token would be ~100% off.
    for a, b in zip(seen[1], seen[2]):
        if isinstance(a, torch.Tensor):
            row_err = (a.float() - b.float()).norm(dim=-1) / b.float().norm(dim=-1).clamp_min(1e-6)
            assert row_err.max() < 0.25, row_err.max()


def test_layers_with_outlier_handling_keep_the_bf16_output():
    name = "sd3.5-medium"
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cpu", seed=1, height=64, width=64,
                                  text_tokens=archs.smoke_text_tokens(name))
    with torch.no_grad():
        sagegen.patch(model, backend="reference", linear="fp8",
                      linear_policy=LinearPolicy(keep_blocks=(), min_rows=1, outliers="smooth"))
        model(**inputs)
        assert patch_info(model)["stats"].get("routed_fp8_out", 0) == 0
        sagegen.unpatch(model)
