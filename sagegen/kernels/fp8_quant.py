"""FP8 (e4m3) quantization of a linear layer's activations: per token or in 1x128 blocks, in one Triton pass.

``quantize_fp8_rows(x, granularity, col_scale=None, prologue=None)`` takes a 2-D activation ``x`` [M, K]
(fp16/bf16/fp32, any row stride, unit stride along K) and returns ``(x_fp8 [M, K] e4m3fn, scales fp32)``:

- ``"per_token"``: ``scales`` [M, 1], one per row;
- ``"per_block"``: ``scales`` [M, ceil(K / 128)], one per 1x128 block of a row (the last block may be short).
  ``scales_k_major=True`` writes them column-major (stride 1 along M), the layout cuBLASLt's block-wise
  scaling reads.

``col_scale`` (fp32 [K], optional) multiplies each input channel before quantizing: SmoothQuant-style
smoothing (1/s) or a 0/1 mask that takes outlier channels out of the FP8 path (`sagegen.linear`).
``prologue="gelu_tanh"`` applies GELU (tanh approximation) to ``x`` first, rounded to ``x``'s dtype as the eager
activation would be stored: the activation before an MLP's second layer, fused (one read of the pre-GELU tensor,
no GELU output written). ``prefix`` [M, K0] puts channels before it: the rows quantized are
``cat([prefix, prologue(x)], 1)``, read from both tensors (Flux's single blocks project
``cat(attention, GELU(mlp))``: no GELU output and no concatenated copy are written).

The numerics are those of `sagegen.linear.numerics.quantize_activations` bit for bit, with only exactly
rounded fp32 operations (so that every implementation agrees, the GPU's torch included, which divides by a
Python scalar as a multiplication by its reciprocal): ``scale = amax * fp32(1/448)`` (1 where that is 0),
``inv = 1 / scale`` (IEEE division, once per row/block), values ``clamp(x * inv, ±448)`` rounded to nearest even.
NaN handling is not specified (the GPU's max drops NaNs, torch's keeps them). The fused GELU computes
``0.5 x (1 + tanh(u))`` as ``x / (1 + 2^(-2u log2 e))`` (``tanh="libdevice"``: torch's form with the CUDA math
library's ``tanhf``, which made the fused kernel compute-bound at 3x the plain quantizer's time on an H100): it
matches eager GELU to a rounding of the last bit on a few elements, not bit for bit everywhere.

With the GELU prologue the amax is floored at ``GELU_AMAX_FLOOR`` (0.171875; GELU's outputs below zero are at
most 0.1700 in magnitude), as in the emulation: the scale is unchanged wherever a row reaches the floor.

One program per tile of rows (per token: the whole row in registers up to 16384 channels, one read; wider rows
in two passes, the second from L2) or per (row tile, 1x128 block). GELU rows that would leave a fifth or more of
a power-of-two tile idle (9728, 12288 channels) run in chunks of 4096 or 2048, two passes: the first reads x for
its maximum only (with the floor, the amax is GELU(max x)), the second computes each GELU once. Loads are 16-byte
vectors when the row stride is a multiple of 8 elements. Nothing here knows diffusers.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from sagegen.kernels.spec import FP8_MAX, GELU_AMAX_FLOOR, cdiv, next_power_of_2
from sagegen.kernels.triton_quant import interpreting, round_to_e4m3_grid

try:  # the GPU's tanhf (the CUDA math library's, as torch's GELU kernel calls)
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older Triton layouts
    from triton.language.extra.cuda import libdevice

BLOCK_K_SCALE = 128          # the 1x128 block of per-block activation scales
SINGLE_PASS_ELEMENTS = 16384  # per-token rows up to this wide are quantized from one read (all models' MLPs)
INV_FP8_MAX = 1.0 / 448.0    # rounded to fp32 where used (an fp32 constant: both sides multiply by the same)
_FP8_MAX = tl.constexpr(FP8_MAX)
_INV_FP8_MAX = tl.constexpr(float(torch.tensor(INV_FP8_MAX, dtype=torch.float32).item()))
GRANULARITIES = ("per_token", "per_block")
PROLOGUES = (None, "gelu_tanh")
# torch's CUDA GELU constants: sqrt(2/pi) and 0.044715, as fp32
_GELU_BETA = tl.constexpr(float(torch.tensor(2.0 ** 0.5 * (2.0 / 3.141592653589793 ** 0.5) * 0.5,
                                             dtype=torch.float32).item()))
_GELU_KAPPA = tl.constexpr(float(torch.tensor(0.044715, dtype=torch.float32).item()))
# the sigmoid form's exponent x (a + b x^2): a = -2 log2(e) beta, b = a kappa
_GELU_A_PY = -2.0 / 0.6931471805599453 * 2.0 ** 0.5 * (2.0 / 3.141592653589793 ** 0.5) * 0.5
_GELU_A = tl.constexpr(float(torch.tensor(_GELU_A_PY, dtype=torch.float32).item()))
_GELU_B = tl.constexpr(float(torch.tensor(_GELU_A_PY * 0.044715, dtype=torch.float32).item()))
TANH_IMPLS = ("exp2", "libdevice")
# GELU's outputs below zero are never larger than 0.1700 in magnitude: a GELU row's amax is floored above that,
# so that its scale can come from GELU(max x) alone
_GELU_AMAX_FLOOR = tl.constexpr(GELU_AMAX_FLOOR)
# GELU rows whose power-of-two tile would leave this share of its lanes idle or more run in chunks instead
# (SD3.5's 9728 channels fill 59% of a 16384 tile, 12288 fill 75%; Wan 14B's 13824, 84%, stay in one tile)
GELU_CHUNK_IDLE_SHARE = 0.2
GELU_CHUNKS = True  # False: every GELU row in one tile (an A/B switch for the probes)
GELU_CHUNK_KS = (4096, 2048)


@triton.jit
def _gelu_tanh(x, INTERPRET: tl.constexpr, TANH_LIBDEVICE: tl.constexpr):
    if TANH_LIBDEVICE and not INTERPRET:  # the CUDA math library's tanhf, as torch (no libdevice in the interpreter)
        # torch's CUDA kernel: inner = beta * (x + kappa * x^3) (nvcc contracts to an fma), 0.5 x (1 + tanh(inner))
        inner = _GELU_BETA * tl.fma(_GELU_KAPPA, x * x * x, x)
        return (0.5 * x) * (1.0 + libdevice.tanh(inner))
    # 0.5 x (1 + tanh(u)) = x / (1 + 2^(-2 log2(e) u)), with -2 log2(e) u = x (a + b x^2): five operations, one
    # exp2 and one fast division (an inf for very negative x gives -0), no cancellation. The kernel is bound by
    # instruction issue, not memory, with the tanh form (lab/NOTES.md v5.8). Within a few fp32 ulps of torch's
    # formula: far below the bf16 rounding that follows.
    e = tl.exp2(x * tl.fma(x * x, _GELU_B, _GELU_A))
    if INTERPRET:
        return x / (1.0 + e)
    return libdevice.fast_dividef(x, 1.0 + e)


@triton.jit
def _round_to_bf16_grid(x):
    # fp32 -> bf16 round-to-nearest-even on the bits (finite inputs): the interpreter's cast truncates
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _gelu_stored(x, X, INTERPRET: tl.constexpr, TANH_LIBDEVICE: tl.constexpr):
    # GELU of fp32 x, rounded to X's dtype as the eager activation stores it, back in fp32
    g = _gelu_tanh(x, INTERPRET, TANH_LIBDEVICE)
    if INTERPRET and X.dtype.element_ty == tl.bfloat16:
        return _round_to_bf16_grid(g)
    return g.to(X.dtype.element_ty).to(tl.float32)


@triton.jit
def _load_act(X, P, rows64, cols, ok, col_ok, stride_xm, stride_pm, K0, C, HAS_COL: tl.constexpr,
              GELU: tl.constexpr, HAS_PREFIX: tl.constexpr, INTERPRET: tl.constexpr, TANH_LIBDEVICE: tl.constexpr):
    # The row is cat(P[:, :K0], act(X)) with a prefix, else act(X): the prefix's lanes load P, the others X
    # (complementary masks, so each byte is read once; K0 a multiple of 8 keeps both loads 16-byte vectors).
    if HAS_PREFIX:
        head = cols < K0
        x = tl.load(X + rows64[:, None] * stride_xm + (cols - K0)[None, :], mask=ok & ~head[None, :], other=0.0)
        p = tl.load(P + rows64[:, None] * stride_pm + cols[None, :], mask=ok & head[None, :], other=0.0)
    else:
        x = tl.load(X + rows64[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0)
    if GELU:  # the eager GELU stores its output in x's dtype: round there before quantizing
        x = _gelu_stored(x.to(tl.float32), X, INTERPRET, TANH_LIBDEVICE)
    x = x.to(tl.float32)
    if HAS_PREFIX:
        x = tl.where(head[None, :], p.to(tl.float32), x)
    if HAS_COL:
        x = x * tl.load(C + cols, mask=col_ok, other=0.0)[None, :]
    return x


@triton.jit
def _scale_and_inverse(amax, GELU: tl.constexpr):
    if GELU:
        amax = tl.maximum(amax, _GELU_AMAX_FLOOR)
    scale = amax * _INV_FP8_MAX
    scale = tl.where(scale > 0, scale, 1.0)
    return scale, tl.math.div_rn(tl.zeros_like(scale) + 1.0, scale)


@triton.jit
def _quantize_tile(x, inv, INTERPRET: tl.constexpr):
    q = x * inv
    if INTERPRET:  # the interpreter's float->fp8 cast neither saturates nor rounds right across binades; the
        # GPU's (cvt.rn.satfinite) does both, so the clamp is left to it there
        q = tl.minimum(tl.maximum(q, -_FP8_MAX), _FP8_MAX)
        r = round_to_e4m3_grid(q)
        q = tl.where(r == 0, q * 0.0, r)  # keep the sign of values that round to zero (-0.0, as the GPU's cast)
    return q.to(tl.float8e4nv)


@triton.jit
def _fp8_quant_per_token_kernel(X, P, C, Q, S, M, K, K0, stride_xm, stride_pm, stride_qm, n_tiles,
                                HAS_COL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                                SINGLE_PASS: tl.constexpr, GELU: tl.constexpr, HAS_PREFIX: tl.constexpr,
                                INTERPRET: tl.constexpr, TANH_LIBDEVICE: tl.constexpr):
    pid = tl.program_id(0)
    for tile in range(pid, n_tiles, tl.num_programs(0)):  # one tile per program unless fewer programs asked
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        rows64 = rows.to(tl.int64)
        if SINGLE_PASS:  # the whole row fits one tile (BLOCK_K >= K): one read
            _quantize_rows_once(X, P, C, Q, S, rows, rows64, row_ok, K, K0, stride_xm, stride_pm, stride_qm,
                                HAS_COL, BLOCK_K, GELU, HAS_PREFIX, INTERPRET, TANH_LIBDEVICE)
        else:
            _quantize_rows_twice(X, P, C, Q, S, rows, rows64, row_ok, K, K0, stride_xm, stride_pm, stride_qm,
                                 HAS_COL, BLOCK_M, BLOCK_K, GELU, HAS_PREFIX, INTERPRET, TANH_LIBDEVICE)


@triton.jit
def _quantize_rows_once(X, P, C, Q, S, rows, rows64, row_ok, K, K0, stride_xm, stride_pm, stride_qm,
                        HAS_COL: tl.constexpr, BLOCK_K: tl.constexpr, GELU: tl.constexpr, HAS_PREFIX: tl.constexpr,
                        INTERPRET: tl.constexpr, TANH_LIBDEVICE: tl.constexpr):
    # One power-of-two tile: a row of 12288 computes 16384 lanes, a quarter of them masked. Rows split into
    # power-of-two parts (8192 + 4096) were slower on the H200 (a cross-warp reduction per part; lab/NOTES.md
    # v5.8), the GELU included.
    cols = tl.arange(0, BLOCK_K)
    col_ok = cols < K
    ok = row_ok[:, None] & col_ok[None, :]
    x = _load_act(X, P, rows64, cols, ok, col_ok, stride_xm, stride_pm, K0, C, HAS_COL, GELU, HAS_PREFIX,
                  INTERPRET, TANH_LIBDEVICE)
    scale, inv = _scale_and_inverse(tl.max(tl.abs(x), axis=1), GELU)
    q = _quantize_tile(x, inv[:, None], INTERPRET)
    tl.store(Q + rows64[:, None] * stride_qm + cols[None, :], q, mask=ok)
    tl.store(S + rows, scale, mask=row_ok)


@triton.jit
def _quantize_rows_twice(X, P, C, Q, S, rows, rows64, row_ok, K, K0, stride_xm, stride_pm, stride_qm,
                         HAS_COL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GELU: tl.constexpr,
                         HAS_PREFIX: tl.constexpr, INTERPRET: tl.constexpr, TANH_LIBDEVICE: tl.constexpr):
    # Pass 1, the row's amax: a running element-wise maximum over chunks, reduced once (a cross-warp reduction
    # per chunk is what made power-of-two parts slow, lab/NOTES.md v5.8).
    if GELU and not HAS_COL and not HAS_PREFIX:
        # GELU rises for x > -0.75 and stays within the amax floor below it, so with the floor the row's amax is
        # GELU(max x): pass 1 reads x and computes no GELU, pass 2 computes each GELU once
        run = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)  # masked lanes read 0: GELU(0) = 0 is below the floor
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            ok = row_ok[:, None] & (cols < K)[None, :]
            x = tl.load(X + rows64[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0)
            run = tl.maximum(run, x.to(tl.float32))
        amax = _gelu_stored(tl.max(run, axis=1), X, INTERPRET, TANH_LIBDEVICE)
    else:
        run = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            col_ok = cols < K
            ok = row_ok[:, None] & col_ok[None, :]
            x = _load_act(X, P, rows64, cols, ok, col_ok, stride_xm, stride_pm, K0, C, HAS_COL, GELU, HAS_PREFIX,
                          INTERPRET, TANH_LIBDEVICE)
            run = tl.maximum(run, tl.abs(x))
        amax = tl.max(run, axis=1)
    scale, inv = _scale_and_inverse(amax, GELU)
    for k0 in range(0, K, BLOCK_K):  # pass 2: quantize (the tile is back from L2)
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        ok = row_ok[:, None] & col_ok[None, :]
        x = _load_act(X, P, rows64, cols, ok, col_ok, stride_xm, stride_pm, K0, C, HAS_COL, GELU, HAS_PREFIX,
                      INTERPRET, TANH_LIBDEVICE)
        q = _quantize_tile(x, inv[:, None], INTERPRET)
        tl.store(Q + rows64[:, None] * stride_qm + cols[None, :], q, mask=ok)
    tl.store(S + rows, scale, mask=row_ok)


@triton.jit
def _fp8_quant_per_block_kernel(X, P, C, Q, S, M, K, K0, stride_xm, stride_pm, stride_qm, stride_sm, stride_sk,
                                n_tiles_m, n_kb, HAS_COL: tl.constexpr, BLOCK_M: tl.constexpr,
                                BLOCK_K: tl.constexpr, GELU: tl.constexpr, HAS_PREFIX: tl.constexpr,
                                INTERPRET: tl.constexpr, TANH_LIBDEVICE: tl.constexpr):
    pid = tl.program_id(0)
    for t in range(pid, n_tiles_m * n_kb, tl.num_programs(0)):
        # consecutive programs take consecutive K blocks of the same rows: neighbouring reads
        tile_m = t // n_kb
        kb = t % n_kb
        rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        row_ok = rows < M
        col_ok = cols < K
        ok = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)
        x = _load_act(X, P, rows64, cols, ok, col_ok, stride_xm, stride_pm, K0, C, HAS_COL, GELU, HAS_PREFIX,
                      INTERPRET, TANH_LIBDEVICE)
        scale, inv = _scale_and_inverse(tl.max(tl.abs(x), axis=1), GELU)
        q = _quantize_tile(x, inv[:, None], INTERPRET)
        tl.store(Q + rows64[:, None] * stride_qm + cols[None, :], q, mask=ok)
        tl.store(S + rows64 * stride_sm + kb * stride_sk, scale, mask=row_ok)


def _gelu_chunk(K: int) -> int:
    """The chunk width of chunked GELU rows: 4096 or 2048, whichever pads the row less (the wider on a tie)."""
    return min(GELU_CHUNK_KS, key=lambda c: (cdiv(K, c) * c, -c))


def gelu_rows_chunked(K: int, gelu: bool, has_col: bool, has_prefix: bool) -> bool:
    """Whether GELU rows of K channels run in chunks (two passes, GELU(max x) for the scale) rather than in one
    power-of-two tile: where the tile would leave GELU_CHUNK_IDLE_SHARE of its lanes idle or more and the chunks
    would not, because the GELU path is bound by instruction issue and idle lanes issue too (lab/NOTES.md v5.8,
    v6.3)."""
    if not gelu or has_col or has_prefix or not GELU_CHUNKS:
        return False
    chunk = _gelu_chunk(K)
    return cdiv(K, chunk) * chunk <= next_power_of_2(K) * (1 - GELU_CHUNK_IDLE_SHARE)


def per_token_launch(K: int, *, chunked: bool = False, block_m: int | None = None, num_warps: int | None = None,
                     max_single_pass_k: int = SINGLE_PASS_ELEMENTS, chunk_k: int | None = None,
                     interpret: bool = False) -> dict:
    """The per-token kernel's tile and warps for rows of K channels (the bench sweeps the overrides).
    ``chunked``: two passes over BLOCK_K chunks even where the row fits one tile (see `gelu_rows_chunked`)."""
    single = K <= max_single_pass_k and not chunked
    if single:
        bk = next_power_of_2(max(K, 16))
        # at least ~4096 elements a program (a whole row for K > 4096), 32 fp32 values a thread (16-byte loads,
        # no spills): 4 warps for 4096 elements, 8 for 8192, 16 for 16384
        bm = block_m or max(1, 4096 // bk)
    elif interpret or interpreting():
        bk, bm = chunk_k or 128, block_m or 4
    elif chunked:
        # one row a program, 8 warps, chunks of 4096 or 2048 (whichever pads the row less; 12288 -> 3 x 4096,
        # 9728 -> 5 x 2048): the fastest of 1024-4096-wide chunks at 1-4 rows, 4-16 warps on the H200
        # (lab/NOTES.md v6.3)
        bk = chunk_k or _gelu_chunk(K)
        bm = block_m or 1
        num_warps = num_warps or 8
    else:  # rows wider than one tile
        bk, bm = chunk_k or 1024, block_m or 2
    warps = num_warps or min(16, max(4, bm * bk // 1024))
    return dict(BLOCK_M=bm, BLOCK_K=bk, SINGLE_PASS=single, num_warps=warps)


@functools.lru_cache(maxsize=512)
def _default_per_token_plan(K: int, interp: bool, gelu: bool, has_col: bool, has_prefix: bool,
                            chunks_switch: bool) -> dict:
    # ``chunks_switch`` is GELU_CHUNKS, which `gelu_rows_chunked` reads: passed only to key the cache on it
    return per_token_launch(K, chunked=gelu_rows_chunked(K, gelu, has_col, has_prefix), interpret=interp)


def quantize_per_token_unchecked(x: torch.Tensor, col_scale: torch.Tensor | None = None, gelu: bool = False,
                                 prefix: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_fp8_rows` per token with the default launch and no argument checks: the FP8 linears' eager
    path, whose host time per call is what an eager image-model step waits on. ``x``: 2-D, unit stride along K,
    fp16/bf16/fp32; ``prefix``: None or [M, K0] of x's dtype, unit stride along K0; ``col_scale``: None or fp32
    [K0 + K] on x's device (the caller guarantees all three)."""
    M, K = x.shape
    K0 = 0 if prefix is None else prefix.shape[1]
    interp = interpreting()
    launch = _default_per_token_plan(K0 + K, interp, gelu, col_scale is not None, prefix is not None, GELU_CHUNKS)
    q = torch.empty((M, K0 + K), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    if M:
        n_tiles = -(-M // launch["BLOCK_M"])
        _fp8_quant_per_token_kernel[(n_tiles,)](x, x if prefix is None else prefix,
                                                x if col_scale is None else col_scale, q, scales, M, K0 + K, K0,
                                                x.stride(0), 0 if prefix is None else prefix.stride(0),
                                                q.stride(0), n_tiles, HAS_COL=col_scale is not None, GELU=gelu,
                                                HAS_PREFIX=prefix is not None, INTERPRET=interp,
                                                TANH_LIBDEVICE=False, enable_fp_fusion=True, **launch)
    return q, scales


def _checked_prefix(prefix: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    if prefix is None:
        return None
    if prefix.dim() != 2 or prefix.shape[0] != x.shape[0] or prefix.dtype != x.dtype or prefix.device != x.device:
        raise ValueError(f"prefix must be 2-D [{x.shape[0]}, K0] of x's dtype {x.dtype} on {x.device}, got "
                         f"{prefix.dtype} {tuple(prefix.shape)} on {prefix.device}")
    return prefix if prefix.stride(1) == 1 else prefix.contiguous()


def quantize_fp8_rows(x: torch.Tensor, granularity: str = "per_token", col_scale: torch.Tensor | None = None,
                      *, prologue: str | None = None, prefix: torch.Tensor | None = None,
                      scales_k_major: bool = False, block_m: int | None = None, num_warps: int | None = None,
                      programs: int | None = None, max_single_pass_k: int = SINGLE_PASS_ELEMENTS, tanh: str = "exp2",
                      chunked: bool | None = None, chunk_k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D activation to FP8 e4m3 with per-token or 1x128-block scales (see the module doc).

    ``prefix`` [M, K0] (x's dtype): the rows quantized are ``cat([prefix, prologue(x)], 1)`` [M, K0 + K], read
    from both tensors (no concatenated copy); ``col_scale`` then has K0 + K entries.
    ``block_m`` / ``num_warps`` / ``chunked`` / ``chunk_k`` override the launch heuristics; ``programs`` caps the
    grid (the programs then walk the tiles, grid-stride). ``tanh``: how the GELU prologue computes tanh on the
    GPU, ``"exp2"`` (default, the sigmoid form: one exp2 and one division) or ``"libdevice"`` (the CUDA math
    library's tanhf, as torch; several times slower inside this kernel)."""
    if tanh not in TANH_IMPLS:
        raise ValueError(f"tanh={tanh!r} is not supported; use one of {TANH_IMPLS}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not supported; use one of {GRANULARITIES}")
    if prologue not in PROLOGUES:
        raise ValueError(f"prologue={prologue!r} is not supported; use one of {PROLOGUES}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [tokens, features], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    if x.stride(1) != 1:
        x = x.contiguous()
    prefix = _checked_prefix(prefix, x)
    M, K1 = x.shape
    K0 = 0 if prefix is None else prefix.shape[1]
    K = K0 + K1
    if col_scale is not None:
        if col_scale.shape != (K,) or col_scale.dtype != torch.float32 or col_scale.device != x.device:
            raise ValueError(f"col_scale must be fp32 [{K}] on {x.device}, got {col_scale.dtype} "
                             f"{tuple(col_scale.shape)} on {col_scale.device}")
        col_scale = col_scale.contiguous()
    gelu = prologue == "gelu_tanh"
    if granularity == "per_token" and tanh == "exp2" and (block_m, num_warps, programs, max_single_pass_k, chunked,
                                                          chunk_k) == (None, None, None, SINGLE_PASS_ELEMENTS,
                                                                       None, None):
        return quantize_per_token_unchecked(x, col_scale, gelu, prefix)
    q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    interp = interpreting()
    col = col_scale if col_scale is not None else x  # dummy pointers when HAS_COL / HAS_PREFIX are off
    pre, stride_pm = (x, 0) if prefix is None else (prefix, prefix.stride(0))
    common = dict(HAS_COL=col_scale is not None, GELU=gelu, HAS_PREFIX=prefix is not None, INTERPRET=interp,
                  TANH_LIBDEVICE=tanh == "libdevice", enable_fp_fusion=True)
    if granularity == "per_token":
        scales = torch.empty((M, 1), dtype=torch.float32, device=x.device)
        launch = per_token_launch(K, chunked=gelu_rows_chunked(K, gelu, col_scale is not None, prefix is not None)
                                  if chunked is None else chunked, block_m=block_m, num_warps=num_warps,
                                  max_single_pass_k=max_single_pass_k, chunk_k=chunk_k)
        n_tiles = cdiv(M, launch["BLOCK_M"])
        if M:
            grid = (min(n_tiles, programs) if programs else n_tiles,)
            _fp8_quant_per_token_kernel[grid](x, pre, col, q, scales, M, K, K0, x.stride(0), stride_pm, q.stride(0),
                                              n_tiles, **common, **launch)
        return q, scales
    n_kb = cdiv(K, BLOCK_K_SCALE)
    if scales_k_major:
        scales = torch.empty((n_kb, M), dtype=torch.float32, device=x.device).t()
    else:
        scales = torch.empty((M, n_kb), dtype=torch.float32, device=x.device)
    bm = block_m or (4 if interp else 32)
    n_tiles = cdiv(M, bm) * n_kb
    if M:
        grid = (min(n_tiles, programs) if programs else n_tiles,)
        _fp8_quant_per_block_kernel[grid](x, pre, col, q, scales, M, K, K0, x.stride(0), stride_pm, q.stride(0),
                                          scales.stride(0), scales.stride(1), cdiv(M, bm), n_kb,
                                          BLOCK_M=bm, BLOCK_K=BLOCK_K_SCALE, num_warps=num_warps or 4, **common)
    return q, scales
