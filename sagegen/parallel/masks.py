"""Attention masks under context parallelism.

A model hands the backend a mask built from its *local* tensors (or, rarely, from global ones). Before
attention the mask must describe exactly the queries, heads and keys this rank computes:

- keys: the whole sequence of the CP group (gathered once over the flattened mesh, in chunk order); Ring
  then takes the slice of the KV chunk it is working on at each step (`ring_key_slice`) -- diffusers'
  template reuses the local slice for every rotated chunk, which is silently wrong (defect a);
- heads: after Ulysses a rank holds H/U heads, so a per-head mask [B, H, *, *] is sliced to them -- the
  template passes all H and crashes (defect b). A mask that is the same for every head (size 1 or an
  expanded stride-0 view) is reduced to one head first, which also keeps the gather small;
- queries: a mask with a query dimension follows the queries (gathered over the Ulysses group).
"""

from __future__ import annotations

import torch

from sagegen.parallel.topology import Topology, all_gather, segment_order


def _constant(mask: torch.Tensor, dim: int) -> bool:
    return mask.shape[dim] == 1 or mask.stride(dim) == 0


def _reduce(mask: torch.Tensor, dim: int) -> torch.Tensor:
    return mask.narrow(dim, 0, 1) if mask.shape[dim] != 1 else mask


def to_4d(mask: torch.Tensor, batch: int, sq: int) -> torch.Tensor:
    """SDPA broadcasting (left-pad with size-1 dims), except the diffusers form [B, S_kv] (2-D with the batch
    first and not the query length), which is a key-padding mask and becomes [B, 1, 1, S_kv]."""
    if mask.dim() == 2 and mask.shape[0] == batch and batch != sq:
        return mask[:, None, None, :]
    if mask.dim() > 4:
        raise ValueError(f"attn_mask must have at most 4 dims [B, H, S_q, S_kv], got shape {tuple(mask.shape)}")
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask


def prepare_mask(mask: torch.Tensor | None, *, batch: int, heads: int, sq_local: int, skv_local: int,
                 topo: Topology, segments: tuple[int, ...] | None = None) -> torch.Tensor | None:
    """The mask for what this rank computes: [Bm, Hm, Qm, Km] with Hm in (1, H/U), Qm in (1, U * sq_local)
    and Km in (1, world * skv_local) (the CP group's whole key sequence, in chunk order; with ``segments``, in
    `topology.seq_to_heads`'s segment order: each part of every chunk together)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise TypeError("attn_mask must be a bool or float torch.Tensor or None")
    mask = to_4d(mask, batch, sq_local)
    w, u = topo.world, topo.ulysses
    bm, hm, qm, km = mask.shape
    if bm not in (1, batch):
        raise ValueError(f"attn_mask batch dim {bm} is neither 1 nor the batch size {batch}")
    # a mask that is the same for every head (size 1 or an expanded stride-0 view) travels as one head
    if _constant(mask, 1):
        mask = _reduce(mask, 1)
    elif hm != heads:
        raise ValueError(f"attn_mask head dim {hm} is neither 1 nor the number of heads {heads}")

    # The gathers run before the head slice: every rank of a group must send the same heads.
    # queries: this rank computes, after Ulysses, the U local chunks of its Ulysses group
    if _constant(mask, 2):
        mask = _reduce(mask, 2)
    elif qm == sq_local:
        if u > 1:
            mask = all_gather(mask, 2, topo.ulysses_group)
    elif qm == sq_local * w:
        span = sq_local * u
        mask = mask[:, :, topo.ring_rank * span:(topo.ring_rank + 1) * span]
    else:
        raise ValueError(f"attn_mask query dim {qm} matches neither the local query length {sq_local} nor "
                         f"the global one {sq_local * w}")

    # keys: the whole CP group's key sequence
    if _constant(mask, 3):
        mask = _reduce(mask, 3)
    elif km == skv_local:
        mask = all_gather(mask, 3, topo.flat_group)
    elif km != skv_local * w:
        raise ValueError(f"attn_mask key dim {km} matches neither the local key length {skv_local} nor the "
                         f"global one {skv_local * w} (context parallelism over {w} ranks)")

    if segments is not None:  # the order of seq_to_heads(..., segments): the Ulysses group's queries, and
        for dim, chunks in ((2, u), (3, w)):  # every key (under Ring, as `_ring_one_call` orders them)
            if mask.shape[dim] > 1 and chunks > 1:
                mask = mask.index_select(dim, segment_order(chunks, segments, mask.device))
    # heads: a per-head mask is sliced to this rank's Ulysses heads
    if u > 1 and mask.shape[1] == heads:
        hl = heads // u
        mask = mask[:, topo.ulysses_rank * hl:(topo.ulysses_rank + 1) * hl]
    return mask


def ring_key_slice(mask: torch.Tensor | None, chunk: int, topo: Topology) -> torch.Tensor | None:
    """The part of a prepared mask that covers ring KV chunk ``chunk`` (ring super-chunk of U local chunks)."""
    if mask is None or mask.shape[3] == 1:
        return mask
    span = mask.shape[3] // topo.ring
    return mask[..., chunk * span:(chunk + 1) * span]
