"""SageAttention2-style forward attention for Hopper (sm_90a), head dim 64 or 128, in NVIDIA's CuTe DSL.

Research prototype (lab/cute_proto). The kernel does the main loop only; inputs are pre-quantized by
`bench.quantize_inputs` (torch); D = 64 or 128 (`Sa2Config.head_dim`, compile-time, taken from the inputs):

  Q  int8 [B, H, N, D]  + q_scale fp32 [B, H, >= N]  (q_granularity="per_token", default: one scale per row)
                          or [B, H, ceil(N/64)]        ("per_block": one per 64 rows = one consumer WG tile)
  K  int8 [B, H, N, D]  (mean over tokens subtracted) + k_scale fp32 [B, H, ceil(N/128)]  (one per key tile)
  Vt e4m3 [B, H, D, Np] (V transposed, Np = N padded to 128, keys permuted within each 32-key chunk,
                         see `key_perm32`) + v_scale fp32 [B, H, D]  (per channel amax / 448)

Kernel numerics (per 64-row query tile, per 128-key block j):
  S_int  = Q·K_jᵀ                      wgmma s8·s8 -> s32
  s      = float(S_int) · c_j,  c_j = q_scale(row or tile) · k_scale_j · sm_scale · log2(e)   (base-2 logits)
  m_new  = max(m, rowmax(s)) (keys >= N masked to -inf), alpha = exp2(m - m_new)
  P      = exp2(s - m_new + log2 448)   (= 448 · exp2(s - m_new), uses e4m3's full range), l = l·alpha + rowsum(P)
  acc    = acc·alpha + (fp8(P) · V_j)    P·V_j in a fresh fp32 wgmma accumulator (e4m3·e4m3 -> f32), then added
  O      = acc / l · v_scale  (the 448 cancels because l sums the scaled P)  -> bf16

Design: one CTA = 128 query rows = 2 consumer warpgroups (64 rows each) + 1 producer warpgroup (one warp issues
TMA: Q once, then K_j and V_j into two multi-stage smem rings guarded by mbarrier pipelines). Register
reallocation (setmaxnreg) gives the consumers 240 registers. Variants (`Sa2Config`):
  * schedule="serial": per block QK -> softmax -> PV, all waits immediate (simplest, the correctness baseline).
  * schedule="overlap": FA3-style intra-warpgroup overlap: QK of block j+1 is issued before the softmax of
    block j, and P_j·V_j is waited lazily (while the next softmax runs).
  * pingpong=True: FA3's inter-warpgroup ping-pong: named barriers make the two consumer WGs take turns issuing
    their GEMMs, so one WG's softmax overlaps the other WG's tensor-core work.

The P -> A-operand trick: wgmma's 8-bit A fragment wants 4 consecutive k per thread, the f32 accumulator gives 2.
Instead of shuffling between threads, each thread reinterprets its own 8 accumulator values of a 32-key chunk as
its 8 A-fragment values; this permutes the keys of P inside every 32-key chunk by a fixed permutation, which the
host helper applies to V's key axis when it writes Vt (free). See `key_perm32`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass._mlir.dialects import llvm

HEAD_DIM = 128  # default head dim (the kernel also supports 64: Sa2Config.head_dim)
SUPPORTED_HEAD_DIMS = (64, 128)
BM_WG = 64  # query rows per consumer warpgroup (= q_scale block)
BN = 128  # keys per block (= k_scale block)
LOG2_FP8_MAX = math.log2(448.0)
MAGIC_I = 0x4B400000  # bits of 12582912.0 = 1.5 * 2^23: int x (|x| < 2^22) + MAGIC_I, read as f32, is 12582912 + x
MAGIC_F = 12582912.0


def key_perm32():
    """perm[p] = the key (0..31, inside a 32-key chunk) whose P value lands in A-fragment k-slot p.

    The f32 accumulator gives thread q (= lane % 4) the columns 8g + 2q + {0, 1} (g = 8-column group); the e4m3
    A fragment wants k = 16b + 4q + i (i in 0..3, b in 0..1). Slot (b, q, i) takes the accumulator value of
    column group 2b + (i >> 1), element i & 1, i.e. key 16b + 8(i >> 1) + 2q + (i & 1).
    """
    perm = []
    for p in range(32):
        b, q, i = p // 16, (p % 16) // 4, p % 4
        perm.append(16 * b + 8 * (i >> 1) + 2 * q + (i & 1))
    return perm


@dsl_user_op
def opaque_mov_u32(x, *, loc=None, ip=None):
    """A register copy the LLVM optimizer cannot look through (volatile inline asm). Used to define the loop-
    carried P fragment *after* wgmma.wait_group: without it LLVM coalesces next iteration's P into the registers
    the in-flight P.V wgmma still reads, and ptxas then serializes the wgmmas (warning C7513)."""
    return cutlass.Uint32(
        llvm.inline_asm(
            T.i32(), [cutlass.Uint32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
            has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
        )
    )


@dataclass(frozen=True)
class Sa2Config:
    schedule: str = "serial"  # "serial" | "overlap"
    pingpong: bool = False
    # Q's INT8 scale granularity: "per_token" (sagegen's default: one scale per query row, q_scale [B, H, >= N])
    # or "per_block" (one per 64-row consumer tile, q_scale [B, H, ceil(N/64)]). Per token costs one FMUL per
    # row per key block: the row's scale folds into its softmax scale c_row = q_scale[row] * k_scale_j * ...
    q_granularity: str = "per_token"
    head_dim: int = 128  # 64 or 128 (set from the inputs by sa2_attention / make_launcher)
    k_stages: int = 0  # 0: auto (3 at head dim 128, 4 at 64, where a K or V stage is only 8 KB)
    v_stages: int = 0
    consumer_regs: int = 240
    producer_regs: int = 24

    def __post_init__(self):
        assert self.schedule in ("serial", "overlap"), self.schedule
        assert self.q_granularity in ("per_token", "per_block"), self.q_granularity
        assert self.head_dim in SUPPORTED_HEAD_DIMS, self.head_dim

    def stages(self):
        auto = 3 if self.head_dim == 128 else 4
        return (self.k_stages or auto, self.v_stages or auto)

    def with_head_dim(self, d):
        return self if d == self.head_dim else replace(self, head_dim=d)

    def tag(self):
        ks, vs = self.stages()
        q = "qtok" if self.q_granularity == "per_token" else "qblk"
        return f"{self.schedule}{'_pp' if self.pingpong else ''}_{q}_d{self.head_dim}_k{ks}v{vs}"


class Sa2Fwd:
    def __init__(self, cfg: Sa2Config):
        self.cfg = cfg
        self.D = cfg.head_dim
        self.k_stages, self.v_stages = cfg.stages()
        self.per_token_q = cfg.q_granularity == "per_token"
        self.num_consumer_wg = 2
        self.threads = 128 * (1 + self.num_consumer_wg)
        self.buffer_align_bytes = 1024

    # ------------------------------------------------------------------ host-side (traced) entry
    @cute.jit
    def __call__(
        self,
        q3: cute.Tensor,  # int8 (BH, N, D)
        k3: cute.Tensor,  # int8 (BH, N, D)
        vt3: cute.Tensor,  # e4m3 (BH, D, Np)
        q_scale: cute.Tensor,  # f32 (BH, ceil(N/64))
        k_scale: cute.Tensor,  # f32 (BH, ceil(N/128))
        v_scale: cute.Tensor,  # f32 (BH, D)
        o3: cute.Tensor,  # bf16 (BH, N, D)
        sm_scale_log2: cutlass.Float32,
        stream,
    ):
        # (N, D, BH) views, D (or N for Vt) contiguous: the TMA / MMA "K-major" layouts
        mQ = cute.make_tensor(
            q3.iterator,
            cute.make_layout((q3.shape[1], q3.shape[2], q3.shape[0]), stride=(q3.stride[1], q3.stride[2], q3.stride[0])),
        )
        mK = cute.make_tensor(
            k3.iterator,
            cute.make_layout((k3.shape[1], k3.shape[2], k3.shape[0]), stride=(k3.stride[1], k3.stride[2], k3.stride[0])),
        )
        mV = cute.make_tensor(
            vt3.iterator,
            cute.make_layout((vt3.shape[1], vt3.shape[2], vt3.shape[0]), stride=(vt3.stride[1], vt3.stride[2], vt3.stride[0])),
        )
        mO = cute.make_tensor(
            o3.iterator,
            cute.make_layout((o3.shape[1], o3.shape[2], o3.shape[0]), stride=(o3.stride[1], o3.stride[2], o3.stride[0])),
        )

        kmaj = cute.nvgpu.OperandMajorMode.K
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            cutlass.Int8, cutlass.Int8, kmaj, kmaj, cutlass.Int32, (1, 1, 1), (BM_WG, BN)
        )
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            cutlass.Float8E4M3FN, cutlass.Float8E4M3FN, kmaj, kmaj, cutlass.Float32, (1, 1, 1), (BM_WG, self.D),
            warpgroup.OperandSource.RMEM,
        )
        qk_tiler = (BM_WG, BN, self.D)
        pv_tiler = (BM_WG, self.D, BN)

        row_major = utils.LayoutEnum.ROW_MAJOR  # K-major for A (M,K) and B (N,K) alike
        sQ_layout = sm90_utils.make_smem_layout_a(row_major, qk_tiler, cutlass.Int8, self.num_consumer_wg)
        sK_layout = sm90_utils.make_smem_layout_b(row_major, qk_tiler, cutlass.Int8, self.k_stages)
        sV_layout = sm90_utils.make_smem_layout_b(row_major, pv_tiler, cutlass.Float8E4M3FN, self.v_stages)

        g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tma_mQ = cute.nvgpu.cpasync.make_tiled_tma_atom(
            g2s, mQ, cute.slice_(sQ_layout, (None, None, 0)), (BM_WG, self.D)
        )
        tma_k, tma_mK = cute.nvgpu.cpasync.make_tiled_tma_atom(
            g2s, mK, cute.slice_(sK_layout, (None, None, 0)), (BN, self.D)
        )
        tma_v, tma_mV = cute.nvgpu.cpasync.make_tiled_tma_atom(
            g2s, mV, cute.slice_(sV_layout, (None, None, 0)), (self.D, BN)
        )
        self.q_bytes = BM_WG * self.D
        self.k_bytes = BN * self.D
        self.v_bytes = self.D * BN

        @cute.struct
        class SharedStorage:
            q_mbar: cute.struct.MemRange[cutlass.Int64, 2 * 2]
            k_mbar: cute.struct.MemRange[cutlass.Int64, self.k_stages * 2]
            v_mbar: cute.struct.MemRange[cutlass.Int64, self.v_stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[cutlass.Int8, cute.cosize(sQ_layout)], self.buffer_align_bytes]
            sK: cute.struct.Align[cute.struct.MemRange[cutlass.Int8, cute.cosize(sK_layout)], self.buffer_align_bytes]
            sV: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float8E4M3FN, cute.cosize(sV_layout)], self.buffer_align_bytes
            ]

        self.shared_storage = SharedStorage

        n_q = q3.shape[1]
        grid = (cute.ceil_div(n_q, BM_WG * self.num_consumer_wg), q3.shape[0], 1)
        self.kernel(
            qk_mma, pv_mma, tma_q, tma_mQ, tma_k, tma_mK, tma_v, tma_mV,
            mO, q_scale, k_scale, v_scale, sm_scale_log2,
            sQ_layout, sK_layout, sV_layout,
        ).launch(grid=grid, block=[self.threads, 1, 1], stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------ device kernel
    @cute.kernel
    def kernel(
        self,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        mO: cute.Tensor,
        q_scale: cute.Tensor,
        k_scale: cute.Tensor,
        v_scale: cute.Tensor,
        sm_scale_log2: cutlass.Float32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
    ):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        m_blk, bh, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)

        seqlen = mK.shape[0]
        n_kb = (seqlen + BN - 1) // BN

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        q_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.q_mbar.data_ptr(), num_stages=2, producer_group=one_thread,
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4),
            tx_count=self.q_bytes, defer_sync=True,
        )
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.num_consumer_wg)
        k_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.k_mbar.data_ptr(), num_stages=self.k_stages, producer_group=one_thread,
            consumer_group=consumers, tx_count=self.k_bytes, defer_sync=True,
        )
        v_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.v_mbar.data_ptr(), num_stages=self.v_stages, producer_group=one_thread,
            consumer_group=consumers, tx_count=self.v_bytes, defer_sync=True,
        )
        pipeline.pipeline_init_arrive()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)

        # global tiles: (tile, tile, n_tiles...) for this head
        gQ = cute.local_tile(mQ[None, None, bh], (BM_WG, self.D), (None, 0))  # (64, 128, nQ)
        gK = cute.local_tile(mK[None, None, bh], (BN, self.D), (None, 0))  # (128, 128, nK)
        gV = cute.local_tile(mV[None, None, bh], (self.D, BN), (0, None))  # (128, 128, nK)
        tQsQ, tQgQ = cute.nvgpu.cpasync.tma_partition(
            tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2)
        )
        tKsK, tKgK = cute.nvgpu.cpasync.tma_partition(
            tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2)
        )
        tVsV, tVgV = cute.nvgpu.cpasync.tma_partition(
            tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2)
        )

        pipeline.pipeline_init_wait()

        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_q)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_k)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_v)

        # ============================================================ producer warpgroup
        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(cfg.producer_regs)
            if warp_idx == 0:
                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 2)
                k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.k_stages)
                v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.v_stages)
                for w in cutlass.range_constexpr(self.num_consumer_wg):
                    q_pipe.producer_acquire(q_state)
                    cute.copy(
                        tma_q, tQgQ[None, m_blk * self.num_consumer_wg + w], tQsQ[None, q_state.index],
                        tma_bar_ptr=q_pipe.producer_get_barrier(q_state),
                    )
                    q_state.advance()
                for kb in cutlass.range(n_kb, unroll=1):
                    k_pipe.producer_acquire(k_state)
                    cute.copy(
                        tma_k, tKgK[None, kb], tKsK[None, k_state.index],
                        tma_bar_ptr=k_pipe.producer_get_barrier(k_state),
                    )
                    k_state.advance()
                    v_pipe.producer_acquire(v_state)
                    cute.copy(
                        tma_v, tVgV[None, kb], tVsV[None, v_state.index],
                        tma_bar_ptr=v_pipe.producer_get_barrier(v_state),
                    )
                    v_state.advance()

        # ============================================================ consumer warpgroups
        if wg_idx > 0:
            cute.arch.setmaxregister_increase(cfg.consumer_regs)
            cw = wg_idx - 1  # consumer warpgroup 0 / 1
            wg_tid = tidx % 128
            q_tile = m_blk * self.num_consumer_wg + cw

            qk_thr = qk_mma.get_slice(wg_tid)
            pv_thr = pv_mma.get_slice(wg_tid)
            tSrQ = qk_mma.make_fragment_A(qk_thr.partition_A(sQ))  # (MMA, 1, 4, 2)
            tSrK = qk_mma.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, 1, 4, k_stages)
            tOrV = pv_mma.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, 1, 4, v_stages)

            acc_s_shape = qk_thr.partition_shape_C((BM_WG, BN))
            acc_o_shape = pv_thr.partition_shape_C((BM_WG, self.D))
            acc_o = cute.make_rmem_tensor(acc_o_shape, cutlass.Float32)
            acc_o.fill(0.0)
            p_shape = pv_thr.partition_shape_A((BM_WG, BN))  # ((4,2,2), 1, 4)

            # per-thread (row, col) coordinates of the accumulator values
            tScS = qk_thr.partition_C(cute.make_identity_tensor((BM_WG, BN)))

            row_max = cute.make_rmem_tensor((2,), cutlass.Float32)
            row_sum = cute.make_rmem_tensor((2,), cutlass.Float32)
            row_max.fill(-cutlass.Float32.inf)
            row_sum.fill(0.0)

            # Q's scale for this thread's two rows (h = 0, 1: rows r and r + 8 of its warp's 16), times
            # sm_scale * log2(e). Per block: the tile's one scale; per token: each row's own, clamped to the last
            # entry for rows >= N (computed on TMA zeros, never stored; a CTA's second query tile can lie wholly
            # past N too).
            qs_log2 = cute.make_rmem_tensor((2,), cutlass.Float32)
            for h in cutlass.range_constexpr(2):
                if cutlass.const_expr(self.per_token_q):
                    q_row = q_tile * BM_WG + tScS[2 * h][0]
                    qs_log2[h] = q_scale[bh, cutlass.min(q_row, q_scale.shape[1] - 1)] * sm_scale_log2
                else:
                    qs_log2[h] = q_scale[bh, cutlass.min(q_tile, q_scale.shape[1] - 1)] * sm_scale_log2

            # Q tile of this warpgroup
            q_cstate = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 2)
            if cw == 1:
                q_cstate.advance()
            q_pipe.consumer_wait(q_cstate)
            q_stage = q_cstate.index

            k_cstate = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.k_stages)
            v_cstate = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.v_stages)

            if cutlass.const_expr(cfg.schedule == "serial"):
                for kb in cutlass.range(n_kb, unroll=1):
                    # ---------------- S = Q K^T (int32)
                    acc_s = cute.make_rmem_tensor(acc_s_shape, cutlass.Int32)
                    k_pipe.consumer_wait(k_cstate)
                    qk_mma = self.issue_qk(qk_mma, acc_s, tSrQ, tSrK, q_stage, k_cstate.index)
                    cute.nvgpu.warpgroup.wait_group(0)
                    k_pipe.consumer_release(k_cstate)
                    k_cstate.advance()

                    # ---------------- softmax (base 2, online)
                    s_f = self.scores_f32(acc_s, tScS, kb, seqlen)
                    alpha = cute.make_rmem_tensor((2,), cutlass.Float32)
                    self.softmax_step(s_f, qs_log2, k_scale[bh, kb], row_max, row_sum, alpha)

                    # ---------------- P (e4m3, A-operand register layout) . V into a fresh accumulator
                    tOrP = cute.make_rmem_tensor(p_shape, cutlass.Float8E4M3FN)
                    self.pack_p(s_f, tOrP, p_shape)
                    acc_pv = cute.make_rmem_tensor(acc_o_shape, cutlass.Float32)
                    v_pipe.consumer_wait(v_cstate)
                    pv_mma = self.issue_pv(pv_mma, acc_pv, tOrP, tOrV, v_cstate.index)
                    cute.nvgpu.warpgroup.wait_group(0)
                    v_pipe.consumer_release(v_cstate)
                    v_cstate.advance()
                    self.accumulate(acc_o, acc_pv, alpha)
            else:
                # FA3-style intra-warpgroup overlap: step j issues QK_j and PV_{j-1} together, then runs the
                # softmax of S_j while PV_{j-1} is on the tensor cores. With ping-pong, the two consumer
                # warpgroups take turns issuing their GEMM steps (named barriers 1 and 2).
                pp = cutlass.const_expr(cfg.pingpong)
                bar_mine = 1 + cw
                bar_other = 2 - cw
                if cutlass.const_expr(pp):
                    if cw == 1:
                        cute.arch.barrier_arrive(barrier_id=1, number_of_threads=256)
                alpha_prev = cute.make_rmem_tensor((2,), cutlass.Float32)
                alpha_cur = cute.make_rmem_tensor((2,), cutlass.Float32)
                tOrP_prev = cute.make_rmem_tensor(p_shape, cutlass.Float8E4M3FN)

                # step 0: QK_0
                acc_s = cute.make_rmem_tensor(acc_s_shape, cutlass.Int32)
                k_pipe.consumer_wait(k_cstate)
                if cutlass.const_expr(pp):
                    cute.arch.barrier(barrier_id=bar_mine, number_of_threads=256)
                qk_mma = self.issue_qk(qk_mma, acc_s, tSrQ, tSrK, q_stage, k_cstate.index)
                if cutlass.const_expr(pp):
                    cute.arch.barrier_arrive(barrier_id=bar_other, number_of_threads=256)
                cute.nvgpu.warpgroup.wait_group(0)
                k_pipe.consumer_release(k_cstate)
                k_cstate.advance()
                s_f = self.scores_f32(acc_s, tScS, 0, seqlen)
                self.softmax_step(s_f, qs_log2, k_scale[bh, 0], row_max, row_sum, alpha_prev)
                self.pack_p(s_f, tOrP_prev, p_shape)

                for kb in cutlass.range(1, n_kb, unroll=1):
                    acc_s = cute.make_rmem_tensor(acc_s_shape, cutlass.Int32)
                    acc_pv = cute.make_rmem_tensor(acc_o_shape, cutlass.Float32)
                    k_pipe.consumer_wait(k_cstate)
                    v_pipe.consumer_wait(v_cstate)
                    if cutlass.const_expr(pp):
                        cute.arch.barrier(barrier_id=bar_mine, number_of_threads=256)
                    qk_mma = self.issue_qk(qk_mma, acc_s, tSrQ, tSrK, q_stage, k_cstate.index)
                    pv_mma = self.issue_pv(pv_mma, acc_pv, tOrP_prev, tOrV, v_cstate.index)
                    if cutlass.const_expr(pp):
                        cute.arch.barrier_arrive(barrier_id=bar_other, number_of_threads=256)
                    cute.nvgpu.warpgroup.wait_group(1)  # QK_j done
                    k_pipe.consumer_release(k_cstate)
                    k_cstate.advance()
                    s_f = self.scores_f32(acc_s, tScS, kb, seqlen)
                    self.softmax_step(s_f, qs_log2, k_scale[bh, kb], row_max, row_sum, alpha_cur)
                    tOrP_cur = cute.make_rmem_tensor(p_shape, cutlass.Float8E4M3FN)
                    self.pack_p(s_f, tOrP_cur, p_shape)
                    cute.nvgpu.warpgroup.wait_group(0)  # PV_{j-1} done
                    v_pipe.consumer_release(v_cstate)
                    v_cstate.advance()
                    self.accumulate(acc_o, acc_pv, alpha_prev)
                    alpha_prev.store(alpha_cur.load())
                    p_prev_u32 = cute.recast_tensor(tOrP_prev, cutlass.Uint32)
                    p_cur_u32 = cute.recast_tensor(tOrP_cur, cutlass.Uint32)
                    for i in cutlass.range_constexpr(cute.size(p_cur_u32)):
                        p_prev_u32[i] = opaque_mov_u32(p_cur_u32[i])

                # last step: PV_{n-1}
                acc_pv = cute.make_rmem_tensor(acc_o_shape, cutlass.Float32)
                v_pipe.consumer_wait(v_cstate)
                if cutlass.const_expr(pp):
                    cute.arch.barrier(barrier_id=bar_mine, number_of_threads=256)
                pv_mma = self.issue_pv(pv_mma, acc_pv, tOrP_prev, tOrV, v_cstate.index)
                if cutlass.const_expr(pp):
                    if cw == 0:  # WG1's last arrive on barrier 1 would have no matching sync
                        cute.arch.barrier_arrive(barrier_id=bar_other, number_of_threads=256)
                cute.nvgpu.warpgroup.wait_group(0)
                v_pipe.consumer_release(v_cstate)
                v_cstate.advance()
                self.accumulate(acc_o, acc_pv, alpha_prev)

            # The ACCUMULATE flag is runtime state of the MMA atoms; re-set it here so that no value created
            # inside the loops above is used below (the epilogue partitions with pv_thr).
            qk_mma.set(warpgroup.Field.ACCUMULATE, False)
            pv_mma.set(warpgroup.Field.ACCUMULATE, False)
            # ---------------- epilogue
            self.epilogue(acc_o, row_sum, pv_thr, mO, v_scale, bh, q_tile, seqlen)
        return

    # ------------------------------------------------------------------ helpers (inlined at trace time)
    @cute.jit
    def issue_qk(self, qk_mma, acc_s, tSrQ, tSrK, q_stage, k_stage):
        cute.nvgpu.warpgroup.fence()
        for kk in cutlass.range_constexpr(self.D // 32):
            qk_mma.set(warpgroup.Field.ACCUMULATE, kk != 0)
            cute.gemm(qk_mma, acc_s, tSrQ[None, None, kk, q_stage], tSrK[None, None, kk, k_stage], acc_s)
        cute.nvgpu.warpgroup.commit_group()
        return qk_mma

    @cute.jit
    def issue_pv(self, pv_mma, acc_pv, tOrP, tOrV, v_stage):
        cute.nvgpu.warpgroup.fence()
        for kk in cutlass.range_constexpr(BN // 32):
            pv_mma.set(warpgroup.Field.ACCUMULATE, kk != 0)
            cute.gemm(pv_mma, acc_pv, tOrP[None, None, kk], tOrV[None, None, kk, v_stage], acc_pv)
        cute.nvgpu.warpgroup.commit_group()
        return pv_mma

    @cute.jit
    def scores_f32(self, acc_s, tScS, kb, seqlen):
        """int32 scores -> f32 (exact: |S| < 2^22) with the 1.5*2^23 trick (IADD + FADD instead of I2F, whose
        throughput is 1/8 of FFMA's); keys >= seqlen set to -inf (last block only)."""
        s_f = cute.make_rmem_tensor(acc_s.layout, cutlass.Float32)
        s_f.store((acc_s.load() + MAGIC_I).bitcast(cutlass.Float32) - MAGIC_F)
        if kb * BN + BN > seqlen:
            lim = seqlen - kb * BN
            for i in cutlass.range_constexpr(cute.size(s_f)):
                s_f[i] = cutlass.Float32(
                    cutlass.select_(tScS[i][1] >= lim, -cutlass.Float32.inf, s_f[i])
                )
        return s_f

    @cute.jit
    def accumulate(self, acc_o, acc_pv, alpha):
        """Two-level accumulation: acc_o = acc_o * alpha(row) + acc_pv (acc_pv: this block's fresh P.V)."""
        for g in cutlass.range_constexpr(cute.size(acc_o) // 4):
            for h in cutlass.range_constexpr(2):
                for e in cutlass.range_constexpr(2):
                    v = e + 2 * h + 4 * g
                    acc_o[v] = acc_o[v] * alpha[h] + acc_pv[v]

    @cute.jit
    def softmax_step(self, s_f, qs_log2, ks, row_max, row_sum, alpha):
        """Online softmax update for one block. s_f: raw (unscaled) logits, f32, in the C-fragment order
        v = e + 2h + 4g (h: row half, g: 8-column group, e: column parity); the logit scale of row half h is
        c = qs_log2[h] * ks > 0 (Q's row or tile scale * sm_scale * log2 e, times the block's K scale).
        Overwrites s_f with P*448 = exp2(s*c - m_new + log2 448); updates row_max, row_sum (thread-partial sums,
        quad-reduced in the epilogue); alpha[h] = exp2(m_old - m_new), the rescale for older accumulators."""
        n_groups = cute.size(s_f) // 4
        for h in cutlass.range_constexpr(2):
            c = qs_log2[h] * ks
            mx = s_f[2 * h]
            for g in cutlass.range_constexpr(n_groups):
                for e in cutlass.range_constexpr(2):
                    if g + e > 0:
                        mx = cute.arch.fmax(mx, s_f[e + 2 * h + 4 * g])
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=1))
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=2))
            m_old = row_max[h]
            m_new = cute.arch.fmax(m_old, mx * c)
            m_use = m_new
            if m_new == -cutlass.Float32.inf:
                m_use = 0.0
            alpha[h] = cute.math.exp2(m_old - m_use, fastmath=True)
            row_max[h] = m_new
            neg = LOG2_FP8_MAX - m_use
            rs = cutlass.Float32(0.0)
            for g in cutlass.range_constexpr(n_groups):
                for e in cutlass.range_constexpr(2):
                    v = e + 2 * h + 4 * g
                    p = cute.math.exp2(s_f[v] * c + neg, fastmath=True)
                    s_f[v] = p
                    rs = rs + p
            row_sum[h] = row_sum[h] * alpha[h] + rs

    @cute.jit
    def pack_p(self, p_f, tOrP, p_shape):
        """Write P (f32, C-fragment order) into the e4m3 A fragment ((4,2,2),1,4): slot v = i + 4a + 8b of
        k-block s takes C value (i & 1) + 2a + 4(4s + 2b + (i >> 1)) (same row half a; see key_perm32)."""
        tmp = cute.make_rmem_tensor(p_shape, cutlass.Float32)
        for s in cutlass.range_constexpr(BN // 32):
            for b in cutlass.range_constexpr(2):
                for a in cutlass.range_constexpr(2):
                    for i in cutlass.range_constexpr(4):
                        tmp[i + 4 * a + 8 * b + 16 * s] = p_f[(i & 1) + 2 * a + 4 * (4 * s + 2 * b + (i >> 1))]
        tOrP.store(tmp.load().to(cutlass.Float8E4M3FN))

    @cute.jit
    def epilogue(self, acc_o, row_sum, pv_thr, mO, v_scale, bh, q_tile, seqlen):
        inv = cute.make_rmem_tensor((2,), cutlass.Float32)
        for h in cutlass.range_constexpr(2):
            l = row_sum[h]
            l = l + cute.arch.shuffle_sync_bfly(l, offset=1)
            l = l + cute.arch.shuffle_sync_bfly(l, offset=2)
            r = cutlass.Float32(0.0)
            if l > 0.0:
                r = 1.0 / l
            inv[h] = r
        gO = cute.local_tile(mO[None, None, bh], (BM_WG, self.D), (q_tile, 0))
        tOgO = pv_thr.partition_C(gO)
        tOcO = pv_thr.partition_C(cute.make_identity_tensor((BM_WG, self.D)))
        row0 = q_tile * BM_WG
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            h = (i // 2) % 2
            crd = tOcO[i]
            if row0 + crd[0] < seqlen:
                tOgO[i] = (acc_o[i] * inv[h] * v_scale[bh, crd[1]]).to(cutlass.BFloat16)


# ====================================================================== host side
_COMPILED = {}


def _cute_tensor(t, dtype=None, leading_dim=None):
    from cutlass.cute.runtime import from_dlpack

    ct = from_dlpack(t, assumed_align=16)
    if dtype is not None:
        ct.element_type = dtype
    if leading_dim is not None:
        ct = ct.mark_layout_dynamic(leading_dim=leading_dim)
    return ct


def _prepare_args(q_i8, k_i8, v_fp8_t, q_scale, k_scale, v_scale, o):
    import torch

    B, H, N, D = q_i8.shape
    assert D in SUPPORTED_HEAD_DIMS, D
    q3 = q_i8.reshape(B * H, N, D)
    k3 = k_i8.reshape(B * H, N, D)
    vt = v_fp8_t.reshape(B * H, D, v_fp8_t.shape[-1])
    if vt.dtype != torch.uint8:
        vt = vt.view(torch.uint8)
    args = (
        _cute_tensor(q3, leading_dim=2),
        _cute_tensor(k3, leading_dim=2),
        _cute_tensor(vt, cutlass.Float8E4M3FN, leading_dim=2),
        _cute_tensor(q_scale.reshape(B * H, -1), leading_dim=1),
        _cute_tensor(k_scale.reshape(B * H, -1), leading_dim=1),
        _cute_tensor(v_scale.reshape(B * H, D), leading_dim=1),
        _cute_tensor(o.view(B * H, N, D), leading_dim=2),
    )
    return args


def _check_inputs(cfg, q_i8, v_fp8_t, q_scale, k_scale):
    B, H, N, D = q_i8.shape
    assert D == cfg.head_dim, (D, cfg.head_dim)
    assert v_fp8_t.shape[-1] % BN == 0 and v_fp8_t.shape[-1] >= N and v_fp8_t.shape[-2] == D
    if cfg.q_granularity == "per_token":  # one per row; a padded buffer (sagegen's [B, H, N_pad]) is fine
        assert q_scale.shape[-1] >= N, (q_scale.shape, N)
    else:
        assert q_scale.shape[-1] == -(-N // BM_WG), (q_scale.shape, N)
    assert k_scale.shape[-1] == -(-N // BN), (k_scale.shape, N)


def compile_variant(cfg: Sa2Config, args, stream):
    key = cfg
    if key not in _COMPILED:
        kern = Sa2Fwd(cfg)
        _COMPILED[key] = cute.compile(kern, *args, cutlass.Float32(1.0), stream)
    return _COMPILED[key]


def sa2_attention(q_i8, k_i8, v_fp8_t, q_scale, k_scale, v_scale, sm_scale, cfg: Sa2Config | None = None, out=None):
    """q_i8, k_i8: int8 [B, H, N, D] (D = 64 or 128); v_fp8_t: e4m3 (or its uint8 view) [B, H, D, Np] (keys
    permuted per 32-chunk, Np = ceil(N/128)*128); q_scale [B, H, >= N] (cfg.q_granularity="per_token", the
    default) or [B, H, ceil(N/64)] ("per_block"), k_scale [B, H, ceil(N/128)], v_scale [B, H, D] (fp32).
    Returns bf16 [B, H, N, D]. cfg's head_dim is taken from the inputs."""
    import torch
    import cuda.bindings.driver as cuda

    B, H, N, D = q_i8.shape
    cfg = (cfg or Sa2Config()).with_head_dim(D)
    _check_inputs(cfg, q_i8, v_fp8_t, q_scale, k_scale)
    o = out if out is not None else torch.empty(B, H, N, D, dtype=torch.bfloat16, device=q_i8.device)
    args = _prepare_args(q_i8, k_i8, v_fp8_t, q_scale.float().contiguous(), k_scale.float().contiguous(),
                         v_scale.float().contiguous(), o)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    fn = compile_variant(cfg, args, stream)
    fn(*args, cutlass.Float32(sm_scale * 1.4426950408889634), stream)
    return o


def make_launcher(q_i8, k_i8, v_fp8_t, q_scale, k_scale, v_scale, sm_scale, out, cfg: Sa2Config | None = None):
    """Prepare the cute tensors once and return a no-argument launch closure (for timing without the per-call
    DLPack conversion cost of `sa2_attention`)."""
    import torch
    import cuda.bindings.driver as cuda

    cfg = (cfg or Sa2Config()).with_head_dim(q_i8.shape[-1])
    _check_inputs(cfg, q_i8, v_fp8_t, q_scale, k_scale)
    args = _prepare_args(q_i8, k_i8, v_fp8_t, q_scale, k_scale, v_scale, out)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    fn = compile_variant(cfg, args, stream)
    scale = cutlass.Float32(sm_scale * 1.4426950408889634)
    return lambda: fn(*args, scale, stream)


def compile_only(cfg: Sa2Config):
    """Compile the kernel without a GPU (fake tensors; dynamic shapes, like the real call)."""
    from cutlass.cute.runtime import make_fake_tensor, make_fake_stream

    D = cfg.head_dim
    sym = cute.sym_int
    s64 = lambda: cute.sym_int(64)  # noqa: E731
    q = make_fake_tensor(cutlass.Int8, (sym(), sym(), D), stride=(s64(), s64(), 1), assumed_align=16)
    k = make_fake_tensor(cutlass.Int8, (sym(), sym(), D), stride=(s64(), s64(), 1), assumed_align=16)
    v = make_fake_tensor(cutlass.Float8E4M3FN, (sym(), D, sym()), stride=(s64(), s64(), 1), assumed_align=16)
    qs = make_fake_tensor(cutlass.Float32, (sym(), sym()), stride=(s64(), 1), assumed_align=16)
    ks = make_fake_tensor(cutlass.Float32, (sym(), sym()), stride=(s64(), 1), assumed_align=16)
    vs = make_fake_tensor(cutlass.Float32, (sym(), D), stride=(s64(), 1), assumed_align=16)
    o = make_fake_tensor(cutlass.BFloat16, (sym(), sym(), D), stride=(s64(), s64(), 1), assumed_align=16)
    return cute.compile(Sa2Fwd(cfg), q, k, v, qs, ks, vs, o, cutlass.Float32(1.0), make_fake_stream())


VARIANTS = {
    "serial": Sa2Config(schedule="serial"),
    "overlap": Sa2Config(schedule="overlap"),
    "overlap_pp": Sa2Config(schedule="overlap", pingpong=True),
    "overlap_pp_qblock": Sa2Config(schedule="overlap", pingpong=True, q_granularity="per_block"),
}

if __name__ == "__main__":
    import sys
    import time

    # python sa2_fwd.py [variant...] [--d 64|128]  (default: every variant at both head dims)
    argv = sys.argv[1:]
    dims = list(SUPPORTED_HEAD_DIMS)
    if "--d" in argv:
        i = argv.index("--d")
        dims = [int(argv[i + 1])]
        argv = argv[:i] + argv[i + 2:]
    names = argv or list(VARIANTS)
    for d in dims:
        for name in names:
            t0 = time.time()
            cfg = VARIANTS[name].with_head_dim(d)
            compile_only(cfg)
            print(f"compiled {name} ({cfg.tag()}) in {time.time() - t0:.1f}s", flush=True)
