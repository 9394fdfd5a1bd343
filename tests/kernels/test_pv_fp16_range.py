"""fp16 P·V (``pv_precision="fp16"``, what Ampere runs) with V beyond fp16's range, and non-finite inputs.

bf16 V can hold ~3e38, fp16 only 65504: V (after smoothing) is cast to fp16 for P·V, so |V| ~ 1e5 came out
as inf/NaN from both the emulation and the Triton kernel. Each channel of V now gets a power-of-two scale
where it would overflow (spec.FP16_V_EXP): exact, the same in both implementations, 1 (the old bits) below
2^15. On CPU the Triton kernel runs in the interpreter; on a GPU machine these run on the GPU.
"""

import math

import pytest
import torch
from tests.support.helpers import qkv, rel_l1, to_hnd

import sagegen
from sagegen import SageConfig
from sagegen.kernels.reference import attention_fp64, fp16_v_scale
from sagegen.kernels.spec import FP16_V_EXP

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP16 = SageConfig(pv_precision="fp16")


def _large_v(v: torch.Tensor, magnitude: str) -> torch.Tensor:
    """"1e5": N(0, 1e5^2), beyond fp16 everywhere. "6e4": within ±6e4 (inside fp16's range as it is) but mostly
    near -4e4, so V minus its mean (smooth_v) reaches ~1e5: the overflow is in the smoothed V."""
    x = v.float()
    if magnitude == "1e5":
        return (x * 1e5).to(v.dtype)
    return ((x * 0.3 - 0.7).clamp(-1.0, 1.0) * 6e4).to(v.dtype)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("magnitude", ["1e5", "6e4"])
@pytest.mark.parametrize("smooth_v", [False, True])
def test_fp16_pv_with_v_beyond_fp16_range(seed, layout, magnitude, smooth_v):
    """GQA, a key-padding mask with garbage in the padding, odd sizes: finite, as accurate against fp64 as at
    unit scale, and the kernel tracks the emulation as closely as it does there (test_triton_interpret)."""
    q, k, v = qkv(2, 4, 2, 37, 150, 64, dtype=torch.bfloat16, layout=layout, device=DEVICE)
    v = _large_v(v, magnitude)
    n_dim = 2 if layout == "HND" else 1
    keep = torch.ones(2, 1, 1, 150, dtype=torch.bool, device=DEVICE)
    keep[1, ..., 110:] = False
    v.narrow(n_dim, 110, 40)[1] = 3e5  # masked padding: out of the scale as out of everything else
    cfg = FP16.replace(smooth_v=smooth_v)
    t = sagegen.sageattn(q, k, v, tensor_layout=layout, attn_mask=keep, config=cfg, backend="triton")
    r = sagegen.sageattn(q, k, v, tensor_layout=layout, attn_mask=keep, config=cfg, backend="reference")
    qh, kh, vh = (to_hnd(x, layout) for x in (q, k, v))
    ref, _ = attention_fp64(qh, kh, vh, sm_scale=0.125, mask=sagegen.api.normalize_mask(keep, 2, 150))
    assert torch.isfinite(t).all() and torch.isfinite(r).all()
    scale = vh.float().abs().amax().item()
    err_t, err_r = rel_l1(to_hnd(t, layout), ref), rel_l1(to_hnd(r, layout), ref)
    assert err_r < 0.025 and err_t < 0.025, (err_t, err_r)  # unit-scale V: ~0.011 at this size
    assert rel_l1(t, r) < 4e-3
    assert (t.float() - r.float()).abs().max() < 0.05 * scale / 4  # test_triton_interpret's 0.05 at |V| ~ 4


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("smooth_v", [False, True])
def test_fp16_pv_scale_is_exact(seed, backend, smooth_v):
    """V with max |V| ~ 24,000 (below 2^15: scale 1, the unscaled path) and the same V times 16 (~3.8e5,
    scale 16): the second output is exactly 16 times the first, bit for bit, as is the lse; the scale is a
    power of two applied before the fp16 cast and undone after P·V."""
    q, k, v = qkv(1, 4, 2, 45, 90, 64, dtype=torch.bfloat16, device=DEVICE)
    v = (v.float() / v.float().abs().amax() * 24000).bfloat16()
    cfg = FP16.replace(smooth_v=smooth_v)
    out, lse = sagegen.sageattn(q, k, v, config=cfg, backend=backend, return_lse=True)
    out16, lse16 = sagegen.sageattn(q, k, v * 16, config=cfg, backend=backend, return_lse=True)
    assert torch.isfinite(out16).all()
    assert torch.equal(out16, out * 16) and torch.equal(lse16, lse)


@pytest.mark.parametrize("n,masked", [(90, False), (300, True)])
def test_fp16_v_scales_match_the_emulation(seed, n, masked):
    """The statistics launch's fp16 scales (fp8=False) equal the emulation's, bit for bit, channel by channel:
    the smallest power of two taking max |V - mean| below 2^15; 1 for channels below it, for a NaN or inf
    channel (which then reaches the output as on the FP8 path), for padding channels (48 -> 64) and for masked
    keys' garbage."""
    from sagegen.kernels.reference import _live_keys, _sampled_mean
    from sagegen.kernels.spec import MaskSpec
    from sagegen.kernels.triton_quant import _kv_stats

    k, v = (torch.randn(2, 3, n, 48, device=DEVICE) for _ in range(2))
    v = v * torch.logspace(-3, 6, 48, device=DEVICE)  # from 1e-3 to 1e6: scales from 1 to 2^7
    v[0, 0, 5, 3] = 2.0**15  # exactly the bound: 2
    v[0, 1, :, 3] = 2.0**15 - 8  # just below (bf16's step there is 128; fp32 here): 1
    v[1, 2, 7, 9], v[1, 1, 8, 10] = float("inf"), float("nan")
    bias = None
    if masked:
        live = torch.ones(2, n, dtype=torch.bool, device=DEVICE)
        live[1, n // 2:] = False
        v[1, :, n // 2:] = 1e30
        bias = torch.zeros(2, n, device=DEVICE).masked_fill(~live, float("-inf"))
    for smooth_v in (False, True):
        _, _, scale, inv = _kv_stats(k, v, 64, False, smooth_v, True, bias, fp8=False)
        mask = MaskSpec("key", bias) if masked else MaskSpec()
        live_f = _live_keys(mask, n)
        vs = v - _sampled_mean(v, live_f) if smooth_v else v
        if live_f is not None:
            vs = torch.where(live_f > 0, vs, 0.0)
        want, want_inv = fp16_v_scale(vs.abs().amax(dim=2))
        assert torch.equal(scale[:, :48], want.reshape(6, 48)) and torch.equal(inv[:, :48], want_inv.reshape(6, 48))
        assert torch.equal(scale[:, 48:], torch.ones(6, 16, device=DEVICE))
        assert torch.equal(scale * inv, torch.ones_like(scale))
        if not smooth_v:
            assert scale[0, 3] == 2.0 and scale[1, 3] == 1.0
        assert scale[5, 9] == 1.0 and scale[4, 10] == 1.0  # inf, NaN
        assert scale[:, 0].eq(1.0).all() and (scale[:, 47] >= 2.0**6).all()  # |V| ~ 1e-3 and ~1e6 (> 2^21)
    # the bound itself: max |V| < 2^15 after scaling, and the smallest such power of two
    amax = torch.tensor([0.0, 1.0, 2.0**15 - 1, 2.0**15, 65504.0, 1e5, 3e38, math.inf, math.nan])
    s, i = fp16_v_scale(amax)
    assert s.tolist()[:7] == [1.0, 1.0, 1.0, 2.0, 2.0, 4.0, 2.0**113] and s[7] == 1 and s[8] == 1
    fin = amax.isfinite()
    assert (amax[fin] * i[fin] < 2.0**FP16_V_EXP).all()
    assert ((s[fin] == 1) | (amax[fin] * i[fin] * 2 >= 2.0**FP16_V_EXP)).all()  # no smaller power of two does


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("where", ["k", "v"])
def test_non_finite_inputs_on_the_fp16_path(seed, backend, where):
    """What an inf does on the fp16 path with |V| ~ 1e5 (README, "Non-finite inputs"): in V, its channel of the
    heads reading it; in K, every row of the heads reading that K head (the K smoothing mean and the K block's
    INT8 scale take it in), where SDPA keeps the rows whose score with it is -inf finite."""
    q, k, v = qkv(1, 4, 2, 40, 90, 64, dtype=torch.bfloat16, device=DEVICE)
    v = (v.float() * 1e5).bfloat16()
    {"k": k, "v": v}[where][0, 1, 33, 17] = float("inf")
    out = sagegen.sageattn(q, k, v, config=FP16, backend=backend)
    want = torch.zeros_like(out, dtype=torch.bool)
    if where == "k":
        want[0, 2:] = True  # q heads 2 and 3 read K head 1
    else:
        want[0, 2:, :, 17] = True
    assert torch.equal(~out.isfinite(), want)


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("pv_precision", ["fp8", "fp16"])
def test_non_finite_values_in_masked_keys_change_nothing(seed, backend, pv_precision):
    """inf and NaN in keys a key-padding mask drops (padding) take no part: the output is bit-identical to
    the one with zeros there. (The emulation multiplied by the mask: inf * 0 = NaN spread through K's mean to
    every row.)"""
    q, k, v = qkv(2, 2, 2, 30, 100, 64, dtype=torch.bfloat16, device=DEVICE)
    keep = torch.ones(2, 1, 1, 100, dtype=torch.bool, device=DEVICE)
    keep[0, ..., 70:] = False
    cfg = SageConfig(pv_precision=pv_precision, smooth_v=True)
    clean = sagegen.sageattn(q, k, v, attn_mask=keep, config=cfg, backend=backend)
    k[0, :, 70:80], k[0, :, 80:], v[0, :, 75:90] = float("inf"), float("nan"), float("-inf")
    assert torch.equal(sagegen.sageattn(q, k, v, attn_mask=keep, config=cfg, backend=backend), clean)
