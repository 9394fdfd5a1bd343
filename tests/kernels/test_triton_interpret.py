"""The Triton kernels (on CPU under TRITON_INTERPRET=1, on the GPU when there is one) against the emulation.

Small odd sizes so every partial tile, padding and mask path runs. The emulation is the oracle: the two
differ only in fp32 summation order, exp2 rounding and the output cast, so they must agree far more
closely than either agrees with float64.
"""

import math

import pytest
import torch

import sagegen
from tests.support.helpers import qkv, rel_l1, to_hnd
from sagegen import SageConfig

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def both(q, k, v, **kw):
    t = sagegen.sageattn(q, k, v, backend="triton", **kw)
    r = sagegen.sageattn(q, k, v, backend="reference", **kw)
    return t, r


def assert_close(t, r, lse_t=None, lse_r=None):
    assert t.shape == r.shape and t.dtype == r.dtype
    assert torch.isfinite(t).all()
    assert rel_l1(t, r) < 4e-3
    assert (t.float() - r.float()).abs().max() < 0.05
    if lse_t is not None:
        assert torch.equal(torch.isinf(lse_t), torch.isinf(lse_r))
        fin = torch.isfinite(lse_r)
        assert (lse_t[fin] - lse_r[fin]).abs().max() < 5e-3  # fp32 rounding of the scaled scores


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("contiguous", [True, False])
def test_layouts_gqa_cross_attention(seed, layout, contiguous):
    q, k, v = qkv(2, 4, 2, 77, 150, 64, layout=layout, device=DEVICE, contiguous=contiguous)
    (t, lt), (r, lr) = both(q, k, v, tensor_layout=layout, return_lse=True)
    assert t.shape == q.shape
    assert_close(t, r, lt, lr)


@pytest.mark.parametrize("d", [32, 64, 96, 128])
def test_head_dims(seed, d):
    q, k, v = qkv(1, 2, 2, 65, 65, d, dtype=torch.bfloat16, device=DEVICE)
    t, r = both(q, k, v)
    assert_close(t, r)


@pytest.mark.parametrize("cfg", [
    SageConfig(smooth_q=True, smooth_v=True),
    SageConfig(q_granularity="per_block", k_granularity="per_token", smooth_k=False),
    SageConfig(pv_precision="fp16"),
    SageConfig(block_q=64, block_k=32),
    SageConfig(qk_rotation="hadamard"),
    SageConfig(qk_rotation="hadamard", smooth_q=True, smooth_v=True, q_granularity="per_block"),
], ids=["smooth_qv", "granularity", "fp16_pv", "blocks", "hadamard", "hadamard_smooth_q"])
def test_configs(seed, cfg):
    q, k, v = qkv(1, 2, 1, 100, 90, 64, device=DEVICE)
    v = v + 3.0  # a V bias, so smooth_v has work to do
    (t, lt), (r, lr) = both(q, k, v, config=cfg, return_lse=True)
    assert_close(t, r, lt, lr)


def test_causal_square_and_cross(seed):
    for nq, nk in [(97, 97), (50, 130), (130, 50)]:
        q, k, v = qkv(1, 2, 2, nq, nk, 64, device=DEVICE)
        (t, lt), (r, lr) = both(q, k, v, is_causal=True, return_lse=True)
        assert_close(t, r, lt, lr)


def test_key_padding_mask_bool_and_additive(seed):
    q, k, v = qkv(2, 2, 2, 70, 140, 64, device=DEVICE)
    keep = torch.rand(2, 1, 1, 140, device=DEVICE) > 0.4
    keep[1, ..., 100:] = False  # a padded tail, as HunyuanVideo's text tokens
    additive = torch.zeros(keep.shape, device=DEVICE).masked_fill(~keep, -math.inf).half()
    for mask in (keep, additive, additive + torch.randn(keep.shape, device=DEVICE).half()):
        (t, lt), (r, lr) = both(q, k, v, attn_mask=mask, return_lse=True)
        assert_close(t, r, lt, lr)


def test_general_masks_with_broadcast(seed):
    q, k, v = qkv(2, 2, 1, 70, 90, 64, device=DEVICE)
    bool_mask = torch.rand(1, 2, 70, 90, device=DEVICE) > 0.5
    bool_mask[0, 0, 3] = False  # one fully masked row
    additive = torch.randn(2, 1, 70, 90, device=DEVICE)
    for mask, causal in [(bool_mask, False), (additive, True), (additive[0, 0], False)]:
        (t, lt), (r, lr) = both(q, k, v, attn_mask=mask, is_causal=causal, return_lse=True)
        assert_close(t, r, lt, lr)
    t = sagegen.sageattn(q, k, v, attn_mask=bool_mask, backend="triton")
    assert torch.all(t[0, 0, 3] == 0)


def test_every_output_element_written(seed):
    """Poison the output buffer: the kernel must overwrite all of it (odd sizes, NHD strides)."""
    from sagegen.kernels import launch

    q, k, v = qkv(1, 3, 3, 45, 45, 96, layout="NHD", device=DEVICE)
    out = torch.full_like(q, float("nan"))
    launch.sage_attention(to_hnd(q, "NHD"), to_hnd(k, "NHD"), to_hnd(v, "NHD"), to_hnd(out, "NHD"),
                               sm_scale=96**-0.5)
    assert torch.isfinite(out).all()
    r = sagegen.sageattn(q, k, v, tensor_layout="NHD", backend="reference")
    assert_close(out, r)


def test_kernel_accuracy_against_fp64(seed):
    from sagegen.kernels.reference import attention_fp64

    q, k, v = qkv(1, 2, 2, 256, 256, 64, device=DEVICE)
    t = sagegen.sageattn(q, k, v, backend="triton")
    ref, _ = attention_fp64(q, k, v, sm_scale=0.125)
    assert rel_l1(t, ref) < 0.045


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_padded_keys_do_not_touch_the_statistics(seed, backend):
    """Whatever sits in key-padding positions (HunyuanVideo's padded text tokens) must not change the result:
    masked keys are left out of the smoothing means and the INT8/FP8 scales, so the output is identical."""
    q, k, v = qkv(2, 2, 2, 80, 150, 64, device=DEVICE)
    keep = torch.ones(2, 1, 1, 150, dtype=torch.bool, device=DEVICE)
    keep[0, ..., 120:] = False
    keep[1, ..., 60:] = False
    pad = ~keep[:, 0, 0, :, None].expand(-1, -1, 64)[:, None].expand(-1, 2, -1, -1)
    k_junk = torch.where(pad, torch.full_like(k, 300.0), k)
    v_junk = torch.where(pad, torch.full_like(v, -500.0), v)
    cfg = SageConfig(smooth_v=True)
    clean = sagegen.sageattn(q, k, v, attn_mask=keep, config=cfg, backend=backend)
    junk = sagegen.sageattn(q, k_junk, v_junk, attn_mask=keep, config=cfg, backend=backend)
    assert torch.equal(clean, junk)
    from sagegen.kernels.reference import attention_fp64

    ref, _ = attention_fp64(q, k, v, sm_scale=0.125, mask=sagegen.api.normalize_mask(keep, 2, keep.shape[-1]))
    assert rel_l1(junk, ref) < 0.05


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("shape", [(), (1,), (1, 1, 1, 1), (2, 1, 1, 1)])
def test_masks_broadcast_along_the_keys(seed, backend, shape):
    """A mask whose key dim is 1 broadcasts over every key (SDPA's rule): a constant bias changes nothing, an
    all-False row gives zeros. It once took the key-padding path with one bias for the first key only: an
    IndexError in the emulation, and reads past the bias in the Triton kernels."""
    q, k, v = qkv(2, 2, 2, 40, 70, 64, device=DEVICE)
    plain = sagegen.sageattn(q, k, v, backend=backend)
    shifted = sagegen.sageattn(q, k, v, attn_mask=torch.full(shape, -5.0, device=DEVICE), backend=backend)
    assert rel_l1(shifted, plain) < 2e-3  # softmax-invariant up to the quantization's rounding
    if len(shape) == 4 and shape[0] == 2:
        keep = torch.tensor([True, False], device=DEVICE).view(shape)
        out, lse = sagegen.sageattn(q, k, v, attn_mask=keep, backend=backend, return_lse=True)
        assert rel_l1(out[0], plain[0]) < 2e-3 and not out[1].any() and torch.isinf(lse[1]).all()


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_expanded_key_padding_masks_are_key_masks(seed, backend):
    """The same key-padding mask expanded over heads or query rows (stride-0 views, as `mask.expand(...)` gives)
    is recognised as one: the padded keys stay out of the statistics and the output is bit-identical to the
    [B, 1, 1, Nk] form's."""
    q, k, v = qkv(2, 2, 2, 30, 90, 64, device=DEVICE)
    keep = torch.ones(2, 1, 1, 90, dtype=torch.bool, device=DEVICE)
    keep[1, ..., 50:] = False
    k[1, :, 50:] += 40.0  # large padding values: they would dominate K's mean and V's scale if counted
    v[1, :, 50:] -= 60.0
    cfg = SageConfig(smooth_v=True)
    want = sagegen.sageattn(q, k, v, attn_mask=keep, config=cfg, backend=backend)
    for view in (keep.expand(2, 2, 1, 90), keep.expand(2, 1, 30, 90), keep.expand(2, 2, 30, 90)):
        assert sagegen.api.normalize_mask(view, 2, 90).kind == "key"
        assert torch.equal(sagegen.sageattn(q, k, v, attn_mask=view, config=cfg, backend=backend), want)
    dense = keep.expand(2, 2, 30, 90).clone()  # materialised: a general mask, applied per score
    assert sagegen.api.normalize_mask(dense, 2, 90).kind == "bool"


@pytest.mark.parametrize("d,sigma", [(64, 10.0), (64, 30.0), (128, 30.0)])
def test_large_scores_keep_the_emulations_accuracy(seed, d, sigma):
    """Q and K scaled by sigma. The fast path's per-row shift (~12582912 * row_scale) holds its reference only
    to an fp32 ulp, ~1.5 row_scale log2 units (spec.py): the kernel follows the reference it really
    subtracts. Before, the blocks' weights and the lse drifted with that error: 0.076 against the emulation's
    0.060 at sigma 30 (head dim 128)."""
    from sagegen.kernels.reference import attention_fp64

    q, k, v = qkv(1, 2, 2, 150, 200, d, device=DEVICE)
    q, k = q * sigma, k * sigma
    ref, ref_lse = attention_fp64(q, k, v, sm_scale=d**-0.5)
    t, lt = sagegen.sageattn(q, k, v, backend="triton", return_lse=True)
    e, le = sagegen.sageattn(q, k, v, backend="reference", return_lse=True)
    assert rel_l1(t, ref) < 1.3 * rel_l1(e, ref) + 2e-3
    assert ((lt - le).abs() <= 1e-5 * le.abs() + 1e-2).all()  # the lse follows the reference really used


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("smooth_v", [False, True])
def test_non_finite_inputs_reach_the_output(seed, backend, where, bad, smooth_v):
    """A NaN or inf in the inputs must show in the output, never be quantized into finite garbage: in q, its
    row (and its lse); in k, everything (every row sees every key); in v, its channel. (The scales' max()
    used to drop NaNs and the INT8/FP8 clamps turned them into finite values; with V smoothing a NaN row
    came out as zeros, like a fully masked one.)"""
    q, k, v = qkv(1, 2, 2, 70, 90, 64, device=DEVICE)
    tensors = dict(q=q, k=k, v=v)
    tensors[where][0, 1, 33, 17] = bad
    out, lse = sagegen.sageattn(**tensors, backend=backend, return_lse=True, config=SageConfig(smooth_v=smooth_v))
    bad_out, bad_lse = ~out.isfinite(), ~lse.isfinite()
    want = torch.zeros_like(bad_out)
    if where == "q":
        want[0, 1, 33] = True
    elif where == "k":
        want[0, 1] = True
    else:
        want[0, 1, :, 17] = True
    assert torch.equal(bad_out, want)
    assert torch.equal(bad_lse, want.any(-1) if where != "v" else torch.zeros_like(bad_lse))


@pytest.mark.parametrize("n,masked", [(1, False), (700, True), (2100, True), (8300, False)])
def test_quantization_statistics_match_torch(seed, n, masked):
    """Smoothing means of K and V over the sampled keys and V's FP8 scale over every key (the statistics
    launch and its finishing launch) against torch: a head dim that pads (48 -> 64), fewer keys than the
    sample (all of them used), more V partials than one finishing chunk (8300 keys: 65), a key-padding mask
    with a different number of live keys per batch item and garbage in the padding, and an outlier of V on a
    key outside the sample (the scale must cover it; the means must not see it)."""
    from sagegen.kernels.reference import sample_index
    from sagegen.kernels.triton_quant import _kv_stats

    k, v = (torch.randn(2, 3, n, 48, device=DEVICE) + 2.0 for _ in range(2))
    idx = sample_index(n, DEVICE)
    bias = None
    live = torch.ones(2, n, dtype=torch.bool, device=DEVICE)
    if masked:
        live[0, n * 2 // 3:], live[1, 7:] = False, False
        k[~live[:, None, :, None].expand_as(k)] = 1e4
        v[~live[:, None, :, None].expand_as(v)] = -1e4
        bias = torch.zeros(2, n, device=DEVICE).masked_fill(~live, float("-inf"))
    unsampled = [j for j in range(min(n, 7)) if j not in set(idx.tolist())]  # keys 0-6 are live everywhere
    if unsampled:
        k[:, :, unsampled[0], 5] = 1e3
        v[:, :, unsampled[0], 5] = 1e3
    k_mean, v_mean, v_scale, v_inv = _kv_stats(k, v, 64, True, True, True, bias)
    w = live[:, None, :, None].float()
    count = w[:, :, idx].sum(dim=2).clamp(min=1)
    want_k = ((k * w)[:, :, idx].sum(dim=2) / count).reshape(6, 48)
    want_v = ((v * w)[:, :, idx].sum(dim=2) / count).reshape(6, 48)
    vs = (v - want_v.reshape(2, 3, 1, 48)).masked_fill(w == 0, 0.0)
    want_scale = vs.abs().amax(dim=2).reshape(6, 48).clamp(min=1e-8) / 448.0
    assert torch.allclose(k_mean[:, :48], want_k, rtol=1e-5, atol=1e-5)
    assert torch.allclose(v_mean[:, :48], want_v, rtol=1e-5, atol=1e-5)
    assert torch.allclose(v_scale[:, :48], want_scale, rtol=1e-5)
    if unsampled:
        assert (v_scale[:, 5] > 2.0).all() and (k_mean[:, 5].abs() < 10).all()
    assert torch.equal(v_scale[:, 48:], torch.ones(6, 16, device=DEVICE))  # padding channels: scale 1
    assert torch.allclose(v_inv * v_scale, torch.ones_like(v_scale), rtol=1e-6)


def test_permuted_v_keys_are_a_relabelling():
    """quantize(permute_v_keys=True) stores the same FP8 V with keys in gluon_attn's order."""
    from sagegen.kernels.triton_quant import quantize

    q, k, v = (torch.randn(1, 2, 200, 64, device=DEVICE) for _ in range(3))
    cfg = SageConfig()
    plain = quantize(q, k, v, cfg, 64, 128, 64).v.float()
    perm = quantize(q, k, v, cfg, 64, 128, 64, permute_v_keys=True).v.float()
    n = torch.arange(plain.shape[-1], device=DEVICE)
    pos = (n & ~15) | (((n >> 1) & 3) << 2) | (((n >> 3) & 1) << 1) | (n & 1)
    assert sorted(pos.tolist()) == n.tolist() and not torch.equal(pos, n)
    assert torch.equal(perm[..., pos], plain)


def test_gluon_build_failure_falls_back_to_the_triton_kernel(monkeypatch, seed):
    """A Triton whose Gluon cannot build the Hopper kernel: one warning, the same result from the Triton kernel
    (V re-quantized in plain key order), and no retry afterwards."""
    from triton.compiler.errors import CompilationError

    from sagegen.kernels import gluon_attn, triton_attn
    from sagegen.kernels import launch as kernel_choice

    q, k, v = qkv(1, 2, 2, 70, 140, 64, device=DEVICE)
    monkeypatch.setenv("SAGEGEN_KERNEL", "triton")
    expected = sagegen.sageattn(q, k, v, backend="triton")
    monkeypatch.delenv("SAGEGEN_KERNEL")
    monkeypatch.setattr(kernel_choice, "_gluon_broken", [])
    real_applies = kernel_choice.gluon_applies
    monkeypatch.setattr(kernel_choice, "gluon_applies",  # where the launcher looks it up
                        lambda *a, **kw: None if not kernel_choice._gluon_broken else real_applies((9, 0), *a[1:],
                                                                                                   **kw))

    def broken(*args, **kwargs):
        raise CompilationError(None, None, "unsupported layout")

    monkeypatch.setattr(gluon_attn, "launch", broken)
    with pytest.warns(RuntimeWarning, match="Gluon kernel did not build"):
        out = sagegen.sageattn(q, k, v, backend="triton")
    assert torch.equal(out, expected)
    assert "did not build" in kernel_choice.gluon_applies((9, 0), SageConfig(), 64, (64, 128), False,
                                                          triton_attn.MaskSpec())


def test_key_mask_under_graph_capture_takes_the_triton_kernel_without_a_host_check(monkeypatch, seed):
    """While a CUDA graph is captured, the host check that lets the Gluon kernel take a key-padding mask as key
    lengths would fail the capture: the Triton kernel applies the mask instead, with the same result as the
    plain Triton path (where the Gluon kernel would otherwise run, as `gluon_applies` is made to say here)."""
    from sagegen.kernels import gluon_attn
    from sagegen.kernels import launch as kernel_choice

    q, k, v = qkv(2, 2, 2, 70, 140, 64, device=DEVICE)
    keep = torch.ones(2, 140, dtype=torch.bool, device=DEVICE)
    keep[1, 100:] = False
    mask = keep[:, None, None, :]
    monkeypatch.setenv("SAGEGEN_KERNEL", "triton")
    expected = sagegen.sageattn(q, k, v, attn_mask=mask, backend="triton")
    unmasked = sagegen.sageattn(q, k, v, backend="triton")
    assert rel_l1(expected, unmasked) > 1e-3  # the mask matters here
    monkeypatch.delenv("SAGEGEN_KERNEL")
    monkeypatch.setattr(kernel_choice, "gluon_applies", lambda *a, **kw: None)
    monkeypatch.setattr(kernel_choice, "capturing", lambda: True)

    def fail(*args, **kwargs):
        raise AssertionError("no host check and no Gluon launch while capturing")

    monkeypatch.setattr(kernel_choice, "key_prefix_lengths", fail)
    monkeypatch.setattr(gluon_attn, "launch", fail)
    out = sagegen.sageattn(q, k, v, attn_mask=mask, backend="triton")
    assert torch.equal(out, expected)


@pytest.mark.parametrize("d,start,norm,rope", [(64, 7, True, True), (48, 0, True, True), (128, 3, False, True),
                                               (64, 5, True, False)])
def test_layer_norm_rope_matches_diffusers_eager_ops(seed, d, start, norm, rope):
    """The fused Q/K prologue against what CogVideoX's processor runs eagerly: nn.LayerNorm over the head dim
    (bf16 out), then diffusers' apply_rotary_emb on the tokens from `start` on, on a transposed view."""
    from diffusers.models.embeddings import apply_rotary_emb

    from sagegen.kernels.triton_qk_prologue import layer_norm_rope

    B, H, N = 2, 3, 77
    x = (torch.randn(B, N, H, d, device=DEVICE) * 2 + 0.5).to(torch.bfloat16).transpose(1, 2)  # [B, H, N, d]
    ln = torch.nn.LayerNorm(d, eps=1e-6).to(DEVICE)
    with torch.no_grad():
        ln.weight.copy_(torch.rand(d) + 0.5)
        ln.bias.copy_(torch.randn(d) * 0.1)
    ln = ln.to(torch.bfloat16)
    theta = torch.rand(N - start, d, device=DEVICE) * 6.28
    cos, sin = theta.cos(), theta.sin()
    with torch.no_grad():
        normed = ln(x) if norm else x.clone()
        ref = normed.clone()
        if rope:
            ref[:, :, start:] = apply_rotary_emb(ref[:, :, start:], (cos, sin))
        out = layer_norm_rope(x, (ln.weight, ln.bias, ln.eps) if norm else None, (cos, sin) if rope else None,
                              start)
    assert out.shape == x.shape and out.stride() == x.stride() and out.dtype == x.dtype
    diff = (out.float() - ref.float()).abs()
    # A rotated value can cancel to near zero, so the bound is a couple of bf16 steps at the scale of the
    # pair it came from (the LayerNorm's statistics round differently from torch's now and then).
    pair = normed.float().abs().unflatten(-1, (-1, 2)).amax(-1, keepdim=True).expand(-1, -1, -1, -1, 2).flatten(-2)
    bound = (pair + ref.float().abs()) * 2.0**-7
    assert (diff <= bound).all(), float((diff / bound).max())
    assert (diff > 0).float().mean() < 0.05  # rounding-order differences only, at a few elements
    if rope:
        assert not torch.equal(out[:, :, start:], (ln(x) if norm else x)[:, :, start:])  # it did rotate
    if not norm:  # the rotation alone rounds exactly as the eager ops (no FMA contraction in the kernel)
        assert torch.equal(out, ref)


def test_layer_norm_rope_rejects_bad_rope_shape():
    from sagegen.kernels.triton_qk_prologue import layer_norm_rope

    x = torch.zeros(1, 2, 10, 64, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="rope"):
        layer_norm_rope(x, None, (torch.zeros(9, 64), torch.zeros(9, 64)), start=2)
    with pytest.raises(ValueError, match="x:"):
        layer_norm_rope(x.float(), None, None)


def _mochi_rope_eager(x, cos, sin):
    """Mochi's processor's rotation (diffusers MochiAttnProcessor2_0.apply_rotary_emb), on x [B, N, H, D]."""
    x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()
    c = (x_even * cos - x_odd * sin).to(x.dtype)
    s = (x_even * sin + x_odd * cos).to(x.dtype)
    return torch.stack([c, s], dim=-1).flatten(-2)


@pytest.mark.parametrize("d,norm,weight,rope", [(64, True, True, True), (48, True, False, True),
                                                (128, False, False, True), (64, True, True, False)])
def test_rms_norm_rope_matches_mochi_eager_ops(seed, d, norm, weight, rope):
    """The fused Mochi prologue against the processor's eager ops: MochiRMSNorm over the head dim (bf16 out),
    then the fp32 rotation with per-head tables [N, H, D/2]; written into a slice of a joint buffer."""
    from diffusers.models.normalization import MochiRMSNorm

    from sagegen.kernels.triton_qk_prologue import rms_norm_rope

    B, H, N, T = 2, 3, 45, 7
    x = (torch.randn(B, N, H, d, device=DEVICE) * 2 + 0.5).to(torch.bfloat16)  # as the processor has it
    rms = MochiRMSNorm(d, 1e-5, elementwise_affine=weight).to(DEVICE)
    if weight:
        with torch.no_grad():
            rms.weight.copy_(torch.rand(d) + 0.5)
    rms = rms.to(torch.bfloat16)
    theta = torch.rand(N, H, d // 2, device=DEVICE) * 6.28
    cos, sin = theta.cos(), theta.sin()
    with torch.no_grad():
        normed = rms(x) if norm else x.clone()
        ref = _mochi_rope_eager(normed, cos, sin) if rope else normed
        joint = torch.full((B, N + T, H, d), 7.0, dtype=torch.bfloat16, device=DEVICE)
        out = rms_norm_rope(x.transpose(1, 2), (rms.weight, rms.eps) if norm else None,
                            (cos, sin) if rope else None, out=joint[:, :N].transpose(1, 2))
    assert out.data_ptr() == joint.data_ptr() and (joint[:, N:] == 7).all()  # wrote the slice, nothing else
    diff = (joint[:, :N].float() - ref.float()).abs()
    pair = normed.float().abs().unflatten(-1, (-1, 2)).amax(-1, keepdim=True).expand(-1, -1, -1, -1, 2).flatten(-2)
    bound = (pair + ref.float().abs()) * 2.0**-7
    assert (diff <= bound).all(), float((diff / bound).max())
    assert (diff > 0).float().mean() < 0.05  # rounding-order differences only, at a few elements
    if rope:
        assert not torch.equal(joint[:, :N], normed)  # it did rotate


def test_rms_norm_rope_rejects_bad_tables_and_outputs():
    from sagegen.kernels.triton_qk_prologue import rms_norm_rope

    x = torch.zeros(1, 2, 10, 64, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="rope"):
        rms_norm_rope(x, None, (torch.zeros(10, 64), torch.zeros(10, 64)))  # CogVideoX's table form
    with pytest.raises(ValueError, match="out:"):
        rms_norm_rope(x, None, None, out=torch.zeros(1, 2, 9, 64, dtype=torch.bfloat16, device=DEVICE))


@pytest.mark.parametrize("d,weight", [(64, True), (128, False), (48, True)])
def test_rms_norm_rounded_matches_diffusers_rmsnorm(seed, d, weight):
    """round_before_weight: diffusers' RMSNorm (SD3's qk_norm), which rounds to the half weight's dtype before
    multiplying by it; into a slice of a joint buffer, on the processor's transposed view."""
    from diffusers.models.normalization import RMSNorm

    from sagegen.kernels.triton_qk_prologue import rms_norm_rope

    B, H, N, T = 2, 3, 37, 5
    x = (torch.randn(B, N, H, d, device=DEVICE) * 3).to(torch.bfloat16)
    rms = RMSNorm(d, eps=1e-6, elementwise_affine=weight).to(DEVICE)
    if weight:
        with torch.no_grad():
            rms.weight.copy_(torch.rand(d) + 0.5)
    rms = rms.to(torch.bfloat16)
    with torch.no_grad():
        ref = rms(x.transpose(1, 2))
        joint = torch.zeros(B, N + T, H, d, dtype=torch.bfloat16, device=DEVICE)
        rms_norm_rope(x.transpose(1, 2), (rms.weight, rms.eps), None, out=joint[:, T:].transpose(1, 2),
                      round_before_weight=True)
    out = joint[:, T:].transpose(1, 2)
    assert (joint[:, :T] == 0).all()
    diff = (out.float() - ref.float()).abs()
    # one bf16 step of the result, and with a weight one step of the normalized value before it: an fp32
    # normalization an ulp apart can round that value the other way at a tie, and the weight scales the step
    bound = ref.float().abs() * 2.0**-7 + 1e-6
    if weight:
        xf = x.float().transpose(1, 2)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + rms.eps)
        bound = bound + normed.abs() * rms.weight.float().abs() * 2.0**-7
    assert (diff <= bound).all(), float((diff / bound).max())
    assert (diff > 0).float().mean() < 0.02
    if weight:  # the double rounding is what it reproduces: the single-rounding form differs somewhere
        once = rms_norm_rope(x.transpose(1, 2), (rms.weight, rms.eps), None)
        assert (once != ref).any() or d == 48


def test_rms_norm_rope_per_channel_tables_match_apply_rotary_emb(seed):
    """per_channel_rope: tables [N, D] shared by the heads, as diffusers' apply_rotary_emb(use_real=True)."""
    from diffusers.models.embeddings import apply_rotary_emb

    from sagegen.kernels.triton_qk_prologue import rms_norm_rope

    # On the GPU large enough (2M elements) that FMA contraction would show: it moves ~2e-5 of them a bf16 step
    B, H, N, d = (1, 2, 29, 64) if DEVICE == "cpu" else (2, 8, 2048, 64)
    x = torch.randn(B, H, N, d, device=DEVICE).to(torch.bfloat16)
    theta = (torch.rand(N, d // 2, device=DEVICE) * 6.28).repeat_interleave(2, dim=1)
    cos, sin = theta.cos(), theta.sin()
    with torch.no_grad():
        ref = apply_rotary_emb(x, (cos, sin))
        out = rms_norm_rope(x, None, (cos, sin), per_channel_rope=True)
    # No FMA contraction in the kernel (triton_qk_prologue.FP_FUSION): each product rounds as in eager torch,
    # so the rotation is bit-identical, in the interpreter and on the GPU.
    assert torch.equal(out, ref)
    assert not torch.equal(out, x)


def test_rms_norm_matches_torch_rmsnorm(seed):
    """Flux's qk norm, torch.nn.RMSNorm: one rounding (the default form), within a bf16 step of torch."""
    from sagegen.kernels.triton_qk_prologue import rms_norm_rope

    d = 128
    x = (torch.randn(1, 3, 50, d, device=DEVICE) * 3).to(torch.bfloat16)
    norm = torch.nn.RMSNorm(d, eps=1e-6).to(DEVICE)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(d) + 0.5)
    norm = norm.to(torch.bfloat16)
    with torch.no_grad():
        ref, out = norm(x), rms_norm_rope(x, (norm.weight, norm.eps), None)
    diff = (out.float() - ref.float()).abs()
    assert (diff <= ref.float().abs() * 2.0**-7 + 1e-6).all()
    assert (diff > 0).float().mean() < 0.02, float((diff > 0).float().mean())


@pytest.mark.parametrize("d", [32, 128])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_hadamard_rotation_in_the_quantization_pass(seed, d, layout):
    """`qk_rotation="hadamard"`: the Triton quantization pass turns Q and K as the emulation does (GQA, odd sizes,
    either layout, a key-padding mask with garbage in the padding), and the rotation is really applied: the
    output moves by the quantization error's size against the unrotated kernel."""
    q, k, v = qkv(2, 4, 2, 77, 150, d, layout=layout, device=DEVICE)
    n_dim = 2 if layout == "HND" else 1
    keep = torch.ones(2, k.shape[n_dim], dtype=torch.bool, device=DEVICE)
    keep[1, 100:] = False
    if layout == "HND":
        k[1, :, 100:] = 1e4
    else:
        k[1, 100:] = 1e4
    mask = keep[:, None, None, :]
    cfg = SageConfig(qk_rotation="hadamard")
    (t, lt), (r, lr) = both(q, k, v, tensor_layout=layout, attn_mask=mask, config=cfg, return_lse=True)
    assert_close(t, r, lt, lr)
    plain = sagegen.sageattn(q, k, v, tensor_layout=layout, attn_mask=mask, backend="triton")
    assert rel_l1(t, plain) > 5 * rel_l1(t, r)


def test_hadamard_rotation_refuses_a_head_dim_that_is_not_a_power_of_two(seed):
    q, k, v = qkv(1, 2, 2, 40, 40, 96, device=DEVICE)
    for backend in ("triton", "reference"):
        with pytest.raises(ValueError, match="qk_rotation='hadamard' needs a power-of-two head dim"):
            sagegen.sageattn(q, k, v, backend=backend, config=SageConfig(qk_rotation="hadamard"))
