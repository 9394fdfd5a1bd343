"""The FP8 attention output on the GPU (kernels/fp8_out.py): the Hopper kernel and the portable Triton kernel
against the emulation's FP8 output (the same scale; codes apart by at most the two computations' difference
plus one e4m3 step), the dequantized output against fp64 exact attention (no worse than quantizing sagegen's
bf16 output per token), NaN propagation, and the patched output projections (FP8 output + FP8 GEMM) against
the bf16-output path."""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.conftest import gpu
from tests.support.helpers import rel_l1
from sagegen.api import sageattn_fp8_out
from sagegen.kernels.spec import FP8_MAX
from sagegen.linear import LinearPolicy, fp8_capable
from sagegen.linear.numerics import dequantize_activations, quantize_activations
from sagegen.models import arch as archs
from sagegen.patch import patch_info
from sagegen.patch import fp8_handoff as fp8_out

pytestmark = gpu

CFG = sagegen.DIFFUSION_CONFIG


def _need_fp8():
    ok, why = fp8_capable(torch.device("cuda"))
    if not ok:
        pytest.skip(why)


def _exact(q, k, v, mask=None, layout="HND"):
    hnd = (lambda t: t) if layout == "HND" else (lambda t: t.transpose(1, 2))
    qh, kh, vh = (hnd(t).double() for t in (q, k, v))
    if kh.shape[1] != qh.shape[1]:
        kh, vh = (t.repeat_interleave(qh.shape[1] // t.shape[1], dim=1) for t in (kh, vh))
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    return hnd(out)


CASES = [  # (B, Hq, Hkv, Nq, Nk, D, layout, key-padding, smooth_v)
    (2, 4, 4, 4608, 4608, 128, "NHD", None, True),
    (2, 6, 6, 1000, 777, 64, "HND", None, True),
    (1, 8, 2, 513, 1030, 128, "NHD", "prefix", True),
    (2, 4, 4, 700, 900, 96, "HND", "middle", False),
    (1, 3, 3, 333, 257, 32, "NHD", None, False),
]


@pytest.mark.parametrize("kernel", ["auto", "triton"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_fp8_output_matches_the_emulation_and_exact_attention(seed, monkeypatch, kernel, case):
    _need_fp8()
    monkeypatch.setenv("SAGEGEN_KERNEL", kernel)
    B, Hq, Hkv, Nq, Nk, D, layout, pad, smooth_v = case
    cfg = CFG.replace(smooth_v=smooth_v)
    shape = (lambda h, n: (B, h, n, D)) if layout == "HND" else (lambda h, n: (B, n, h, D))
    q = torch.randn(*shape(Hq, Nq), device="cuda", dtype=torch.bfloat16)
    k = torch.randn(*shape(Hkv, Nk), device="cuda", dtype=torch.bfloat16)
    # channels 100x apart, and heads 30x apart, under one call-wide scale
    spread = torch.logspace(-1, 1, D, device="cuda") * torch.logspace(0, 1.5, Hkv, device="cuda")[:, None]
    v = torch.randn(*shape(Hkv, Nk), device="cuda") * (spread[:, None, :] if layout == "HND" else spread)
    v = v.to(torch.bfloat16)
    mask = None
    if pad is not None:
        keep = torch.ones(B, Nk, dtype=torch.bool, device="cuda")
        if pad == "prefix":
            keep[:, Nk - 200:] = False
        else:
            keep[:, Nk // 3:Nk // 2] = False
        mask = keep[:, None, None, :]
    got, row_scale = sageattn_fp8_out(q, k, v, tensor_layout=layout, attn_mask=mask, config=cfg)
    want, want_rows = sageattn_fp8_out(q, k, v, tensor_layout=layout, attn_mask=mask, config=cfg,
                                        backend="reference")
    assert got.dtype == torch.float8_e4m3fn and got.shape == q.shape and got.stride() == q.stride()
    # the same bound, from statistics summed in another order (V's sampled mean)
    scale = row_scale[0]
    assert row_scale.shape == (got.shape[0] * got.shape[2 if layout == "HND" else 1], 1)
    assert torch.equal(row_scale, scale.expand_as(row_scale))  # one value for every row
    assert torch.allclose(scale, want_rows[0], rtol=1e-5, atol=0)
    g, w = got.float(), want.float()
    # The kernel and the emulation compute the output in other orders (their bf16 outputs t and r differ by
    # ~1e-4 relative, more near zero); rounding to e4m3 keeps that difference and adds at most one e4m3 step.
    t = sagegen.sageattn(q, k, v, tensor_layout=layout, attn_mask=mask, config=cfg, backend="triton").float()
    r = sagegen.sageattn(q, k, v, tensor_layout=layout, attn_mask=mask, config=cfg, backend="reference").float()
    apart = ((t - r).abs() + 2.0 ** -8 * (t.abs() + r.abs())) / scale  # the fp32 outputs, at most, in e4m3 units
    step = torch.maximum(torch.maximum(g.abs(), w.abs()) * 2.0 ** -3, torch.full_like(w, 2.0 ** -9))
    assert ((g - w).abs() <= apart + step * 1.001).all()
    # The conversion itself: the kernel's codes against its own bf16 output converted by torch with the same
    # scale differ only where that output's bf16 rounding crossed an e4m3 rounding boundary (~2^-9 / 2^-4 of
    # the values); a conversion that truncated instead of rounding would move about half.
    own = (t.to(torch.bfloat16).float() / scale).to(torch.float8_e4m3fn).float()
    flips = (g != own).float().mean().item()
    print(f"codes apart from the kernel's own bf16 output converted: {flips:.2e}; "
          f"from the emulation's: {(g != w).float().mean().item():.2e}")
    assert flips < 0.1
    # Against fp64: e4m3 rounds each normal value by at most 2^-4 of it, whatever the scale; and about as well
    # as sagegen's bf16 output quantized per token (what the FP8 projection took). Per-token scaling puts each
    # row's largest value at 448, high in its binade; a call-wide scale lands values anywhere in theirs, so on
    # nearly constant outputs it can be worse by up to ~1.5x, on spread-out ones (these) it is not.
    exact = _exact(q, k, v, mask, layout)
    bf16 = t.to(torch.bfloat16)
    nhd = (lambda x: x) if layout == "NHD" else (lambda x: x.transpose(1, 2))  # token rows of all heads
    rows = nhd(bf16).reshape(-1, Hq * D)
    per_token = dequantize_activations(*quantize_activations(rows, "per_token")).reshape(nhd(bf16).shape)
    err_fp8, err_token = rel_l1(nhd(g * scale), nhd(exact)), rel_l1(per_token, nhd(exact))
    print(f"rel. L1 vs fp64: FP8 output {err_fp8:.4f}, bf16 output per-token FP8 {err_token:.4f}, "
          f"bf16 output {rel_l1(bf16, exact):.4f}")
    assert err_fp8 <= rel_l1(bf16, exact) + 2.0 ** -4
    assert err_fp8 <= err_token * 1.25 + 1e-4
    assert g.abs().max() <= FP8_MAX


def test_nan_in_v_gives_nan_as_the_bf16_output_does():
    _need_fp8()
    q, k, v = (torch.randn(1, 2, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    v[0, 1, 7, 3] = float("nan")
    out, row_scale = sageattn_fp8_out(q, k, v, config=CFG)
    # one scale for the call: V's NaN makes it NaN, so the whole output is (the bf16 one: that head's)
    assert row_scale.isnan().all() and (out.float() * row_scale[0])[0, 1].isnan().all()


@pytest.mark.parametrize("name", ["flux.1-dev", "sd3.5-medium", "wan2.1-t2v-1.3b", "cogvideox-2b", "mochi-1",
                                  "ltx-video", "qwen-image", "hunyuanvideo-1.5"])
def test_patched_output_projections_take_the_fp8_output(name):
    _need_fp8()
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cuda", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    inputs = archs.example_inputs(name, batch=2, dtype=torch.bfloat16, device="cuda", seed=1, height=128,
                                  width=128, text_tokens=archs.smoke_text_tokens(name))
    with torch.no_grad():
        stock = model(**inputs)[0]
        # backend "triton": both runs take the kernel (auto would give the bf16 run's tiny calls to SDPA)
        sagegen.patch(model, backend="triton", linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
        fused = model(**inputs)[0]
        routed = patch_info(model)["stats"].get("routed_fp8_out", 0)
        with fp8_out.disabled():
            plain = model(**inputs)[0]
        sagegen.unpatch(model)
    assert routed > 0
    err_fused, err_plain = rel_l1(fused, stock), rel_l1(plain, stock)
    print(f"{name}: vs stock, FP8 attention output {err_fused:.4f}, bf16 output {err_plain:.4f}")
    assert err_fused <= err_plain * 1.15 + 1e-3
