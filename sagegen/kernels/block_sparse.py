"""Block-sparse attention masks: sagegen's compact form, conversion from FlexAttention's `BlockMask`, and the
tile layout the kernels and the emulation run on.

`BlockSparse` lists, per (batch, head, q-block), how many key blocks are computed and which ones (sorted
ascending); every other key block is skipped, as if masked out. Block sizes are the mask's own
(``block_q`` query rows x ``block_kv`` keys); each must be a multiple of the kernel's tile along its axis
(`SageConfig.blocks`: 64 x 128 on Hopper and in the emulation, 128 x 64 on Ada/Ampere), so 128 x 128 -
FlexAttention's default - works everywhere. The last block along each axis may be ragged (cut off at the
sequence length).

Layering: this module knows nothing of diffusers or of the attention kernels; `sagegen.api` validates a mask
against a call, `tile_layout` (the emulation) and `kernel_tiles` (the kernels, through one Triton launch of
`triton_sparse_tiles`) turn it into the per-tile form.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# Mask block sizes that are multiples of both tile shapes (Hopper 64 x 128, Ada/Ampere 128 x 64).
PORTABLE_BLOCKS = (128, 128)


class BlockSparse(NamedTuple):
    """Which key blocks each query block attends to.

    Fields:
        counts: int32 [B', H', NQB]: how many key blocks (batch, head, q-block) computes; 0 = none (its rows
            give zeros and lse = -inf, as fully masked rows do).
        indices: int32 [B', H', NQB, NKB]: the key-block indices, sorted ascending and distinct, in the first
            ``counts`` entries of the last dim; entries past the count are ignored.
        block_q: query rows per block (a multiple of the kernel's query tile).
        block_kv: keys per block (a multiple of the kernel's key tile).

    B' is 1 or the batch size, H' is 1 or the number of query heads (size-1 dims broadcast);
    NQB = ceil(Nq / block_q) and NKB = ceil(Nk / block_kv) for the call's Nq and Nk.
    A NamedTuple of tensors and ints, so it passes through `torch.compile` (fullgraph) as is.
    """

    counts: torch.Tensor
    indices: torch.Tensor
    block_q: int
    block_kv: int

    @classmethod
    def from_block_dense(cls, blocks: torch.Tensor, block_q: int, block_kv: int) -> "BlockSparse":
        """From a bool block matrix [B', H', NQB, NKB] (True = compute the block). No host sync."""
        if not isinstance(blocks, torch.Tensor) or blocks.dtype != torch.bool or blocks.dim() != 4:
            raise ValueError("blocks must be a 4-D bool tensor [B, H, NQB, NKB] (True = compute), got "
                             f"{_describe(blocks)}")
        counts, indices = compact(blocks)
        return cls(counts, indices, int(block_q), int(block_kv))

    @classmethod
    def from_flex_block_mask(cls, block_mask, *, partial_blocks: str = "check") -> "BlockSparse":
        """From FlexAttention's `BlockMask` (`torch.nn.attention.flex_attention.create_block_mask`).

        The union of its partial and full blocks is computed. A *partial* block is one where the mask_mod
        masks some of the tokens; sagegen skips or computes whole blocks only, so:
          - ``partial_blocks="check"`` (default): evaluate the mask_mod on the in-bounds tokens of every
            partial block (one host sync, then a pass over those blocks only) and raise ValueError if it
            masks any token there. Blocks that are partial only because the sequence ends inside them pass.
            A mask_mod of None or `noop_mask` needs no evaluation.
          - ``partial_blocks="keep"``: compute partial blocks whole, unchecked. The result then equals the
            BlockMask only together with a token-level mask: pass ``attn_mask`` as well (e.g.
            ``flex_attention.create_mask(mask_mod, B, H, Nq, Nk)``).
        """
        if partial_blocks not in ("check", "keep"):
            raise ValueError(f"partial_blocks={partial_blocks!r}: use 'check' or 'keep'")
        bq, bkv = _flex_block_sizes(block_mask)
        n_q, n_k = block_mask.seq_lengths
        nqb, nkb = -(-n_q // bq), -(-n_k // bkv)
        partial = _listed(block_mask.kv_num_blocks, block_mask.kv_indices, nqb, nkb)
        full = block_mask.full_kv_num_blocks
        blocks = partial if full is None else partial | _listed(full, block_mask.full_kv_indices, nqb, nkb)
        if partial_blocks == "check":
            _check_partial_blocks(block_mask, partial, bq, bkv, n_q, n_k)
        return cls.from_block_dense(blocks, bq, bkv)

    def to_block_dense(self) -> torch.Tensor:
        """bool [B', H', NQB, NKB]: True where the key block is computed: the listed entries that are in range
        and above every in-range entry listed before them (what the kernels run; see `validate`)."""
        nkb = self.indices.shape[-1]
        idx = self.indices.long()
        live = (torch.arange(nkb, device=self.counts.device) < self.counts[..., None].long()) & (idx >= 0) & (idx < nkb)
        run_max = torch.where(live, idx, -1).cummax(dim=-1).values
        before = torch.nn.functional.pad(run_max[..., :-1], (1, 0), value=-1)
        live = live & (idx > before)
        out = torch.zeros(self.indices.shape, dtype=torch.int32, device=self.indices.device)
        return out.scatter_add_(-1, idx.clamp(0, nkb - 1), live.int()) > 0

    def to_dense_mask(self, n_q: int, n_k: int) -> torch.Tensor:
        """bool [B', H', Nq, Nk] token mask (True = attend): the dense equivalent, for checks and fallbacks."""
        dense = self.to_block_dense().repeat_interleave(self.block_q, dim=2)[:, :, :n_q]
        return dense.repeat_interleave(self.block_kv, dim=3)[..., :n_k]

    def to(self, device) -> "BlockSparse":
        """The same mask with its tensors on `device`."""
        return self._replace(counts=self.counts.to(device), indices=self.indices.to(device))

    def density(self) -> torch.Tensor:
        """Fraction of key blocks computed, per (batch, head, q-block), as fp32 (ragged blocks count as 1)."""
        return self.counts.float() / self.indices.shape[-1]

    def validate(self) -> "BlockSparse":
        """Check the data (host sync): counts in [0, NKB], listed indices in range, sorted and distinct.
        Returns self. `sagegen.sageattn` checks shapes and dtypes only; the kernels and the emulation tolerate
        bad data the same way (entries out of range, or not above every in-range entry before them, are
        dropped) but the intended mask is then not what runs."""
        check_shapes(self)
        nkb = self.indices.shape[-1]
        if bool(((self.counts < 0) | (self.counts > nkb)).any()):
            raise ValueError(f"block_mask.counts must lie in [0, {nkb}] (the number of key blocks)")
        live = torch.arange(nkb, device=self.counts.device) < self.counts[..., None].long()
        idx = self.indices.long()
        if bool((live & ((idx < 0) | (idx >= nkb))).any()):
            raise ValueError(f"block_mask.indices: a listed index is outside [0, {nkb})")
        if nkb > 1 and bool((live[..., 1:] & (idx[..., 1:] <= idx[..., :-1])).any()):
            raise ValueError("block_mask.indices must be sorted ascending and distinct within each count")
        return self


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__


def check_shapes(bs: BlockSparse) -> None:
    """Types, dtypes and shapes of a BlockSparse on its own (no host sync)."""
    if not isinstance(bs.block_q, int) or not isinstance(bs.block_kv, int) or bs.block_q < 1 or bs.block_kv < 1:
        raise ValueError(f"block_mask.block_q / block_kv must be positive ints, got {bs.block_q!r} / {bs.block_kv!r}")
    for name, t, dims in (("counts", bs.counts, 3), ("indices", bs.indices, 4)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != dims:
            raise ValueError(f"block_mask.{name} must be an int32 tensor with {dims} dims, got {_describe(t)}")
    if tuple(bs.indices.shape[:3]) != tuple(bs.counts.shape):
        raise ValueError(f"block_mask.indices {tuple(bs.indices.shape)} must be counts' shape "
                         f"{tuple(bs.counts.shape)} plus the key-block dim")
    if bs.counts.device != bs.indices.device:
        raise ValueError(f"block_mask.counts is on {bs.counts.device} but indices on {bs.indices.device}")


def check_against_call(bs: BlockSparse, batch: int, heads: int, n_q: int, n_k: int, device) -> None:
    """A BlockSparse fits a call with q [batch, heads, n_q, D] and n_k keys (shapes only, no host sync)."""
    check_shapes(bs)
    nqb, nkb = -(-n_q // bs.block_q), -(-n_k // bs.block_kv)
    b, h, q_blocks = bs.counts.shape
    want = f"[1 or {batch}, 1 or {heads}, {nqb}]"
    if b not in (1, batch) or h not in (1, heads) or q_blocks != nqb or bs.indices.shape[-1] != nkb:
        raise ValueError(
            f"block_mask (counts {tuple(bs.counts.shape)}, indices {tuple(bs.indices.shape)}, blocks "
            f"{bs.block_q}x{bs.block_kv}) does not fit this call: Nq={n_q}, Nk={n_k} need counts {want} and "
            f"indices {want[:-1]}, {nkb}]")
    if bs.counts.device != torch.device(device):
        raise ValueError(f"block_mask is on {bs.counts.device} but q is on {device}")


def check_tiles(bs: BlockSparse, tile_q: int, tile_k: int, where: str) -> None:
    """The mask's blocks must be whole multiples of the kernel's tiles (it skips whole tiles)."""
    if bs.block_q % tile_q or bs.block_kv % tile_k:
        raise ValueError(
            f"block_mask blocks of {bs.block_q} query rows x {bs.block_kv} keys are not multiples of the "
            f"kernel's {tile_q} x {tile_k} tiles ({where}): use block_q in {{{tile_q}, {2 * tile_q}, "
            f"{3 * tile_q}, ...}} and block_kv in {{{tile_k}, {2 * tile_k}, {3 * tile_k}, ...}}; "
            f"{PORTABLE_BLOCKS[0]} x {PORTABLE_BLOCKS[1]} (FlexAttention's default) works on every GPU")


def compact(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [..., N] -> (int32 counts [...], int32 indices [..., N]): the True positions, ascending, first;
    entries past the count are 0 (a valid index: the kernels may read them). No host sync."""
    n = blocks.shape[-1]
    pos = blocks.cumsum(-1, dtype=torch.int32).long() - 1
    target = torch.where(blocks, pos, torch.full_like(pos, n))  # unlisted ones land in a dropped extra slot
    src = torch.arange(n, device=blocks.device, dtype=torch.int32).expand(blocks.shape)
    out = torch.zeros((*blocks.shape[:-1], n + 1), dtype=torch.int32, device=blocks.device)
    out.scatter_(-1, target, src)
    return blocks.sum(-1, dtype=torch.int32), out[..., :n].contiguous()


def tile_layout(bs: BlockSparse, tile_q: int, tile_k: int, n_q: int, n_k: int) -> torch.Tensor:
    """bool [B', H', NQT, NKT]: which kernel tiles (tile_q rows x tile_k keys) are computed. Requires
    `check_tiles`. Out-of-range and unlisted indices are dropped."""
    nqt, nkt = -(-n_q // tile_q), -(-n_k // tile_k)
    blocks = bs.to_block_dense()
    tiles = blocks.repeat_interleave(bs.block_q // tile_q, dim=2)[:, :, :nqt]
    return tiles.repeat_interleave(bs.block_kv // tile_k, dim=3)[..., :nkt]


def kernel_tiles(bs: BlockSparse, tile_q: int, tile_k: int, n_q: int, n_k: int,
                 key_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """What the kernels read: (counts int32 [B', H', NQT], indices int32 [B', H', NQT, NKT]) per kernel tile,
    sorted, entries past the count 0. key_lengths (int32 [B], valid-prefix key counts) drops the tiles past
    each batch's last valid key (then B' = B). No host sync. One Triton launch where Triton runs (CUDA, or the
    interpreter); `kernel_tiles_dense` elsewhere, which gives the same result."""
    from sagegen.kernels import triton_sparse_tiles
    from sagegen.kernels.triton_quant import interpreting

    if bs.indices.is_cuda or interpreting():
        return triton_sparse_tiles.convert(bs.counts, bs.indices, bs.block_q, bs.block_kv, tile_q, tile_k, n_q,
                                           n_k, key_lengths)
    return kernel_tiles_dense(bs, tile_q, tile_k, n_q, n_k, key_lengths)


def kernel_tiles_dense(bs: BlockSparse, tile_q: int, tile_k: int, n_q: int, n_k: int,
                       key_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`kernel_tiles` in PyTorch, through the dense tile matrix (~17 small kernels)."""
    tiles = tile_layout(bs, tile_q, tile_k, n_q, n_k)
    if key_lengths is not None:
        n_tiles = (key_lengths.long() + tile_k - 1) // tile_k
        tiles = tiles & (torch.arange(tiles.shape[-1], device=tiles.device) < n_tiles[:, None, None, None])
    return compact(tiles)


def sparse_args(tiles: tuple[torch.Tensor, torch.Tensor] | None, dummy: torch.Tensor) -> tuple[tuple, tuple]:
    """Kernel arguments (counts, indices) and their strides (b, h of counts; b, h, q-tile of indices), with 0
    for broadcast dims; placeholders when dense."""
    if tiles is None:
        return (dummy, dummy), (0, 0, 0, 0, 0)
    counts, indices = tiles
    bcast = lambda t, d: t.stride(d) if t.shape[d] > 1 else 0
    return (counts, indices), (bcast(counts, 0), bcast(counts, 1), bcast(indices, 0), bcast(indices, 1),
                               indices.stride(2))


def _flex_block_sizes(block_mask) -> tuple[int, int]:
    size = block_mask.BLOCK_SIZE
    bq, bkv = (size, size) if isinstance(size, int) else size
    return int(bq), int(bkv)


def _listed(num: torch.Tensor, idx: torch.Tensor, nqb: int, nkb: int) -> torch.Tensor:
    """A FlexAttention (num_blocks, indices) pair -> bool [B, H, NQB, NKB]."""
    num, idx = num[:, :, :nqb], idx[:, :, :nqb]
    live = torch.arange(idx.shape[-1], device=idx.device) < num[..., None].long()
    ok = live & (idx >= 0) & (idx < nkb)
    out = torch.zeros((*idx.shape[:3], nkb), dtype=torch.int32, device=idx.device)
    return out.scatter_add_(-1, idx.long().clamp(0, nkb - 1), ok.int()) > 0


def _is_noop(mask_mod) -> bool:
    from torch.nn.attention.flex_attention import noop_mask

    return mask_mod is None or mask_mod is noop_mask


def _check_partial_blocks(block_mask, partial: torch.Tensor, bq: int, bkv: int, n_q: int, n_k: int,
                          chunk: int = 256) -> None:
    """Raise if the mask_mod masks an in-bounds token of a partial block (evaluated blockwise, chunked)."""
    if _is_noop(block_mask.mask_mod):
        return
    where = partial.nonzero()  # [P, 4]: b, h, q-block, kv-block (the host sync)
    if where.shape[0] == 0:
        return
    dev = where.device
    tq, tk = torch.arange(bq, device=dev), torch.arange(bkv, device=dev)
    for start in range(0, where.shape[0], chunk):
        w = where[start:start + chunk]
        b, h = w[:, 0, None, None], w[:, 1, None, None]
        q_idx = w[:, 2, None, None] * bq + tq[None, :, None]
        kv_idx = w[:, 3, None, None] * bkv + tk[None, None, :]
        inside = (q_idx < n_q) & (kv_idx < n_k)
        keep = block_mask.mask_mod(b, h, q_idx.clamp(max=n_q - 1), kv_idx.clamp(max=n_k - 1))
        bad = inside & ~torch.as_tensor(keep, device=dev).bool()
        if bool(bad.any()):
            first = w[bad.flatten(1).any(1).nonzero()[0, 0]].tolist()
            raise ValueError(
                "this BlockMask has partial blocks (its mask_mod masks tokens inside a block, first at batch "
                f"{first[0]}, head {first[1]}, q-block {first[2]}, kv-block {first[3]}); sagegen computes or "
                "skips whole blocks. Use a block-aligned mask_mod, or convert with "
                "BlockSparse.from_flex_block_mask(bm, partial_blocks='keep') and pass the token-level mask as "
                "attn_mask too")


def from_flex_block_mask(block_mask, *, partial_blocks: str = "check") -> BlockSparse:
    """`BlockSparse.from_flex_block_mask` as a function."""
    return BlockSparse.from_flex_block_mask(block_mask, partial_blocks=partial_blocks)


def to_dense_mask(bs: BlockSparse, n_q: int, n_k: int) -> torch.Tensor:
    """`BlockSparse.to_dense_mask` as a function: bool [B', H', Nq, Nk], True = attend."""
    return bs.to_dense_mask(n_q, n_k)
