"""Hopper (sm90) attention kernel in Gluon, two warpgroups in ping-pong: `gluon_attn`'s numerics, FA3's schedule.

One CTA holds 128 query rows, 64 per warpgroup, and both warpgroups read one shared ring of K/V tiles. Two
named hardware barriers make the warpgroups take turns issuing their matrix multiplies (FlashAttention-3's
"ping-pong"): in its turn a warpgroup issues block j's INT8 Q·Kᵀ and block j-1's FP8 P·V, hands the turn to
the other, then runs block j's softmax while its P·V (and the other warpgroup's multiplies) are on the tensor
cores. So one warpgroup's exp2 always overlaps the other's tensor-core work, which two independent CTAs per
SM (`gluon_attn`) only get by chance (bench/NOTES.md, "Where an iteration's cycles go").

Why named barriers and not mbarriers: bar.sync/bar.arrive cost a few cycles and need no shared memory or
warp specialization (v2.3, the mbarrier ping-pong with a loader warp, lost to register limits).

Ring reuse without a CTA barrier: in its turn t, warpgroup 0 has waited for its own multiplies of turn t-1
and, because turns alternate, warpgroup 1 has issued turn t-1 and so waited for its turn t-2 multiplies
(Q·Kᵀ of block t-2, P·V of block t-3). Block t-3's slot is free for both, and warp 0 (the only warp whose TMA
issues take effect) refills it there. Same scope as `gluon_attn`; `reference.py` is the oracle.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .gluon_attn import _epilogue, _issue_kv, _p_operand, _softmax_block, _tma_load, shared_layouts

# Named barrier 12 + w is "warpgroup w may issue its multiplies": warpgroup w syncs on it (128 threads) and the
# other warpgroup arrives on it (128 more). IDs well above the few that Triton's partitions use.
_SYNC_0 = gl.constexpr("bar.sync 12, 256; mov.u32 $0, $1;")
_SYNC_1 = gl.constexpr("bar.sync 13, 256; mov.u32 $0, $1;")
_ARRIVE_0 = gl.constexpr("bar.arrive 12, 256; mov.u32 $0, $1;")
_ARRIVE_1 = gl.constexpr("bar.arrive 13, 256; mov.u32 $0, $1;")
LOADER_REGS = gl.constexpr(24)
CONSUMER_REGS = gl.constexpr(240)


@gluon.jit
def _asm(code: gl.constexpr, token):
    # The token threads a data dependence through, so nothing is hoisted across the barrier by LLVM.
    return gl.inline_asm_elementwise(code, "=r,r", [token], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _wait_turn(WG: gl.constexpr, token, TURNS: gl.constexpr):
    """Block until the other warpgroup hands warpgroup WG the turn."""
    if not TURNS:
        pass
    elif WG == 0:
        token = _asm(_SYNC_0, token)
    else:
        token = _asm(_SYNC_1, token)
    return token


@gluon.jit
def _pass_turn(WG: gl.constexpr, token, TURNS: gl.constexpr):
    """Hand the turn to the other warpgroup; returns at once."""
    if not TURNS:
        pass
    elif WG == 0:
        token = _asm(_ARRIVE_1, token)
    else:
        token = _asm(_ARRIVE_0, token)
    return token


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, full, empty, q_row0, kv_row0, v_row0,
                    n_blocks, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    """One warp: both warpgroups' Q tiles, then K/V block b into slot b % STAGES once both warpgroups have
    finished with block b - STAGES."""
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row0, 0], q_bar, q_smem.index(0))
    _tma_load(q_desc, [q_row0 + q_desc.block_type.shape[0], 0], q_bar, q_smem.index(1))
    for blk in range(n_blocks):
        if blk >= STAGES:
            mbarrier.wait(empty.index(blk % STAGES), ((blk // STAGES) - 1) & 1)
        _issue_kv(k_desc, v_desc, k_smem, v_smem, full, kv_row0, v_row0, blk, STAGES, BLOCK_N)


@gluon.jit
def _turn(WG: gl.constexpr, j, q_smem, k_smem, v_smem, full, empty, ks_base, p8, alpha, acc, q_scale, m_i, r_i,
          l_i, n_keys, s_zero, o_zero, p_layout: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
          STAGES: gl.constexpr, BLOCK_N: gl.constexpr, TAIL: gl.constexpr, PERMUTED_V: gl.constexpr,
          TURNS: gl.constexpr):
    """Turn j >= 1: issue Q·Kᵀ(j) and P·V(j-1), pass the turn, softmax(j) while P·V(j-1) runs, add P·V(j-1)."""
    mbarrier.wait(full.index(j % STAGES), (j // STAGES) & 1)
    j = _wait_turn(WG, j, TURNS)
    s_tok = warpgroup_mma(q_smem, k_smem.index(j % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    pv_tok = warpgroup_mma(p8, v_smem.index((j - 1) % STAGES).permute((1, 0)), o_zero, use_acc=False,
                           is_async=True)
    j = _pass_turn(WG, j, TURNS)
    ks = gl.load(ks_base + j * BLOCK_N)
    s = warpgroup_mma_wait(1, deps=(s_tok,))
    p, alpha_j, m_i, r_i, l_i = _softmax_block(s, q_scale, ks, m_i, r_i, l_i, j * BLOCK_N, n_keys, TAIL,
                                               s_layout)
    p8_j = _p_operand(p, p_layout, PERMUTED_V)
    pv = warpgroup_mma_wait(0, deps=(pv_tok,))
    mbarrier.arrive(empty.index((j - 1) % STAGES))
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1) + pv
    return p8_j, alpha_j, acc, m_i, r_i, l_i


@gluon.jit
def _mma_partition(WG: gl.constexpr, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out, Lse, b, h,
                   pid_bh, row0, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh, stride_om, stride_od,
                   stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2, BLOCK_N: gl.constexpr,
                   HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, SMOOTH_V: gl.constexpr, RETURN_LSE: gl.constexpr,
                   PERMUTED_V: gl.constexpr, TURNS: gl.constexpr):
    """One warpgroup (its own partition, so the compiler's shared-memory barriers stay inside it): 64 query
    rows from row0, taking turns with the other warpgroup on the tensor cores."""
    BLOCK_M: gl.constexpr = 64
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, HEAD_DIM, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    ks_base = KS + kv_row0
    q_tile = q_smem.index(WG)

    # Rows past the padded length (the second warpgroup of a head's last tile) belong to the next head and
    # are never stored.
    offs_m = row0 + gl.arange(0, BLOCK_M, layout=row_s)
    q_scale = gl.load(QS + pid_bh * NQ_PAD + offs_m, mask=offs_m < NQ_PAD, other=0.0) * sm_scale_log2
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    r_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.int32, s_layout)
    o_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    token = row0
    if WG == 1:
        token = _pass_turn(WG, token, TURNS)  # warpgroup 0 takes the first turn
    # Turn 0: Q·Kᵀ of block 0 only.
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(full.index(0), 0)
    token = _wait_turn(WG, token, TURNS)
    s_tok = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    token = _pass_turn(WG, token, TURNS)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    ks = gl.load(ks_base)
    if n_blocks == 1:
        p, alpha, m_i, r_i, l_i = _softmax_block(s, q_scale, ks, m_i, r_i, l_i, 0, n_keys, True, s_layout)
    else:
        p, alpha, m_i, r_i, l_i = _softmax_block(s, q_scale, ks, m_i, r_i, l_i, 0, n_keys, False, s_layout)
    p8 = _p_operand(p, p_layout, PERMUTED_V)

    for j in range(1, n_blocks - 1):
        p8, alpha, acc, m_i, r_i, l_i = _turn(
            WG, j, q_tile, k_smem, v_smem, full, empty, ks_base, p8, alpha, acc, q_scale, m_i, r_i, l_i, n_keys,
            s_zero, o_zero, p_layout, s_layout, o_layout, STAGES, BLOCK_N, False, PERMUTED_V, TURNS)
    if n_blocks > 1:
        p8, alpha, acc, m_i, r_i, l_i = _turn(
            WG, n_blocks - 1, q_tile, k_smem, v_smem, full, empty, ks_base, p8, alpha, acc, q_scale, m_i, r_i,
            l_i, n_keys, s_zero, o_zero, p_layout, s_layout, o_layout, STAGES, BLOCK_N, True, PERMUTED_V, TURNS)

    # Last turn: P·V of the last block only. Warpgroup 1 does not pass it back: nobody would take it.
    token = _wait_turn(WG, n_blocks + token * 0, TURNS)
    pv_tok = warpgroup_mma(p8, v_smem.index((n_blocks - 1) % STAGES).permute((1, 0)), o_zero, use_acc=False,
                           is_async=True)
    if WG == 0:
        token = _pass_turn(WG, token, TURNS)
    pv = warpgroup_mma_wait(0, deps=(pv_tok,))
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1) + pv

    _epilogue(acc, l_i, r_i, VS, VM, Out, Lse, b, h, v_row0, row0, N_Q, D,
              stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh, BLOCK_M, HEAD_DIM,
              SMOOTH_V, RETURN_LSE, s_layout, o_layout)


@gluon.jit
def _mma_partition_prefetch(WG: gl.constexpr, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out,
                            Lse, b, h, pid_bh, row0, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh,
                            stride_om, stride_od, stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2,
                            BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                            SMOOTH_V: gl.constexpr, RETURN_LSE: gl.constexpr, PERMUTED_V: gl.constexpr,
                            TURNS: gl.constexpr):
    """`gluon_attn`'s loop order (block j+1's Q·Kᵀ in flight during block j's softmax) in this kernel's
    two-partition structure, no turns: to measure the structure apart from the schedule."""
    BLOCK_M: gl.constexpr = 64
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, HEAD_DIM, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    ks_base = KS + kv_row0
    q_tile = q_smem.index(WG)
    offs_m = row0 + gl.arange(0, BLOCK_M, layout=row_s)
    q_scale = gl.load(QS + pid_bh * NQ_PAD + offs_m, mask=offs_m < NQ_PAD, other=0.0) * sm_scale_log2
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    r_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.int32, s_layout)
    o_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(full.index(0), 0)
    s_tok = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    ks = gl.load(ks_base)
    for j in range(0, n_blocks - 1):
        nxt = j + 1
        mbarrier.wait(full.index(nxt % STAGES), (nxt // STAGES) & 1)
        s_tok = warpgroup_mma(q_tile, k_smem.index(nxt % STAGES).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        ks_next = gl.load(ks_base + nxt * BLOCK_N)
        p, alpha, m_i, r_i, l_i = _softmax_block(s, q_scale, ks, m_i, r_i, l_i, j * BLOCK_N, n_keys, False,
                                                 s_layout)
        p8 = _p_operand(p, p_layout, PERMUTED_V)
        pv_tok = warpgroup_mma(p8, v_smem.index(j % STAGES).permute((1, 0)), o_zero, use_acc=False,
                               is_async=True)
        s, pv = warpgroup_mma_wait(0, deps=(s_tok, pv_tok))
        mbarrier.arrive(empty.index(j % STAGES))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1) + pv
        ks = ks_next
    last = n_blocks - 1
    p, alpha, m_i, r_i, l_i = _softmax_block(s, q_scale, ks, m_i, r_i, l_i, last * BLOCK_N, n_keys, True,
                                             s_layout)
    p8 = _p_operand(p, p_layout, PERMUTED_V)
    pv_tok = warpgroup_mma(p8, v_smem.index(last % STAGES).permute((1, 0)), o_zero, use_acc=False,
                           is_async=True)
    pv = warpgroup_mma_wait(0, deps=(pv_tok,))
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1) + pv
    _epilogue(acc, l_i, r_i, VS, VM, Out, Lse, b, h, v_row0, row0, N_Q, D,
              stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh, BLOCK_M, HEAD_DIM,
              SMOOTH_V, RETURN_LSE, s_layout, o_layout)


@gluon.jit
def _mma_partition_alt(WG: gl.constexpr, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out, Lse, b,
                       h, pid_bh, row0, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh, stride_om,
                       stride_od, stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2, BLOCK_N: gl.constexpr,
                       HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, SMOOTH_V: gl.constexpr,
                       RETURN_LSE: gl.constexpr, PERMUTED_V: gl.constexpr, TURNS: gl.constexpr):
    """Turns around both of a block's multiplies, nothing of this warpgroup in flight during its softmax:
    softmax(j) on S(j) (already done), then in its turn P·V(j) and Q·Kᵀ(j+1), pass the turn, wait for both.
    The overlap comes only from the other warpgroup's softmax running during these multiplies."""
    BLOCK_M: gl.constexpr = 64
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, HEAD_DIM, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    ks_base = KS + kv_row0
    q_tile = q_smem.index(WG)
    offs_m = row0 + gl.arange(0, BLOCK_M, layout=row_s)
    q_scale = gl.load(QS + pid_bh * NQ_PAD + offs_m, mask=offs_m < NQ_PAD, other=0.0) * sm_scale_log2
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    r_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.int32, s_layout)
    o_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    token = row0
    if WG == 1:
        token = _pass_turn(WG, token, TURNS)  # warpgroup 0 takes the first turn
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(full.index(0), 0)
    token = _wait_turn(WG, token, TURNS)
    s_tok = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    token = _pass_turn(WG, token, TURNS)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    ks = gl.load(ks_base)
    for j in range(0, n_blocks - 1):
        p, alpha, m_i, r_i, l_i = _softmax_block(s, q_scale, ks, m_i, r_i, l_i, j * BLOCK_N, n_keys, False,
                                                 s_layout)
        p8 = _p_operand(p, p_layout, PERMUTED_V)
        nxt = j + 1
        mbarrier.wait(full.index(nxt % STAGES), (nxt // STAGES) & 1)
        nxt = _wait_turn(WG, nxt, TURNS)
        pv_tok = warpgroup_mma(p8, v_smem.index(j % STAGES).permute((1, 0)), o_zero, use_acc=False,
                               is_async=True)
        s_tok = warpgroup_mma(q_tile, k_smem.index(nxt % STAGES).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        nxt = _pass_turn(WG, nxt, TURNS)
        ks = gl.load(ks_base + nxt * BLOCK_N)
        pv, s = warpgroup_mma_wait(0, deps=(pv_tok, s_tok))
        mbarrier.arrive(empty.index(j % STAGES))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1) + pv
    last = n_blocks - 1
    p, alpha, m_i, r_i, l_i = _softmax_block(s, q_scale, ks, m_i, r_i, l_i, last * BLOCK_N, n_keys, True,
                                             s_layout)
    p8 = _p_operand(p, p_layout, PERMUTED_V)
    # Last turn: P·V of the last block only. Warpgroup 1 does not pass it back: nobody would take it.
    token = _wait_turn(WG, n_blocks + token * 0, TURNS)
    pv_tok = warpgroup_mma(p8, v_smem.index(last % STAGES).permute((1, 0)), o_zero, use_acc=False,
                           is_async=True)
    if WG == 0:
        token = _pass_turn(WG, token, TURNS)
    pv = warpgroup_mma_wait(0, deps=(pv_tok,))
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1) + pv
    _epilogue(acc, l_i, r_i, VS, VM, Out, Lse, b, h, v_row0, row0, N_Q, D,
              stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh, BLOCK_M, HEAD_DIM,
              SMOOTH_V, RETURN_LSE, s_layout, o_layout)


@gluon.jit
def _attn_fwd_sm90_pingpong(
    q_desc, k_desc, v_desc, QS, KS, VS, VM, KV_LEN, Out, Lse,
    stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh,
    H, GROUP, N_Q, N_K, NQ_PAD, NK_PAD, D, sm_scale_log2,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
    HAS_KV_LEN: gl.constexpr, SMOOTH_V: gl.constexpr, RETURN_LSE: gl.constexpr, PERMUTED_V: gl.constexpr,
    TURNS: gl.constexpr = True, PREFETCH: gl.constexpr = False, ALT: gl.constexpr = False,
):
    gl.static_assert(gl.num_warps() == 4, "the default partition is warpgroup 0")
    gl.static_assert(BLOCK_M == 128, "64 rows per warpgroup")
    start_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    bh_kv = b * (H // GROUP) + h // GROUP
    n_keys = N_K
    if HAS_KV_LEN:
        n_keys = gl.load(KV_LEN + b)
    n_blocks = gl.cdiv(n_keys, BLOCK_N)
    kv_row0 = bh_kv * NK_PAD
    v_row0 = bh_kv * HEAD_DIM
    row0 = start_m * BLOCK_M

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival per warpgroup

    if ALT:
        gl.warp_specialize([
            (_mma_partition_alt, (0, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out, Lse, b, h,
                                  pid_bh, row0, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh, stride_om,
                                  stride_od, stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2, BLOCK_N, HEAD_DIM,
                                  STAGES, SMOOTH_V, RETURN_LSE, PERMUTED_V, TURNS)),
            (_mma_partition_alt, (1, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out, Lse, b, h,
                                  pid_bh, row0 + 64, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh,
                                  stride_om, stride_od, stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2, BLOCK_N,
                                  HEAD_DIM, STAGES, SMOOTH_V, RETURN_LSE, PERMUTED_V, TURNS)),
            (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, full, empty,
                               pid_bh * NQ_PAD + row0, kv_row0, v_row0, n_blocks, STAGES, BLOCK_N)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    elif PREFETCH:
        gl.warp_specialize([
            (_mma_partition_prefetch, (0, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out, Lse, b, h, pid_bh,
                              row0, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh, stride_om, stride_od,
                              stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2, BLOCK_N, HEAD_DIM, STAGES, SMOOTH_V,
                              RETURN_LSE, PERMUTED_V, TURNS)),
            (_mma_partition_prefetch, (1, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out, Lse, b, h, pid_bh,
                              row0 + 64, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh, stride_om, stride_od,
                              stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2, BLOCK_N, HEAD_DIM, STAGES, SMOOTH_V,
                              RETURN_LSE, PERMUTED_V, TURNS)),
            (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, full, empty,
                               pid_bh * NQ_PAD + row0, kv_row0, v_row0, n_blocks, STAGES, BLOCK_N)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_mma_partition, (0, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out, Lse, b, h, pid_bh,
                              row0, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh, stride_om, stride_od,
                              stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2, BLOCK_N, HEAD_DIM, STAGES, SMOOTH_V,
                              RETURN_LSE, PERMUTED_V, TURNS)),
            (_mma_partition, (1, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out, Lse, b, h, pid_bh,
                              row0 + 64, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh, stride_om, stride_od,
                              stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2, BLOCK_N, HEAD_DIM, STAGES, SMOOTH_V,
                              RETURN_LSE, PERMUTED_V, TURNS)),
            (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, full, empty,
                               pid_bh * NQ_PAD + row0, kv_row0, v_row0, n_blocks, STAGES, BLOCK_N)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


BLOCK_M = 128
STAGES = 4
TURNS = True  # False: the same kernel without the turn barriers (to measure what they buy)
PREFETCH = False  # True: gluon_attn's loop order in this structure (to measure the structure alone)
ALT = False  # True: turns around P·V(j) + Q·Kᵀ(j+1), nothing of a warpgroup in flight during its own softmax


def launch(qq, out: torch.Tensor, lse, kv_len, *, H: int, group: int, n_q: int, n_k: int, d: int,
           block_n: int, smooth_v: bool, sm_scale_log2: float, permuted_v: bool = True,
           stages: int | None = None) -> None:
    """As `gluon_attn.launch`, on the same quantized buffers (Q scales per 64 rows: one per warpgroup)."""
    d_pad = qq.q8.shape[-1]
    nq_pad, nk_pad = qq.q8.shape[2], qq.k8.shape[2]
    q_l, k_l, v_l = shared_layouts(64, block_n, d_pad)
    q_desc = TensorDescriptor.from_tensor(qq.q8.view(-1, d_pad), [64, d_pad], q_l)
    k_desc = TensorDescriptor.from_tensor(qq.k8.view(-1, d_pad), [block_n, d_pad], k_l)
    v_desc = TensorDescriptor.from_tensor(qq.v.view(-1, nk_pad), [d_pad, block_n], v_l)
    vm = qq.v_mean if qq.v_mean is not None else qq.v_scale
    grid = (triton.cdiv(n_q, BLOCK_M), out.shape[0] * H)
    _attn_fwd_sm90_pingpong[grid](
        q_desc, k_desc, v_desc, qq.q_scale, qq.k_scale, qq.v_scale, vm,
        kv_len if kv_len is not None else qq.q_scale, out, lse if lse is not None else qq.q_scale,
        *out.stride(), lse.stride(0) if lse is not None else 0, lse.stride(1) if lse is not None else 0,
        H, group, n_q, n_k, nq_pad, nk_pad, d, sm_scale_log2,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, HEAD_DIM=d_pad, STAGES=stages or STAGES,
        HAS_KV_LEN=kv_len is not None, SMOOTH_V=smooth_v, RETURN_LSE=lse is not None, PERMUTED_V=permuted_v,
        TURNS=TURNS, PREFETCH=PREFETCH, ALT=ALT, num_warps=4,
    )
