"""Hopper (sm90) attention kernel in Gluon: the same numerics as `triton_attn`'s fast path, with the
tensor-core work scheduled by hand.

Why a second kernel: Triton waits for every `tl.dot` whose result is not an accumulator right after issuing
it, so in `triton_attn` the softmax never overlaps a matrix multiply of the same warpgroup (lab/NOTES.md,
v1.6). Gluon exposes `warpgroup_mma(..., is_async=True)` and `warpgroup_mma_wait`, so here the next key
block's INT8 Q·Kᵀ runs on the tensor cores while this block's exp2 runs (FlashAttention-3's intra-warpgroup
overlap), and the FP8 P·V of each block is still computed fresh and added into the FP32 accumulator
(two-level accumulation).

Scope (the launcher in `triton_attn` sends everything else to the Triton kernel): sm90, no causal mask,
per-block K scales, no Q smoothing, FP8 P·V, head dims 64 and 128 (padded), masks: none, or a key-padding
mask that is a valid prefix per batch (given as key lengths); optionally block-sparse (a list of key tiles per
q-tile, `block_sparse.kernel_tiles`: the loop runs over those only, TMA addressed from the list). Same math,
op for op, as `triton_attn` with FAST=True, so `reference.py` stays its oracle. With per-token Q scales (the
default) each CTA quantizes its own Q rows (`_quantize_q_tile`) instead of reading them from the separate
quantization pass.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from sagegen.kernels.block_sparse import sparse_args
from sagegen.kernels.gluon_tile_list import scale_at, staged, tile_at, tile_list
from sagegen.kernels.spec import EPS, INT8_MAX, LOG2_FP8_MAX, REF_WINDOW, cdiv

_EPS = gl.constexpr(EPS)
_INT8_MAX = gl.constexpr(INT8_MAX)
_LOG2_FP8_MAX = gl.constexpr(LOG2_FP8_MAX)
_REF_WINDOW = gl.constexpr(REF_WINDOW)
_MAGIC = gl.constexpr(0x4B400000)  # int32 bits of 1.5·2^23: (i + _MAGIC) read as fp32 is 12582912 + i, exactly
_MAGIC_F = gl.constexpr(12582912.0)
# The TMA load was renamed after Triton 3.6 (async_copy_global_to_shared -> async_load).
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_TRITON_VERSION = tuple(int(part) for part in triton.__version__.split(".")[:2])


@gluon.jit
def _issue_kv(k_desc, v_desc, k_smem, v_smem, bars, kv_row0, v_row0, i, tile, STAGES: gl.constexpr,
              BLOCK_N: gl.constexpr):
    """TMA loads of key tile `tile` (K and the transposed FP8 V), the loop's i-th, into ring slot i % STAGES."""
    slot = i % STAGES
    bar = bars.index(slot)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _tma_load(k_desc, [kv_row0 + tile * BLOCK_N, 0], bar, k_smem.index(slot))
    _tma_load(v_desc, [v_row0, tile * BLOCK_N], bar, v_smem.index(slot))


@gluon.jit
def _quantize_q_tile(Q, q_smem, b, h, row0, N_Q, D, stride_qb, stride_qh, stride_qm, stride_qd,
                     BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, PAD_D: gl.constexpr, row_s: gl.constexpr):
    """Rows row0.. of Q (bf16/fp16, any strides) -> INT8 with one scale per row, written to q_smem for the
    Q·Kᵀ multiplies; returns the scales in `row_s`. The same ops as `triton_quant._quant_q_kernel`
    (per-token granularity), so the result is bit-identical to quantizing in a separate pass; Q is read once
    per CTA either way, and this saves that pass's launch and its INT8 round trip through memory."""
    TPW_D: gl.constexpr = HEAD_DIM // 8  # 16-byte loads along the head dim
    layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 // TPW_D, TPW_D],
                                            warps_per_cta=[gl.num_warps(), 1], order=[1, 0])
    offs_m = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    # a runtime head-dim bound in the mask would split the 16-byte loads: only padded head dims have one
    valid = gl.expand_dims(offs_m < N_Q, 1) & gl.expand_dims((offs_d < D) | (not PAD_D), 0)
    ptrs = (Q + b.to(gl.int64) * stride_qb + h.to(gl.int64) * stride_qh + gl.expand_dims(offs_m, 1) * stride_qm
            + gl.expand_dims(offs_d, 0) * stride_qd)
    x = gl.load(ptrs, mask=valid, other=0.0).to(gl.float32)
    # + sum(x * 0): exactly amax for finite rows, NaN for a row with NaN or inf (max() would drop a NaN)
    amax = gl.maximum(gl.max(gl.abs(x), axis=1), _EPS) + gl.sum(x * 0.0, axis=1)
    y = x * gl.expand_dims(gl.div_rn(gl.full_like(amax, _INT8_MAX), amax), 1)
    y = gl.where(y >= 0, y + 0.5, y - 0.5)  # round half away from zero (the int8 cast truncates)
    y = gl.minimum(gl.maximum(y, -_INT8_MAX), _INT8_MAX)
    q_smem.store(y.to(gl.int8))
    fence_async_shared()  # the stores above, before the tensor cores read q_smem
    return gl.convert_layout(gl.div_rn(amax, gl.full_like(amax, _INT8_MAX)), row_s)


@gluon.jit
def _softmax_block(s, q_scale, ks, m_i, r_i, l_i, start_n, N_K, TAIL: gl.constexpr, s_layout: gl.constexpr):
    """Scores of one key block (raw int32) -> P (fp32, on e4m3's scale), the rescale factor, new row stats.

    Identical to `triton_attn._attn_block` with FAST=True: max, scale and shift work on the magic-offset
    floats, and the scale and the shift are one FMA inside exp2."""
    x = (s + _MAGIC).to(gl.float32, bitcast=True)
    if TAIL:
        offs_n = start_n + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))
        x = gl.where(gl.expand_dims(offs_n < N_K, 0), x, float("-inf"))
    row_scale = q_scale * ks
    m_blk = (gl.max(x, axis=1) - _MAGIC_F) * row_scale
    m_new = gl.maximum(m_i, m_blk)
    r_new = gl.maximum(m_blk, m_new - _REF_WINDOW)
    shift = row_scale * _MAGIC_F + r_new - _LOG2_FP8_MAX
    # the reference the shift really subtracts, as triton_attn._exp2_shift (spec.py)
    r_new = gl.fma(-row_scale, gl.full_like(row_scale, _MAGIC_F), shift) + _LOG2_FP8_MAX
    p = gl.exp2(gl.fma(x, gl.expand_dims(row_scale, 1), -gl.expand_dims(shift, 1)))
    alpha = gl.exp2(r_i - r_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, r_new, l_i


@gluon.jit
def _p_operand(p, p_layout: gl.constexpr, PERMUTED_V: gl.constexpr):
    """P (fp32, accumulator layout) -> FP8 in the register layout of the P·V multiply's A operand."""
    p8 = p.to(gl.float8e4nv)
    if PERMUTED_V:
        # In the accumulator a thread holds key columns 2t, 2t+1 of every 8-column group; the FP8 A operand
        # wants keys 4t..4t+3 of every 16. Relabelling the keys (bit 3 of the column moves below the lane
        # bits) makes the two layouts the same registers; V was stored with its keys in that order.
        BM: gl.constexpr = p.shape[0]
        BN: gl.constexpr = p.shape[1]
        p8 = p8.reshape([BM, BN // 16, 2, 4, 2]).permute((0, 1, 3, 2, 4)).reshape([BM, BN])
        return gl.convert_layout(p8, p_layout, assert_trivial=True)
    return gl.convert_layout(p8, p_layout)


@gluon.jit
def _attn_fwd_sm90(
    q_desc, k_desc, v_desc, Q, QS, KS, VS, VM, KV_LEN, Out, OS, Lse, CNT, IDX,
    stride_qb, stride_qh, stride_qm, stride_qd, stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh,
    stride_cb, stride_ch, stride_ib, stride_ih, stride_im,
    H, GROUP, N_Q, N_K, NQ_PAD, NK_PAD, D, sm_scale_log2,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
    HAS_KV_LEN: gl.constexpr, SMOOTH_V: gl.constexpr, RETURN_LSE: gl.constexpr, PERMUTED_V: gl.constexpr,
    QUANT_Q: gl.constexpr, PAD_D: gl.constexpr, SPARSE: gl.constexpr, OUT_FP8: gl.constexpr,
    q_layout: gl.constexpr, EARLY_INDEX: gl.constexpr = False, LIST_IN_SMEM: gl.constexpr = False,
    MAX_TILES: gl.constexpr = 1,
):
    gl.static_assert(BLOCK_M == 16 * gl.num_warps(), "one warpgroup per 64 rows")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, HEAD_DIM, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    start_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    bh_kv = b * (H // GROUP) + h // GROUP
    n_keys = N_K
    if HAS_KV_LEN:
        n_keys = gl.load(KV_LEN + b)
    idx_row = IDX
    if SPARSE:
        # Only the listed key tiles (block_sparse.kernel_tiles: sorted, none past the valid keys, so only the
        # last can be ragged). An empty q-tile computes tile 0 and discards it in the end.
        cnt = gl.load(CNT + b * stride_cb + h * stride_ch + start_m)
        idx_row = IDX + b.to(gl.int64) * stride_ib + h.to(gl.int64) * stride_ih + start_m * stride_im
        n_blocks = gl.maximum(cnt, 1)
    else:
        n_blocks = gl.cdiv(n_keys, BLOCK_N)
    kv_row0 = bh_kv * NK_PAD
    v_row0 = bh_kv * HEAD_DIM
    ks_base = KS + kv_row0

    q_smem = gl.allocate_shared_memory(gl.int8, [BLOCK_M, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)

    if not QUANT_Q:
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        _tma_load(q_desc, [pid_bh * NQ_PAD + start_m * BLOCK_M, 0], q_bar, q_smem)
    tile_smem = idx_row
    ks_smem = ks_base
    if LIST_IN_SMEM:  # see `list_in_smem`
        listed = tile_list(idx_row, cnt, MAX_TILES)
        tile_smem = staged(listed, MAX_TILES, gl.int32)
    for i in gl.static_range(STAGES):
        if i < n_blocks:
            _issue_kv(k_desc, v_desc, k_smem, v_smem, bars, kv_row0, v_row0, i,
                      tile_at(idx_row, tile_smem, i, n_blocks, SPARSE, LIST_IN_SMEM, MAX_TILES), STAGES, BLOCK_N)
    if LIST_IN_SMEM:  # K's scales of the listed tiles, gathered while the first tiles load
        ks_smem = staged(gl.load(ks_base + listed * BLOCK_N), MAX_TILES, gl.float32)

    if QUANT_Q:  # while the first K/V tiles are on their way
        q_scale = _quantize_q_tile(Q, q_smem, b, h, start_m * BLOCK_M, N_Q, D, stride_qb, stride_qh, stride_qm,
                                   stride_qd, BLOCK_M, HEAD_DIM, PAD_D, row_s) * sm_scale_log2
    else:
        offs_m = start_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_s)
        q_scale = gl.load(QS + pid_bh * NQ_PAD + offs_m) * sm_scale_log2
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)  # running row max of the scores
    r_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)  # the max that acc and l are relative to
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.int32, s_layout)
    o_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    if not QUANT_Q:
        mbarrier.wait(q_bar, 0)
    mbarrier.wait(bars.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    tile = tile_at(idx_row, tile_smem, 0, n_blocks, SPARSE, LIST_IN_SMEM, MAX_TILES)
    # indices are read a step ahead: no load on the path
    tile_nxt = tile_at(idx_row, tile_smem, 1, n_blocks, SPARSE, LIST_IN_SMEM, MAX_TILES)
    if EARLY_INDEX:  # see `early_index`: the loop's loads run one more step ahead
        tile_after = tile_at(idx_row, tile_smem, 2, n_blocks, SPARSE, LIST_IN_SMEM, MAX_TILES)
        tile_far = tile_at(idx_row, tile_smem, STAGES, n_blocks, SPARSE, LIST_IN_SMEM, MAX_TILES)
    ks = scale_at(ks_base, ks_smem, tile, 0, LIST_IN_SMEM, MAX_TILES, BLOCK_N)

    # Steady state over every block but the last: issue block j+1's Q·Kᵀ, then block j's softmax runs while
    # the tensor cores work, then block j's P·V; the ring slot of block j is refilled once both are done.
    for j in range(0, n_blocks - 1):
        nxt = j + 1
        # indices first: their loads overlap the wait and the softmax below
        if EARLY_INDEX:
            tile_after_next = tile_at(idx_row, tile_smem, j + 3, n_blocks, SPARSE, LIST_IN_SMEM, MAX_TILES)
            tile_far_next = tile_at(idx_row, tile_smem, j + 1 + STAGES, n_blocks, SPARSE, LIST_IN_SMEM, MAX_TILES)
        else:
            tile_after = tile_at(idx_row, tile_smem, j + 2, n_blocks, SPARSE, LIST_IN_SMEM, MAX_TILES)
            tile_far = tile_at(idx_row, tile_smem, j + STAGES, n_blocks, SPARSE, LIST_IN_SMEM, MAX_TILES)
        mbarrier.wait(bars.index(nxt % STAGES), (nxt // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(nxt % STAGES).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        ks_next = scale_at(ks_base, ks_smem, tile_nxt, nxt, LIST_IN_SMEM, MAX_TILES, BLOCK_N)
        p, alpha, m_i, r_i, l_i = _softmax_block(s, q_scale, ks, m_i, r_i, l_i, tile * BLOCK_N, n_keys, False,
                                                 s_layout)
        p8 = _p_operand(p, p_layout, PERMUTED_V)
        pv_tok = warpgroup_mma(p8, v_smem.index(j % STAGES).permute((1, 0)), o_zero, use_acc=False,
                               is_async=True)
        s, pv = warpgroup_mma_wait(0, deps=(s_tok, pv_tok))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1) + pv
        if j + STAGES < n_blocks:
            _issue_kv(k_desc, v_desc, k_smem, v_smem, bars, kv_row0, v_row0, j + STAGES, tile_far, STAGES, BLOCK_N)
        ks = ks_next
        tile = tile_nxt
        tile_nxt = tile_after
        if EARLY_INDEX:
            tile_after = tile_after_next
            tile_far = tile_far_next

    # The last block: the only one that can be partial.
    last = n_blocks - 1
    p, alpha, m_i, r_i, l_i = _softmax_block(s, q_scale, ks, m_i, r_i, l_i, tile * BLOCK_N, n_keys, True,
                                             s_layout)
    p8 = _p_operand(p, p_layout, PERMUTED_V)
    pv_tok = warpgroup_mma(p8, v_smem.index(last % STAGES).permute((1, 0)), o_zero, use_acc=False,
                           is_async=True)
    pv = warpgroup_mma_wait(0, deps=(pv_tok,))
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1) + pv
    if SPARSE:  # an empty q-tile: zeros and lse = -inf, as a fully masked row
        l_i = gl.where(cnt > 0, l_i, 0.0)
        acc = gl.where(cnt > 0, acc, 0.0)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    _epilogue(acc, l_i, r_i, VS, VM, Out, OS, Lse, b, h, v_row0, start_m * BLOCK_M, N_Q, D,
              stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh, BLOCK_M, HEAD_DIM,
              SMOOTH_V, RETURN_LSE, PAD_D, OUT_FP8, s_layout, o_layout)


@gluon.jit
def _epilogue(acc, l_i, r_i, VS, VM, Out, OS, Lse, b, h, v_row0, row0, N_Q, D,
              stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh,
              BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, SMOOTH_V: gl.constexpr, RETURN_LSE: gl.constexpr,
              PAD_D: gl.constexpr, OUT_FP8: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr):
    """O = acc / l, undo V's FP8 scale (and smoothing), store rows row0.. of head (b, h) (in e4m3 with the
    call's scale at OS with OUT_FP8: fp8_out.py); the LSE too."""
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    # acc and l both carry P's factor 448, which cancels here.
    l_o = gl.convert_layout(l_i, row_o)
    inv_l = gl.where(l_o != 0, 1.0 / gl.where(l_o != 0, l_o, 1.0), 0.0)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o = acc * gl.expand_dims(inv_l, 1) * gl.expand_dims(gl.load(VS + v_row0 + offs_d), 0)
    if SMOOTH_V:
        v_mean = gl.expand_dims(gl.load(VM + v_row0 + offs_d), 0)
        o = gl.where(gl.expand_dims(l_o != 0, 1), o + v_mean, 0.0)
    # Stored from a layout with 8 consecutive head-dim elements (16 bytes) a thread: the accumulator's layout
    # gives each thread pairs of columns, and its 4-byte stores cost up to 0.08 ms a call, a fifth of a
    # one-key-tile call (lab/NOTES.md v7.4). The conversion goes through shared memory the ring has freed.
    if OUT_FP8:  # (the conversion to e4m3 saturates: F2FP.SATFINITE, tests/kernels/test_kernel_codegen.py)
        o = o * gl.load(OS)
    VEC: gl.constexpr = 16 if OUT_FP8 else 8  # 16 bytes a thread
    TPW_D: gl.constexpr = HEAD_DIM // VEC
    st_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, VEC], threads_per_warp=[32 // TPW_D, TPW_D],
                                               warps_per_cta=[gl.num_warps(), 1], order=[1, 0])
    o_st = gl.convert_layout(o.to(Out.dtype.element_ty), st_layout)
    offs_mo = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, st_layout))
    offs_do = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, st_layout))
    # int64 offsets: outputs past 2^31 elements (large batches of HunyuanVideo 720p) must not wrap
    o_ptrs = (Out + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh + gl.expand_dims(offs_mo, 1) * stride_om
              + gl.expand_dims(offs_do, 0) * stride_od)
    o_mask = gl.expand_dims(offs_mo < N_Q, 1) & gl.expand_dims((offs_do < D) | (not PAD_D), 0)
    gl.store(o_ptrs, o_st, mask=o_mask)
    if RETURN_LSE:
        offs_m = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        lse = (r_i + gl.log2(l_i) - _LOG2_FP8_MAX) * 0.6931471805599453
        gl.store(Lse + b * stride_lb + h * stride_lh + offs_m, lse, mask=offs_m < N_Q)


@functools.lru_cache(maxsize=None)
def shared_layouts(block_m: int, block_n: int, head_dim: int):
    """NVMMA shared layouts of the Q, K and transposed-V tiles (what the TMA descriptors carry). Made once per
    tile shape: building them costs ~10 us of host time, on every attention call."""
    return (gl.NVMMASharedLayout.get_default_for([block_m, head_dim], gl.int8),
            gl.NVMMASharedLayout.get_default_for([block_n, head_dim], gl.int8),
            gl.NVMMASharedLayout.get_default_for([head_dim, block_n], gl.float8e4nv))


# V's keys stored in `_p_operand`'s order (no shuffles for P); False only to measure the difference.
PERMUTE_V = True
# Q quantized inside the kernel (no separate Q pass); False only to measure the difference.
QUANT_Q_IN_KERNEL = True
# (ring slots, register cap) per padded head dim; lab/probes/tune_gluon.py measures the alternatives.
LAUNCH_OVERRIDES: dict[int, tuple[int, int | None]] = {}


def launch_settings(head_dim: int) -> tuple[int, int | None]:
    """Three K+V ring slots at head dim 128 (104 KiB of shared memory: two CTAs per SM, 254 registers);
    four at head dim 64 with registers capped at 168 so that three CTAs share an SM."""
    if head_dim in LAUNCH_OVERRIDES:
        return LAUNCH_OVERRIDES[head_dim]
    return (3, None) if head_dim >= 128 else (4, 168)


def early_index(head_dim: int) -> bool:
    """Whether a block-sparse launch loads its key-tile indices one more loop step ahead (``EARLY_INDEX``).

    Triton 3.9 moves each loaded index into a uniform register a few instructions after its load, so every key
    tile waited on a global load: at head dim 128 the sparse loop ran 6-8% slower than the dense one. Loaded a
    step earlier, the value crosses the loop's back edge first and the wait is gone. H200, kernel alone, sparse
    over dense with every tile listed (lab/probes/probe_sparse_index_loads.py, lab/NOTES.md v8.2):
    Triton 3.9 hd128 1.084 -> 1.006 (32k), 1.057 -> 0.998 (75.6k); Triton 3.6, whose loop carries the indices
    in ordinary registers already, 0.998 -> 1.019; head dim 64 1.045-1.049 -> 1.062-1.067 on both. Offline
    SASS of Triton 3.8 shows 3.9's pattern."""
    return head_dim >= 128 and _TRITON_VERSION >= (3, 8)


# The longest key-tile list a CTA stages in shared memory (`list_in_smem`), per padded head dim: 8 bytes an
# entry, within what an SM has left at that head dim's CTAs per SM (hd64: 68 KiB a CTA, three). At head dim 128
# (104 KiB, two: room for 1024) the loop loads its indices early instead (`early_index`).
LIST_LIMIT = {64: 512}


def list_in_smem(head_dim: int, n_key_tiles: int) -> int:
    """How many entries a block-sparse launch stages its key-tile list and K scales in shared memory with
    (``LIST_IN_SMEM``, ``MAX_TILES``), or 0 to read them from global memory in the loop (`early_index`).

    At head dim 64 the loop's register cap (168, three CTAs per SM) makes every Triton version move each loaded
    index and K scale into a uniform register in the iteration that loads it, so each key tile waited on three
    global loads (offline SASS); read from shared memory those waits are a few cycles."""
    entries = triton.next_power_of_2(max(n_key_tiles, 1))
    return entries if entries <= LIST_LIMIT.get(head_dim, 0) else 0


def launch(qq, out: torch.Tensor, lse, kv_len, *, H: int, group: int, n_q: int, n_k: int, d: int,
           block_m: int, block_n: int, smooth_v: bool, sm_scale_log2: float, permuted_v: bool = True,
           q: torch.Tensor | None = None, tiles: tuple[torch.Tensor, torch.Tensor] | None = None,
           out_inv_scale: torch.Tensor | None = None) -> None:
    """Run the kernel on quantized buffers from `triton_quant.quantize`.

    out: [B, H, Nq, D], any strides; lse: [B, H, Nq] fp32 or None; kv_len: int32 [B] valid-prefix key
    lengths or None; permuted_v: V's keys are in `_p_operand`'s order (`quantize(..., permute_v_keys=True)`);
    q: the unquantized Q [B, H, Nq, D] (any strides) to quantize inside the kernel (per-token scales), when
    `quantize(..., quantize_q=False)` left qq.q8 empty; tiles: `block_sparse.kernel_tiles` (with kv_len) or None;
    out_inv_scale: fp32 [1], for an e4m3 ``out`` (fp8_out.py).
    """
    d_pad = qq.k8.shape[-1]
    nk_pad = qq.k8.shape[2]
    nq_pad = cdiv(n_q, block_m) * block_m
    stages, maxnreg = launch_settings(d_pad)
    q_l, k_l, v_l = shared_layouts(block_m, block_n, d_pad)
    k_desc = TensorDescriptor.from_tensor(qq.k8.view(-1, d_pad), [block_n, d_pad], k_l)
    v_desc = TensorDescriptor.from_tensor(qq.v.view(-1, nk_pad), [d_pad, block_n], v_l)
    if q is None:
        q_desc = TensorDescriptor.from_tensor(qq.q8.view(-1, d_pad), [block_m, d_pad], q_l)
        q_arg, q_strides, qs = qq.q8, (0, 0, 0, 0), qq.q_scale
    else:  # no Q buffers: k_desc stands in for the unused descriptor argument
        q_desc, q_arg, q_strides, qs = k_desc, q, q.stride(), qq.k_scale
    vm = qq.v_mean if qq.v_mean is not None else qq.v_scale
    sparse_ptrs, sparse_strides = sparse_args(tiles, qq.k_scale)
    grid = (cdiv(n_q, block_m), out.shape[0] * H)
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    max_tiles = list_in_smem(d_pad, nk_pad // block_n) if tiles is not None else 0
    _attn_fwd_sm90[grid](
        q_desc, k_desc, v_desc, q_arg, qs, qq.k_scale, qq.v_scale, vm,
        kv_len if kv_len is not None else qq.k_scale, out,
        out_inv_scale if out_inv_scale is not None else qq.k_scale, lse if lse is not None else qq.k_scale,
        *sparse_ptrs,
        *q_strides, *out.stride(), lse.stride(0) if lse is not None else 0, lse.stride(1) if lse is not None else 0,
        *sparse_strides,
        H, group, n_q, n_k, nq_pad, nk_pad, d, sm_scale_log2,
        BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=d_pad, STAGES=stages, HAS_KV_LEN=kv_len is not None,
        SMOOTH_V=smooth_v, RETURN_LSE=lse is not None, PERMUTED_V=permuted_v, QUANT_Q=q is not None,
        PAD_D=d != d_pad, SPARSE=tiles is not None, OUT_FP8=out_inv_scale is not None, q_layout=q_l,
        EARLY_INDEX=tiles is not None and not max_tiles and early_index(d_pad), LIST_IN_SMEM=max_tiles > 0,
        MAX_TILES=max(max_tiles, 1), num_warps=4, enable_fp_fusion=True, **extra,
    )
