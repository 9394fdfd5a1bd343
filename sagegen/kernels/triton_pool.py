"""Pooled block statistics for the block-sparse predictor (`sagegen.sparse.pool`): per block of tokens, the
mean vector and the mean cosine of (token - center) to (mean - center), in one read of the tensor."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sagegen.kernels.spec import cdiv, next_power_of_2
from sagegen.kernels.triton_quant import _load_tile


@triton.jit
def _pool_kernel(
    X, Center, Mean, Sim,
    stride_xb, stride_xh, stride_xn, stride_xd,
    H, N, D, N_BLOCKS,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, PAD_D: tl.constexpr,
):
    """One block of tokens per program: its mean [HEAD_DIM] and mean cosine of (token - center) to
    (mean - center): how well the mean stands for the block (sagegen.sparse.pool)."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    x, valid = _load_tile(X, pid_bh // H, pid_bh % H, offs_n, offs_d, stride_xb, stride_xh, stride_xn,
                          stride_xd, N, D, PAD_D)
    count = tl.minimum(N - pid_n * BLOCK, BLOCK).to(tl.float32)
    mean = tl.sum(x, axis=0) / count
    c = tl.load(Center + pid_bh * D + offs_d, mask=offs_d < D, other=0.0)
    xc = tl.where(valid, x - c[None, :], 0.0)
    mc = tl.where(offs_d < D, mean - c, 0.0)
    dots = tl.sum(xc * mc[None, :], axis=1)
    norms = tl.sqrt(tl.sum(xc * xc, axis=1)) * tl.sqrt(tl.sum(mc * mc, axis=0))
    cos = dots / tl.maximum(norms, 1e-12)
    sim = tl.sum(tl.where(offs_n < N, cos, 0.0), axis=0) / count
    out = pid_bh * N_BLOCKS + pid_n
    tl.store(Mean + out * D + offs_d, mean, mask=offs_d < D)
    tl.store(Sim + out, sim)


def pool_blocks(x: torch.Tensor, block: int, center: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per `block` tokens of x [B, H, N, D] (any strides): (mean [B, H, NB, D], sim [B, H, NB]) fp32, with
    `center` [B, H, D] fp32. One read of x: at hd128 and 32k tokens ~1% of the attention call's time."""
    B, H, N, D = x.shape
    nb = cdiv(N, block)
    d_pad = next_power_of_2(D)
    mean = torch.empty(B, H, nb, D, dtype=torch.float32, device=x.device)
    sim = torch.empty(B, H, nb, dtype=torch.float32, device=x.device)
    _pool_kernel[(nb, B * H)](
        x, center.float().contiguous(), mean, sim, *x.stride(), H, N, D, nb,
        BLOCK=block, HEAD_DIM=d_pad, PAD_D=D != d_pad, num_warps=4, enable_fp_fusion=True,
    )
    return mean, sim
