"""The call counters a patched forward moves, for CUDA graphs (`sagegen.patch.graphs`).

A replay runs no Python, so the counters a forward moves (the session's attention stats, each FP8 layer's call
count) would stop at the capture: a run replayed as graphs reported no attention calls at all. The capture
records how far it moved them (`ForwardCounters.delta`), and each later replay adds that again.
"""

from __future__ import annotations

from collections import Counter

import torch

from sagegen.linear.module import FP8Linear


class CountDelta:
    """What one captured forward moved: stats keys -> n, and (an FP8 layer's count list, n) pairs."""

    __slots__ = ("stats", "lists")

    def __init__(self, stats: dict[str, int], lists: list[tuple[list, int]]):
        self.stats, self.lists = stats, lists

    def __bool__(self) -> bool:
        return bool(self.stats or self.lists)


class ForwardCounters:
    """The counters of one patched denoiser: ``stats`` (the patch session's Counter) and the call counts of
    the FP8 layers inside ``model`` (looked up at each snapshot: layers are swapped in and out by patching)."""

    def __init__(self, stats: Counter, model: torch.nn.Module):
        self.stats, self.model = stats, model

    def _lists(self) -> list[list]:
        return [m._fp8_calls for m in self.model.modules() if isinstance(m, FP8Linear)]

    def snapshot(self) -> tuple[dict[str, int], list[tuple[list, int]]]:
        return dict(self.stats), [(counts, counts[0]) for counts in self._lists()]

    def delta(self, before) -> CountDelta:
        """What moved since ``before`` (a `snapshot`)."""
        stats0, lists0 = before
        stats = {k: n - stats0.get(k, 0) for k, n in self.stats.items() if n != stats0.get(k, 0)}
        lists = [(counts, counts[0] - n0) for counts, n0 in lists0 if counts[0] != n0]
        return CountDelta(stats, lists)

    def restore(self, before) -> None:
        """Put every counter back to ``before`` (a `snapshot`)."""
        stats0, lists0 = before
        self.stats.clear()
        self.stats.update(stats0)
        for counts, n0 in lists0:
            counts[0] = n0

    def add(self, delta: CountDelta) -> None:
        for key, n in delta.stats.items():
            self.stats[key] += n
        for counts, n in delta.lists:
            counts[0] += n
