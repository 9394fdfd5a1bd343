"""Hopper (sm90) attention at head dim 128 with one K/V ring shared by two warpgroups (Gluon, warp-specialized).

`gluon_attn` runs one warpgroup of 64 query rows per CTA, two CTAs per SM, each streaming every K/V tile of its
head from L2 into its own ring. Here one CTA holds 128 query rows: two consumer warpgroups (64 rows each, the
same loop and numerics as `gluon_attn`, op for op, so its output is bit-identical) read one ring that a loader
warp fills by TMA, so each K/V tile crosses L2 -> shared memory once per 128 rows instead of once per 64. A slot
is refilled once both warpgroups have arrived on its "empty" barrier. Each warpgroup quantizes its own Q rows
(`gluon_attn._quantize_q_tile`), so no Q pass runs.

Why: alone, the kernel matches `gluon_attn` within ~1%; inside a Wan2.1-14B 720p step, where the H200 sits at its
700 W cap, the halved tile traffic is worth ~0.8% of the step with a separate Q pass
(bench/results/probe-shared-ring-power-h200-2026-11-26.json; bench/NOTES.md v6.1).

Scope (`triton_attn` routes here only when `applies`): what `gluon_attn` runs, at head dim 128, without a
block-sparse tile list, with per-token Q scales quantized in the kernel. `reference.py` stays the oracle.
"""

from __future__ import annotations

import warnings

import torch
import triton
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources, PTXASError
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .gluon_attn import _epilogue, _issue_kv, _p_operand, _quantize_q_tile, _softmax_block, shared_layouts

# False: `triton_attn` keeps every call on `gluon_attn` (to measure the difference).
ENABLED = True
STAGES = 4  # ring slots: 16 KiB of Q + 4 x 32 KiB of K and V, one CTA per SM
ROWS = 128  # query rows per CTA: two warpgroups of 64
_LOADER_REGS = gl.constexpr(24)
_CONSUMER_REGS = gl.constexpr(240)
broken: list[str] = []  # why it failed to build in this process (then `gluon_attn` runs instead)


@gluon.jit
def _n_blocks(KV_LEN, b, N_K, HAS_KV_LEN: gl.constexpr, BLOCK_N: gl.constexpr):
    n_keys = N_K
    if HAS_KV_LEN:
        n_keys = gl.load(KV_LEN + b)
    return n_keys, gl.cdiv(n_keys, BLOCK_N)


@gluon.jit
def _load_partition(k_desc, v_desc, k_smem, v_smem, full, empty, KV_LEN, b, kv_row0, v_row0, N_K,
                    HAS_KV_LEN: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    """One warp: K/V tile j into slot j % STAGES once both warpgroups are done with tile j - STAGES."""
    n_keys, n_blocks = _n_blocks(KV_LEN, b, N_K, HAS_KV_LEN, BLOCK_N)
    for j in range(n_blocks):
        if j >= STAGES:
            mbarrier.wait(empty.index(j % STAGES), ((j // STAGES) - 1) & 1)
        _issue_kv(k_desc, v_desc, k_smem, v_smem, full, kv_row0, v_row0, j, j, STAGES, BLOCK_N)


@gluon.jit
def _mma_partition(WG: gl.constexpr, Q, q_smem, k_smem, v_smem, full, empty, KS, VS, VM, KV_LEN, Out, Lse, b, h,
                   row0, kv_row0, v_row0, N_Q, N_K, D, stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh, sm_scale_log2,
                   BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, HAS_KV_LEN: gl.constexpr,
                   SMOOTH_V: gl.constexpr, RETURN_LSE: gl.constexpr, PERMUTED_V: gl.constexpr,
                   PAD_D: gl.constexpr):
    """One warpgroup, query rows row0..row0+63: `gluon_attn`'s loop (tile j+1's Q·Kᵀ in flight during tile j's
    softmax); it arrives on a slot's "empty" barrier once its P·V of that slot is done."""
    BLOCK_M: gl.constexpr = 64
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, HEAD_DIM, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    n_keys, n_blocks = _n_blocks(KV_LEN, b, N_K, HAS_KV_LEN, BLOCK_N)
    ks_base = KS + kv_row0
    q_tile = q_smem.index(WG)
    # rows past N_Q (the second warpgroup of a head's last CTA) quantize as zeros and are never stored
    q_scale = _quantize_q_tile(Q, q_tile, b, h, row0, N_Q, D, stride_qb, stride_qh, stride_qm, stride_qd,
                               BLOCK_M, HEAD_DIM, PAD_D, row_s) * sm_scale_log2
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    r_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.int32, s_layout)
    o_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

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
    # the last tile: the only one that can be partial
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
def _attn_fwd_sm90_ring(
    k_desc, v_desc, Q, KS, VS, VM, KV_LEN, Out, Lse,
    stride_qb, stride_qh, stride_qm, stride_qd, stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh,
    H, GROUP, N_Q, N_K, NK_PAD, D, sm_scale_log2,
    BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, HAS_KV_LEN: gl.constexpr,
    SMOOTH_V: gl.constexpr, RETURN_LSE: gl.constexpr, PERMUTED_V: gl.constexpr, PAD_D: gl.constexpr,
    q_layout: gl.constexpr,
):
    pid_bh = gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    bh_kv = b * (H // GROUP) + h // GROUP
    kv_row0 = bh_kv * NK_PAD
    v_row0 = bh_kv * HEAD_DIM
    row0 = gl.program_id(0) * 128

    q_smem = gl.allocate_shared_memory(gl.int8, [2, 64, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival per warpgroup

    gl.warp_specialize([
        (_mma_partition, (0, Q, q_smem, k_smem, v_smem, full, empty, KS, VS, VM, KV_LEN, Out, Lse, b, h, row0,
                          kv_row0, v_row0, N_Q, N_K, D, stride_qb, stride_qh, stride_qm, stride_qd, stride_ob,
                          stride_oh, stride_om, stride_od, stride_lb, stride_lh, sm_scale_log2, BLOCK_N, HEAD_DIM,
                          STAGES, HAS_KV_LEN, SMOOTH_V, RETURN_LSE, PERMUTED_V, PAD_D)),
        (_mma_partition, (1, Q, q_smem, k_smem, v_smem, full, empty, KS, VS, VM, KV_LEN, Out, Lse, b, h, row0 + 64,
                          kv_row0, v_row0, N_Q, N_K, D, stride_qb, stride_qh, stride_qm, stride_qd, stride_ob,
                          stride_oh, stride_om, stride_od, stride_lb, stride_lh, sm_scale_log2, BLOCK_N, HEAD_DIM,
                          STAGES, HAS_KV_LEN, SMOOTH_V, RETURN_LSE, PERMUTED_V, PAD_D)),
        (_load_partition, (k_desc, v_desc, k_smem, v_smem, full, empty, KV_LEN, b, kv_row0, v_row0, N_K,
                           HAS_KV_LEN, STAGES, BLOCK_N)),
    ], [4, 1], [_CONSUMER_REGS, _LOADER_REGS])


def applies(d_pad: int, block_m: int, q_in_kernel: bool, sparse: bool) -> bool:
    """Whether a call that `gluon_attn` runs goes here instead."""
    return ENABLED and not broken and d_pad == 128 and block_m == 64 and q_in_kernel and not sparse


def try_launch(qq, out, lse, kv_len, **kwargs) -> bool:
    """`launch`; False (with a warning, once) if the kernel does not build with this Triton: the caller then runs
    `gluon_attn`, as every later call does."""
    try:
        launch(qq, out, lse, kv_len, **kwargs)
    except (CompilationError, OutOfResources, PTXASError) as exc:
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}"
        broken.append(why)
        warnings.warn(f"sagegen: the shared-ring Gluon kernel did not build with this Triton ({why}); using "
                      "gluon_attn from now on", RuntimeWarning, stacklevel=3)
        return False
    return True


def launch(qq, out: torch.Tensor, lse, kv_len, *, q: torch.Tensor, H: int, group: int, n_q: int, n_k: int, d: int,
           block_n: int, smooth_v: bool, sm_scale_log2: float, permuted_v: bool = True) -> None:
    """As `gluon_attn.launch` (buffers from `triton_quant.quantize(..., quantize_q=False)`), Q unquantized.

    out: [B, H, Nq, D], any strides; lse: [B, H, Nq] fp32 or None; kv_len: int32 [B] valid-prefix key lengths
    or None; q: [B, H, Nq, D] bf16/fp16, any strides."""
    d_pad = qq.k8.shape[-1]
    nk_pad = qq.k8.shape[2]
    q_l, k_l, v_l = shared_layouts(64, block_n, d_pad)
    k_desc = TensorDescriptor.from_tensor(qq.k8.view(-1, d_pad), [block_n, d_pad], k_l)
    v_desc = TensorDescriptor.from_tensor(qq.v.view(-1, nk_pad), [d_pad, block_n], v_l)
    vm = qq.v_mean if qq.v_mean is not None else qq.v_scale
    grid = (triton.cdiv(n_q, ROWS), out.shape[0] * H)
    _attn_fwd_sm90_ring[grid](
        k_desc, v_desc, q, qq.k_scale, qq.v_scale, vm, kv_len if kv_len is not None else qq.k_scale, out,
        lse if lse is not None else qq.k_scale,
        *q.stride(), *out.stride(), lse.stride(0) if lse is not None else 0, lse.stride(1) if lse is not None else 0,
        H, group, n_q, n_k, nk_pad, d, sm_scale_log2,
        BLOCK_N=block_n, HEAD_DIM=d_pad, STAGES=STAGES, HAS_KV_LEN=kv_len is not None, SMOOTH_V=smooth_v,
        RETURN_LSE=lse is not None, PERMUTED_V=permuted_v, PAD_D=d != d_pad, q_layout=q_l, num_warps=4,
        enable_fp_fusion=True,
    )
