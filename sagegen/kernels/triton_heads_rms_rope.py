"""An RMSNorm across all heads followed by Wan's (or LTX-Video's) rotary embeddings, in one Triton pass.

Wan's attention processor (diffusers ``WanAttnProcessor``) normalises the whole projection of a token,
``torch.nn.RMSNorm(heads · head_dim)`` (qk_norm "rms_norm_across_heads"), splits it into heads, and rotates
neighbouring channel pairs with one (cos, sin) per pair shared by the heads: for pair i of token n,
out[2i] = x[2i]·cos[n, i] - x[2i+1]·sin[n, i] and out[2i+1] = x[2i]·sin[n, i] + x[2i+1]·cos[n, i], computed
in the tables' dtype and written to the activations' dtype. Eagerly that is the norm plus about ten kernels
over strided copies; here one program per block of tokens reads the token rows twice (the sum of squares
across heads, then the norm and rotation per head, the second read mostly from L2) and writes once, into any
strided output such as a [B, N, H, D] attention buffer.

Roundings as the eager ops: the normalised value x·rsqrt(mean(x²) + eps)·weight is computed in fp32 and
rounded once to the activations' dtype (torch.nn.RMSNorm's fused form); the rotation then runs
* in fp32 for fp32 tables (products and sum rounded in fp32, no FMA contraction), then rounded once;
* in fp64 for fp64 tables (Wan builds them in float64 and keeps them so when loaded with from_pretrained),
  then rounded to fp32 and to the half dtype, as torch's double -> bfloat16 cast does;
* with every product and the sum rounded to the half dtype for half-precision tables (a model cast whole
  with ``.to(torch.bfloat16)``), as eager half arithmetic does.

LTX-Video normalises the same way and rotates with fp32 tables of one (cos, sin) per channel of every head
and sample, [B, N, H·D]: out[2i] = x[2i]·cos[2i] - x[2i+1]·sin[2i], out[2i+1] = x[2i+1]·cos[2i+1] +
x[2i]·sin[2i+1] (``per_channel_rope``), in fp32 with every product rounded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sagegen.kernels.spec import cdiv, next_power_of_2
from sagegen.kernels.triton_qk_prologue import FP_FUSION, _to_out
from sagegen.kernels.triton_quant import interpreting

_TABLE_FP32, _TABLE_FP64, _TABLE_HALF = 0, 1, 2


@triton.jit
def _heads_rms_rope_kernel(
    X, Out, W, Cos, Sin,
    stride_xb, stride_xn, stride_xh, stride_xd,
    stride_ob, stride_on, stride_oh, stride_od,
    stride_cb, stride_cn, stride_cd,
    H, N, D, eps,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    ROPE: tl.constexpr, TABLE: tl.constexpr, CHANNEL_TABLE: tl.constexpr, EXACT_CAST: tl.constexpr,
    FULL_D: tl.constexpr,
):
    pid_n = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_n < N
    if FULL_D:
        ok = rows[:, None] & (offs_d < HEAD_DIM)[None, :]
    else:
        ok = rows[:, None] & (offs_d < D)[None, :]
    x_ptrs = X + b * stride_xb + offs_n[:, None].to(tl.int64) * stride_xn + offs_d[None, :] * stride_xd
    o_ptrs = Out + b * stride_ob + offs_n[:, None].to(tl.int64) * stride_on + offs_d[None, :] * stride_od
    dt: tl.constexpr = Out.dtype.element_ty
    rstd = tl.zeros([BLOCK_N], dtype=tl.float32)
    if HAS_NORM:
        ssq = tl.zeros([BLOCK_N], dtype=tl.float32)
        for h in range(0, H):
            x = tl.load(x_ptrs + h * stride_xh, mask=ok, other=0.0).to(tl.float32)
            ssq += tl.sum(x * x, axis=1)
        rstd = tl.math.rsqrt(ssq / (H * D) + eps)  # as torch.rsqrt(x.float().pow(2).mean(-1) + eps)
    if ROPE and not CHANNEL_TABLE:  # one angle per channel pair, shared by the heads: loaded once per token block
        offs_i = tl.arange(0, HEAD_DIM // 2)
        t_ok = rows[:, None] & (offs_i < (HEAD_DIM if FULL_D else D) // 2)[None, :]
        t_off = offs_n[:, None].to(tl.int64) * stride_cn + offs_i[None, :] * stride_cd
        c = tl.load(Cos + t_off, mask=t_ok, other=1.0)
        s = tl.load(Sin + t_off, mask=t_ok, other=0.0)
        if TABLE == 2:
            c = c.to(tl.float32)
            s = s.to(tl.float32)
    for h in range(0, H):
        x = tl.load(x_ptrs + h * stride_xh, mask=ok, other=0.0).to(tl.float32)
        if HAS_NORM:
            x = x * rstd[:, None]
            if HAS_WEIGHT:
                x = x * tl.load(W + h * D + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)[None, :]
            x = _to_out(x, dt, EXACT_CAST).to(tl.float32)
        y = x
        if ROPE and CHANNEL_TABLE:  # LTX: fp32 (cos, sin) per batch, token and channel of all heads [B, N, H·D]
            xe, xo = tl.split(tl.reshape(x, [BLOCK_N, HEAD_DIM // 2, 2]))
            t_off = b * stride_cb + offs_n[:, None].to(tl.int64) * stride_cn + (h * D + offs_d[None, :]) * stride_cd
            ce, co = tl.split(tl.reshape(tl.load(Cos + t_off, mask=ok, other=1.0), [BLOCK_N, HEAD_DIM // 2, 2]))
            se, so = tl.split(tl.reshape(tl.load(Sin + t_off, mask=ok, other=0.0), [BLOCK_N, HEAD_DIM // 2, 2]))
            y = tl.reshape(tl.join(xe * ce - xo * se, xo * co + xe * so), [BLOCK_N, HEAD_DIM])
        elif ROPE:
            xe, xo = tl.split(tl.reshape(x, [BLOCK_N, HEAD_DIM // 2, 2]))
            if TABLE == 1:  # fp64 arithmetic, then double -> float -> half as torch casts
                xe = xe.to(tl.float64)
                xo = xo.to(tl.float64)
                ye = (xe * c - xo * s).to(tl.float32)
                yo = (xe * s + xo * c).to(tl.float32)
            elif TABLE == 2:  # half arithmetic: every product and the sum rounded to the half dtype
                ye = _to_out(_to_out(xe * c, dt, EXACT_CAST).to(tl.float32)
                             - _to_out(xo * s, dt, EXACT_CAST).to(tl.float32), dt, EXACT_CAST).to(tl.float32)
                yo = _to_out(_to_out(xe * s, dt, EXACT_CAST).to(tl.float32)
                             + _to_out(xo * c, dt, EXACT_CAST).to(tl.float32), dt, EXACT_CAST).to(tl.float32)
            else:
                ye = xe * c - xo * s
                yo = xe * s + xo * c
            y = tl.reshape(tl.join(ye, yo), [BLOCK_N, HEAD_DIM])
        tl.store(o_ptrs + h * stride_oh, _to_out(y, dt, EXACT_CAST), mask=ok)


_TABLE_KIND = {torch.float32: _TABLE_FP32, torch.float64: _TABLE_FP64,
               torch.bfloat16: _TABLE_HALF, torch.float16: _TABLE_HALF}


def heads_rms_norm_rope(x: torch.Tensor, norm: tuple[torch.Tensor | None, float] | None,
                        rope: tuple[torch.Tensor, torch.Tensor] | None,
                        out: torch.Tensor | None = None, *, per_channel_rope: bool = False) -> torch.Tensor:
    """RMSNorm over all heads of each token, then rotary embeddings of neighbouring channel pairs.

    Args:
        x: [B, N, H, D] fp16/bf16, any strides (e.g. a projection [B, N, H·D] unflattened).
        norm: (weight [H·D] or None, eps) of a torch.nn.RMSNorm over H·D, or None.
        rope: (cos, sin), each [N, D/2] (one angle per channel pair, shared by the heads: Wan; fp32, fp64 or
            x's dtype), or with ``per_channel_rope`` each [B, N, H·D] fp32 (one cos/sin per channel of every
            head and sample: LTX-Video's ``x·cos + rotate(x)·sin``); or None.
        out: where to write (x's shape and dtype, any strides); default a new contiguous tensor.

    Returns:
        ``out``.
    """
    if x.dim() != 4 or x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"x: expected a 4-D fp16/bf16 tensor [B, N, H, D], got {tuple(x.shape)} {x.dtype}")
    B, N, H, D = x.shape
    if D % 2:
        raise ValueError(f"x: the head dim must be even for rotary pairs, got {D}")
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    elif out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out: expected {tuple(x.shape)} {x.dtype} on {x.device}, got {tuple(out.shape)} "
                         f"{out.dtype} on {out.device}")
    weight, eps = norm if norm is not None else (None, 0.0)
    if weight is not None and (tuple(weight.shape) != (H * D,) or weight.device != x.device):
        raise ValueError(f"norm: the weight must be [{H * D}] on {x.device}, got {tuple(weight.shape)} "
                         f"on {weight.device}")
    dummy = x.new_empty(1, dtype=torch.float32)
    cos = sin = dummy
    strides, table = (0, 0, 0), _TABLE_FP32
    if rope is not None:
        cos, sin = _check_tables(rope, x, per_channel_rope)
        strides = cos.stride() if per_channel_rope else (0, *cos.stride())
        table = _TABLE_KIND[cos.dtype]
    head_dim = next_power_of_2(D)
    block_n = max(1, min(16, 2048 // head_dim))
    _heads_rms_rope_kernel[(cdiv(N, block_n), B)](
        x, out, weight if weight is not None else dummy, cos, sin, x.stride(0), x.stride(1), x.stride(2),
        x.stride(3), out.stride(0), out.stride(1), out.stride(2), out.stride(3), *strides, H, N, D, float(eps),
        BLOCK_N=block_n, HEAD_DIM=head_dim, HAS_NORM=norm is not None, HAS_WEIGHT=weight is not None,
        ROPE=rope is not None, TABLE=table, CHANNEL_TABLE=per_channel_rope, EXACT_CAST=interpreting(),
        FULL_D=head_dim == D, num_warps=4, enable_fp_fusion=FP_FUSION,
    )
    return out


def _check_tables(rope, x: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    B, N, H, D = x.shape
    cos, sin = rope
    shape = (B, N, H * D) if per_channel else (N, D // 2)
    if tuple(cos.shape) != shape or tuple(sin.shape) != shape or cos.dtype != sin.dtype:
        raise ValueError(f"rope: cos and sin must be {list(shape)} of one dtype, got {tuple(cos.shape)} "
                         f"{cos.dtype} and {tuple(sin.shape)} {sin.dtype}")
    allowed = (torch.float32,) if per_channel else (torch.float32, torch.float64, x.dtype)
    if cos.dtype not in allowed:
        raise ValueError(f"rope: tables must be {' or '.join(str(d) for d in allowed)}, got {cos.dtype}")
    cos, sin = cos.to(x.device), sin.to(x.device)
    if cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin
