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
def _quant_int8_kernel(
    X, Mean, Y, Scale, BlockMean,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_yb, stride_yh, stride_yn,
    stride_mb, stride_mh,
    stride_sb, stride_sh,
    stride_bmb, stride_bmh, stride_bmn,
    H, N, D,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
    SUB_MEAN: tl.constexpr, BLOCK_MEAN: tl.constexpr, PER_TOKEN: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    valid = (offs_n < N)[:, None] & (offs_d < D)[None, :]
    x_ptrs = X + b * stride_xb + h * stride_xh + offs_n[:, None] * stride_xn + offs_d[None, :] * stride_xd
    x = tl.load(x_ptrs, mask=valid, other=0.0).to(tl.float32)
    if SUB_MEAN:
        mu = tl.load(Mean + b * stride_mb + h * stride_mh + offs_d, mask=offs_d < D, other=0.0)
        x = x - mu[None, :]
    if BLOCK_MEAN:
        count = tl.minimum(N - pid_n * BLOCK, BLOCK).to(tl.float32)
        mu_blk = tl.sum(tl.where(valid, x, 0.0), axis=0) / count
        tl.store(BlockMean + b * stride_bmb + h * stride_bmh + pid_n * stride_bmn + offs_d, mu_blk)
        x = x - mu_blk[None, :]
    x = tl.where(valid, x, 0.0)
    if PER_TOKEN:
        amax = tl.max(tl.abs(x), axis=1)
        scale = tl.math.div_rn(tl.maximum(amax, _EPS), _INT8_MAX)
        y = tl.math.div_rn(x, scale[:, None])
    else:
        amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
        scale_blk = tl.math.div_rn(tl.maximum(amax, _EPS), _INT8_MAX)
        y = tl.math.div_rn(x, scale_blk)
        scale = tl.zeros([BLOCK], dtype=tl.float32) + scale_blk
    y = tl.minimum(tl.maximum(_round_half_away(y), -_INT8_MAX), _INT8_MAX)
    y_ptrs = Y + b * stride_yb + h * stride_yh + offs_n[:, None] * stride_yn + offs_d[None, :]
    tl.store(y_ptrs, y.to(tl.int8))
    tl.store(Scale + b * stride_sb + h * stride_sh + offs_n, scale)


@triton.jit
def _quant_v_kernel(
    X, Mean, Scale, Y,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_yb, stride_yh, stride_yn, stride_yd,
    stride_mb, stride_mh,
    H, N, D,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, SUB_MEAN: tl.constexpr, FP8: tl.constexpr,
    EXACT_FP8_CAST: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    valid = (offs_n < N)[:, None] & (offs_d < D)[None, :]
    x_ptrs = X + b * stride_xb + h * stride_xh + offs_n[:, None] * stride_xn + offs_d[None, :] * stride_xd
    x = tl.load(x_ptrs, mask=valid, other=0.0).to(tl.float32)
    if SUB_MEAN:
        mu = tl.load(Mean + b * stride_mb + h * stride_mh + offs_d, mask=offs_d < D, other=0.0)
        x = tl.where(valid, x - mu[None, :], 0.0)
    y_ptrs = Y + b * stride_yb + h * stride_yh + offs_n[:, None] * stride_yn + offs_d[None, :] * stride_yd
    if FP8:
        scale = tl.load(Scale + b * stride_mb + h * stride_mh + offs_d, mask=offs_d < D, other=1.0)
        y = tl.math.div_rn(x, scale[None, :])
        y = tl.minimum(tl.maximum(y, -_FP8_MAX), _FP8_MAX)
        if EXACT_FP8_CAST:
            y = round_to_e4m3_grid(y)
        tl.store(y_ptrs, y.to(tl.float8e4nv))
    else:
        tl.store(y_ptrs, x.to(tl.float16))


@dataclass
class QuantizedQKV:
    q8: torch.Tensor  # int8 [B, Hq, Nq_pad, D_pad]
    q_scale: torch.Tensor  # fp32 [B, Hq, Nq_pad], per row (per-block scales repeated)
    q_block_mean: torch.Tensor | None  # fp32 [B, Hq, nblocks_q, D_pad] when smooth_q
    k8: torch.Tensor  # int8 [B, Hkv, Nk_pad, D_pad]
    k_scale: torch.Tensor  # fp32 [B, Hkv, Nk_pad]
    k_mean: torch.Tensor | None  # fp32 [B, Hkv, D_pad] when smooth_k
    v: torch.Tensor  # fp8 [B, Hkv, D_pad, Nk_pad] or fp16 [B, Hkv, Nk_pad, D_pad]
    v_scale: torch.Tensor | None  # fp32 [B, Hkv, D_pad] (fp8 only)
    v_mean: torch.Tensor | None  # fp32 [B, Hkv, D_pad] when smooth_v


def _pad_dim(x: torch.Tensor, d_pad: int) -> torch.Tensor:
    """[B, H, D] fp32 -> contiguous [B, H, D_pad] with zeros."""
    out = torch.zeros(*x.shape[:-1], d_pad, dtype=torch.float32, device=x.device)
    out[..., : x.shape[-1]] = x
    return out


def _quant_int8(x, block, d_pad, n_pad, per_token, mean, block_mean):
    B, H, N, D = x.shape
    y = torch.empty(B, H, n_pad, d_pad, dtype=torch.int8, device=x.device)
    scale = torch.empty(B, H, n_pad, dtype=torch.float32, device=x.device)
    bm = torch.empty(B, H, n_pad // block, d_pad, dtype=torch.float32, device=x.device) if block_mean else None
    mean_arg = mean if mean is not None else scale
    bm_arg = bm if bm is not None else scale
    _quant_int8_kernel[(n_pad // block, B * H)](
        x, mean_arg, y, scale, bm_arg,
        *x.stride(),
        y.stride(0), y.stride(1), y.stride(2),
        mean_arg.stride(0), mean_arg.stride(1),
        scale.stride(0), scale.stride(1),
        bm_arg.stride(0), bm_arg.stride(1), bm_arg.stride(2) if bm is not None else 0,
        H, N, D,
        BLOCK=block, HEAD_DIM=d_pad, SUB_MEAN=mean is not None, BLOCK_MEAN=block_mean, PER_TOKEN=per_token,
    )
    return y, scale, bm


def quantize(q, k, v, config: SageConfig, block_q: int, block_k: int, d_pad: int) -> QuantizedQKV:
    """Quantize q [B, Hq, Nq, D] and k, v [B, Hkv, Nk, D] (any strides) for the attention kernel."""
    Nq, Nk = q.shape[2], k.shape[2]
    nq_pad = triton.cdiv(Nq, block_q) * block_q
    nk_pad = triton.cdiv(Nk, block_k) * block_k
    q8, q_scale, q_bm = _quant_int8(q, block_q, d_pad, nq_pad, config.q_granularity == "per_token",
                                    None, config.smooth_q)
    k_mean = _pad_dim(k.float().mean(dim=2), d_pad) if config.smooth_k else None
    k8, k_scale, _ = _quant_int8(k, block_k, d_pad, nk_pad, config.k_granularity == "per_token", k_mean, False)

    B, Hkv, _, D = v.shape
    v_mean = _pad_dim(v.float().mean(dim=2), d_pad) if config.smooth_v else None
    fp8 = config.pv_precision == "fp8"
    v_scale = None
    if fp8:
        vmin, vmax = torch.aminmax(v.float(), dim=2)
        if v_mean is not None:
            mu = v_mean[..., :D]
            amax = torch.maximum(vmax - mu, mu - vmin)
        else:
            amax = torch.maximum(vmax, -vmin)
        v_scale = _pad_dim(torch.clamp(amax, min=EPS) / FP8_MAX, d_pad)
        v_scale[..., D:] = 1.0
        vq = torch.empty(B, Hkv, d_pad, nk_pad, dtype=torch.float8_e4m3fn, device=v.device)
        y_strides = (vq.stride(0), vq.stride(1), vq.stride(3), vq.stride(2))
    else:
        vq = torch.empty(B, Hkv, nk_pad, d_pad, dtype=torch.float16, device=v.device)
        y_strides = vq.stride()
    stats = v_scale if v_scale is not None else (v_mean if v_mean is not None else q_scale)
    _quant_v_kernel[(nk_pad // block_k, B * Hkv)](
        v, v_mean if v_mean is not None else stats, stats, vq,
        *v.stride(), *y_strides, stats.stride(0), stats.stride(1),
        Hkv, Nk, D,
        BLOCK=block_k, HEAD_DIM=d_pad, SUB_MEAN=v_mean is not None, FP8=fp8, EXACT_FP8_CAST=interpreting(),
    )
    return QuantizedQKV(q8, q_scale, q_bm, k8, k_scale, k_mean, vq, v_scale, v_mean)
