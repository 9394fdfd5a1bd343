"""`CachedLaunch`: launch a ``@triton.jit`` kernel again without Triton's per-call Python dispatch.

``kernel[grid](...)`` re-derives the specialization of every argument, builds a cache key string, checks the
kernel's globals and creates launch metadata for hooks on every call: ~25 us of host time on an H200's host
(bench/results/probe-fp8-overhead-h200-2026-11-26.txt). An eager image-model step with FP8 linears launches
hundreds of small kernels and is bound by that host time. `CachedLaunch` keeps the compiled kernel that
Triton chose, under a key of everything Triton specializes on, and calls its launcher directly next time:

- a tensor: its dtype and whether its address is a multiple of 16;
- an int: whether it is 1, whether it is a multiple of 16, and whether it needs 32, 64 signed or 64
  unsigned bits;
- a constexpr, float, bool, str or None: its value (a float's value only refines the key);
- the launch options (``num_warps``, ``enable_fp_fusion``, ...) and the current CUDA device.

The key is never coarser than Triton's own (a GPU test checks that equal keys get the kernel Triton picks).
A miss, a launch hook (a profiler such as proton), the interpreter or a Triton without the launcher this
was written against all take the ordinary ``kernel[grid](...)`` path. Nothing here knows diffusers.
"""

from __future__ import annotations

import torch
import triton

from .triton_quant import interpreting

_INT32 = (-(2 ** 31), 2 ** 31)
_INT64_MAX = 2 ** 63


def _version_ok() -> bool:
    # the launcher call below is that of CompiledKernel.__getitem__ / JITFunction.run in Triton 3.4 - 3.9
    try:
        major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    except ValueError:
        return False
    return (3, 4) <= (major, minor) <= (3, 9)


def _hooks_idle() -> bool:
    try:
        from triton import knobs
    except ImportError:
        return False
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return all(h is None or (hasattr(h, "calls") and not h.calls) for h in hooks)


def _arg_key(v):
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() % 16 == 0)
    if isinstance(v, bool) or v is None or isinstance(v, (float, str)):
        return v
    if isinstance(v, int):
        size = 0 if _INT32[0] <= v < _INT32[1] else (1 if v < _INT64_MAX else 2)
        return (v == 1, v % 16 == 0, size)
    raise TypeError(f"CachedLaunch: unsupported argument type {type(v).__name__}")


class CachedLaunch:
    """``CachedLaunch(kernel)(grid, *args, **kwargs)`` = ``kernel[grid](*args, **kwargs)`` (see the module doc).

    ``args`` are the kernel's leading parameters in order; ``kwargs`` name the others (constexprs included) and
    the launch options. Every parameter must be given."""

    def __init__(self, fn):
        self.fn = fn
        params = getattr(fn, "params", None)  # (the interpreter's InterpretedFunction has none)
        self.names = [p.name for p in params or ()]
        self.constexpr = [p.is_constexpr for p in params or ()]
        self.kernels: dict = {}
        self.enabled = params is not None and _version_ok()
        self.direct_launches = 0

    def _ordered(self, args: tuple, kwargs: dict) -> tuple[list, tuple]:
        values = list(args)
        for name in self.names[len(args):]:
            values.append(kwargs[name])  # KeyError: a parameter left out (Triton would fill a default)
        options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in self.names))
        return values, options

    def key(self, args: tuple, kwargs: dict):
        values, options = self._ordered(args, kwargs)
        spec = tuple(v if c else _arg_key(v) for v, c in zip(values, self.constexpr))
        return (torch.cuda.current_device(), spec, options), values

    def __call__(self, grid: tuple, *args, **kwargs):
        if not self.enabled or interpreting():
            return self.fn[grid](*args, **kwargs)
        key, values = self.key(args, kwargs)
        kernel = self.kernels.get(key)
        if kernel is None or not _hooks_idle():
            kernel = self.fn[grid](*args, **kwargs)
            self.kernels.setdefault(key, kernel)
            return kernel
        stream = torch._C._cuda_getCurrentRawStream(key[0])
        kernel.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                   kernel.function, kernel.packed_metadata, None, None, None, *values)
        self.direct_launches += 1
        return kernel
