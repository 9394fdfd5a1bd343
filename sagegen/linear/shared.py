"""One FP8 copy per activation for the projections that read the same tensor.

Attention processors project one hidden state three times (Q, K and V; joint attention does it for the text
too), and each `FP8Linear` would quantize it again: the same values, one Triton launch and one read of the
activation each. Inside a `sharing()` scope (`sagegen.patch` opens one around each eager attention-processor
call) `SharedActivations` keeps the last plain quantization (no column scale, no GELU prologue) with the
tensor it came from, and the next projection of that same tensor takes it. The scope is what makes this
sound under ``torch.inference_mode``, whose tensors have no version counter: a processor projects its inputs
without changing them in place, and the cache is emptied when the scope ends.

The match is on the tensor itself, not on an address: the entry holds a weak reference to the root tensor of
the input's views (``x._base``, which stays the same object across the processor's reshapes), plus the view's
address, shape, strides, dtype and version counter (so an in-place change in between is a miss). When that
root tensor is freed the entry is dropped (a weakref callback), so the FP8 copy never outlives its source and
a new tensor at a reused address can never match. Eager only: `FP8Linear` skips it under torch.compile.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch


def _root(x: torch.Tensor) -> torch.Tensor:
    return x._base if x._base is not None else x


def _key(x: torch.Tensor, granularity: str, emulate: bool) -> tuple:
    version = None if x.is_inference() else x._version  # (inference tensors track no version)
    return (x.data_ptr(), x.device, tuple(x.shape), x.stride(), x.dtype, version, granularity, emulate)


class SharedActivations:
    """The last plain activation quantization of this thread (see the module doc)."""

    def __init__(self):
        self._entry = None  # (weakref to the root tensor, key, (x_fp8, scales))
        self.hits = 0

    def get(self, x: torch.Tensor, granularity: str, emulate: bool):
        entry = self._entry
        if entry is not None and entry[0]() is _root(x) and entry[1] == _key(x, granularity, emulate):
            self.hits += 1
            return entry[2]
        return None

    def put(self, x: torch.Tensor, granularity: str, emulate: bool, value) -> None:
        self._entry = (weakref.ref(_root(x), self._dropped), _key(x, granularity, emulate), value)

    def clear(self) -> None:
        self._entry = None

    def _dropped(self, ref) -> None:
        entry = self._entry
        if entry is not None and entry[0] is ref:
            self._entry = None


_LOCAL = threading.local()


def shared() -> SharedActivations | None:
    """This thread's cache inside a `sharing()` scope; None outside one (every call quantizes)."""
    if not getattr(_LOCAL, "depth", 0):
        return None
    cache = getattr(_LOCAL, "cache", None)
    if cache is None:
        cache = _LOCAL.cache = SharedActivations()
    return cache


@contextlib.contextmanager
def sharing():
    """A scope in which FP8 projections of one unchanged tensor share its quantization (nests; the cache is
    emptied when the outermost scope ends)."""
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    try:
        yield
    finally:
        _LOCAL.depth -= 1
        if not _LOCAL.depth and getattr(_LOCAL, "cache", None) is not None:
            _LOCAL.cache.clear()
