"""The attention output in FP8 e4m3, for an FP8 output projection: one scale per call, from V's range.

Every output row is a convex combination of V's rows (plus V's channel mean, with smoothing), so each element
obeys |o_c| <= max_j |v_jc|. That bound is known as soon as the quantization pass has V's channel statistics
(its FP8 scale and mean), so the attention kernel can write e4m3 directly, with no reduction over its output:
the projection that reads it skips its own quantization pass. P·V runs on quantized P (each e4m3 value at most
2^-4 above the exact one), so the bound gets that margin; the e4m3 conversion saturates at +-448 as well
(``cvt.satfinite`` on the GPU, checked in tests/kernels/test_kernel_codegen.py; an explicit clamp in the interpreter).

One scale for the whole call is enough for a floating-point format: e4m3 keeps 3 mantissa bits across 2^15 of
range, so values far below the bound lose nothing until 2^-6 of the scale's 448 (3.5e-5 x the bound).

`out_scale(v_scale, v_mean, d, buf)` is one small Triton launch (no host sync) that also writes the scale once
per output row, as the row-wise FP8 GEMM reads it; `reference.fp8_out_scale` is its emulation, op for op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sagegen.kernels.spec import FP8_MAX, FP8_OUT_MARGIN

_FP8_MAX = tl.constexpr(FP8_MAX)
_SCALE_PER_BOUND = tl.constexpr(FP8_OUT_MARGIN / FP8_MAX)


@triton.jit
def _out_scale_kernel(VS, VM, RowScale, InvScale, ROWS, D, M, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_M: tl.constexpr, SMOOTH_V: tl.constexpr):
    # Every program takes the bound over all of V's statistics (a few thousand floats, from L2) and writes its
    # share of the per-row scales, so the row-wise GEMM's scale vector needs no launch of its own.
    offs_d = tl.arange(0, HEAD_DIM)
    best = tl.zeros([BLOCK_R, HEAD_DIM], dtype=tl.float32)
    for start in range(0, ROWS, BLOCK_R):
        rows = start + tl.arange(0, BLOCK_R)
        valid = (rows < ROWS)[:, None] & (offs_d < D)[None, :]  # padded channels hold scale 1, not V's range
        offs = rows[:, None] * HEAD_DIM + offs_d[None, :]
        bound = tl.load(VS + offs, mask=valid, other=0.0) * _FP8_MAX
        if SMOOTH_V:
            bound = bound + tl.abs(tl.load(VM + offs, mask=valid, other=0.0))
        best = tl.maximum(best, bound, propagate_nan=tl.PropagateNan.ALL)
    bound = tl.max(tl.max(best, axis=1), axis=0)
    # a NaN in V's statistics gives a NaN scale, so the output is NaN as the bf16 one would be
    bound = tl.where(tl.max(tl.max((best != best).to(tl.int32), axis=1), axis=0) > 0, float("nan"), bound)
    scale = bound * _SCALE_PER_BOUND
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(RowScale + offs_m, tl.zeros([BLOCK_M], dtype=tl.float32) + scale, mask=offs_m < M)
    if tl.program_id(0) == 0:
        tl.store(InvScale, tl.math.div_rn(1.0, scale))


def out_scale(v_scale: torch.Tensor, v_mean: torch.Tensor | None, d: int, buf: torch.Tensor) -> torch.Tensor:
    """Write the call's scale into ``buf[:-1]`` once per output token row (``out_fp8 * buf[:-1, None]`` is the
    attention output; the row-wise GEMM's scale vector as it is) and its inverse into ``buf[-1]``, which is
    returned ([1], for the kernel).

    v_scale: fp32 [B, Hkv, D_pad], V's FP8 scale per channel (after smoothing); v_mean: the same shape, V's
    channel mean when smoothing V, else None; d: the real head dim (padded channels are left out); buf: fp32
    [B·Nq + 1], contiguous.
    """
    d_pad, rows = v_scale.shape[-1], buf.shape[0] - 1
    vs = v_scale.reshape(-1, d_pad)
    vm = v_mean.reshape(-1, d_pad) if v_mean is not None else vs
    block_m = 1024
    # fused multiply-adds off: the emulation computes the bound with separate rounding steps
    _out_scale_kernel[(triton.cdiv(rows, block_m),)](
        vs, vm, buf, buf[rows:], vs.shape[0], d, rows, HEAD_DIM=d_pad, BLOCK_R=16, BLOCK_M=block_m,
        SMOOTH_V=v_mean is not None, num_warps=4, enable_fp_fusion=False)
    return buf[rows:]
