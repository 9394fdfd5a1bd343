"""Block masks: a boolean keep[B, H, NQB, NKB] <-> the kernels' compact `BlockSparse` <-> a dense token mask or
FlexAttention's `BlockMask`.

`BlockSparse` is the kernels' type (`sagegen.kernels.block_sparse`): per (batch, head, q-block) a count and
the key-block indices, kept ones first in ascending order.
"""

from __future__ import annotations

import torch

try:
    from ..kernels.block_sparse import BlockSparse
except ImportError:  # before the block-sparse kernels land: the same fields, for the emulation path
    from dataclasses import dataclass

    @dataclass
    class BlockSparse:  # type: ignore[no-redef]
        counts: torch.Tensor  # int32 [B, H, NQB]
        indices: torch.Tensor  # int32 [B, H, NQB, NKB]
        block_q: int
        block_kv: int


def from_keep(keep: torch.Tensor, block_q: int, block_kv: int) -> BlockSparse:
    """keep: bool [B, H, NQB, NKB] -> BlockSparse (indices of kept blocks first, ascending; then the others)."""
    nkb = keep.shape[-1]
    order = torch.arange(nkb, device=keep.device, dtype=torch.int32)
    # kept blocks sort first (key 0..nkb-1), dropped ones after (nkb..2nkb-1), each group ascending
    key = torch.where(keep, order, order + nkb)
    indices = torch.sort(key, dim=-1).values
    indices = torch.where(indices >= nkb, indices - nkb, indices).to(torch.int32)
    counts = keep.sum(dim=-1, dtype=torch.int32)
    return BlockSparse(counts, indices.contiguous(), block_q, block_kv)


def to_keep(bs: BlockSparse) -> torch.Tensor:
    """BlockSparse -> bool keep [B, H, NQB, NKB]."""
    nkb = bs.indices.shape[-1]
    rank = torch.arange(nkb, device=bs.indices.device)
    listed = rank < bs.counts[..., None]
    keep = torch.zeros(bs.indices.shape, dtype=torch.bool, device=bs.indices.device)
    return keep.scatter_(-1, bs.indices.long(), listed)


def to_dense_mask(bs: BlockSparse, n_q: int, n_k: int) -> torch.Tensor:
    """BlockSparse -> bool token mask [B, H, n_q, n_k] (True = attend): the equivalent dense mask."""
    keep = to_keep(bs)
    rows = keep.repeat_interleave(bs.block_q, dim=2)[:, :, :n_q]
    return rows.repeat_interleave(bs.block_kv, dim=3)[..., :n_k]


def density(bs: BlockSparse) -> torch.Tensor:
    """Fraction of (q-block, kv-block) pairs computed, as a 0-d fp32 tensor (no host sync)."""
    return bs.counts.float().mean() / bs.indices.shape[-1]


def to_flex_block_mask(bs: BlockSparse, n_q: int, n_k: int):
    """BlockSparse -> `torch.nn.attention.flex_attention.BlockMask` over n_q x n_k tokens (for FlexAttention
    comparisons; ragged last blocks are cut by a mask_mod on the token bounds)."""
    from torch.nn.attention.flex_attention import BlockMask

    def inside(b, h, q_idx, kv_idx):
        return (q_idx < n_q) & (kv_idx < n_k)

    return BlockMask.from_kv_blocks(bs.counts, bs.indices, BLOCK_SIZE=(bs.block_q, bs.block_kv),
                                    mask_mod=inside, seq_lengths=(n_q, n_k))
