"""LayerNorm over the head dim followed by interleaved rotary embeddings, in one Triton pass.

What CogVideoX-style attention does to Q and K before attention (``norm_q`` / ``norm_k``, then
``apply_rotary_emb`` on the tokens after the text), written eagerly as a LayerNorm kernel plus about ten
elementwise kernels over fp32 copies of Q and K. Here: one read, one write. The same roundings as that eager
code: the normalised value is rounded to the input dtype before the rotation, and the result once more.

Rotation (pairs of neighbouring channels, ``use_real_unbind_dim=-1`` in diffusers): for a token n >= start,
out[2i] = y[2i] cos[n', 2i] - y[2i+1] sin[n', 2i] and out[2i+1] = y[2i+1] cos[n', 2i+1] + y[2i] sin[n', 2i+1],
with n' = n - start.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_quant import interpreting


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


@triton.jit
def _layer_norm_rope_kernel(
    X, Out, W, Bias, Cos, Sin,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_cn, stride_cd,
    H, N, D, START, eps,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr,
    EXACT_CAST: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    pair = offs_d ^ 1  # the other channel of each rotation pair
    rows = offs_n < N
    ok = rows[:, None] & (offs_d < D)[None, :]
    base = X + b * stride_xb + h * stride_xh + offs_n[:, None] * stride_xn
    x = tl.load(base + offs_d[None, :] * stride_xd, mask=ok, other=0.0).to(tl.float32)
    xp = tl.load(base + pair[None, :] * stride_xd, mask=ok, other=0.0).to(tl.float32)
    if NORM:
        mean = tl.sum(x, axis=1) / D
        diff = tl.where(ok, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=1) / D + eps)
        w = tl.load(W + offs_d, mask=offs_d < D, other=0.0)
        bias = tl.load(Bias + offs_d, mask=offs_d < D, other=0.0)
        wp = tl.load(W + pair, mask=offs_d < D, other=0.0)
        bp = tl.load(Bias + pair, mask=offs_d < D, other=0.0)
        # rounded to the input dtype, as the eager LayerNorm's output is
        dt: tl.constexpr = Out.dtype.element_ty
        x = _to_out((x - mean[:, None]) * rstd[:, None] * w[None, :] + bias[None, :], dt, EXACT_CAST).to(tl.float32)
        xp = _to_out((xp - mean[:, None]) * rstd[:, None] * wp[None, :] + bp[None, :], dt, EXACT_CAST).to(tl.float32)
    y = x
    if ROPE:
        rot = ok & (offs_n >= START)[:, None]
        c_off = (offs_n - START)[:, None] * stride_cn + offs_d[None, :] * stride_cd
        cos = tl.load(Cos + c_off, mask=rot, other=1.0)
        sin = tl.load(Sin + c_off, mask=rot, other=0.0)
        sign = tl.where((offs_d % 2) == 0, -1.0, 1.0)
        y = x * cos + (xp * sign[None, :]) * sin
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_n[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, _to_out(y, Out.dtype.element_ty, EXACT_CAST), mask=ok)


def layer_norm_rope(x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor, float] | None,
                    rope: tuple[torch.Tensor, torch.Tensor] | None, start: int = 0) -> torch.Tensor:
    """LayerNorm over the last dim and/or rotary embeddings of the tokens from ``start`` on.

    Args:
        x: [B, H, N, D] fp16/bf16, any strides.
        norm: (weight [D], bias [D], eps) of an affine LayerNorm over D, or None.
        rope: (cos, sin), each [N - start, D] (fp32 or x's dtype), or None.
        start: the first token that is rotated (tokens before it are only normalised).

    Returns:
        A new tensor shaped and strided like ``x`` (``torch.empty_like``).
    """
    if x.dim() != 4 or x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"x: expected a 4-D fp16/bf16 tensor [B, H, N, D], got {tuple(x.shape)} {x.dtype}")
    B, H, N, D = x.shape
    if D % 2:
        raise ValueError(f"x: the head dim must be even for rotary pairs, got {D}")
    out = torch.empty_like(x)
    dummy = x.new_empty(1, dtype=torch.float32)
    w, bias, eps = norm if norm is not None else (dummy, dummy, 0.0)
    cos, sin = rope if rope is not None else (dummy.view(1, 1), dummy.view(1, 1))
    if rope is not None and (cos.shape != (N - start, D) or sin.shape != cos.shape):
        raise ValueError(f"rope: cos and sin must be [{N - start}, {D}] (tokens from start={start}), got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    if rope is not None:  # as apply_rotary_emb, which moves them to x's device
        cos, sin = cos.to(x.device), sin.to(x.device)
        if cos.stride() != sin.stride():
            cos, sin = cos.contiguous(), sin.contiguous()
    head_dim = triton.next_power_of_2(D)
    block_n = max(1, min(64, 4096 // head_dim))
    _layer_norm_rope_kernel[(triton.cdiv(N, block_n), B * H)](
        x, out, w, bias, cos, sin, *x.stride(), *out.stride(), cos.stride(0), cos.stride(1),
        H, N, D, start, float(eps), BLOCK_N=block_n, HEAD_DIM=head_dim, NORM=norm is not None,
        ROPE=rope is not None, EXACT_CAST=interpreting(), num_warps=4,
    )
    return out
