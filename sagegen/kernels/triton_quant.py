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
from .spec import EPS, FP8_MAX, INT8_MAX

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
def _kv_stats_kernel(
    K, V, KeyBias, KSum, VSum, VMin, VMax,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    H, N, D, N_BLOCKS,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, K_SUM: tl.constexpr, V_SUM: tl.constexpr,
    V_RANGE: tl.constexpr, KEY_MASK: tl.constexpr,
):
    """Per-tile partial statistics over tokens: K's and V's channel sums, V's channel min and max
    (keys masked out by a key-padding mask excluded)."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    out = (pid_bh * N_BLOCKS + pid_n) * HEAD_DIM + offs_d
    live = _live_keys(KeyBias, b, offs_n, N, KEY_MASK)
    if K_SUM:
        k, _ = _load_tile(K, b, h, offs_n, offs_d, stride_kb, stride_kh, stride_kn, stride_kd, N, D)
        tl.store(KSum + out, tl.sum(tl.where(live[:, None], k, 0.0), axis=0))
    if V_SUM or V_RANGE:
        v, valid = _load_tile(V, b, h, offs_n, offs_d, stride_vb, stride_vh, stride_vn, stride_vd, N, D)
        valid = valid & live[:, None]
        v = tl.where(valid, v, 0.0)
        if V_SUM:
            tl.store(VSum + out, tl.sum(v, axis=0))
        if V_RANGE:
            tl.store(VMin + out, tl.min(tl.where(valid, v, float("inf")), axis=0))
            tl.store(VMax + out, tl.max(tl.where(valid, v, float("-inf")), axis=0))


@triton.jit
def _kv_stats_finish_kernel(
    KSum, VSum, VMin, VMax, KeyBias, KMean, VMean, VScale, VInvScale,
    H, N, D, N_BLOCKS,
    HEAD_DIM: tl.constexpr, CHANNELS: tl.constexpr, K_SUM: tl.constexpr, V_SUM: tl.constexpr,
    V_RANGE: tl.constexpr, KEY_MASK: tl.constexpr, ROWS: tl.constexpr, COUNT_BLOCK: tl.constexpr,
):
    """One (batch, head) and CHANNELS channels per program: the per-tile partials of `_kv_stats_kernel` ->
    K's and V's channel means and V's FP8 scale and its inverse (one launch instead of a dozen small torch
    ops, which weigh on the quantization pass at short sequences). Padding channels get scale 1."""
    pid = tl.program_id(0)
    offs_d = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
    if KEY_MASK:  # live keys of this batch item
        live = tl.zeros([COUNT_BLOCK], dtype=tl.int32)
        for start in range(0, N, COUNT_BLOCK):
            offs = start + tl.arange(0, COUNT_BLOCK)
            bias = tl.load(KeyBias + (pid // H) * N + offs, mask=offs < N, other=float("-inf"))
            live += (bias > float("-inf")).to(tl.int32)
        count = tl.maximum(tl.sum(live, axis=0), 1).to(tl.float32)
    else:
        count = tl.full([], N, tl.int32).to(tl.float32)
    k_sum = tl.zeros([CHANNELS], dtype=tl.float32)
    v_sum = tl.zeros([CHANNELS], dtype=tl.float32)
    v_min = tl.full([CHANNELS], float("inf"), dtype=tl.float32)
    v_max = tl.full([CHANNELS], float("-inf"), dtype=tl.float32)
    for start in range(0, N_BLOCKS, ROWS):
        rows = start + tl.arange(0, ROWS)
        offs = (pid * N_BLOCKS + rows)[:, None] * HEAD_DIM + offs_d[None, :]
        ok = (rows < N_BLOCKS)[:, None]
        if K_SUM:
            k_sum += tl.sum(tl.load(KSum + offs, mask=ok, other=0.0), axis=0)
        if V_SUM:
            v_sum += tl.sum(tl.load(VSum + offs, mask=ok, other=0.0), axis=0)
        if V_RANGE:
            v_min = tl.minimum(v_min, tl.min(tl.load(VMin + offs, mask=ok, other=float("inf")), axis=0))
            v_max = tl.maximum(v_max, tl.max(tl.load(VMax + offs, mask=ok, other=float("-inf")), axis=0))
    out = pid * HEAD_DIM + offs_d
    v_mean = tl.math.div_rn(v_sum, count)
    if K_SUM:
        tl.store(KMean + out, tl.math.div_rn(k_sum, count))
    if V_SUM:
        tl.store(VMean + out, v_mean)
    if V_RANGE:
        if V_SUM:
            amax = tl.maximum(v_max - v_mean, v_mean - v_min)
        else:
            amax = tl.maximum(v_max, -v_min)
        amax = tl.where(offs_d < D, tl.maximum(amax, _EPS), _FP8_MAX)
        tl.store(VScale + out, tl.math.div_rn(amax, _FP8_MAX))
        tl.store(VInvScale + out, tl.math.div_rn(_FP8_MAX + tl.zeros_like(amax), amax))


@triton.jit
def _quant_kv_kernel(
    K, V, KeyBias, KMean, VMean, VInvScale, K8, KScale, VQ,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    H, N, D, N_PAD,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, SMOOTH_K: tl.constexpr, SMOOTH_V: tl.constexpr,
    K_PER_TOKEN: tl.constexpr, FP8: tl.constexpr, EXACT_FP8_CAST: tl.constexpr, KEY_MASK: tl.constexpr,
    PERMUTE_KEYS: tl.constexpr,
):
    """K -> int8 [B*H, N_PAD, HEAD_DIM] (smoothed), V -> fp8 [B*H, HEAD_DIM, N_PAD] (transposed, per-channel
    scale) or fp16 [B*H, N_PAD, HEAD_DIM], in one pass over the tile. PERMUTE_KEYS stores the FP8 V's keys in
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
        y = v * tl.load(VInvScale + stats)[None, :]
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
    v_scale: torch.Tensor | None  # fp32 [B, Hkv, D_pad] (fp8 only)
    v_mean: torch.Tensor | None  # fp32 [B, Hkv, D_pad] when smooth_v


STATS_BLOCK = 128


def _kv_stats(k, v, d_pad, k_sum, v_sum, v_range, key_bias=None):
    """Channel statistics of k and v [B, H, N, D] in one pass over them plus a small finishing launch:
    (k_mean, v_mean, v_scale, v_inv_scale), each [B*H, d_pad] fp32 or None (the FP8 scale of V, with V's
    mean taken out when v_sum); over the keys a key-padding bias [B, N] keeps, when given."""
    B, H, N, D = k.shape
    if not (k_sum or v_sum or v_range):
        return None, None, None, None
    nb = triton.cdiv(N, STATS_BLOCK)
    new = lambda flag: torch.empty(B * H, nb, d_pad, dtype=torch.float32, device=k.device) if flag else None
    ksum, vsum, vmin, vmax = new(k_sum), new(v_sum), new(v_range), new(v_range)
    dummy = next(t for t in (ksum, vsum, vmin) if t is not None)
    _kv_stats_kernel[(nb, B * H)](
        k, v, key_bias if key_bias is not None else dummy,
        *(t if t is not None else dummy for t in (ksum, vsum, vmin, vmax)),
        *k.stride(), *v.stride(), H, N, D, nb,
        BLOCK=STATS_BLOCK, HEAD_DIM=d_pad, K_SUM=k_sum, V_SUM=v_sum, V_RANGE=v_range,
        KEY_MASK=key_bias is not None, num_warps=QUANT_WARPS["stats"], enable_fp_fusion=True,
    )
    out = lambda flag: torch.empty(B * H, d_pad, dtype=torch.float32, device=k.device) if flag else None
    k_mean, v_mean, v_scale, v_inv_scale = out(k_sum), out(v_sum), out(v_range), out(v_range)
    channels = min(32, d_pad)
    _kv_stats_finish_kernel[(B * H, d_pad // channels)](
        *(t if t is not None else dummy for t in (ksum, vsum, vmin, vmax)),
        key_bias if key_bias is not None else dummy,
        *(t if t is not None else dummy for t in (k_mean, v_mean, v_scale, v_inv_scale)),
        H, N, D, nb, HEAD_DIM=d_pad, CHANNELS=channels, K_SUM=k_sum, V_SUM=v_sum, V_RANGE=v_range,
        KEY_MASK=key_bias is not None, ROWS=64, COUNT_BLOCK=1024, num_warps=4, enable_fp_fusion=True,
    )
    return k_mean, v_mean, v_scale, v_inv_scale


# Warps per CTA of the three quantization launches (bench/profile_quant.py --warps measures alternatives).
QUANT_WARPS = {"stats": 2, "q": 4, "kv": 4}  # stats: 2 warps 10-30 us faster than 4 (H200)


def quantize(q, k, v, config: SageConfig, block_q: int, block_k: int, d_pad: int,
             key_bias: torch.Tensor | None = None, permute_v_keys: bool = False,
             quantize_q: bool = True) -> QuantizedQKV:
    """Quantize q [B, Hq, Nq, D] and k, v [B, Hkv, Nk, D] (any strides) for the attention kernel.

    key_bias: a key-padding mask as an fp32 bias [B, Nk] (contiguous; -inf = masked). Masked keys are left
    out of the smoothing means and the scales, and quantize to zeros.
    permute_v_keys: store FP8 V's keys in `gluon_attn`'s order (see `_quant_kv_kernel`).
    quantize_q: False leaves Q to the attention kernel (`gluon_attn` quantizes it per CTA): q8 and q_scale
    are None.

    Launches: Q (one read; skipped with quantize_q=False), K/V channel statistics (one read of K and V, plus a
    small finishing launch), and K with V (one more read of each), writing int8 Q and K and fp8 (transposed)
    or fp16 V.
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
    k_mean, v_mean, v_scale, v_inv_scale = _kv_stats(k, v, d_pad, config.smooth_k, config.smooth_v, fp8, key_bias)
    if fp8:
        vq = torch.empty(B, Hkv, d_pad, nk_pad, dtype=torch.float8_e4m3fn, device=dev)
    else:
        vq = torch.empty(B, Hkv, nk_pad, d_pad, dtype=torch.float16, device=dev)
    k8 = torch.empty(B, Hkv, nk_pad, d_pad, dtype=torch.int8, device=dev)
    k_scale = torch.empty(B, Hkv, nk_pad, dtype=torch.float32, device=dev)
    dummy = k_scale
    _quant_kv_kernel[(nk_pad // block_k, B * Hkv)](
        k, v, key_bias if key_bias is not None else dummy,
        *(t if t is not None else dummy for t in (k_mean, v_mean, v_inv_scale)), k8, k_scale, vq,
        *k.stride(), *v.stride(), Hkv, Nk, D, nk_pad,
        BLOCK=block_k, HEAD_DIM=d_pad, SMOOTH_K=config.smooth_k, SMOOTH_V=config.smooth_v,
        K_PER_TOKEN=config.k_granularity == "per_token", FP8=fp8, EXACT_FP8_CAST=interpreting(),
        KEY_MASK=key_bias is not None, PERMUTE_KEYS=permute_v_keys and fp8, num_warps=QUANT_WARPS["kv"],
        enable_fp_fusion=True,
    )
    shape = (B, Hkv, d_pad)
    return QuantizedQKV(q8, q_scale, q_bm, k8, k_scale, k_mean.view(shape) if k_mean is not None else None,
                        vq, v_scale.view(shape) if v_scale is not None else None,
                        v_mean.view(shape) if v_mean is not None else None)
