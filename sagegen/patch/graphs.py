"""CUDA graphs for a denoiser's forward: ``sagegen.patch(pipe, cuda_graphs=True)``.

Why: an eager step at ~4k tokens (Flux, SD3.5 at 1024²) is bound by the host. Every FP8 linear adds two
launches (quantization, GEMM), and the GPU waits for Python (lab/NOTES.md v5.0: a Flux FP8 step took
104 ms of GPU time and 126-197 ms of wall time). Replaying the whole forward as one CUDA graph takes those
launches off the host without `torch.compile`'s compile time.

How: the module's ``forward`` is replaced (an instance attribute; `disable` deletes it) by a `GraphedForward`.
Each call gets a key made of everything that decides what the forward launches:
- the pytree structure of its arguments, each tensor's shape, dtype, strides and device, every other leaf's value;
- grad and inference mode, ``module.training``;
- ``state_fn()``: Python-side state read inside the forward (sagegen's step policies, attention overrides).
The storage addresses of the module's parameters and buffers are checked on every call; when they change
(the model was moved, offloaded, re-patched) every graph is dropped.

The first call with a new key runs eagerly: it warms up (Triton compiles, FP8 layers calibrate, cuBLAS picks
its kernels). The second captures a graph and replays it; later calls copy their tensors into the graph's
inputs and replay. Outputs are cloned, since the next replay overwrites the graph's own.
These calls run eagerly instead (counted in `info`): calls while a step cache is on the module (a diffusers hook
other than the stateless ones in `GRAPH_SAFE_HOOKS`, or a cache-dit module: its Python decides per step what
runs, and a replay would repeat the captured step's choice), calls under ``torch.compile`` tracing, with autograd
recording, with CPU tensors among the arguments (their values would be baked into the graph), with arguments
other than tensors, numbers, strings, dtypes, devices and enums (nested in lists, tuples, dicts), keys past
``max_graphs``, and keys whose capture failed (e.g. a host sync such as ``.item()`` in the forward; warned
once, with the reason). A small host tensor the forward itself copies to the GPU (Qwen-Image's text length)
is captured as a constant (`host_constants`).

Costs: each graph keeps a private memory pool the size of the forward's activations.
Counters: a replay runs no Python, so the counters the forward moves (given as ``counters``: `patch_info`
stats, FP8 call counts) would stop at the capture. What the capture moved them by is added again at each later
replay (the capture's own pass counts for the replay that follows it).
"""

from __future__ import annotations

import enum
import warnings
from collections import Counter
from typing import TYPE_CHECKING, Callable

import torch
from torch.utils import _pytree as pytree

from sagegen.kernels.spec import capturing, value_checks_allowed  # noqa: F401 (read here by the patcher)
from sagegen.patch.host_constants import HostConstants

if TYPE_CHECKING:
    from sagegen.patch.graph_counts import ForwardCounters

_ATTR = "_sagegen_graphs"
# non-tensor arguments keyed by value (anything else makes the call eager)
_VALUE_TYPES = (bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.memory_format, enum.Enum)
# diffusers hooks that change nothing from one call to the next (casting, context parallelism's splits):
# graphs replay through them. Any other hook (FirstBlockCache, TaylorSeer, MagCache, PAB, FasterCache, SeaCache,
# sagegen's schedule recorder, hooks not known here) makes the call eager: "step_cache".
GRAPH_SAFE_HOOKS = ("layerwise_casting", "peft_autocast_disable")
GRAPH_SAFE_HOOK_PREFIXES = ("cp_input---", "cp_output---")
# the counters of the capture under way (a seam: the CPU stand-in of `capture` re-runs Python at each replay,
# which a real replay does not, and puts these counters back afterwards)
capture_counters: ForwardCounters | None = None


def on_gpu(t: torch.Tensor) -> bool:
    """Whether ``t`` lives where graphs are captured (a seam: CPU tests replace it, with `capture`)."""
    return t.is_cuda


def capture(fn: Callable[[], object]):
    """Capture ``fn()`` into a CUDA graph -> (graph, its output). The graph gets its own memory pool;
    ``thread_local``: other threads' CUDA calls do not invalidate it. Small host values the forward copies to
    the GPU become constants of the graph (`host_constants`)."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"), HostConstants():
            output = fn()
    except BaseException:
        _end_generator_capture()
        raise
    return graph, output


def _end_generator_capture() -> None:
    """After a failed capture the device's random generator is left in capture mode (torch ends that mode only
    when a capture succeeds), and every random op after it fails ("Offset increment outside graph capture
    encountered unexpectedly", seen on an H100 with torch 2.11). A capture of nothing ends it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the CUDA graph is empty"
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                pass
        except Exception:  # noqa: BLE001 - best effort; the original failure is what gets reported
            pass


class _Graph:
    __slots__ = ("graph", "tensor_positions", "static_leaves", "output", "counts")

    def __init__(self, graph, tensor_positions, static_leaves, output, counts=None):
        self.graph, self.tensor_positions = graph, tensor_positions
        self.static_leaves, self.output = static_leaves, output
        self.counts = counts  # what the capture moved the counters by (a `CountDelta`), or None


class GraphedForward:
    """A module's forward answered by CUDA graph replays (see the module doc)."""

    def __init__(self, module: torch.nn.Module, forward: Callable, state_fn: Callable[[], object] | None = None,
                 max_graphs: int = 4, counters: ForwardCounters | None = None):
        if not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"max_graphs must be a positive int, got {max_graphs!r}")
        self.forward = forward
        self.module_type = type(module).__name__
        self._tensors = lambda: [*module.parameters(), *module.buffers()]
        self._step_cache = lambda: step_cache_on(module)
        self._training = lambda: module.training
        self.state_fn = state_fn
        self.max_graphs = max_graphs
        self.counters = counters
        self.graphs: dict = {}
        self.seen: set = set()       # keys that ran their eager warm-up call
        self.failed: dict = {}       # key -> why its capture failed
        self.stats: Counter = Counter()
        self._storage = None

    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return self.forward(*args, **kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        why = self._eager_reason(leaves)
        if why is not None:
            self.stats[f"eager:{why}"] += 1
            return self.forward(*args, **kwargs)
        key = self._key(leaves, spec)
        if isinstance(key, str):
            self.stats[f"eager:{key}"] += 1
            return self.forward(*args, **kwargs)
        entry = self.graphs.get(key)
        if entry is None:
            if key in self.failed:
                self.stats["eager:capture_failed"] += 1
                return self.forward(*args, **kwargs)
            if key not in self.seen:
                if len(self.seen) >= self.max_graphs:
                    self.stats["eager:max_graphs"] += 1
                    return self.forward(*args, **kwargs)
                self.seen.add(key)
                self.stats["warmup"] += 1
                return self.forward(*args, **kwargs)
            entry = self._capture(key, leaves, spec)
            if entry is None:
                return self.forward(*args, **kwargs)
            return self._replay(entry, leaves, counted=True)  # the capture's pass counted this call
        return self._replay(entry, leaves)

    # -- keys -------------------------------------------------------------------------------------------------
    def _eager_reason(self, leaves) -> str | None:
        tensors = self._tensors()
        if not tensors or not on_gpu(tensors[0]):
            return "not_cuda"
        storage = tuple(t.data_ptr() for t in tensors)
        if storage != self._storage:  # moved, offloaded or re-patched: the graphs read the old addresses
            self.drop()
            self._storage = storage
        if torch.is_grad_enabled() and (any(t.requires_grad for t in tensors) or
                                        any(isinstance(x, torch.Tensor) and x.requires_grad for x in leaves)):
            return "autograd"
        if any(isinstance(x, torch.Tensor) and not on_gpu(x) for x in leaves):
            return "cpu_tensor_argument"
        if self._step_cache() is not None:
            return "step_cache"
        return None

    def _key(self, leaves, spec):
        """The call's key, or a str saying why it cannot have one (an argument of a type whose value is not
        known to be what its hash says: keying it by identity could replay another object's baked-in value)."""
        parts = []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                parts.append((tuple(x.shape), x.dtype, x.stride(), x.device))
            elif x is None or isinstance(x, _VALUE_TYPES):
                parts.append((type(x), x))
            else:
                return f"argument_type:{type(x).__name__}"
        state = self.state_fn() if self.state_fn is not None else None
        return (spec, tuple(parts), torch.is_inference_mode_enabled(), self._training(), state)

    # -- capture and replay -----------------------------------------------------------------------------------
    def _capture(self, key, leaves, spec) -> _Graph | None:
        positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        static = list(leaves)
        for i in positions:
            static[i] = torch.empty_like(leaves[i]).copy_(leaves[i])  # strides kept where dense (else contiguous)
        args, kwargs = pytree.tree_unflatten(static, spec)
        global capture_counters
        before = self.counters.snapshot() if self.counters is not None else None
        capture_counters = self.counters
        try:
            graph, output = capture(lambda: self.forward(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - anything the forward cannot do under capture: eager from now on
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            self.failed[key] = reason
            self.stats["capture_failed"] += 1
            if before is not None:  # the call runs eagerly next and counts itself
                self.counters.restore(before)
            warnings.warn(f"sagegen cuda_graphs: {self.module_type}.forward could not be captured ({reason}); "
                          "these calls run eagerly", RuntimeWarning, stacklevel=3)
            return None
        finally:
            capture_counters = None
        out_leaves = pytree.tree_leaves(output)
        if any(isinstance(t, torch.Tensor) and not on_gpu(t) for t in out_leaves):
            self.failed[key] = "the forward returned a CPU tensor"
            self.stats["capture_failed"] += 1
            if before is not None:
                self.counters.restore(before)
            return None
        counts = self.counters.delta(before) if self.counters is not None else None
        entry = _Graph(graph, positions, static, output, counts or None)
        self.graphs[key] = entry
        self.stats["captured"] += 1
        return entry

    def _replay(self, entry: _Graph, leaves, counted: bool = False):
        for i in entry.tensor_positions:
            entry.static_leaves[i].copy_(leaves[i])
        entry.graph.replay()
        if entry.counts is not None and not counted:
            self.counters.add(entry.counts)
        self.stats["replayed"] += 1
        return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, entry.output)

    def drop(self) -> None:
        """Forget every graph (their memory pools are freed once nothing else holds them)."""
        self.graphs.clear()
        self.seen.clear()
        self.failed.clear()

    def info(self) -> dict:
        """Graph count, why each failed capture failed (a list, one per call key), call counts: JSON-ready."""
        return {"graphs": len(self.graphs), "failed": list(self.failed.values()), "calls": dict(self.stats)}


def step_cache_on(module: torch.nn.Module) -> str | None:
    """The first hook or module under ``module`` that decides per call what the forward runs (a step cache),
    as "module path: hook name"; None when graphs may replay it."""
    if module.__dict__.get("_is_cached"):  # cache-dit's mark on a transformer whose forward it wrapped
        return "<root>: cache-dit"
    for path, m in module.named_modules():
        if type(m).__module__.startswith("cache_dit"):
            return f"{path or '<root>'}: {type(m).__name__} (cache-dit)"
        registry = m.__dict__.get("_diffusers_hook")
        for name in getattr(registry, "hooks", {}) if registry is not None else ():
            if name not in GRAPH_SAFE_HOOKS and not name.startswith(GRAPH_SAFE_HOOK_PREFIXES):
                return f"{path or '<root>'}: {name}"
    return None


def enable(module: torch.nn.Module, state_fn: Callable[[], object] | None = None, max_graphs: int = 4,
           counters: ForwardCounters | None = None) -> GraphedForward:
    """Answer ``module``'s forward with CUDA graph replays (see the module doc). ``counters``: what the forward
    counts, advanced at each replay as the capture advanced them. Enabling again replaces the previous wrapper
    (its graphs are dropped)."""
    disable(module)
    graphed = GraphedForward(module, module.forward, state_fn, max_graphs, counters)
    object.__setattr__(module, "forward", graphed)
    object.__setattr__(module, _ATTR, graphed)
    return graphed


def disable(module: torch.nn.Module) -> None:
    """Undo `enable`: the class's forward (or whatever forward was set before) answers again."""
    graphed = module.__dict__.get(_ATTR)
    if graphed is None:
        return
    graphed.drop()
    if module.__dict__.get("forward") is graphed:
        if getattr(graphed.forward, "__self__", None) is module and graphed.forward.__func__ is type(module).forward:
            object.__delattr__(module, "forward")
        else:
            object.__setattr__(module, "forward", graphed.forward)
    object.__delattr__(module, _ATTR)


def info(module: torch.nn.Module) -> dict | None:
    """The wrapper's graph count, failed captures and call counts; None when not enabled."""
    graphed = module.__dict__.get(_ATTR)
    return graphed.info() if graphed is not None else None
