"""GPU checks at real sizes (H100/H200); skipped without CUDA. CPU-side twins are in test_triton_interpret.py."""

import warnings

import pytest
import torch

import sagegen
from tests.conftest import gpu
from tests.support.helpers import cosine, qkv, rel_l1
from sagegen import SageConfig
from sagegen.kernels.reference import attention_fp64, sage_attention

pytestmark = gpu
# backend="triton" throughout: "auto" runs SDPA below the measured crossover (backends.auto_prefers_sdpa).


@pytest.mark.parametrize("d", [64, 128])
def test_accuracy_bar_on_gpu(seed, d):
    """N(0,1), B=1, H=8, N=4096: cos >= 0.9992 and rel L1 <= 0.039 (upstream SageAttention2: 0.9992/0.039)."""
    q, k, v = qkv(1, 8, 8, 4096, 4096, d, dtype=torch.bfloat16, device="cuda")
    out = sagegen.sageattn(q, k, v, backend="triton")
    ref, _ = attention_fp64(q, k, v, sm_scale=d**-0.5)
    print(f"d={d}: cos {cosine(out, ref):.6f} rel-L1 {rel_l1(out, ref):.4f}")
    assert cosine(out, ref) >= 0.9992 and rel_l1(out, ref) <= 0.039


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("cfg", [SageConfig(), SageConfig(smooth_q=True, smooth_v=True, k_granularity="per_token"),
                                 SageConfig(pv_precision="fp16")], ids=["default", "smooth", "fp16pv"])
def test_kernel_tracks_emulation_at_real_size(seed, monkeypatch, layout, cfg):
    """A random key mask (padding scattered): the kernel against the emulation with the same keys. Where the
    Gluon kernel takes the call (the default config on Hopper) the valid keys are first gathered to the front
    (`key_padding.compact_valid_keys`), which puts other keys in each quantization block: there the emulation
    runs over those compacted keys, and both stay as accurate against fp64 as the emulation over the original
    order."""
    from sagegen.kernels import launch
    from sagegen.kernels.spec import MaskSpec

    compacted, real_compact = [], launch.compact_valid_keys
    monkeypatch.setattr(launch, "compact_valid_keys", lambda *a: compacted.append(real_compact(*a)) or
                        compacted[-1])
    q, k, v = qkv(2, 8, 4, 4096 + 37, 4096 + 37, 128, dtype=torch.bfloat16, device="cuda", layout=layout)
    mask = torch.rand(2, 1, 1, k.shape[1 if layout == "NHD" else 2], device="cuda") > 0.2
    t, lt = sagegen.sageattn(q, k, v, tensor_layout=layout, config=cfg, attn_mask=mask, return_lse=True,
                             backend="triton")
    r, lr = sagegen.sageattn(q, k, v, tensor_layout=layout, config=cfg, attn_mask=mask, return_lse=True,
                             backend="reference")
    hnd = (lambda x: x.transpose(1, 2)) if layout == "NHD" else (lambda x: x)
    if compacted and compacted[0] is not None:
        kc, vc, bias, _ = compacted[0]
        ref, _ = attention_fp64(hnd(q), hnd(k), hnd(v), sm_scale=128**-0.5,
                                mask=sagegen.api.normalize_mask(mask, 2, mask.shape[-1]))
        assert rel_l1(hnd(t), ref) < 1.2 * rel_l1(hnd(r), ref)
        rc, lrc = sage_attention(hnd(q), kc, vc, sm_scale=128**-0.5, mask=MaskSpec("key", bias), config=cfg,
                                 return_lse=True)
        t, r, lr = hnd(t), rc, lrc
    assert rel_l1(t, r) < 4e-3 and (lt - lr).abs().max() < 2e-3


def test_two_level_accumulation_on_hardware(seed):
    """The kernel's error tracks the FP32-accumulator emulation, not single-level FP22 accumulation."""
    n = 32768
    q, k = (torch.randn(1, 4, n, 64, device="cuda").half() for _ in range(2))
    v = (torch.randn(1, 4, n, 64, device="cuda") + 8).half()
    ref, _ = attention_fp64(q, k, v, sm_scale=0.125)
    kern = sagegen.sageattn(q, k, v, backend="triton")
    e32 = sage_attention(q, k, v, sm_scale=0.125)[0]
    e22 = sage_attention(q, k, v, sm_scale=0.125, config=SageConfig(pv_accum="fp22"))[0]
    err_k, err_32, err_22 = rel_l1(kern, ref), rel_l1(e32, ref), rel_l1(e22, ref)
    print(f"rel-L1 vs fp64: kernel {err_k:.5f}, emu fp32 {err_32:.5f}, emu fp22 {err_22:.5f}; "
          f"kernel vs emu32 {rel_l1(kern, e32):.5f}, vs emu22 {rel_l1(kern, e22):.5f}")
    assert err_22 > 1.5 * err_32
    assert abs(err_k - err_32) < 0.2 * (err_22 - err_32)
    assert rel_l1(kern, e32) < 0.5 * rel_l1(kern, e22)


def test_torch_compile_fullgraph_inductor(seed):
    q, k, v = qkv(1, 4, 4, 1000, 1000, 64, dtype=torch.bfloat16, device="cuda", layout="NHD")

    def f(q, k, v):
        return sagegen.sageattn(q * 1.0, k, v, tensor_layout="NHD", backend="triton") + 1

    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(q, k, v), f(q, k, v))


def test_hunyuan_like_key_padding_and_causal_cross(seed):
    q, k, v = qkv(2, 24, 24, 8192 + 256, 8192 + 256, 128, dtype=torch.bfloat16, device="cuda")
    keep = torch.ones(2, 1, 1, k.shape[2], dtype=torch.bool, device="cuda")
    keep[0, ..., -200:] = False
    t = sagegen.sageattn(q, k, v, attn_mask=keep, backend="triton")
    ref, _ = attention_fp64(q[:, :4], k[:, :4], v[:, :4], sm_scale=128**-0.5,
                            mask=sagegen.api.normalize_mask(keep, 2, keep.shape[-1]))
    assert rel_l1(t[:, :4], ref) < 0.04
    q2, k2, v2 = qkv(1, 8, 8, 3000, 5000, 64, dtype=torch.float16, device="cuda")
    t2 = sagegen.sageattn(q2, k2, v2, is_causal=True, backend="triton")
    r2 = sagegen.sageattn(q2, k2, v2, is_causal=True, backend="reference")
    assert rel_l1(t2, r2) < 4e-3


def test_smooth_v_cuts_kernel_error_on_biased_v(seed):
    """V with a per-channel bias of 8-9 (as the paper reports for CogVideoX): smooth-V cuts the kernel's
    relative L1 error by at least 40% (fp16, so the output's own rounding does not hide the difference)."""
    q, k = (torch.randn(1, 8, 4096, 64, device="cuda").half() for _ in range(2))
    v = (torch.randn(1, 8, 4096, 64, device="cuda") + 8 + torch.rand(64, device="cuda")).half()
    ref, _ = attention_fp64(q, k, v, sm_scale=0.125)
    plain = rel_l1(sagegen.sageattn(q, k, v, backend="triton"), ref)
    smooth = rel_l1(sagegen.sageattn(q, k, v, backend="triton", config=SageConfig(smooth_v=True)), ref)
    print(f"biased V: rel-L1 {plain:.5f} without smooth-V, {smooth:.5f} with")
    assert smooth <= 0.6 * plain


KERNELS = ["gluon", "triton"]


def _use_kernel(monkeypatch, kernel: str, cfg: SageConfig) -> SageConfig:
    if kernel.startswith("gluon") and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernels are sm90-only")
    monkeypatch.setenv("SAGEGEN_KERNEL", kernel)
    return cfg


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d,hkv,nq,nk", [(128, 8, 4096 + 37, 3000 + 5), (64, 2, 1000 + 3, 5000 + 77),
                                         (128, 4, 64, 128), (96, 8, 777, 129), (64, 8, 100, 50),
                                         (128, 8, 300, 192)])
def test_hopper_kernels_track_emulation(seed, monkeypatch, kernel, d, hkv, nq, nk):
    """Every kernel (SAGEGEN_KERNEL) against the emulation and fp64: odd lengths, GQA, V smoothing, LSE;
    key counts of one partial block, two, and a partial third."""
    cfg = _use_kernel(monkeypatch, kernel, SageConfig(smooth_v=True))
    q, _, _ = qkv(2, 8, hkv, nq, nk, d, dtype=torch.bfloat16, device="cuda")
    _, k, v = qkv(2, 8, hkv, nq, nk, d, dtype=torch.bfloat16, device="cuda")
    v = v + 3.0
    t, lt = sagegen.sageattn(q, k, v, config=cfg, return_lse=True, backend="triton")
    r, lr = sagegen.sageattn(q, k, v, config=cfg, return_lse=True, backend="reference")
    ref, _ = attention_fp64(q, k, v, sm_scale=d**-0.5)
    print(f"{kernel} d={d} nq={nq} nk={nk}: vs emu {rel_l1(t, r):.2e}, vs fp64 {rel_l1(t, ref):.4f}")
    assert torch.isfinite(t).all()
    assert rel_l1(t, r) < 2e-4 and (lt - lr).abs().max() < 5e-4
    assert cosine(t, ref) > 0.999


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d,sigma", [(128, 1.0), (128, 8.0), (64, 30.0), (128, 30.0)])
def test_large_scores_keep_the_emulations_accuracy_on_hardware(seed, monkeypatch, kernel, d, sigma):
    """The fast path's per-row shift at growing score scales (spec.py), on every kernel."""
    cfg = _use_kernel(monkeypatch, kernel, SageConfig())
    q, k, v = qkv(2, 8, 8, 2048 + 37, 3000 + 5, d, dtype=torch.bfloat16, device="cuda")
    q, k = q * sigma, k * sigma
    ref, _ = attention_fp64(q, k, v, sm_scale=d**-0.5)
    t, lt = sagegen.sageattn(q, k, v, config=cfg, return_lse=True, backend="triton")
    e, le = sagegen.sageattn(q, k, v, config=cfg, return_lse=True, backend="reference")
    print(f"{kernel} d={d} sigma={sigma}: kernel {rel_l1(t, ref):.4f}, emulation {rel_l1(e, ref):.4f}, "
          f"lse {(lt - le).abs().max():.2e}")
    assert rel_l1(t, ref) < 1.3 * rel_l1(e, ref) + 2e-3
    assert ((lt - le).abs() <= 1e-5 * le.abs() + 1e-2).all()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_inputs_reach_the_output_on_hardware(seed, monkeypatch, kernel, where):
    cfg = _use_kernel(monkeypatch, kernel, SageConfig(smooth_v=True))
    q, k, v = qkv(1, 4, 4, 1000, 1500, 128, dtype=torch.bfloat16, device="cuda")
    tensors = dict(q=q, k=k, v=v)
    tensors[where][0, 2, 333, 17] = float("nan")
    t = sagegen.sageattn(**tensors, config=cfg, backend="triton")
    r = sagegen.sageattn(**tensors, config=cfg, backend="reference")
    assert torch.equal(t.isnan(), r.isnan()) and t.isnan().any()


@pytest.mark.parametrize("d,layout", [(128, "HND"), (64, "NHD"), (96, "NHD")])
def test_gluon_q_quantized_in_kernel_is_bit_identical(seed, monkeypatch, d, layout):
    """The Gluon kernel quantizes Q per CTA (gluon_attn.QUANT_Q_IN_KERNEL): the same output and LSE, bit for
    bit, as with Q quantized by the separate pass; odd lengths, a padded head dim, a strided (NHD) Q."""
    from sagegen.kernels import gluon_attn, launch

    cfg = _use_kernel(monkeypatch, "gluon", SageConfig(smooth_v=True))
    q, k, v = qkv(2, 8, 4, 1000 + 3, 700 + 9, d, dtype=torch.bfloat16, device="cuda", layout=layout)
    q = q * 5.0  # rows with large values: scales far from 1
    seen, real_quantize = [], launch.quantize
    monkeypatch.setattr(launch, "quantize",
                        lambda *a, **kw: seen.append(kw["quantize_q"]) or real_quantize(*a, **kw))
    runs = {}
    for in_kernel in (True, False):
        monkeypatch.setattr(gluon_attn, "QUANT_Q_IN_KERNEL", in_kernel)
        runs[in_kernel] = sagegen.sageattn(q, k, v, tensor_layout=layout, config=cfg, return_lse=True,
                                           backend="triton")
    assert seen == [False, True]  # the first run left Q to the kernel, the second quantized it separately
    assert torch.equal(runs[True][0], runs[False][0]) and torch.equal(runs[True][1], runs[False][1])


@pytest.mark.parametrize("kernel", KERNELS)
def test_hopper_kernels_key_padding_prefix(seed, monkeypatch, kernel):
    """HunyuanVideo-style key padding (valid keys first, per-batch lengths): the Gluon kernels run it as key
    lengths, skipping padded blocks; every kernel tracks the emulation."""
    cfg = _use_kernel(monkeypatch, kernel, SageConfig())
    q, k, v = qkv(2, 4, 4, 3000 + 5, 2900 + 11, 128, dtype=torch.bfloat16, device="cuda")
    mask = torch.ones(2, 1, 1, k.shape[2], dtype=torch.bool, device="cuda")
    mask[0, ..., -333:] = False
    mask[1, ..., -7:] = False
    k[0, :, -333:] = 1e4  # padding holds garbage; it must not reach the scales or the output
    t, lt = sagegen.sageattn(q, k, v, attn_mask=mask, config=cfg, return_lse=True, backend="triton")
    r, lr = sagegen.sageattn(q, k, v, attn_mask=mask, config=cfg, return_lse=True, backend="reference")
    ref, _ = attention_fp64(q, k, v, sm_scale=128**-0.5, mask=sagegen.api.normalize_mask(mask, 2, mask.shape[-1]))
    print(f"{kernel} key prefix: vs emu {rel_l1(t, r):.2e}, vs fp64 {rel_l1(t, ref):.4f} "
          f"(emulation vs fp64 {rel_l1(r, ref):.4f})")
    # The fast path folds the score's scale and shift into one FMA (its constant rounds to ~6e-5 in log2
    # units), so a few P values round to the neighbouring FP8 value compared with the emulation; zero-mean V
    # makes that visible in rel-L1. Accuracy against fp64 is what must not move.
    assert rel_l1(t, r) < 1.5e-3 and (lt - lr).abs().max() < 5e-4
    assert abs(rel_l1(t, ref) - rel_l1(r, ref)) < 0.02 * rel_l1(r, ref)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_gluon_runs_key_padding_in_the_middle(seed, monkeypatch, layout):
    """HunyuanVideo's key mask as Ulysses gathers it ([video 0, text 0, video 1, text 1], the text padded at
    its end, so padding sits in the middle): the valid keys are moved first and the Gluon kernel runs it
    (SAGEGEN_KERNEL=gluon raises otherwise), as accurate against fp64 as the emulation over the original order,
    and within the prefix test's bound of the emulation over the compacted keys."""
    from sagegen.kernels.key_padding import compact_valid_keys
    from sagegen.kernels.spec import MaskSpec

    cfg = _use_kernel(monkeypatch, "gluon", SageConfig())
    nv, nt = 1500 + 7, 128
    mask = torch.ones(2, 1, 1, 2 * (nv + nt), dtype=torch.bool, device="cuda")
    for b, valid in enumerate((64, 200)):           # sample 0: text 0 half padded, text 1 all padding
        text = torch.arange(2 * nt, device="cuda") < valid
        mask[b, 0, 0, nv:nv + nt], mask[b, 0, 0, 2 * nv + nt:] = text[:nt], text[nt:]
    q, k, v = qkv(2, 8, 4, 3000 + 5, mask.shape[-1], 128, dtype=torch.bfloat16, device="cuda", layout=layout)
    hnd = (lambda t: t.transpose(1, 2)) if layout == "NHD" else (lambda t: t)
    hnd(k)[~mask[:, :, 0, :, None].expand_as(hnd(k))] = 1e4   # padding holds garbage
    t, lt = sagegen.sageattn(q, k, v, tensor_layout=layout, attn_mask=mask, config=cfg, return_lse=True,
                             backend="triton")
    r, _ = sagegen.sageattn(q, k, v, tensor_layout=layout, attn_mask=mask, config=cfg, return_lse=True,
                            backend="reference")
    spec = sagegen.api.normalize_mask(mask, 2, mask.shape[-1])
    ref, _ = attention_fp64(hnd(q), hnd(k), hnd(v), sm_scale=128**-0.5, mask=spec)
    kc, vc, bias, _ = compact_valid_keys(hnd(k), hnd(v), spec.tensor)
    rc, lrc = sage_attention(hnd(q), kc, vc, sm_scale=128**-0.5, mask=MaskSpec("key", bias), config=cfg,
                             return_lse=True)
    t = hnd(t)
    print(f"key padding in the middle ({layout}): vs fp64 {rel_l1(t, ref):.4f} (emulation {rel_l1(hnd(r), ref):.4f}), "
          f"vs compacted emulation {rel_l1(t, rc):.2e}")
    assert rel_l1(t, rc) < 1.5e-3 and (lt - lrc).abs().max() < 5e-4
    assert rel_l1(t, ref) < 1.1 * rel_l1(hnd(r), ref)


@pytest.mark.parametrize("cap", [(8, 9), (8, 6), (8, 0)], ids=["ada-sm89", "ampere-sm86", "ampere-sm80"])
def test_pre_hopper_variants_forced_on_this_card(seed, monkeypatch, cap):
    """The Ada (FP8 P·V) and Ampere (fp16 P·V) variants, forced here with SAGEGEN_CAPABILITY: their tile
    sizes, warps and stages, and Ampere's automatic switch to fp16 P·V, against the emulation (which picks the
    same tiles) and fp64. Triton still compiles for this card."""
    monkeypatch.setenv("SAGEGEN_CAPABILITY", f"{cap[0]}.{cap[1]}")
    monkeypatch.setattr(sagegen.api, "_warned", set())
    q, k, v = qkv(2, 8, 4, 3000 + 7, 2500 + 3, 128, dtype=torch.bfloat16, device="cuda", layout="NHD")
    cfg = SageConfig(smooth_v=True)
    with pytest.warns(RuntimeWarning, match="fp16") if cap < (8, 9) else warnings.catch_warnings():
        t = sagegen.sageattn(q, k, v, tensor_layout="NHD", config=cfg, backend="triton")
    r_cfg = cfg if cap >= (8, 9) else cfg.replace(pv_precision="fp16")
    r = sagegen.sageattn(q, k, v, tensor_layout="NHD", config=r_cfg, backend="reference")
    ref, _ = attention_fp64(*(x.transpose(1, 2) for x in (q, k, v)), sm_scale=128**-0.5)
    err = rel_l1(t.transpose(1, 2), ref)
    print(f"sm{cap[0]}{cap[1]} variant: vs emu {rel_l1(t, r):.2e}, vs fp64 {err:.4f}")
    assert rel_l1(t, r) < 1.5e-3 and err < 0.04


@pytest.mark.parametrize("cap", [None, (8, 0)], ids=["this-card", "ampere-sm80"])
@pytest.mark.parametrize("smooth_v", [False, True])
def test_fp16_pv_with_v_beyond_fp16_range_on_hardware(seed, monkeypatch, cap, smooth_v):
    """bf16 V at ~1e5 (past fp16's 65,504) on the fp16 P·V path, asked for (pv_precision="fp16") and as the
    Ampere variant switches to it, with a key-padding mask and GQA: finite, as accurate against fp64 as at unit
    scale, tracking the emulation; and exact: V with max |V| ~ 24,000 (scale 1) and the same V times 16 (scale
    16) give outputs 16x apart bit for bit (spec.FP16_V_EXP). Before, inf/NaN everywhere."""
    if cap is not None:
        monkeypatch.setenv("SAGEGEN_CAPABILITY", f"{cap[0]}.{cap[1]}")
    monkeypatch.setattr(sagegen.api, "_warned", set())
    cfg = SageConfig(smooth_v=smooth_v, pv_precision="fp16" if cap is None else "fp8")
    r_cfg = cfg.replace(pv_precision="fp16")
    q, k, v = qkv(2, 8, 4, 3000 + 7, 2500 + 3, 128, dtype=torch.bfloat16, device="cuda", layout="NHD")
    keep = torch.rand(2, 1, 1, 2503, device="cuda") > 0.2

    def run(v_, c, backend):
        return sagegen.sageattn(q, k, v_, tensor_layout="NHD", attn_mask=keep, config=c, backend=backend)

    def ref(v_):
        return attention_fp64(*(x.transpose(1, 2) for x in (q, k, v_)), sm_scale=128**-0.5,
                              mask=sagegen.api.normalize_mask(keep, 2, 2503))[0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the Ampere variant's switch to fp16 P·V
        unit = rel_l1(run(v, cfg, "triton").transpose(1, 2), ref(v))
        big = (v.float() * 1e5).bfloat16()
        t = run(big, cfg, "triton")
        v24 = (v.float() / v.float().abs().amax() * 24000).bfloat16()
        t24, t384 = run(v24, cfg, "triton"), run(v24 * 16, cfg, "triton")
    r = run(big, r_cfg, "reference")
    err = rel_l1(t.transpose(1, 2), ref(big))
    print(f"fp16 P·V, V ~ 1e5 ({cap or 'this card'}, smooth_v={smooth_v}): vs fp64 {err:.4f} (unit V {unit:.4f}), "
          f"vs emu {rel_l1(t, r):.2e}")
    assert torch.isfinite(t).all() and torch.isfinite(t384).all()
    assert err < 1.2 * unit + 1e-3 and rel_l1(t, r) < 4e-3
    assert torch.equal(t384, t24 * 16)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d", [64, 128])
def test_hadamard_rotation_tracks_emulation_on_hardware(seed, monkeypatch, kernel, d):
    """`qk_rotation="hadamard"` (the quantization pass turns Q and K; Gluon's in-kernel Q pass steps aside) on
    outlier channels: the kernels match the emulation, and both beat the unrotated kernel against fp64."""
    from sagegen.testing.attention_inputs import distribution_qkv

    cfg = _use_kernel(monkeypatch, kernel, SageConfig(smooth_v=True, qk_rotation="hadamard"))
    q, k, v = (t.cuda() for t in distribution_qkv("channel_bias_outliers", 4096 + 37, heads=8, head_dim=d, seed=5))
    t, lt = sagegen.sageattn(q, k, v, config=cfg, return_lse=True, backend="triton")
    r, lr = sagegen.sageattn(q, k, v, config=cfg, return_lse=True, backend="reference")
    plain = sagegen.sageattn(q, k, v, config=cfg.replace(qk_rotation="none"), backend="triton")
    ref, _ = attention_fp64(q, k, v, sm_scale=d**-0.5)
    print(f"{kernel} d={d}: vs emu {rel_l1(t, r):.2e}; vs fp64 rotated {rel_l1(t, ref):.4f}, "
          f"unrotated {rel_l1(plain, ref):.4f}")
    assert rel_l1(t, r) < 2e-4 and (lt - lr).abs().max() < 5e-3
    assert rel_l1(t, ref) < 0.8 * rel_l1(plain, ref)
