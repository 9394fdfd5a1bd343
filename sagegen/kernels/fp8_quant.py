"""FP8 (e4m3) quantization of a linear layer's activations: per token or in 1x128 blocks, in one Triton pass.

``quantize_fp8_rows(x, granularity, col_scale=None)`` takes a 2-D activation ``x`` [M, K] (fp16/bf16/fp32,
any row stride, unit stride along K) and returns ``(x_fp8 [M, K] e4m3fn, scales fp32)``:

- ``"per_token"``: ``scales`` [M, 1], one per row (``amax(|row|) / 448``);
- ``"per_block"``: ``scales`` [M, ceil(K / 128)], one per 1x128 block of a row (the last block may be short).
  ``scales_k_major=True`` writes them column-major (stride 1 along M), the layout cuBLASLt's block-wise
  scaling reads.

``col_scale`` (fp32 [K], optional) multiplies each input channel before quantizing: SmoothQuant-style
smoothing (1/s) or a 0/1 mask that takes outlier channels out of the FP8 path (`sagegen.linear`).

The numerics are those of `sagegen.linear.numerics.quantize_activations` bit for bit: fp32 amax, an IEEE
division for the scale and for each value (``div_rn``), clamp to ±448, round to nearest even. A row (block)
of zeros gets scale 1. NaN handling is not specified (the GPU's max drops NaNs, torch's keeps them).

Grid-stride: a fixed number of programs (a few per SM) walk the row tiles (per token) or the (row tile,
K block) tiles (per block), so launch cost and tail effects do not grow with M. Nothing here knows diffusers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .spec import FP8_MAX
from .triton_quant import interpreting, round_to_e4m3_grid

BLOCK_K_SCALE = 128          # the 1x128 block of per-block activation scales
SINGLE_PASS_ELEMENTS = 8192  # per-token rows up to this wide are quantized from one read
_FP8_MAX = tl.constexpr(FP8_MAX)
GRANULARITIES = ("per_token", "per_block")


@triton.jit
def _quantize_tile(x, scale, INTERPRET: tl.constexpr):
    q = tl.math.div_rn(x, scale)
    q = tl.minimum(tl.maximum(q, -_FP8_MAX), _FP8_MAX)
    if INTERPRET:  # the interpreter's float->fp8 cast mis-rounds across binades; round on the grid first
        r = round_to_e4m3_grid(q)
        q = tl.where(r == 0, q * 0.0, r)  # keep the sign of values that round to zero (-0.0, as the GPU's cast)
    return q.to(tl.float8e4nv)


@triton.jit
def _fp8_quant_per_token_kernel(X, C, Q, S, M, K, stride_xm, stride_qm, n_tiles,
                                HAS_COL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                                SINGLE_PASS: tl.constexpr, INTERPRET: tl.constexpr):
    pid = tl.program_id(0)
    for tile in range(pid, n_tiles, tl.num_programs(0)):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        rows64 = rows.to(tl.int64)
        if SINGLE_PASS:  # the whole row fits one tile (BLOCK_K >= K): one read
            _quantize_rows_once(X, C, Q, S, rows, rows64, row_ok, K, stride_xm, stride_qm, HAS_COL, BLOCK_K,
                                INTERPRET)
        else:
            _quantize_rows_twice(X, C, Q, S, rows, rows64, row_ok, K, stride_xm, stride_qm, HAS_COL, BLOCK_M,
                                 BLOCK_K, INTERPRET)


@triton.jit
def _quantize_rows_once(X, C, Q, S, rows, rows64, row_ok, K, stride_xm, stride_qm, HAS_COL: tl.constexpr,
                        BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr):
    cols = tl.arange(0, BLOCK_K)
    ok = row_ok[:, None] & (cols < K)[None, :]
    x = tl.load(X + rows64[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if HAS_COL:
        x = x * tl.load(C + cols, mask=cols < K, other=0.0)[None, :]
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, _FP8_MAX), 1.0)
    q = _quantize_tile(x, scale[:, None], INTERPRET)
    tl.store(Q + rows64[:, None] * stride_qm + cols[None, :], q, mask=ok)
    tl.store(S + rows, scale, mask=row_ok)


@triton.jit
def _quantize_rows_twice(X, C, Q, S, rows, rows64, row_ok, K, stride_xm, stride_qm, HAS_COL: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr):
    amax = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # pass 1: the row's amax
        cols = k0 + tl.arange(0, BLOCK_K)
        ok = row_ok[:, None] & (cols < K)[None, :]
        x = tl.load(X + rows64[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_COL:
            x = x * tl.load(C + cols, mask=cols < K, other=0.0)[None, :]
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
    scale = tl.where(amax > 0, tl.math.div_rn(amax, _FP8_MAX), 1.0)
    for k0 in range(0, K, BLOCK_K):  # pass 2: quantize (the tile is back from L2)
        cols = k0 + tl.arange(0, BLOCK_K)
        ok = row_ok[:, None] & (cols < K)[None, :]
        x = tl.load(X + rows64[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_COL:
            x = x * tl.load(C + cols, mask=cols < K, other=0.0)[None, :]
        q = _quantize_tile(x, scale[:, None], INTERPRET)
        tl.store(Q + rows64[:, None] * stride_qm + cols[None, :], q, mask=ok)
    tl.store(S + rows, scale, mask=row_ok)


@triton.jit
def _fp8_quant_per_block_kernel(X, C, Q, S, M, K, stride_xm, stride_qm, stride_sm, stride_sk, n_tiles_m,
                                n_kb, HAS_COL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                                INTERPRET: tl.constexpr):
    pid = tl.program_id(0)
    for t in range(pid, n_tiles_m * n_kb, tl.num_programs(0)):
        # consecutive programs take consecutive K blocks of the same rows: neighbouring reads
        tile_m = t // n_kb
        kb = t % n_kb
        rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        row_ok = rows < M
        ok = row_ok[:, None] & (cols < K)[None, :]
        rows64 = rows.to(tl.int64)
        x = tl.load(X + rows64[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_COL:
            x = x * tl.load(C + cols, mask=cols < K, other=0.0)[None, :]
        amax = tl.max(tl.abs(x), axis=1)
        scale = tl.where(amax > 0, tl.math.div_rn(amax, _FP8_MAX), 1.0)
        q = _quantize_tile(x, scale[:, None], INTERPRET)
        tl.store(Q + rows64[:, None] * stride_qm + cols[None, :], q, mask=ok)
        tl.store(S + rows64 * stride_sm + kb * stride_sk, scale, mask=row_ok)


def _programs(device: torch.device, tiles: int) -> int:
    if device.type != "cuda":
        return max(1, min(tiles, 4))  # the interpreter: a few programs still exercise the grid-stride loop
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(tiles, 4 * sms))


def quantize_fp8_rows(x: torch.Tensor, granularity: str = "per_token", col_scale: torch.Tensor | None = None,
                      *, scales_k_major: bool = False, block_m: int | None = None, programs: int | None = None,
                      max_single_pass_k: int = SINGLE_PASS_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D activation to FP8 e4m3 with per-token or 1x128-block scales (see the module doc)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not supported; use one of {GRANULARITIES}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [tokens, features], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    if x.stride(1) != 1:
        x = x.contiguous()
    M, K = x.shape
    if col_scale is not None:
        if col_scale.shape != (K,) or col_scale.dtype != torch.float32 or col_scale.device != x.device:
            raise ValueError(f"col_scale must be fp32 [{K}] on {x.device}, got {col_scale.dtype} "
                             f"{tuple(col_scale.shape)} on {col_scale.device}")
        col_scale = col_scale.contiguous()
    q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    interp = interpreting()
    col = col_scale if col_scale is not None else x  # a dummy pointer when HAS_COL is off
    if granularity == "per_token":
        scales = torch.empty((M, 1), dtype=torch.float32, device=x.device)
        # Rows up to SINGLE_PASS_ELEMENTS wide are read once (the whole row in registers); wider rows are read
        # twice, the second time from L2: 2 rows per program keep a wave's rows (4 programs per SM) in L2.
        single = K <= max_single_pass_k
        if single:
            bk = triton.next_power_of_2(max(K, 16))
            bm = block_m or max(1, SINGLE_PASS_ELEMENTS // bk)
        else:
            bk, bm = (128, block_m or 4) if interp else (1024, block_m or 2)
        n_tiles = triton.cdiv(M, bm)
        if M:
            grid = (programs or _programs(x.device, n_tiles),)
            _fp8_quant_per_token_kernel[grid](x, col, q, scales, M, K, x.stride(0), q.stride(0), n_tiles,
                                              HAS_COL=col_scale is not None, BLOCK_M=bm, BLOCK_K=bk,
                                              SINGLE_PASS=single, INTERPRET=interp,
                                              num_warps=8 if bm * bk >= 4096 else 4)
        return q, scales
    n_kb = triton.cdiv(K, BLOCK_K_SCALE)
    if scales_k_major:
        scales = torch.empty((n_kb, M), dtype=torch.float32, device=x.device).t()
    else:
        scales = torch.empty((M, n_kb), dtype=torch.float32, device=x.device)
    bm = block_m or (4 if interp else 32)
    n_tiles_m = triton.cdiv(M, bm)
    if M:
        grid = (programs or _programs(x.device, n_tiles_m * n_kb),)
        _fp8_quant_per_block_kernel[grid](x, col, q, scales, M, K, x.stride(0), q.stride(0), scales.stride(0),
                                          scales.stride(1), n_tiles_m, n_kb, HAS_COL=col_scale is not None,
                                          BLOCK_M=bm, BLOCK_K=BLOCK_K_SCALE, INTERPRET=interp, num_warps=4)
    return q, scales
