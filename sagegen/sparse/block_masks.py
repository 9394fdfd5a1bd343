"""Block masks: a boolean keep[B, H, NQB, NKB] <-> the kernels' compact `BlockSparse` <-> FlexAttention's
`BlockMask` (the dense token mask is `BlockSparse.to_dense_mask`)."""

from __future__ import annotations

import torch

from sagegen.kernels.block_sparse import BlockSparse


def from_keep(keep: torch.Tensor, block_q: int, block_kv: int) -> BlockSparse:
    """keep: bool [B, H, NQB, NKB] -> BlockSparse (no host sync)."""
    return BlockSparse.from_block_dense(keep, block_q, block_kv)


def density(bs: BlockSparse) -> torch.Tensor:
    """Fraction of (q-block, kv-block) pairs computed, as a 0-d fp32 tensor (no host sync)."""
    return bs.counts.float().mean() / bs.indices.shape[-1]


def to_flex_block_mask(bs: BlockSparse, n_q: int, n_k: int):
    """BlockSparse -> `torch.nn.attention.flex_attention.BlockMask` over n_q x n_k tokens (for FlexAttention
    comparisons; ragged last blocks are cut by a mask_mod on the token bounds). Broadcast (size-1) batch /
    head dims stay size 1."""
    from torch.nn.attention.flex_attention import BlockMask

    def inside(b, h, q_idx, kv_idx):
        return (q_idx < n_q) & (kv_idx < n_k)

    return BlockMask.from_kv_blocks(bs.counts, bs.indices, BLOCK_SIZE=(bs.block_q, bs.block_kv),
                                    mask_mod=inside, seq_lengths=(n_q, n_k))
