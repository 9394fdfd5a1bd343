"""A block mask's compact form -> the per-tile lists the attention kernels read, in one Triton launch.

The PyTorch form (`block_sparse.kernel_tiles_dense`: a dense bool detour, two `repeat_interleave`s and a
scan-and-scatter compaction) takes ~17 small launches per call; at low density they were a visible share of a
sparse call (issue 20's d + 0.05 bound). Here one program per output row (batch, head, q-tile):

1. loads its q-block's count and listed key blocks;
2. keeps an entry only if it is listed (before the count), in range, and above every in-range entry before it
   (the rule `BlockSparse.to_block_dense` applies, so the kernels and the emulation drop the same bad data);
3. expands each kept key block into its ``block_kv // tile_k`` key tiles, cut at the last tile of the keys
   (or of the batch's valid key prefix, with key lengths);
4. writes the tiles ascending, then zeros (a valid tile: an empty row's kernel reads entry 0 and discards it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sagegen.kernels.spec import next_power_of_2


@triton.jit
def _combine_above(m_left, ok_left, m_right, ok_right):
    # (max so far, "the segment's last entry is above everything before it"): associative, since an `ok`
    # segment's last entry is its max
    return tl.maximum(m_left, m_right), ok_right & (m_right > m_left)


@triton.jit
def _tiles_kernel(
    Counts, Indices, KvLen, OutCounts, OutIndices,
    H_OUT, NQT, NKB, NKT, q_per_block, kv_per_block, tile_k,
    stride_cb, stride_ch, stride_cq, stride_ib, stride_ih, stride_iq,
    HAS_KV_LEN: tl.constexpr, BLOCK: tl.constexpr, PER: tl.constexpr,
):
    row = tl.program_id(0)
    qt = row % NQT
    bh = row // NQT
    h = bh % H_OUT
    b = bh // H_OUT
    qb = qt // q_per_block
    j = tl.arange(0, BLOCK)
    count = tl.load(Counts + b * stride_cb + h * stride_ch + qb * stride_cq)
    idx = tl.load(Indices + b.to(tl.int64) * stride_ib + h.to(tl.int64) * stride_ih + qb * stride_iq + j,
                  mask=j < NKB, other=-1)
    valid = (j < count) & (j < NKB) & (idx >= 0) & (idx < NKB)
    _, above = tl.associative_scan((tl.where(valid, idx, -1), valid), 0, _combine_above)
    keep = valid & above
    n_tiles = NKT
    if HAS_KV_LEN:
        n_tiles = tl.minimum(NKT, (tl.load(KvLen + b) + tile_k - 1) // tile_k)
    rank = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    t = tl.arange(0, PER)
    tile = idx[:, None] * kv_per_block + t[None, :]  # [BLOCK, PER]: a kept block's key tiles
    live = keep[:, None] & (t[None, :] < kv_per_block) & (tile < n_tiles)
    pos = rank[:, None] * kv_per_block + t[None, :]  # ascending; the cut ones are the last ones
    out = OutIndices + row.to(tl.int64) * NKT
    n_out = tl.sum(tl.sum(live.to(tl.int32), axis=1), axis=0)
    tl.store(out + pos, tile, mask=live)
    flat = j[:, None] * PER + t[None, :]  # every slot once: zeros past the count
    tl.store(out + flat, tl.zeros_like(flat), mask=(flat >= n_out) & (flat < NKT))
    tl.store(OutCounts + row, n_out)


def convert(counts: torch.Tensor, indices: torch.Tensor, block_q: int, block_kv: int, tile_q: int, tile_k: int,
            n_q: int, n_k: int, key_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts int32 [B", H', NQT], indices int32 [B", H', NQT, NKT]) for the kernels, from a BlockSparse's
    counts [B', H', NQB] and indices [B', H', NQB, NKB] (blocks multiples of the tiles). B" = B' without
    key_lengths (int32 [B], valid-prefix key counts), else B. NQT, NKT: the tiles of n_q, n_k."""
    indices = indices if indices.stride(-1) == 1 else indices.contiguous()
    b_mask, h_mask, nqb, nkb = indices.shape
    nqt, nkt = -(-n_q // tile_q), -(-n_k // tile_k)
    b_out = key_lengths.shape[0] if key_lengths is not None else b_mask
    out_counts = torch.empty(b_out, h_mask, nqt, dtype=torch.int32, device=indices.device)
    out_indices = torch.empty(b_out, h_mask, nqt, nkt, dtype=torch.int32, device=indices.device)
    per = block_kv // tile_k
    block = max(16, next_power_of_2(nkb))
    bstride = lambda t: t.stride(0) if t.shape[0] > 1 else 0  # noqa: E731 (a broadcast batch dim)
    _tiles_kernel[(b_out * h_mask * nqt,)](
        counts, indices, key_lengths if key_lengths is not None else counts, out_counts, out_indices,
        h_mask, nqt, nkb, nkt, block_q // tile_q, per, tile_k,
        bstride(counts), counts.stride(1), counts.stride(2), bstride(indices), indices.stride(1),
        indices.stride(2),
        HAS_KV_LEN=key_lengths is not None, BLOCK=block, PER=next_power_of_2(per),
        num_warps=4 if block * per <= 2048 else 8, enable_fp_fusion=True,  # integer work; silences 3.9
    )
    return out_counts, out_indices
