"""Probe kernel (not shipped): `gluon_attn._attn_fwd_sm90` with three ways to get K's per-block scale inside the
loop (KS_MODE): 0 as shipped (a global load of the next block's scale: the compiler issues it after the MMA wait
and moves it to a uniform register ~25 instructions later, so the warp waits on it every iteration; SASS,
Triton 3.6 and 3.9, head dim 64), 1 hoisted out of the loop (wrong numerics: the upper bound of what removing
that wait can give), 2 carried by TMA with the block's K and V into a shared-memory ring (128 bytes a stage),
read after the slot's barrier wait. `probe_kscale.py` times them.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from sagegen.kernels.block_sparse import sparse_args
from sagegen.kernels.gluon_attn import (_epilogue, _kv_tile, _p_operand, _quantize_q_tile, _softmax_block, _tma_load,
                                        launch_settings, shared_layouts)
from sagegen.kernels.spec import cdiv

KS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
KS_BOX = 32  # 128 bytes a slot: a TMA destination must be 128-byte aligned (16-byte slots faulted)


@gluon.jit
def _issue_kvs(k_desc, v_desc, ks_desc, k_smem, v_smem, ks_smem, bars, kv_row0, v_row0, ks_row0,
               KS_MODE: gl.constexpr, i, tile, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    slot = i % STAGES
    bar = bars.index(slot)
    if KS_MODE == 2:
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes + ks_desc.block_type.nbytes)
        _tma_load(ks_desc, [ks_row0 + tile, 0], bar, ks_smem.index(slot))
    else:
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _tma_load(k_desc, [kv_row0 + tile * BLOCK_N, 0], bar, k_smem.index(slot))
    _tma_load(v_desc, [v_row0, tile * BLOCK_N], bar, v_smem.index(slot))


@gluon.jit
def _ks_of_slot(slot_smem):
    """The block's scale from its shared-memory slot (the block's first per-key entries, all equal)."""
    layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[32, 1],
                                            warps_per_cta=[gl.num_warps(), 1], order=[1, 0])
    x = slot_smem.slice(0, 4, dim=1).load(layout)
    return gl.max(gl.max(x, axis=1), axis=0)


@gluon.jit
def _attn_fwd_ks(
    q_desc, k_desc, v_desc, ks_desc, Q, QS, KS, VS, VM, KV_LEN, Out, Lse, CNT, IDX,
    stride_qb, stride_qh, stride_qm, stride_qd, stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh,
    stride_cb, stride_ch, stride_ib, stride_ih, stride_im,
    H, GROUP, N_Q, N_K, NQ_PAD, NK_PAD, D, sm_scale_log2,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
    HAS_KV_LEN: gl.constexpr, SMOOTH_V: gl.constexpr, RETURN_LSE: gl.constexpr, PERMUTED_V: gl.constexpr,
    QUANT_Q: gl.constexpr, PAD_D: gl.constexpr, SPARSE: gl.constexpr, q_layout: gl.constexpr,
    KS_MODE: gl.constexpr,
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
    ks_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + ks_desc.block_type.shape, ks_desc.layout)
    ks_row0 = kv_row0 // BLOCK_N
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)

    if not QUANT_Q:
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        _tma_load(q_desc, [pid_bh * NQ_PAD + start_m * BLOCK_M, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        if i < n_blocks:
            _issue_kvs(k_desc, v_desc, ks_desc, k_smem, v_smem, ks_smem, bars, kv_row0, v_row0, ks_row0, KS_MODE, i,
                      _kv_tile(idx_row, i, n_blocks, SPARSE), STAGES, BLOCK_N)

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
    tile = _kv_tile(idx_row, 0, n_blocks, SPARSE)
    tile_nxt = _kv_tile(idx_row, 1, n_blocks, SPARSE)  # indices are read a step ahead: no load on the path
    if KS_MODE == 2:
        ks = _ks_of_slot(ks_smem.index(0))
    else:
        ks = gl.load(ks_base + tile * BLOCK_N)

    # Steady state over every block but the last: issue block j+1's Q·Kᵀ, then block j's softmax runs while
    # the tensor cores work, then block j's P·V; the ring slot of block j is refilled once both are done.
    for j in range(0, n_blocks - 1):
        nxt = j + 1
        # indices first: their loads overlap the wait and the softmax below
        tile_after = _kv_tile(idx_row, j + 2, n_blocks, SPARSE)
        tile_far = _kv_tile(idx_row, j + STAGES, n_blocks, SPARSE)
        mbarrier.wait(bars.index(nxt % STAGES), (nxt // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(nxt % STAGES).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        if KS_MODE == 0:
            ks_next = gl.load(ks_base + tile_nxt * BLOCK_N)
        elif KS_MODE == 1:  # timing only: every block takes block 0's scale
            ks_next = ks
        else:
            ks_next = _ks_of_slot(ks_smem.index(nxt % STAGES))
        p, alpha, m_i, r_i, l_i = _softmax_block(s, q_scale, ks, m_i, r_i, l_i, tile * BLOCK_N, n_keys, False,
                                                 s_layout)
        p8 = _p_operand(p, p_layout, PERMUTED_V)
        pv_tok = warpgroup_mma(p8, v_smem.index(j % STAGES).permute((1, 0)), o_zero, use_acc=False,
                               is_async=True)
        s, pv = warpgroup_mma_wait(0, deps=(s_tok, pv_tok))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1) + pv
        if j + STAGES < n_blocks:
            _issue_kvs(k_desc, v_desc, ks_desc, k_smem, v_smem, ks_smem, bars, kv_row0, v_row0, ks_row0, KS_MODE, j + STAGES, tile_far, STAGES, BLOCK_N)
        ks = ks_next
        tile = tile_nxt
        tile_nxt = tile_after

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

    _epilogue(acc, l_i, r_i, VS, VM, Out, Lse, b, h, v_row0, start_m * BLOCK_M, N_Q, D,
              stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh, BLOCK_M, HEAD_DIM,
              SMOOTH_V, RETURN_LSE, s_layout, o_layout)



def launch(qq, out, lse, kv_len, *, ks_mode: int, H: int, group: int, n_q: int, n_k: int, d: int,
           block_m: int, block_n: int, smooth_v: bool, sm_scale_log2: float, permuted_v: bool = True,
           q=None, tiles=None) -> None:
    d_pad = qq.k8.shape[-1]
    nk_pad = qq.k8.shape[2]
    nq_pad = cdiv(n_q, block_m) * block_m
    stages, maxnreg = launch_settings(d_pad)
    q_l, k_l, v_l = shared_layouts(block_m, block_n, d_pad)
    k_desc = TensorDescriptor.from_tensor(qq.k8.view(-1, d_pad), [block_n, d_pad], k_l)
    v_desc = TensorDescriptor.from_tensor(qq.v.view(-1, nk_pad), [d_pad, block_n], v_l)
    ks_desc = TensorDescriptor.from_tensor(qq.k_scale.view(-1, block_n), [1, KS_BOX], KS_LAYOUT)
    if q is None:
        q_desc = TensorDescriptor.from_tensor(qq.q8.view(-1, d_pad), [block_m, d_pad], q_l)
        q_arg, q_strides, qs = qq.q8, (0, 0, 0, 0), qq.q_scale
    else:  # no Q buffers: k_desc stands in for the unused descriptor argument
        q_desc, q_arg, q_strides, qs = k_desc, q, q.stride(), qq.k_scale
    vm = qq.v_mean if qq.v_mean is not None else qq.v_scale
    sparse_ptrs, sparse_strides = sparse_args(tiles, qq.k_scale)
    grid = (cdiv(n_q, block_m), out.shape[0] * H)
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    _attn_fwd_ks[grid](
        q_desc, k_desc, v_desc, ks_desc, q_arg, qs, qq.k_scale, qq.v_scale, vm,
        kv_len if kv_len is not None else qq.k_scale, out, lse if lse is not None else qq.k_scale, *sparse_ptrs,
        *q_strides, *out.stride(), lse.stride(0) if lse is not None else 0, lse.stride(1) if lse is not None else 0,
        *sparse_strides,
        H, group, n_q, n_k, nq_pad, nk_pad, d, sm_scale_log2,
        BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=d_pad, STAGES=stages, HAS_KV_LEN=kv_len is not None,
        SMOOTH_V=smooth_v, RETURN_LSE=lse is not None, PERMUTED_V=permuted_v, QUANT_Q=q is not None,
        PAD_D=d != d_pad, SPARSE=tiles is not None, q_layout=q_l, KS_MODE=ks_mode, num_warps=4,
        enable_fp_fusion=True, **extra,
    )
