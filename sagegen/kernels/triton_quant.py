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

from sagegen.config import SageConfig
from sagegen.kernels.spec import EPS, FP8_MAX, FP16_V_EXP, INT8_MAX, SAMPLE_TOKENS, cdiv, hadamard_signs

# Kernels may only read module globals that are constexpr.
_EPS = tl.constexpr(EPS)
_FP8_MAX = tl.constexpr(FP8_MAX)
_INT8_MAX = tl.constexpr(INT8_MAX)
_FP16_V_BIAS = tl.constexpr(126 + FP16_V_EXP)  # fp16 V's scale exponent k = max(0, biased exponent - this)


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
def _load_tile(X, b, h, offs_n, offs_d, stride_xb, stride_xh, stride_xn, stride_xd, N, D, PAD_D: tl.constexpr):
    # the head-dim bound only when the head dim is padded: a runtime bound along the contiguous dimension
    # splits the 16-byte loads into 2-byte ones (Triton 3.6 and 3.9 alike)
    valid = (offs_n < N)[:, None] & ((offs_d < D) | (not PAD_D))[None, :]
    # int64 base: tensors past 2^31 elements must not wrap (the per-row terms stay within one batch item)
    ptrs = (X + b.to(tl.int64) * stride_xb + h.to(tl.int64) * stride_xh + offs_n[:, None] * stride_xn
            + offs_d[None, :] * stride_xd)
    return tl.load(ptrs, mask=valid, other=0.0).to(tl.float32), valid


@triton.jit
def _hadamard_rows(x, Signs, offs_d, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2_D: tl.constexpr,
                   INV_SQRT_D: tl.constexpr):
    """x [BLOCK, HEAD_DIM] fp32 times diag(signs) · H / sqrt(HEAD_DIM) (``SageConfig.qk_rotation="hadamard"``):
    the signs, then a fast Walsh-Hadamard transform of each row in registers, log2(HEAD_DIM) butterfly stages of
    fp32 adds (exact up to their rounding, unlike a TF32 dot), then the scale."""
    x = x * tl.load(Signs + offs_d)[None, :]
    for i in tl.static_range(LOG2_D):  # butterflies of span h = 1, 2, 4, ... HEAD_DIM / 2
        # pair column j with j + h inside each group of 2h columns: (..., 2, h) -> last axis 2 to split
        y = tl.permute(tl.reshape(x, (BLOCK, HEAD_DIM >> (i + 1), 2, 1 << i)), (0, 1, 3, 2))
        a, b = tl.split(y)
        y = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
        x = tl.reshape(y, (BLOCK, HEAD_DIM))
    return x * INV_SQRT_D


@triton.jit
def _min_keep_nan(x, axis):
    """tl.min that returns NaN where the reduced values hold one (tl.min skips NaNs)."""
    return tl.where(tl.max((x != x).to(tl.int32), axis=axis) > 0, float("nan"), tl.min(x, axis=axis))


@triton.jit
def _max_keep_nan(x, axis):
    return tl.where(tl.max((x != x).to(tl.int32), axis=axis) > 0, float("nan"), tl.max(x, axis=axis))


@triton.jit
def _int8_quantize(x, BLOCK: tl.constexpr, PER_TOKEN: tl.constexpr):
    """Symmetric INT8 with one scale per row or per tile (x is zero outside the valid region). A NaN or inf in
    a row (tile) makes its scale NaN, so it propagates to the output (max() alone would drop a NaN): adding
    sum(x * 0) leaves a finite amax exactly as it is."""
    if PER_TOKEN:
        amax = tl.maximum(tl.max(tl.abs(x), axis=1), _EPS) + tl.sum(x * 0.0, axis=1)
        scale = tl.math.div_rn(amax, _INT8_MAX)
        y = x * tl.math.div_rn(_INT8_MAX, amax)[:, None]
    else:
        amax = tl.maximum(tl.max(tl.max(tl.abs(x), axis=1), axis=0), _EPS) + tl.sum(tl.sum(x * 0.0, axis=1), axis=0)
        y = x * tl.math.div_rn(_INT8_MAX, amax)
        scale = tl.zeros([BLOCK], dtype=tl.float32) + tl.math.div_rn(amax, _INT8_MAX)
    y = tl.minimum(tl.maximum(_round_half_away(y), -_INT8_MAX), _INT8_MAX)
    return y.to(tl.int8), scale


@triton.jit
def _quant_q_kernel(
    X, Y, Scale, BlockMean, Signs,
    stride_xb, stride_xh, stride_xn, stride_xd,
    H, N, D, N_PAD,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_MEAN: tl.constexpr, PER_TOKEN: tl.constexpr,
    PAD_D: tl.constexpr, ROTATE: tl.constexpr, LOG2_D: tl.constexpr, INV_SQRT_D: tl.constexpr,
):
    """Q -> int8 [B*H, N_PAD, HEAD_DIM] with per-row scales; with BLOCK_MEAN, smooth by the tile's mean (stored
    unrotated: the kernel's correction pairs it with K unrotated); with ROTATE, turned by `_hadamard_rows`."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    x, valid = _load_tile(X, pid_bh // H, pid_bh % H, offs_n, offs_d, stride_xb, stride_xh, stride_xn,
                          stride_xd, N, D, PAD_D)
    if BLOCK_MEAN:
        count = tl.minimum(N - pid_n * BLOCK, BLOCK).to(tl.float32)
        mu_blk = tl.sum(x, axis=0) / count
        tl.store(BlockMean + (pid_bh * (N_PAD // BLOCK) + pid_n) * HEAD_DIM + offs_d, mu_blk)
        x = tl.where(valid, x - mu_blk[None, :], 0.0)
    if ROTATE:
        x = _hadamard_rows(x, Signs, offs_d, BLOCK, HEAD_DIM, LOG2_D, INV_SQRT_D)
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
    K, V, KeyBias, KSum, VSum, Count, VMin, VMax,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    H, N, D, N_BLOCKS, N_SAMPLE, N_PARTS,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, K_MEAN: tl.constexpr,
    V_MEAN: tl.constexpr, V_RANGE: tl.constexpr, KEY_MASK: tl.constexpr, PAD_D: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Partial statistics, BLOCK keys per program, read ROWS at a time (few registers, many programs):
    - V_RANGE: V's channel min and max over key tile pid_n (every key: the FP8 scale must cover them all);
    - K_MEAN / V_MEAN, programs pid_n < N_PARTS: K's and V's channel sums over BLOCK of the sampled keys
      (t * N) // N_SAMPLE (spec.SAMPLE_TOKENS), and how many were summed.
    Keys a key-padding mask drops are left out of both."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_d = tl.arange(0, HEAD_DIM)
    # elementwise running min / max / sums over the row chunks, reduced across rows once at the end
    if V_RANGE:
        v_min = tl.full([ROWS, HEAD_DIM], float("inf"), dtype=tl.float32)
        v_max = tl.full([ROWS, HEAD_DIM], float("-inf"), dtype=tl.float32)
        for r in tl.range(0, BLOCK, ROWS, num_stages=STAGES):
            offs_n = pid_n * BLOCK + r + tl.arange(0, ROWS)
            v, valid = _load_tile(V, b, h, offs_n, offs_d, stride_vb, stride_vh, stride_vn, stride_vd, N, D, PAD_D)
            valid = valid & _live_keys(KeyBias, b, offs_n, N, KEY_MASK)[:, None]
            # a NaN in V makes its channel's range NaN (so its scale, so its output column, as the emulation)
            v_min = tl.minimum(v_min, tl.where(valid, v, float("inf")), propagate_nan=tl.PropagateNan.ALL)
            v_max = tl.maximum(v_max, tl.where(valid, v, float("-inf")), propagate_nan=tl.PropagateNan.ALL)
        out = (pid_bh * N_BLOCKS + pid_n) * HEAD_DIM + offs_d
        tl.store(VMin + out, _min_keep_nan(v_min, 0))
        tl.store(VMax + out, _max_keep_nan(v_max, 0))
    if K_MEAN or V_MEAN:
        if pid_n < N_PARTS:
            k_sum = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
            v_sum = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
            count = tl.zeros([ROWS], dtype=tl.float32)
            for r in range(0, BLOCK, ROWS):
                t = pid_n * BLOCK + r + tl.arange(0, ROWS)
                idx = ((t.to(tl.int64) * N) // N_SAMPLE).to(tl.int32)  # >= N (so not loaded) past the sample
                use = (t < N_SAMPLE) & _live_keys(KeyBias, b, idx, N, KEY_MASK)
                count += use.to(tl.float32)
                if K_MEAN:
                    k, _ = _load_tile(K, b, h, idx, offs_d, stride_kb, stride_kh, stride_kn, stride_kd, N, D, PAD_D)
                    k_sum += tl.where(use[:, None], k, 0.0)
                if V_MEAN:
                    v, _ = _load_tile(V, b, h, idx, offs_d, stride_vb, stride_vh, stride_vn, stride_vd, N, D, PAD_D)
                    v_sum += tl.where(use[:, None], v, 0.0)
            part = pid_bh * N_PARTS + pid_n
            if K_MEAN:
                tl.store(KSum + part * HEAD_DIM + offs_d, tl.sum(k_sum, axis=0))
            if V_MEAN:
                tl.store(VSum + part * HEAD_DIM + offs_d, tl.sum(v_sum, axis=0))
            tl.store(Count + part, tl.sum(count, axis=0))


@triton.jit
def _kv_stats_finish_kernel(
    KSum, VSum, Count, VMin, VMax, KMean, VMean, VScale, VInvScale,
    D, N_BLOCKS, N_PARTS,
    HEAD_DIM: tl.constexpr, CHANNELS: tl.constexpr, K_MEAN: tl.constexpr, V_MEAN: tl.constexpr,
    V_RANGE: tl.constexpr, ROWS: tl.constexpr, FP8: tl.constexpr,
):
    """One (batch, head) and CHANNELS channels per program: the partials of `_kv_stats_kernel`, added in a
    fixed order (deterministic) -> K's and V's smoothing means and V's scale and its inverse: FP8's, or with
    FP8=False fp16's power of two (spec.FP16_V_EXP). One launch instead of a dozen small torch ops, which weigh
    on the pass at short sequences. Padding channels get scale 1."""
    pid = tl.program_id(0)
    offs_d = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
    out = pid * HEAD_DIM + offs_d
    v_mean = tl.zeros([CHANNELS], dtype=tl.float32)
    if K_MEAN or V_MEAN:
        k_sum = tl.zeros([CHANNELS], dtype=tl.float32)
        v_sum = tl.zeros([CHANNELS], dtype=tl.float32)
        count = tl.zeros([ROWS], dtype=tl.float32)
        for start in range(0, N_PARTS, ROWS):
            rows = start + tl.arange(0, ROWS)
            ok = rows < N_PARTS
            offs = (pid * N_PARTS + rows)[:, None] * HEAD_DIM + offs_d[None, :]
            count += tl.load(Count + pid * N_PARTS + rows, mask=ok, other=0.0)
            if K_MEAN:
                k_sum += tl.sum(tl.load(KSum + offs, mask=ok[:, None], other=0.0), axis=0)
            if V_MEAN:
                v_sum += tl.sum(tl.load(VSum + offs, mask=ok[:, None], other=0.0), axis=0)
        n = tl.maximum(tl.sum(count, axis=0), 1.0) + tl.zeros([CHANNELS], dtype=tl.float32)
        v_mean = tl.math.div_rn(v_sum, n)
        if K_MEAN:
            tl.store(KMean + out, tl.math.div_rn(k_sum, n))
        if V_MEAN:
            tl.store(VMean + out, v_mean)
    if V_RANGE:
        v_min = tl.full([CHANNELS], float("inf"), dtype=tl.float32)
        v_max = tl.full([CHANNELS], float("-inf"), dtype=tl.float32)
        for start in range(0, N_BLOCKS, ROWS):
            rows = start + tl.arange(0, ROWS)
            offs = (pid * N_BLOCKS + rows)[:, None] * HEAD_DIM + offs_d[None, :]
            ok = (rows < N_BLOCKS)[:, None]
            lo = _min_keep_nan(tl.load(VMin + offs, mask=ok, other=float("inf")), 0)
            hi = _max_keep_nan(tl.load(VMax + offs, mask=ok, other=float("-inf")), 0)
            v_min = tl.minimum(v_min, lo, propagate_nan=tl.PropagateNan.ALL)
            v_max = tl.maximum(v_max, hi, propagate_nan=tl.PropagateNan.ALL)
        # max |v - mean| from the range: fl(v - mean) is monotone in v, so this is exact
        amax = tl.maximum(v_max - v_mean, v_mean - v_min, propagate_nan=tl.PropagateNan.ALL)
        if FP8:
            amax = tl.where(offs_d < D, tl.maximum(amax, _EPS, propagate_nan=tl.PropagateNan.ALL), _FP8_MAX)
            tl.store(VScale + out, tl.math.div_rn(amax, _FP8_MAX))
            tl.store(VInvScale + out, tl.math.div_rn(tl.zeros_like(amax) + _FP8_MAX, amax))
        else:  # 2^k and 2^-k from amax's exponent bits (reference.fp16_v_scale); k = 0 for inf, NaN (and -inf:
            # every key masked) and padding channels
            e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
            k = tl.where((e == 255) | (offs_d >= D), 0, tl.maximum(e - _FP16_V_BIAS, 0))
            tl.store(VScale + out, ((k + 127) << 23).to(tl.float32, bitcast=True))
            tl.store(VInvScale + out, ((127 - k) << 23).to(tl.float32, bitcast=True))


@triton.jit
def _quant_kv_kernel(
    K, V, KeyBias, KMean, VMean, VInvScale, K8, KScale, VQ, Signs,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    H, N, D, N_PAD,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, SMOOTH_K: tl.constexpr, SMOOTH_V: tl.constexpr,
    K_PER_TOKEN: tl.constexpr, FP8: tl.constexpr, EXACT_FP8_CAST: tl.constexpr, KEY_MASK: tl.constexpr,
    PERMUTE_KEYS: tl.constexpr, PAD_D: tl.constexpr, ROTATE: tl.constexpr, LOG2_D: tl.constexpr,
    INV_SQRT_D: tl.constexpr,
):
    """K -> int8 [B*H, N_PAD, HEAD_DIM] (smoothed), V -> fp8 [B*H, HEAD_DIM, N_PAD] (transposed, per-channel
    scale) or fp16 [B*H, N_PAD, HEAD_DIM] (per-channel power-of-two scale, 1 unless fp16 would overflow), in one
    pass over the tile. PERMUTE_KEYS stores the FP8 V's keys in
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
    k, valid = _load_tile(K, b, h, offs_n, offs_d, stride_kb, stride_kh, stride_kn, stride_kd, N, D, PAD_D)
    if SMOOTH_K:
        k = k - tl.load(KMean + stats)[None, :]
    k = tl.where(valid & live, k, 0.0)
    if ROTATE:  # after the smoothing, as the emulation (masked keys stay zeros)
        k = _hadamard_rows(k, Signs, offs_d, BLOCK, HEAD_DIM, LOG2_D, INV_SQRT_D)
    k8, k_scale = _int8_quantize(k, BLOCK, K_PER_TOKEN)
    tl.store(K8 + head + offs_n[:, None] * HEAD_DIM + offs_d[None, :], k8)
    tl.store(KScale + pid_bh * N_PAD + offs_n, k_scale)

    v, valid = _load_tile(V, b, h, offs_n, offs_d, stride_vb, stride_vh, stride_vn, stride_vd, N, D, PAD_D)
    if SMOOTH_V:
        v = v - tl.load(VMean + stats)[None, :]
    v = tl.where(valid & live, v, 0.0)
    if FP8:
        y = v * tl.load(VInvScale + stats)[None, :]
        y = tl.minimum(tl.maximum(y, -_FP8_MAX), _FP8_MAX)  # (a NaN in V made its channel's scale NaN)
        if EXACT_FP8_CAST:
            y = round_to_e4m3_grid(y)
        vt = tl.trans(y.to(tl.float8e4nv))
        if PERMUTE_KEYS:  # a relabelling in registers, so the store stays contiguous
            vt = tl.reshape(tl.permute(tl.reshape(vt, (HEAD_DIM, BLOCK // 16, 2, 4, 2)), (0, 1, 3, 2, 4)),
                            (HEAD_DIM, BLOCK))
        tl.store(VQ + head + offs_d[:, None] * N_PAD + offs_n[None, :], vt)
    else:
        y = v * tl.load(VInvScale + stats)[None, :]  # 2^-k: exact
        tl.store(VQ + head + offs_n[:, None] * HEAD_DIM + offs_d[None, :], y.to(tl.float16))


_SIGNS: dict = {}


def _signs(d: int, device) -> torch.Tensor:
    """`spec.hadamard_signs(d)` as an fp32 tensor on ``device`` (kept per device)."""
    key = (d, str(device))
    if key not in _SIGNS:
        _SIGNS[key] = torch.tensor(hadamard_signs(d), dtype=torch.float32, device=device)
    return _SIGNS[key]


def _turn(d_pad: int) -> dict:
    """The rotation's compile-time constants (unused without ROTATE)."""
    return {"LOG2_D": d_pad.bit_length() - 1, "INV_SQRT_D": d_pad ** -0.5}


@dataclass
class QuantizedQKV:
    q8: torch.Tensor | None  # int8 [B, Hq, Nq_pad, D_pad]; None with quantize_q=False
    q_scale: torch.Tensor | None  # fp32 [B, Hq, Nq_pad], per row (per-block scales repeated)
    q_block_mean: torch.Tensor | None  # fp32 [B, Hq, nblocks_q, D_pad] when smooth_q
    k8: torch.Tensor  # int8 [B, Hkv, Nk_pad, D_pad]
    k_scale: torch.Tensor  # fp32 [B, Hkv, Nk_pad]
    k_mean: torch.Tensor | None  # fp32 [B, Hkv, D_pad] when smooth_k
    v: torch.Tensor  # fp8 [B, Hkv, D_pad, Nk_pad] or fp16 [B, Hkv, Nk_pad, D_pad]
    v_scale: torch.Tensor | None  # fp32 [B, Hkv, D_pad]: FP8's, or fp16's power of two (spec.FP16_V_EXP)
    v_mean: torch.Tensor | None  # fp32 [B, Hkv, D_pad] when smooth_v


STATS_BLOCK = 128  # keys per program of the statistics launch (and sampled keys per partial sum)
STATS_ROWS = 32  # rows it reads at a time
STATS_STAGES = 3  # software-pipeline stages of its loop over V's rows: 96 vs 111 us unpipelined (H200, hd128 8k)


def _kv_stats(k, v, d_pad, k_mean, v_mean, v_range, key_bias=None, fp8=True):
    """Channel statistics of k and v [B, H, N, D]: (k_mean, v_mean, v_scale, v_inv_scale), each [B*H, d_pad]
    fp32 or None. The smoothing means are over the sampled keys (spec.SAMPLE_TOKENS); V's scale (FP8's, or
    with fp8=False fp16's power of two; with V's mean taken out when v_mean) covers every key, so only V is
    read in full. Over the keys a key-padding
    bias [B, N] keeps, when given. Two launches: partials, then a small finishing one."""
    B, H, N, D = k.shape
    if not (k_mean or v_mean or v_range):
        return None, None, None, None
    nb = cdiv(N, STATS_BLOCK)
    n_sample = min(N, SAMPLE_TOKENS)
    parts = cdiv(n_sample, STATS_BLOCK)
    f32 = lambda flag, *shape: torch.empty(*shape, dtype=torch.float32, device=k.device) if flag else None
    ksum, vsum = f32(k_mean, B * H, parts, d_pad), f32(v_mean, B * H, parts, d_pad)
    count = torch.empty(B * H, parts, dtype=torch.float32, device=k.device)
    vmin, vmax = f32(v_range, B * H, nb, d_pad), f32(v_range, B * H, nb, d_pad)
    pick = lambda t: t if t is not None else count
    grid = (max(nb if v_range else 0, parts if (k_mean or v_mean) else 0), B * H)
    _kv_stats_kernel[grid](
        k, v, pick(key_bias), pick(ksum), pick(vsum), count, pick(vmin), pick(vmax),
        *k.stride(), *v.stride(), H, N, D, nb, n_sample, parts,
        BLOCK=STATS_BLOCK, HEAD_DIM=d_pad, ROWS=STATS_ROWS, K_MEAN=k_mean, V_MEAN=v_mean, V_RANGE=v_range,
        KEY_MASK=key_bias is not None, PAD_D=D != d_pad, STAGES=STATS_STAGES,
        num_warps=QUANT_WARPS["stats"], enable_fp_fusion=True,
    )
    km, vm = f32(k_mean, B * H, d_pad), f32(v_mean, B * H, d_pad)
    v_scale, v_inv_scale = f32(v_range, B * H, d_pad), f32(v_range, B * H, d_pad)
    channels = min(32, d_pad)
    _kv_stats_finish_kernel[(B * H, d_pad // channels)](
        pick(ksum), pick(vsum), count, pick(vmin), pick(vmax), pick(km), pick(vm), pick(v_scale),
        pick(v_inv_scale), D, nb, parts, HEAD_DIM=d_pad, CHANNELS=channels, K_MEAN=k_mean, V_MEAN=v_mean,
        V_RANGE=v_range, ROWS=64, FP8=fp8, num_warps=4, enable_fp_fusion=True,
    )
    return km, vm, v_scale, v_inv_scale


# Warps per CTA of the three quantization launches (lab/probes/profile_quant.py --warps measures alternatives).
# H200, hd128 8k: statistics 111 us with 2 warps, 167 with 4, 188 with 8; K/V 249 us with 4 warps, 329 with 8.
QUANT_WARPS = {"stats": 2, "q": 4, "kv": 4}


def quantize(q, k, v, config: SageConfig, block_q: int, block_k: int, d_pad: int,
             key_bias: torch.Tensor | None = None, permute_v_keys: bool = False,
             quantize_q: bool = True) -> QuantizedQKV:
    """Quantize q [B, Hq, Nq, D] and k, v [B, Hkv, Nk, D] (any strides) for the attention kernel.

    key_bias: a key-padding mask as an fp32 bias [B, Nk] (contiguous; -inf = masked). Masked keys are left
    out of the smoothing means and the scales, and quantize to zeros.
    permute_v_keys: store FP8 V's keys in `gluon_attn`'s order (see `_quant_kv_kernel`).
    quantize_q: False leaves Q to the attention kernel (`gluon_attn` quantizes it per CTA): q8 and q_scale
    are None.

    Launches: Q (one read; skipped with quantize_q=False), K/V channel statistics (one read of V for its range:
    the FP8 scales, or fp16's overflow guard, spec.FP16_V_EXP; and of the sampled keys for the smoothing means;
    plus a small finishing launch), and K with V (one read of each), writing int8 Q and K and fp8 (transposed)
    or fp16 V.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    rotate = config.qk_rotation == "hadamard"
    signs = _signs(D, q.device) if rotate else None  # (raises for a head dim that is not a power of two)
    nq_pad = cdiv(Nq, block_q) * block_q
    nk_pad = cdiv(Nk, block_k) * block_k
    dev = q.device
    q8 = q_scale = q_bm = None
    if quantize_q:
        q8 = torch.empty(B, Hq, nq_pad, d_pad, dtype=torch.int8, device=dev)
        q_scale = torch.empty(B, Hq, nq_pad, dtype=torch.float32, device=dev)
        if config.smooth_q:
            q_bm = torch.empty(B, Hq, nq_pad // block_q, d_pad, dtype=torch.float32, device=dev)
        _quant_q_kernel[(nq_pad // block_q, B * Hq)](
            q, q8, q_scale, q_bm if q_bm is not None else q_scale, signs if rotate else q_scale, *q.stride(), Hq,
            Nq, D, nq_pad, BLOCK=block_q, HEAD_DIM=d_pad, BLOCK_MEAN=config.smooth_q,
            PER_TOKEN=config.q_granularity == "per_token", PAD_D=D != d_pad, ROTATE=rotate, **_turn(d_pad),
            num_warps=QUANT_WARPS["q"],
            enable_fp_fusion=True,
        )

    fp8 = config.pv_precision == "fp8"
    # V's range for its scale: FP8's, or fp16's overflow guard (spec.FP16_V_EXP)
    k_mean, v_mean, v_scale, v_inv_scale = _kv_stats(k, v, d_pad, config.smooth_k, config.smooth_v, True, key_bias,
                                                     fp8)
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
        signs if rotate else dummy, *k.stride(), *v.stride(), Hkv, Nk, D, nk_pad,
        BLOCK=block_k, HEAD_DIM=d_pad, SMOOTH_K=config.smooth_k, SMOOTH_V=config.smooth_v,
        K_PER_TOKEN=config.k_granularity == "per_token", FP8=fp8, EXACT_FP8_CAST=interpreting(),
        KEY_MASK=key_bias is not None, PERMUTE_KEYS=permute_v_keys and fp8, PAD_D=D != d_pad, ROTATE=rotate,
        **_turn(d_pad),
        num_warps=QUANT_WARPS["kv"],
        enable_fp_fusion=True,
    )
    shape = (B, Hkv, d_pad)
    return QuantizedQKV(q8, q_scale, q_bm, k8, k_scale, k_mean.view(shape) if k_mean is not None else None,
                        vq, v_scale.view(shape) if v_scale is not None else None,
                        v_mean.view(shape) if v_mean is not None else None)
