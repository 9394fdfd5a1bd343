"""Probe kernel (not shipped): `gluon_attn`'s numerics and loop order with two warpgroups of one CTA reading one
shared K/V ring, fed by a loader warp (warp-specialized), so each K/V tile crosses L2 -> shared memory once per
128 query rows instead of once per 64. The structure of v3.0's ping-pong experiment without its turn barriers
(lab/NOTES.md v3.0: 741 / 804 / 837 TFLOP/s at hd128 8k / 16k / 32k against 755 / 802 / 820 for `gluon_attn`,
alone on an H200). Question for `probe_shared_ring_power.py`: does half the tile traffic pay inside a Wan step,
where the H200 runs at its power cap?

Scope: dense, no key mask, head dim 128, Q quantized by the separate pass (per-token scales). Triton 3.6's Gluon
(`gl.warp_specialize` with a list of partitions).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from sagegen.kernels.gluon_attn import _epilogue, _issue_kv, _p_operand, _softmax_block, _tma_load, shared_layouts

LOADER_REGS = gl.constexpr(24)
CONSUMER_REGS = gl.constexpr(240)


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, full, empty, q_row0, kv_row0, v_row0,
                    n_blocks, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    """One warp: both warpgroups' Q tiles, then K/V block b into slot b % STAGES once both warpgroups are done
    with block b - STAGES."""
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row0, 0], q_bar, q_smem.index(0))
    _tma_load(q_desc, [q_row0 + q_desc.block_type.shape[0], 0], q_bar, q_smem.index(1))
    for blk in range(n_blocks):
        if blk >= STAGES:
            mbarrier.wait(empty.index(blk % STAGES), ((blk // STAGES) - 1) & 1)
        _issue_kv(k_desc, v_desc, k_smem, v_smem, full, kv_row0, v_row0, blk, blk, STAGES, BLOCK_N)


@gluon.jit
def _mma_partition(WG: gl.constexpr, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out, Lse, b, h,
                   pid_bh, row0, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh, stride_om, stride_od,
                   stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2, BLOCK_N: gl.constexpr,
                   HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, SMOOTH_V: gl.constexpr, RETURN_LSE: gl.constexpr,
                   PERMUTED_V: gl.constexpr):
    """One warpgroup, 64 query rows from row0: `gluon_attn`'s loop (block j+1's Q·Kᵀ in flight during block j's
    softmax); a slot is released with one arrival per warpgroup."""
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
    # rows past the padded length (the second warpgroup of a head's last tile) are never stored
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
def _attn_fwd_shared_ring(
    q_desc, k_desc, v_desc, QS, KS, VS, VM, Out, Lse,
    stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh,
    H, GROUP, N_Q, N_K, NQ_PAD, NK_PAD, D, sm_scale_log2,
    BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
    SMOOTH_V: gl.constexpr, RETURN_LSE: gl.constexpr, PERMUTED_V: gl.constexpr,
):
    start_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    bh_kv = b * (H // GROUP) + h // GROUP
    n_keys = N_K
    n_blocks = gl.cdiv(n_keys, BLOCK_N)
    kv_row0 = bh_kv * NK_PAD
    v_row0 = bh_kv * HEAD_DIM
    row0 = start_m * 128

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

    gl.warp_specialize([
        (_mma_partition, (0, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out, Lse, b, h, pid_bh,
                          row0, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh, stride_om, stride_od,
                          stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2, BLOCK_N, HEAD_DIM, STAGES, SMOOTH_V,
                          RETURN_LSE, PERMUTED_V)),
        (_mma_partition, (1, q_smem, k_smem, v_smem, q_bar, full, empty, QS, KS, VS, VM, Out, Lse, b, h, pid_bh,
                          row0 + 64, kv_row0, v_row0, n_blocks, n_keys, stride_ob, stride_oh, stride_om, stride_od,
                          stride_lb, stride_lh, N_Q, NQ_PAD, D, sm_scale_log2, BLOCK_N, HEAD_DIM, STAGES, SMOOTH_V,
                          RETURN_LSE, PERMUTED_V)),
        (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, full, empty,
                           pid_bh * NQ_PAD + row0, kv_row0, v_row0, n_blocks, STAGES, BLOCK_N)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


def applies(q, tiles, kv_len, block_m: int, d: int, d_pad: int) -> bool:
    return q is None and tiles is None and kv_len is None and block_m == 64 and d == d_pad == 128


def launch(qq, out: torch.Tensor, lse, *, H: int, group: int, n_q: int, n_k: int, d: int, block_n: int,
           smooth_v: bool, sm_scale_log2: float, permuted_v: bool = True, stages: int = 4) -> None:
    """As `gluon_attn.launch` on buffers from `triton_quant.quantize(..., quantize_q=True)` (block_q = 64)."""
    d_pad = qq.q8.shape[-1]
    nq_pad, nk_pad = qq.q8.shape[2], qq.k8.shape[2]
    q_l, k_l, v_l = shared_layouts(64, block_n, d_pad)
    q_desc = TensorDescriptor.from_tensor(qq.q8.view(-1, d_pad), [64, d_pad], q_l)
    k_desc = TensorDescriptor.from_tensor(qq.k8.view(-1, d_pad), [block_n, d_pad], k_l)
    v_desc = TensorDescriptor.from_tensor(qq.v.view(-1, nk_pad), [d_pad, block_n], v_l)
    vm = qq.v_mean if qq.v_mean is not None else qq.v_scale
    grid = (triton.cdiv(n_q, 128), out.shape[0] * H)
    _attn_fwd_shared_ring[grid](
        q_desc, k_desc, v_desc, qq.q_scale, qq.k_scale, qq.v_scale, vm, out,
        lse if lse is not None else qq.q_scale,
        *out.stride(), lse.stride(0) if lse is not None else 0, lse.stride(1) if lse is not None else 0,
        H, group, n_q, n_k, nq_pad, nk_pad, d, sm_scale_log2,
        BLOCK_N=block_n, HEAD_DIM=d_pad, STAGES=stages, SMOOTH_V=smooth_v, RETURN_LSE=lse is not None,
        PERMUTED_V=permuted_v, num_warps=4, enable_fp_fusion=True,
    )
