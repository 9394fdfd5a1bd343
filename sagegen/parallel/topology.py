"""Where this rank sits in diffusers' context-parallel mesh, and the collectives sagegen's CP uses.

diffusers builds a device mesh of shape (ring_degree, ulysses_degree); the model's sequence is split into
world chunks over the flattened mesh, so global rank ``g = ring_rank * U + ulysses_rank`` holds sequence
chunk ``g``. After the Ulysses all-to-all (over the ulysses group of one ring rank), a rank holds the U
consecutive chunks ``ring_rank * U ... ring_rank * U + U - 1``: the ring's "super-chunk" ``ring_rank``.
Every index computed here follows from that layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


@dataclass(frozen=True)
class Topology:
    ulysses: int            # ulysses degree U
    ring: int               # ring degree R
    ulysses_rank: int
    ring_rank: int
    ulysses_group: object   # ProcessGroup (None when U == 1)
    ring_group: object      # ProcessGroup (None when R == 1)
    flat_group: object      # ProcessGroup over all U * R ranks, in sequence-chunk order

    @property
    def world(self) -> int:
        return self.ulysses * self.ring


def topology_from(parallel_config) -> Topology:
    """Read the CP topology from diffusers' ParallelConfig (or a ContextParallelConfig) after its setup()."""
    cp = getattr(parallel_config, "context_parallel_config", parallel_config)
    if cp is None or not hasattr(cp, "ulysses_degree"):
        raise TypeError("parallel_config must be diffusers' ParallelConfig with a context_parallel_config "
                        f"(or a ContextParallelConfig), got {type(parallel_config).__name__}")
    if getattr(cp, "_flattened_mesh", None) is None:
        raise RuntimeError("the ContextParallelConfig has no device mesh yet: call "
                           "transformer.enable_parallelism(config=...) before running the model")
    if getattr(cp, "ulysses_anything", False) or getattr(cp, "ring_anything", False):
        raise NotImplementedError(
            "sagegen's context parallelism supports ulysses_anything=False and ring_anything=False only: "
            "the sequence must split evenly over the ranks (and the heads over the Ulysses degree)")
    u, r = int(cp.ulysses_degree), int(cp.ring_degree)
    return Topology(
        ulysses=u, ring=r,
        ulysses_rank=int(cp._ulysses_local_rank), ring_rank=int(cp._ring_local_rank),
        ulysses_group=cp._ulysses_mesh.get_group() if u > 1 else None,
        ring_group=cp._ring_mesh.get_group() if r > 1 else None,
        flat_group=cp._flattened_mesh.get_group(),
    )


# all_gather_single replaces all_gather_tensor (deprecated) in newer torch
_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor


def _wait(t: torch.Tensor) -> torch.Tensor:
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def all_gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in group-rank order. Bool tensors travel as uint8
    (not every backend reduces or gathers bool)."""
    is_bool = x.dtype == torch.bool
    y = x.to(torch.uint8) if is_bool else x
    y = _wait(_gather(y.contiguous(), dim, group=group))
    return y.bool() if is_bool else y


def all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """all_to_all_single along dim 0 (split evenly over the group); flat, because some backends and
    Inductor want a 1-D contiguous buffer."""
    shape = x.shape
    y = _wait(funcol.all_to_all_single(x.contiguous().flatten(), None, None, group))
    return y.reshape(shape)


def seq_to_heads(x: torch.Tensor, topo: Topology, segments: tuple[int, ...] | None = None) -> torch.Tensor:
    """[B, S_local, H, D] -> [B, S_local * U, H / U, D]: this rank keeps its U-th of the heads (heads
    ``u * H/U ... (u+1) * H/U - 1``) for the sequence of its whole Ulysses group, in chunk order; with
    ``segments`` (lengths that split every local sequence, e.g. (video, text)), segment by segment: each
    segment of every chunk together ([video 0, video 1, ..., text 0, text 1, ...]), in the same one copy."""
    b, s, h, d = x.shape
    u = topo.ulysses
    x = x.reshape(b, s, u, h // u, d).permute(2, 1, 0, 3, 4)          # [U, S_l, B, H_l, D]
    x = all_to_all(x, topo.ulysses_group)                               # dim 0 now = source rank
    if segments is None:
        return x.flatten(0, 1).permute(1, 0, 2, 3).contiguous()         # [B, U * S_l, H_l, D]
    out = x.new_empty(b, u * s, h // u, d)
    start = offset = 0
    for n in segments:
        out[:, start:start + u * n].view(b, u, n, h // u, d).copy_(x[:, offset:offset + n].permute(2, 0, 1, 3, 4))
        start, offset = start + u * n, offset + n
    return out


def heads_to_seq(x: torch.Tensor, topo: Topology, segments: tuple[int, ...] | None = None) -> torch.Tensor:
    """Inverse of `seq_to_heads` (with the same ``segments``), for outputs [B, S, H_l, D] or lse [B, S, H_l]:
    back to the local sequence with every head."""
    u = topo.ulysses
    squeeze = x.dim() == 3
    if squeeze:
        x = x.unsqueeze(-1)
    b, s, hl, d = x.shape
    if segments is None:
        x = x.reshape(b, u, s // u, hl, d).permute(1, 3, 0, 2, 4)      # [U, H_l, B, S_l, D]
    else:
        y = x.new_empty(u, hl, b, s // u, d)
        start = offset = 0
        for n in segments:
            y[:, :, :, offset:offset + n] = x[:, start:start + u * n].reshape(b, u, n, hl, d).permute(1, 3, 0, 2, 4)
            start, offset = start + u * n, offset + n
        x = y
    x = all_to_all(x, topo.ulysses_group)                               # dim 0 now = source head group
    x = x.flatten(0, 1).permute(1, 2, 0, 3).contiguous()                # [B, S_l, H, D]
    return x.squeeze(-1) if squeeze else x


def segment_order(chunks: int, segments: tuple[int, ...], device=None) -> torch.Tensor:
    """The positions, in chunk order, of `seq_to_heads`'s segment order: a permutation of chunks * S_local."""
    s = sum(segments)
    starts = torch.tensor([0, *segments[:-1]]).cumsum(0).tolist()
    parts = [torch.arange(c * s + a, c * s + a + n) for a, n in zip(starts, segments) for c in range(chunks)]
    return torch.cat(parts).to(device)


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()
