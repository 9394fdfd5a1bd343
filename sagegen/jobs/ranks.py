"""Several processes, one GPU each: `torchrun` / `accelerate launch` split the samples between them.

Both launchers set RANK, WORLD_SIZE and LOCAL_RANK (and MASTER_ADDR/MASTER_PORT). Each process takes every
WORLD_SIZE-th sample starting at its RANK, writes its samples into the shared run directory (sample folders
never collide and the manifest is merged under a file lock, see `sagegen.runs.directory`), and waits for the others
at the end on a gloo barrier (CPU-only, so it works with or without GPUs) before rank 0 prints the summary.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Sequence, TypeVar

T = TypeVar("T")
TIMEOUT_ENV = "SAGEGEN_DIST_TIMEOUT"  # seconds the barrier waits for the slowest process (default 24 h)


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str | None = None  # "torchrun" | "accelerate" | "env" | None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def to_dict(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "launcher": self.launcher}


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from e


def info() -> DistInfo:
    """This process's place among the launched processes (rank 0 of 1 when not launched)."""
    world = _int_env("WORLD_SIZE", 1)
    rank = _int_env("RANK", 0)
    local = _int_env("LOCAL_RANK", rank)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"inconsistent launcher environment: RANK={rank}, WORLD_SIZE={world}")
    launcher = None
    if world > 1 or "RANK" in os.environ:
        if any(k.startswith("ACCELERATE_") for k in os.environ):
            launcher = "accelerate"
        elif "TORCHELASTIC_RUN_ID" in os.environ or "TORCHELASTIC_RESTART_COUNT" in os.environ:
            launcher = "torchrun"
        else:
            launcher = "env"
    return DistInfo(rank=rank, world_size=world, local_rank=local, launcher=launcher)


def shard(items: Sequence[T], dist: DistInfo) -> list[T]:
    """This process's share: items rank, rank + world_size, ... (round robin keeps shares balanced)."""
    return list(items[dist.rank::dist.world_size])


def device_for(requested: str, dist: DistInfo):
    """The torch device to run on: ``auto`` is this process's GPU (cuda:LOCAL_RANK) or the CPU."""
    import torch

    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", dist.local_rank % max(1, torch.cuda.device_count()))
        return torch.device("cpu")
    dev = torch.device(requested)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device {requested}: no CUDA GPU is visible to PyTorch")
        if dev.index is None:
            dev = torch.device("cuda", dist.local_rank % torch.cuda.device_count())
    return dev


def init(dist: DistInfo, *, gpu_collectives: bool = False) -> bool:
    """Join the launched processes' gloo group (for the final barrier); with ``gpu_collectives`` (context
    parallelism on GPUs) NCCL carries the CUDA tensors and gloo the CPU ones. Returns True when one is joined."""
    if not dist.enabled:
        return False
    import torch.distributed as td

    if td.is_available() and not td.is_initialized():
        timeout = datetime.timedelta(seconds=_int_env(TIMEOUT_ENV, 24 * 3600))
        backend = "cpu:gloo,cuda:nccl" if gpu_collectives else "cpu:gloo"
        td.init_process_group(backend, rank=dist.rank, world_size=dist.world_size, timeout=timeout)
    elif gpu_collectives and td.is_initialized() and "cuda" not in _device_backends(td):
        raise RuntimeError("context parallelism on GPUs needs a process group with NCCL for CUDA tensors, but one "
                           f"without it is already initialized ({td.get_backend()}); initialize it with "
                           "'cpu:gloo,cuda:nccl' (or nccl), or let sagegen initialize it")
    return td.is_initialized()


def _device_backends(td) -> set[str]:
    """The device types the default group has a backend for ('cpu', 'cuda'), from what torch exposes."""
    try:
        types = getattr(td.distributed_c10d._get_default_group(), "_device_types", None)
        if types is not None:
            return {str(t.type if hasattr(t, "type") else t) for t in types}
        return {"cpu", "cuda"} if "nccl" in str(td.get_backend()) else {"cpu"}
    except Exception:  # noqa: BLE001 - a private API: unknown means "no CUDA backend known"
        return {"cpu"}


def barrier(dist: DistInfo) -> None:
    if not dist.enabled:
        return
    import torch.distributed as td

    if td.is_available() and td.is_initialized():
        td.barrier()


def shutdown(dist: DistInfo, *, wait_for_peers: bool = True) -> None:
    """Tear the process group down; after a clean run every rank first waits for the others (``wait_for_peers``;
    not after an error, where a peer may never arrive)."""
    if not dist.enabled:
        return
    import torch.distributed as td

    if td.is_available() and td.is_initialized():
        try:
            if wait_for_peers:
                td.barrier()  # no rank tears down while a peer still works (gloo can abort on that)
        finally:
            if not wait_for_peers and "cuda" in _device_backends(td):
                _abort(td)
            else:
                td.destroy_process_group()


def _abort(td) -> None:
    """After an error under NCCL: a peer may sit in a collective this rank will never join, and destroying the
    group waits for it forever (seen on 2 H200s: rank 0 failed saving a sample, rank 1 was in the next
    denoising step). Abort the communicators instead; this rank then exits with its error and torchrun ends
    the peers."""
    abort = getattr(td.distributed_c10d, "_abort_process_group", None)
    if abort is None:
        return  # older torch: leave the group to the process's exit
    try:
        abort()
    except Exception:  # noqa: BLE001 - the error being reported matters more than the teardown
        pass
