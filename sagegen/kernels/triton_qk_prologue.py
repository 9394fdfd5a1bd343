"""A norm over the head dim followed by interleaved rotary embeddings, in one Triton pass.

What CogVideoX- and Mochi-style attention do to Q and K before attention, written eagerly as a norm plus
about ten elementwise kernels over fp32 copies of Q and K. Here: one read, one write (into any strided
output, e.g. a slice of a joint text+video buffer). The same roundings as that eager code: the normalised
value is rounded to the input dtype before the rotation, and the result once more.

* `layer_norm_rope` (CogVideoX): an affine LayerNorm (``norm_q`` / ``norm_k``), then ``apply_rotary_emb`` on
  the tokens from ``start`` on, with cos/sin tables [N - start, D] shared by the heads.
* `rms_norm_rope` (Mochi): ``MochiRMSNorm`` (x · rsqrt(mean(x²) + eps) · weight, in fp32), then Mochi's
  rotation with per-head tables [N, H, D/2] (one angle per channel pair).

Rotation (pairs of neighbouring channels): for a rotated token n (n' = n - start) and pair i,
out[2i] = y[2i] c - y[2i+1] s and out[2i+1] = y[2i+1] c' + y[2i] s', where (c, s) = table[n', 2i] and
(c', s') = table[n', 2i+1] for CogVideoX, and both are table[n', h, i] for Mochi.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sagegen.kernels.spec import cdiv, next_power_of_2
from sagegen.kernels.triton_quant import interpreting


# No FMA contraction here: eager PyTorch rounds every product of the rotation separately, and so does this
# kernel then; the rotation matches diffusers' ops bit for bit on an H200 (with contraction 2e-5 of the
# elements differ by a bf16 step: lab/probes/probe_prologue_rounding.py). Memory-bound, so no speed cost.
FP_FUSION = False


@triton.jit
def _round_to_half_grid(x, dtype: tl.constexpr):
    """fp32 -> the nearest value (ties to even) of bf16/fp16 as fp32, with integer ops: under TRITON_INTERPRET
    the cast itself truncates (bf16), so there the kernel rounds first and the cast is exact."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return bits.to(tl.float32, bitcast=True)
    return x.to(dtype).to(tl.float32)


@triton.jit
def _to_out(x, dtype: tl.constexpr, EXACT_CAST: tl.constexpr):
    if EXACT_CAST:
        x = _round_to_half_grid(x, dtype)
    return x.to(dtype)


_LAYER_NORM, _RMS_NORM, _RMS_NORM_ROUNDED = 1, 2, 3


@triton.jit
def _norm_rope_kernel(
    X, Out, W, Bias, Cos, Sin,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_cn, stride_ch, stride_cd,
    H, N, D, START, eps,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, NORM: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    ROPE: tl.constexpr, PAIR_TABLE: tl.constexpr, EXACT_CAST: tl.constexpr, FULL_D: tl.constexpr,
):
    """NORM: 0 none, 1 affine LayerNorm, 2 RMSNorm (weight optional; one rounding, as MochiRMSNorm and
    torch.nn.RMSNorm), 3 diffusers' RMSNorm (rounded before the half-precision weight multiply); PAIR_TABLE:
    one cos/sin per channel pair and head (Mochi) instead of one per channel shared by the heads (CogVideoX)."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_n < N
    if FULL_D:  # no mask along the head dim, so loads and stores vectorize
        ok = rows[:, None] & (offs_d < HEAD_DIM)[None, :]
    else:
        ok = rows[:, None] & (offs_d < D)[None, :]
    # Whole rows are loaded and stored contiguously (vectorized); the rotation pairs are split in registers.
    x = tl.load(X + b * stride_xb + h * stride_xh + offs_n[:, None] * stride_xn + offs_d[None, :] * stride_xd,
                mask=ok, other=0.0).to(tl.float32)
    dt: tl.constexpr = Out.dtype.element_ty
    if NORM == 3:
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        x = _to_out(x * rstd[:, None], dt, EXACT_CAST).to(tl.float32)
        if HAS_WEIGHT:  # a half-precision product, rounded
            w = tl.load(W + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)
            x = _to_out(x * w[None, :], dt, EXACT_CAST).to(tl.float32)
    if NORM == 2:
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)  # as torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        x = x * rstd[:, None]
        if HAS_WEIGHT:
            x = x * tl.load(W + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)[None, :]
        x = _to_out(x, dt, EXACT_CAST).to(tl.float32)
    if NORM == 1:
        mean = tl.sum(x, axis=1) / D
        diff = tl.where(ok, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=1) / D + eps)
        w = tl.load(W + offs_d, mask=offs_d < D, other=0.0)
        bias = tl.load(Bias + offs_d, mask=offs_d < D, other=0.0)
        # rounded to the input dtype, as the eager LayerNorm's output is
        x = _to_out((x - mean[:, None]) * rstd[:, None] * w[None, :] + bias[None, :], dt, EXACT_CAST).to(tl.float32)
    y = x
    if ROPE:
        xe, xo = tl.split(tl.reshape(x, [BLOCK_N, HEAD_DIM // 2, 2]))
        rot = rows & (offs_n >= START)
        t_row = (offs_n - START)[:, None] * stride_cn
        if PAIR_TABLE:  # one angle per pair and head: [N, H, D/2]
            offs_i = tl.arange(0, HEAD_DIM // 2)
            t_ok = rot[:, None] & (offs_i < (HEAD_DIM if FULL_D else D) // 2)[None, :]
            t_off = t_row + h * stride_ch + offs_i[None, :] * stride_cd
            ce = tl.load(Cos + t_off, mask=t_ok, other=1.0)
            se = tl.load(Sin + t_off, mask=t_ok, other=0.0)
            co, so = ce, se
        else:  # one angle per channel, shared by the heads: [N, D]
            t_ok = rot[:, None] & (offs_d < (HEAD_DIM if FULL_D else D))[None, :]
            t_off = t_row + offs_d[None, :] * stride_cd
            ce, co = tl.split(tl.reshape(tl.load(Cos + t_off, mask=t_ok, other=1.0), [BLOCK_N, HEAD_DIM // 2, 2]))
            se, so = tl.split(tl.reshape(tl.load(Sin + t_off, mask=t_ok, other=0.0), [BLOCK_N, HEAD_DIM // 2, 2]))
        ye = xe * ce + (-xo) * se
        yo = xo * co + xe * so
        y = tl.reshape(tl.join(ye, yo), [BLOCK_N, HEAD_DIM])
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_n[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, _to_out(y, Out.dtype.element_ty, EXACT_CAST), mask=ok)


def _check_x(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if x.dim() != 4 or x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"x: expected a 4-D fp16/bf16 tensor [B, H, N, D], got {tuple(x.shape)} {x.dtype}")
    if x.shape[-1] % 2:
        raise ValueError(f"x: the head dim must be even for rotary pairs, got {x.shape[-1]}")
    if out is None:
        return torch.empty_like(x)
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out: expected {tuple(x.shape)} {x.dtype} on {x.device}, got {tuple(out.shape)} "
                         f"{out.dtype} on {out.device}")
    return out


def _launch(x, out, norm_kind: int, w, bias, eps, rope, table_shape: tuple, pair_table: bool,
            start: int = 0) -> torch.Tensor:
    """One pass over x into out: norm (w None: no weight) and, with ``rope`` = (cos, sin) of ``table_shape``
    (per channel [n, D], or per pair and head [n, H, D/2] when ``pair_table``), the rotation of tokens >= start."""
    B, H, N, D = x.shape
    dummy = x.new_empty(1, dtype=torch.float32)
    cos = sin = dummy
    strides = (0, 0, 0)
    if rope is not None:
        cos, sin = rope
        if tuple(cos.shape) != table_shape or tuple(sin.shape) != table_shape:
            raise ValueError(f"rope: cos and sin must be {list(table_shape)}, got {tuple(cos.shape)} and "
                             f"{tuple(sin.shape)}")
        cos, sin = cos.to(x.device), sin.to(x.device)  # as the eager code, which moves them to x's device
        if cos.stride() != sin.stride():
            cos, sin = cos.contiguous(), sin.contiguous()
        strides = cos.stride() if pair_table else (cos.stride(0), 0, cos.stride(1))
    head_dim = next_power_of_2(D)
    block_n = max(1, min(64, 4096 // head_dim))
    _norm_rope_kernel[(cdiv(N, block_n), B * H)](
        x, out, w if w is not None else dummy, bias if bias is not None else dummy, cos, sin, *x.stride(),
        *out.stride(), *strides, H, N, D, start, float(eps), BLOCK_N=block_n, HEAD_DIM=head_dim, NORM=norm_kind,
        HAS_WEIGHT=w is not None, ROPE=rope is not None, PAIR_TABLE=pair_table, EXACT_CAST=interpreting(),
        FULL_D=head_dim == D, num_warps=4, enable_fp_fusion=FP_FUSION,
    )
    return out


def layer_norm_rope(x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor, float] | None,
                    rope: tuple[torch.Tensor, torch.Tensor] | None, start: int = 0,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm over the last dim and/or rotary embeddings of the tokens from ``start`` on (CogVideoX).

    Args:
        x: [B, H, N, D] fp16/bf16, any strides.
        norm: (weight [D], bias [D], eps) of an affine LayerNorm over D, or None.
        rope: (cos, sin), each [N - start, D] (fp32 or x's dtype), or None.
        start: the first token that is rotated (tokens before it are only normalised).
        out: where to write (x's shape and dtype, any strides); default a new tensor like ``x``.

    Returns:
        ``out``.
    """
    out = _check_x(x, out)
    w, bias, eps = norm if norm is not None else (None, None, 0.0)
    return _launch(x, out, _LAYER_NORM if norm is not None else 0, w, bias, eps, rope,
                   (x.shape[2] - start, x.shape[3]), False, start)


def rms_norm_rope(x: torch.Tensor, norm: tuple[torch.Tensor | None, float] | None,
                  rope: tuple[torch.Tensor, torch.Tensor] | None, out: torch.Tensor | None = None, *,
                  round_before_weight: bool = False, per_channel_rope: bool = False) -> torch.Tensor:
    """An RMSNorm over the last dim and/or rotary embeddings of every token.

    Args:
        x: [B, H, N, D] fp16/bf16, any strides.
        norm: (weight [D] or None, eps), or None. By default x · rsqrt(mean(x²) + eps) · weight rounded once
            (MochiRMSNorm, torch.nn.RMSNorm); ``round_before_weight``: rounded to x's dtype before the weight
            multiply and after it (diffusers' RMSNorm with a half-precision weight).
        rope: (cos, sin), each [N, H, D/2] (one angle per channel pair and head: Mochi), or with
            ``per_channel_rope`` [N, D] shared by the heads (diffusers' apply_rotary_emb, use_real): or None.
        out: where to write (x's shape and dtype, any strides); default a new tensor like ``x``.

    Returns:
        ``out``.
    """
    out = _check_x(x, out)
    _, H, N, D = x.shape
    w, eps = norm if norm is not None else (None, 0.0)
    kind = 0 if norm is None else (_RMS_NORM_ROUNDED if round_before_weight else _RMS_NORM)
    return _launch(x, out, kind, w, None, eps, rope, (N, D) if per_channel_rope else (N, H, D // 2),
                   not per_channel_rope)
