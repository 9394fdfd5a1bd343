"""Triton quantization pass: smoothing, INT8 Q/K with their scales, FP8 (or fp16) V.

Reads the caller's tensors through their strides (either layout, non-contiguous views) and writes padded,
contiguous buffers in the form the attention kernel wants: Q and K as int8 [B, H, N_pad, D_pad], V as
fp8 e4m3 transposed to [B, H, D_pad, N_pad] (the FP8 tensor-core dot needs V K-major) or fp16 [B, H, N_pad, D_pad].
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..config import SageConfig
from .spec import EPS, FP8_MAX, INT8_MAX, SAMPLE_TOKENS, V_SCALE_MAX

# Kernels may only read module globals that are constexpr.
_EPS = tl.constexpr(EPS)
_FP8_MAX = tl.constexpr(FP8_MAX)
_INT8_MAX = tl.constexpr(INT8_MAX)


@triton.jit
def _round_half_away(x):
    return tl.where(x >= 0, x + 0.5, x - 0.5)


@triton.jit
def round_to_e4m3_grid(x):
    """Round fp32 to the nearest e4m3 value (ties to even) with fp32 adds.

    Only used under TRITON_INTERPRET: the interpreter's own float->fp8 cast mis-rounds values whose rounding
    carries into the next binade (e.g. 125.3 -> 64), so there the kernels round first and the cast is exact.
    On the GPU the hardware cast (round to nearest even, satfinite) is used directly.
    """
    bits = x.to(tl.int32, bitcast=True)
    exp = tl.maximum((bits >> 23) & 0xFF, 121)  # e4m3 subnormals share binade 2^-6's spacing of 2^-9
    magic = (((exp + 20) << 23) | 0x400000).to(tl.float32, bitcast=True)
    return (x + magic) - magic


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _load_tile(X, b, h, offs_n, offs_d, stride_xb, stride_xh, stride_xn, stride_xd, N, D):
    valid = (offs_n < N)[:, None] & (offs_d < D)[None, :]
    # int64 base: tensors past 2^31 elements must not wrap (the per-row terms stay within one batch item)
    ptrs = (X + b.to(tl.int64) * stride_xb + h.to(tl.int64) * stride_xh + offs_n[:, None] * stride_xn
            + offs_d[None, :] * stride_xd)
    return tl.load(ptrs, mask=valid, other=0.0).to(tl.float32), valid


@triton.jit
def _int8_quantize(x, BLOCK: tl.constexpr, PER_TOKEN: tl.constexpr):
    """Symmetric INT8 with one scale per row or per tile (x is zero outside the valid region)."""
    if PER_TOKEN:
        amax = tl.maximum(tl.max(tl.abs(x), axis=1), _EPS)
        scale = tl.math.div_rn(amax, _INT8_MAX)
        y = x * tl.math.div_rn(_INT8_MAX, amax)[:, None]
    else:
        amax = tl.maximum(tl.max(tl.max(tl.abs(x), axis=1), axis=0), _EPS)
        y = x * tl.math.div_rn(_INT8_MAX, amax)
        scale = tl.zeros([BLOCK], dtype=tl.float32) + tl.math.div_rn(amax, _INT8_MAX)
    y = tl.minimum(tl.maximum(_round_half_away(y), -_INT8_MAX), _INT8_MAX)
    return y.to(tl.int8), scale


@triton.jit
def _quant_q_kernel(
    X, Y, Scale, BlockMean,
    stride_xb, stride_xh, stride_xn, stride_xd,
    H, N, D, N_PAD,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_MEAN: tl.constexpr, PER_TOKEN: tl.constexpr,
):
    """Q -> int8 [B*H, N_PAD, HEAD_DIM] with per-row scales; with BLOCK_MEAN, smooth by the tile's mean."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    x, valid = _load_tile(X, pid_bh // H, pid_bh % H, offs_n, offs_d, stride_xb, stride_xh, stride_xn,
                          stride_xd, N, D)
    if BLOCK_MEAN:
        count = tl.minimum(N - pid_n * BLOCK, BLOCK).to(tl.float32)
        mu_blk = tl.sum(x, axis=0) / count
        tl.store(BlockMean + (pid_bh * (N_PAD // BLOCK) + pid_n) * HEAD_DIM + offs_d, mu_blk)
        x = tl.where(valid, x - mu_blk[None, :], 0.0)
    y, scale = _int8_quantize(x, BLOCK, PER_TOKEN)
    head = pid_bh.to(tl.int64) * N_PAD * HEAD_DIM  # int64: the int8 buffer may pass 2^31 elements
    tl.store(Y + head + offs_n[:, None] * HEAD_DIM + offs_d[None, :], y)
    tl.store(Scale + pid_bh * N_PAD + offs_n, scale)


@triton.jit
def _live_keys(KeyBias, b, offs_n, N, KEY_MASK: tl.constexpr):
    """Which keys of the tile a key-padding mask keeps (its bias is > -inf); all of them without one."""
    if KEY_MASK:
        bias = tl.load(KeyBias + b * N + offs_n, mask=offs_n < N, other=float("-inf"))
        return bias > float("-inf")
    return offs_n >= 0


@triton.jit
def _sample_sums_kernel(
    K, V, KeyBias, KSum, VSum, Count,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    H, N, D, N_SAMPLE,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, K_MEAN: tl.constexpr, V_MEAN: tl.constexpr,
    KEY_MASK: tl.constexpr,
):
    """Partial channel sums of K and V over ROWS of the sampled keys (t * N) // N_SAMPLE, t < N_SAMPLE
    (spec.SAMPLE_TOKENS), leaving out keys a key-padding mask drops, and how many keys were summed."""
    pid_c = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_d = tl.arange(0, HEAD_DIM)
    t = pid_c * ROWS + tl.arange(0, ROWS)
    idx = ((t.to(tl.int64) * N) // N_SAMPLE).to(tl.int32)
    use = ((t < N_SAMPLE) & _live_keys(KeyBias, b, idx, N, KEY_MASK))[:, None]
    part = pid_bh * tl.num_programs(0) + pid_c
    if K_MEAN:
        k, _ = _load_tile(K, b, h, idx, offs_d, stride_kb, stride_kh, stride_kn, stride_kd, N, D)
        tl.store(KSum + part * HEAD_DIM + offs_d, tl.sum(tl.where(use, k, 0.0), axis=0))
    if V_MEAN:
        v, _ = _load_tile(V, b, h, idx, offs_d, stride_vb, stride_vh, stride_vn, stride_vd, N, D)
        tl.store(VSum + part * HEAD_DIM + offs_d, tl.sum(tl.where(use, v, 0.0), axis=0))
    tl.store(Count + part, tl.sum(tl.sum(use.to(tl.float32), axis=1), axis=0))


@triton.jit
def _sample_means_kernel(KSum, VSum, Count, KMean, VMean, N_PARTS,
                         HEAD_DIM: tl.constexpr, PARTS: tl.constexpr, K_MEAN: tl.constexpr,
                         V_MEAN: tl.constexpr):
    """The partial sums of one (batch, head) -> K's and V's smoothing means, added in a fixed order."""
    pid_bh = tl.program_id(0)
    rows = tl.arange(0, PARTS)
    ok = rows < N_PARTS
    offs = (pid_bh * N_PARTS + rows)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    n = tl.maximum(tl.sum(tl.load(Count + pid_bh * N_PARTS + rows, mask=ok, other=0.0), axis=0), 1.0)
    out = pid_bh * HEAD_DIM + tl.arange(0, HEAD_DIM)
    if K_MEAN:
        k_sum = tl.sum(tl.load(KSum + offs, mask=ok[:, None], other=0.0), axis=0)
        tl.store(KMean + out, tl.math.div_rn(k_sum, n + tl.zeros_like(k_sum)))
    if V_MEAN:
        v_sum = tl.sum(tl.load(VSum + offs, mask=ok[:, None], other=0.0), axis=0)
        tl.store(VMean + out, tl.math.div_rn(v_sum, n + tl.zeros_like(v_sum)))


@triton.jit
def _quant_kv_kernel(
    K, V, KeyBias, KMean, VMean, K8, KScale, VQ, VScale, VInvScale,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    H, N, D, N_PAD,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, SMOOTH_K: tl.constexpr, SMOOTH_V: tl.constexpr,
    V_AMAX_MAX: tl.constexpr,
    K_PER_TOKEN: tl.constexpr, FP8: tl.constexpr, EXACT_FP8_CAST: tl.constexpr, KEY_MASK: tl.constexpr,
    PERMUTE_KEYS: tl.constexpr,
):
    """K -> int8 [B*H, N_PAD, HEAD_DIM] (smoothed), V -> fp8 [B*H, HEAD_DIM, N_PAD] (transposed, one scale
    per tile: VScale and VInvScale [B*H, N_PAD // BLOCK]) or fp16 [B*H, N_PAD, HEAD_DIM], in one pass over
    the tile. PERMUTE_KEYS stores the FP8 V's keys in
    the order `gluon_attn` feeds P to the tensor cores (within every 16 keys, bit 3 of the index moves
    below bits 1-2), so P needs no shuffles there."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    stats = pid_bh * HEAD_DIM + offs_d
    head = pid_bh.to(tl.int64) * N_PAD * HEAD_DIM  # int64: the 8-bit buffers may pass 2^31 elements

    live = _live_keys(KeyBias, b, offs_n, N, KEY_MASK)[:, None]  # masked keys quantize as zeros
    k, valid = _load_tile(K, b, h, offs_n, offs_d, stride_kb, stride_kh, stride_kn, stride_kd, N, D)
    if SMOOTH_K:
        k = k - tl.load(KMean + stats)[None, :]
    k = tl.where(valid & live, k, 0.0)
    k8, k_scale = _int8_quantize(k, BLOCK, K_PER_TOKEN)
    tl.store(K8 + head + offs_n[:, None] * HEAD_DIM + offs_d[None, :], k8)
    tl.store(KScale + pid_bh * N_PAD + offs_n, k_scale)

    v, valid = _load_tile(V, b, h, offs_n, offs_d, stride_vb, stride_vh, stride_vn, stride_vd, N, D)
    if SMOOTH_V:
        v = v - tl.load(VMean + stats)[None, :]
    v = tl.where(valid & live, v, 0.0)
    if FP8:
        amax = tl.minimum(tl.maximum(tl.max(tl.max(tl.abs(v), axis=1), axis=0), _EPS), V_AMAX_MAX)
        inv = tl.math.div_rn(_FP8_MAX + tl.zeros_like(amax), amax)
        blk = pid_bh * (N_PAD // BLOCK) + pid_n
        tl.store(VScale + blk, tl.math.div_rn(amax, _FP8_MAX + tl.zeros_like(amax)))
        tl.store(VInvScale + blk, inv)
        y = v * inv
        y = tl.minimum(tl.maximum(y, -_FP8_MAX), _FP8_MAX)
        if EXACT_FP8_CAST:
            y = round_to_e4m3_grid(y)
        vt = tl.trans(y.to(tl.float8e4nv))
        if PERMUTE_KEYS:  # a relabelling in registers, so the store stays contiguous
            vt = tl.reshape(tl.permute(tl.reshape(vt, (HEAD_DIM, BLOCK // 16, 2, 4, 2)), (0, 1, 3, 2, 4)),
                            (HEAD_DIM, BLOCK))
        tl.store(VQ + head + offs_d[:, None] * N_PAD + offs_n[None, :], vt)
    else:
        tl.store(VQ + head + offs_n[:, None] * HEAD_DIM + offs_d[None, :], v.to(tl.float16))


@dataclass
class QuantizedQKV:
    q8: torch.Tensor | None  # int8 [B, Hq, Nq_pad, D_pad]; None with quantize_q=False
    q_scale: torch.Tensor | None  # fp32 [B, Hq, Nq_pad], per row (per-block scales repeated)
    q_block_mean: torch.Tensor | None  # fp32 [B, Hq, nblocks_q, D_pad] when smooth_q
    k8: torch.Tensor  # int8 [B, Hkv, Nk_pad, D_pad]
    k_scale: torch.Tensor  # fp32 [B, Hkv, Nk_pad]
    k_mean: torch.Tensor | None  # fp32 [B, Hkv, D_pad] when smooth_k
    v: torch.Tensor  # fp8 [B, Hkv, D_pad, Nk_pad] or fp16 [B, Hkv, Nk_pad, D_pad]
    v_scale: torch.Tensor | None  # fp32 [B, Hkv, Nk_pad // block_k]: FP8 V's scale per key block (fp8 only)
    v_inv_scale: torch.Tensor | None  # its inverse, as the quantization used it
    v_mean: torch.Tensor | None  # fp32 [B, Hkv, D_pad] when smooth_v


SAMPLE_ROWS = 128  # sampled keys per program of the partial sums


def sample_means(k, v, d_pad, k_mean: bool, v_mean: bool, key_bias=None):
    """K's and V's smoothing means [B*H, d_pad] fp32 (or None) over the sampled keys (spec.SAMPLE_TOKENS) of
    k, v [B, H, N, D]; over the keys a key-padding bias [B, N] keeps, when given. Padding channels get 0.
    Two launches (partial sums, then their sum in a fixed order): deterministic, with many programs in flight."""
    B, H, N, D = k.shape
    if not (k_mean or v_mean):
        return None, None
    n_sample = min(N, SAMPLE_TOKENS)
    parts = triton.cdiv(n_sample, SAMPLE_ROWS)
    f32 = lambda *shape: torch.empty(*shape, dtype=torch.float32, device=k.device)
    ksum, vsum = (f32(B * H, parts, d_pad) if flag else None for flag in (k_mean, v_mean))
    count = f32(B * H, parts)
    pick = lambda t: t if t is not None else count
    _sample_sums_kernel[(parts, B * H)](
        k, v, pick(key_bias), pick(ksum), pick(vsum), count, *k.stride(), *v.stride(), H, N, D, n_sample,
        HEAD_DIM=d_pad, ROWS=SAMPLE_ROWS, K_MEAN=k_mean, V_MEAN=v_mean, KEY_MASK=key_bias is not None,
        num_warps=QUANT_WARPS["means"], enable_fp_fusion=True,
    )
    km, vm = (f32(B * H, d_pad) if flag else None for flag in (k_mean, v_mean))
    _sample_means_kernel[(B * H,)](
        pick(ksum), pick(vsum), count, pick(km), pick(vm), parts, HEAD_DIM=d_pad,
        PARTS=triton.next_power_of_2(parts), K_MEAN=k_mean, V_MEAN=v_mean, num_warps=4, enable_fp_fusion=True,
    )
    return km, vm


# Warps per CTA of the quantization launches (bench/profile_quant.py --warps measures alternatives).
QUANT_WARPS = {"means": 4, "q": 4, "kv": 4}


def quantize(q, k, v, config: SageConfig, block_q: int, block_k: int, d_pad: int,
             key_bias: torch.Tensor | None = None, permute_v_keys: bool = False,
             quantize_q: bool = True) -> QuantizedQKV:
    """Quantize q [B, Hq, Nq, D] and k, v [B, Hkv, Nk, D] (any strides) for the attention kernel.

    key_bias: a key-padding mask as an fp32 bias [B, Nk] (contiguous; -inf = masked). Masked keys are left
    out of the smoothing means and the scales, and quantize to zeros.
    permute_v_keys: store FP8 V's keys in `gluon_attn`'s order (see `_quant_kv_kernel`).
    quantize_q: False leaves Q to the attention kernel (`gluon_attn` quantizes it per CTA): q8 and q_scale
    are None.

    Launches: Q (one read; skipped with quantize_q=False), the smoothing means (a read of at most
    spec.SAMPLE_TOKENS keys of K and V), and K with V (one read of each), writing int8 Q and K and fp8
    (transposed, a power-of-two scale per key block) or fp16 V.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    nq_pad = triton.cdiv(Nq, block_q) * block_q
    nk_pad = triton.cdiv(Nk, block_k) * block_k
    dev = q.device
    q8 = q_scale = q_bm = None
    if quantize_q:
        q8 = torch.empty(B, Hq, nq_pad, d_pad, dtype=torch.int8, device=dev)
        q_scale = torch.empty(B, Hq, nq_pad, dtype=torch.float32, device=dev)
        if config.smooth_q:
            q_bm = torch.empty(B, Hq, nq_pad // block_q, d_pad, dtype=torch.float32, device=dev)
        _quant_q_kernel[(nq_pad // block_q, B * Hq)](
            q, q8, q_scale, q_bm if q_bm is not None else q_scale, *q.stride(), Hq, Nq, D, nq_pad,
            BLOCK=block_q, HEAD_DIM=d_pad, BLOCK_MEAN=config.smooth_q,
            PER_TOKEN=config.q_granularity == "per_token", num_warps=QUANT_WARPS["q"], enable_fp_fusion=True,
        )

    fp8 = config.pv_precision == "fp8"
    k_mean, v_mean = sample_means(k, v, d_pad, config.smooth_k, config.smooth_v, key_bias)
    v_scale = v_inv = None
    if fp8:
        vq = torch.empty(B, Hkv, d_pad, nk_pad, dtype=torch.float8_e4m3fn, device=dev)
        v_scale, v_inv = (torch.empty(B, Hkv, nk_pad // block_k, dtype=torch.float32, device=dev) for _ in "si")
    else:
        vq = torch.empty(B, Hkv, nk_pad, d_pad, dtype=torch.float16, device=dev)
    k8 = torch.empty(B, Hkv, nk_pad, d_pad, dtype=torch.int8, device=dev)
    k_scale = torch.empty(B, Hkv, nk_pad, dtype=torch.float32, device=dev)
    dummy = k_scale
    _quant_kv_kernel[(nk_pad // block_k, B * Hkv)](
        k, v, key_bias if key_bias is not None else dummy,
        *(t if t is not None else dummy for t in (k_mean, v_mean)), k8, k_scale, vq,
        *(t if t is not None else dummy for t in (v_scale, v_inv)), *k.stride(), *v.stride(), Hkv, Nk, D,
        nk_pad, BLOCK=block_k, HEAD_DIM=d_pad, SMOOTH_K=config.smooth_k, SMOOTH_V=config.smooth_v,
        V_AMAX_MAX=FP8_MAX * V_SCALE_MAX,
        K_PER_TOKEN=config.k_granularity == "per_token", FP8=fp8, EXACT_FP8_CAST=interpreting(),
        KEY_MASK=key_bias is not None, PERMUTE_KEYS=permute_v_keys and fp8, num_warps=QUANT_WARPS["kv"],
        enable_fp_fusion=True,
    )
    shape = (B, Hkv, d_pad)
    return QuantizedQKV(q8, q_scale, q_bm, k8, k_scale, k_mean.view(shape) if k_mean is not None else None,
                        vq, v_scale, v_inv, v_mean.view(shape) if v_mean is not None else None)
