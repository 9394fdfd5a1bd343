"""The block-mask predictor's selection in one Triton pass per (batch, head, q-block) row: the estimated block
scores, top-k or cumulative-mass selection, the always-keep rules, and the compact (count, indices) form.

The same computation as `sagegen.sparse.predictor.predict_keep` followed by `BlockSparse.from_block_dense`,
which take ~25 PyTorch kernels (softmax, a sort-based top-k, scatters, a scan): at 32k tokens their launches
made the predictor host-bound (2.2 ms for 0.8 ms of GPU work, lab/NOTES.md). Here each program loads one row
of pooled scores, finds the k-th largest (``tl.sort``), ORs in the rules, drops key blocks without live keys,
and writes the kept indices ascending (``tl.cumsum``) followed by zeros.

Top-k keeps every block scoring at least the k-th largest score: equal to ``torch.topk`` except for exact
ties at the threshold (then a few more blocks). Cumulative mass ("cdf") keeps the fewest blocks whose
softmax weight reaches ``value``, from a softmax computed here (rounding may differ from torch's by ulps).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from sagegen.kernels.spec import next_power_of_2

MODE_TOPK, MODE_CDF = 0, 1


@triton.jit
def _select_kernel(
    S, Live, QSim, KSim, RowsAlways, ColsAlways, Counts, Indices,
    H, NQB, NKB, group, k_top, value, sim_threshold, scale, block_q, block_kv, q_offset,
    stride_sb, stride_sh, stride_sq, stride_lb, stride_qb, stride_qh, stride_kb, stride_kh,
    MODE: tl.constexpr, USE_SIM: tl.constexpr, KEEP_DIAG: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    i = row % NQB
    bh = row // NQB
    h = bh % H
    b = bh // H
    j = tl.arange(0, BLOCK)
    inside = j < NKB
    s = tl.load(S + b * stride_sb + h * stride_sh + i * stride_sq + j, mask=inside, other=0.0) * scale
    live = tl.load(Live + b * stride_lb + j, mask=inside, other=0.0)
    s = tl.where(inside & (live > 0), s + tl.log(tl.maximum(live, 1.0)), float("-inf"))
    if MODE == 0:  # top-k: the k-th largest score is the threshold
        ranked = tl.sort(s, descending=True)
        thr = tl.max(tl.where(j == k_top - 1, ranked, float("-inf")), axis=0)
        keep = s >= thr
    else:  # cdf: the fewest blocks whose softmax weight reaches `value`
        m = tl.max(s, axis=0)
        m = tl.where(m > float("-inf"), m, 0.0)  # a fully masked row: no (-inf) - (-inf)
        e = tl.where(s > float("-inf"), tl.exp(s - m), 0.0)
        p = e / tl.maximum(tl.sum(e, axis=0), 1e-30)
        ranked = tl.sort(p, descending=True)
        before = tl.cumsum(ranked, axis=0) - ranked
        n_keep = tl.sum(((before < value) & inside).to(tl.int32), axis=0)
        thr = tl.max(tl.where(j == n_keep - 1, ranked, float("-inf")), axis=0)
        keep = p >= thr
    # the rules as 0/1 ints (the interpreter's numpy cannot OR a bool vector with a scalar comparison)
    kept = tl.where(keep, 1, 0)
    kept = tl.maximum(kept, tl.load(ColsAlways + j, mask=inside, other=0).to(tl.int32))
    kept = tl.maximum(kept, tl.load(RowsAlways + i).to(tl.int32))
    if KEEP_DIAG:
        first = q_offset + i * block_q  # the query block's first position in the key sequence
        kept = tl.maximum(kept, tl.where((j * block_kv < first + block_q) & ((j + 1) * block_kv > first), 1, 0))
    if USE_SIM:
        q_sim = tl.load(QSim + b * stride_qb + h * stride_qh + i)
        k_sim = tl.load(KSim + b * stride_kb + (h // group) * stride_kh + j, mask=inside, other=1.0)
        kept = tl.maximum(kept, tl.where(k_sim < sim_threshold, 1, 0))
        kept = tl.maximum(kept, tl.where(k_sim * 0 + q_sim < sim_threshold, 1, 0))
    kept = tl.where(inside & (live > 0), kept, 0)
    pos = tl.cumsum(kept, axis=0) - 1
    count = tl.sum(kept, axis=0)
    out = Indices + row.to(tl.int64) * NKB
    tl.store(out + pos, j, mask=kept != 0)  # the kept indices, ascending
    tl.store(out + j, tl.zeros_like(j), mask=inside & (j >= count))  # then zeros (disjoint slots)
    tl.store(Counts + row, count)


def select_blocks(scores: torch.Tensor, live: torch.Tensor, *, mode: str, value: float, scale: float,
                  rows_always: torch.Tensor, cols_always: torch.Tensor, keep_diagonal: bool, block_q: int,
                  block_kv: int, q_sim: torch.Tensor | None = None, k_sim: torch.Tensor | None = None,
                  sim_threshold: float = 0.0, q_offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts int32 [B, H, NQB], indices int32 [B, H, NQB, NKB]) from unscaled pooled scores.

    Shapes: scores [B, H, NQB, NKB] fp32 (mean(Q_i)·mean(K_j), unit stride over NKB); live [B, NKB] fp32 live
    keys per key block; rows_always [NQB] / cols_always [NKB] bool; q_sim [B, H, NQB], k_sim [B, Hkv, NKB]
    fp32 (with ``sim_threshold`` > 0). ``value``: the top-k fraction or the cdf mass. ``q_offset``: where the
    query blocks start in the key sequence, for the diagonal (one rank's query window under Ring).
    """
    B, H, NQB, NKB = scores.shape
    if scores.dtype != torch.float32 or scores.stride(3) != 1:
        raise ValueError(f"scores must be fp32 [B, H, NQB, NKB] with unit stride over NKB, got {scores.dtype}")
    if mode not in ("topk", "cdf"):
        raise ValueError(f"mode={mode!r}: use 'topk' or 'cdf'")
    live = live.float().expand(B, NKB)
    use_sim = sim_threshold > 0 and q_sim is not None and k_sim is not None
    q_sim = q_sim if use_sim else scores
    k_sim = k_sim if use_sim else scores
    group = H // k_sim.shape[1] if use_sim else 1
    counts = torch.empty(B, H, NQB, dtype=torch.int32, device=scores.device)
    indices = torch.empty(B, H, NQB, NKB, dtype=torch.int32, device=scores.device)
    k_top = max(1, min(NKB, math.ceil(value * NKB - 1e-9)))
    block = max(16, next_power_of_2(NKB))
    _select_kernel[(B * H * NQB,)](
        scores, live, q_sim, k_sim, rows_always.to(torch.int8), cols_always.to(torch.int8), counts, indices,
        H, NQB, NKB, group, k_top, float(value), float(sim_threshold), float(scale), block_q, block_kv, int(q_offset),
        scores.stride(0), scores.stride(1), scores.stride(2), live.stride(0),
        q_sim.stride(0), q_sim.stride(1), k_sim.stride(0), k_sim.stride(1),
        MODE=MODE_TOPK if mode == "topk" else MODE_CDF, USE_SIM=use_sim, KEEP_DIAG=bool(keep_diagonal),
        BLOCK=block, num_warps=4 if block <= 1024 else 8, enable_fp_fusion=True,
    )
    return counts, indices
