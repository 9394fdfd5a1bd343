"""Attention-processor wrappers that route a processor's attention call to `sagegen.sageattn`.

How the routing works: each wrapped processor runs the *original* diffusers processor unchanged, inside a
`torch.overrides.TorchFunctionMode` that intercepts exactly one function, `F.scaled_dot_product_attention`,
and answers it with `sagegen.sageattn`. Every other torch call passes straight through. That one mechanism
covers both kinds of processor diffusers has:

* processors that call ``F.scaled_dot_product_attention`` themselves (CogVideoX, Mochi, SD3/SD3.5 joint and
  dual attention, HunyuanVideo's token refiner, and HunyuanVideo/Flux before diffusers 0.35), and
* processors that call ``diffusers.models.attention_dispatch.dispatch_attention_fn`` (HunyuanVideo and Flux
  from diffusers 0.35 on), whose default ``native`` backend ends in ``F.scaled_dot_product_attention``.

One exception, eager CogVideoX, Mochi, Flux and SD3: their processors run with the Q/K norms and rotary
embeddings fused into one Triton pass writing (joint) Q/K/V buffers (`route.call`; Mochi's per-sample loop
becomes one masked call), falling back to the mechanism above for anything they do not reproduce exactly.

Nothing module-global is replaced: torch-function modes are thread-local and live only for the duration of
one processor call, so text encoders, the VAE, other threads and other models never see the interception.
If a user picked a non-native diffusers attention backend (flash-attn, xformers, ...), the dispatcher does
not call SDPA; the wrapper notices that no call was routed and warns once.

An intercepted call goes to sageattn when it can (4-D HND tensors, a kernel head dim, no dropout, no autograd,
fp16/bf16 -- fp32 is cast to bf16 and back); otherwise it runs on SDPA unchanged and is counted as a fallback
with its reason (``patch_info(obj)["stats"]``). Masks are passed on as SDPA defines them (bool: True =
attend, or additive); a square padding mask is reduced to a per-key mask first (`simplify_mask`).
Under ``torch.compile`` (`torch.compiler.is_compiling()`, which dynamo reads as a constant while tracing) the
wrapper does not enter the mode: it calls a copy of the original processor's ``__call__`` whose globals answer
``F.scaled_dot_product_attention`` / ``dispatch_attention_fn`` with the same routing (`rebind.rebind`), which dynamo
inlines as plain Python, so ``torch.ops.sagegen.sageattn`` lands in the graph. That path has no Python side
effects: no counters, no warnings, no per-call state. Everything it
reads is settings that change only when the patch changes (config, backend, policy names), so dynamo's
guards hold from one call to the next: a compiled patched model compiles once per input shape, like the
stock one. (The diagnostic counters used to be incremented inside the traced code; dynamo then guarded on
their values, so every call failed a guard and recompiled the whole model -- 20 s a call for CogVideoX-5b
with inductor.) Consequences: calls run by compiled code are not counted in ``patch_info(...)["stats"]``,
and the square-padding-mask reduction (`simplify_mask`, which branches on tensor values) is skipped, so such
a mask reaches sageattn unreduced (same result: sageattn applies any boolean mask and gives zeros for rows
with no key).
"""

from __future__ import annotations

import inspect

import torch
from torch.overrides import TorchFunctionMode

from sagegen.linear.shared import sharing
from sagegen.patch.fusion import prologue as _fused_common
from sagegen.patch.fusion import route as _fused
from sagegen.patch.rebind import rebind
from sagegen.patch.session import _SDPA, PatchSession, _compiling


class _SdpaRouter(TorchFunctionMode):
    """Answers `F.scaled_dot_product_attention` with sageattn; every other torch call passes through."""

    def __init__(self, session: PatchSession):
        super().__init__()
        self.session = session
        self.seen = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:
            if not _compiling():
                self.seen += 1
            return self.session.route(args, kwargs)
        return func(*args, **kwargs)


# Families whose diffusers processor breaks dynamo's graph (Mochi: a data-dependent ``nonzero``): a break inside
# the re-bound function makes dynamo resume in the wrong globals (NameError on torch 2.11 with inductor, seen
# on an H200), so under compile their attention runs eagerly, routed as in eager mode, between graph breaks.
EAGER_UNDER_COMPILE = frozenset({"mochi"})


@torch.compiler.disable
def _eager_under_compile(processor, attn, args, kwargs):
    """The whole patched call, outside dynamo: it reads only the processor object here, so the traced caller
    guards on nothing that differs between layers (guards on each layer's name hit dynamo's recompile limit)."""
    session = processor._sage_session
    session.current_name = processor._sage_name
    if session.step_full_precision or processor._sage_full_precision:
        session.count("full_precision_calls")
        return processor._sage_original(attn, *args, **kwargs)
    out = _fused.call(processor, attn, args, kwargs)
    if out is not None:
        return out
    with _SdpaRouter(session):
        return processor._sage_original(attn, *args, **kwargs)


class SageProcessorBase:
    """Wraps one attention module's original processor. Created by `sagegen.patch`; see the module doc."""

    def __init__(self, original, name: str, session: PatchSession, backend_fns=None):
        object.__setattr__(self, "_sage_original", original)
        object.__setattr__(self, "_sage_name", name)
        object.__setattr__(self, "_sage_session", session)
        object.__setattr__(self, "_sage_full_precision", name in session.full_precision_names)
        object.__setattr__(self, "_sage_rebound", rebind(original, session))
        # the backend route (`dispatch_route`): (quantized, full-precision) copies of the processor's __call__
        object.__setattr__(self, "_sage_backend_fns", backend_fns)
        object.__setattr__(self, "_sage_dispatch_fns", None)  # built on the first call that dispatches to sagegen

    @property
    def original(self):
        return self._sage_original

    def _sage_call(self, attn, args, kwargs):
        session = self._sage_session
        compiling = _compiling()
        if compiling and session.family in EAGER_UNDER_COMPILE:
            return _eager_under_compile(self, attn, args, kwargs)
        if not compiling or session.sparse is not None:
            # Traced code reads no per-layer value unless a per-layer decision needs it (the sparse policy):
            # dynamo guards on what it reads, and diffusers' regional compilation, one graph for every block,
            # would recompile per layer and hit the recompile limit (a hard error with fullgraph=True).
            session.current_name = self._sage_name
        # a bool per layer (`set_full_precision`), not the name: at most two graphs under regional compilation
        full = session.step_full_precision or self._sage_full_precision
        backend_fns = self._sage_backend_fns
        if backend_fns is None and _fused_common.dispatches_to_sagegen(self._sage_original):
            # sagegen's diffusers backend chosen for the module, or diffusers' context parallelism (the attention
            # must go through its dispatcher, which splits it over the ranks): the fused call handles both;
            # anything else takes the backend route with this patch's settings
            backend_fns = self._dispatch_backend_fns()
            if backend_fns is not None and not full and not compiling:
                out = _fused.call(self, attn, args, kwargs)
                if out is not None:
                    return out
        if backend_fns is not None:  # diffusers' dispatcher, "sagegen" backend with this patch's settings
            session.count("full_precision_calls" if full else "processor_calls")  # as on the other routes
            return backend_fns[1 if full else 0](self._sage_original, attn, *args, **kwargs)
        if full:
            session.count("full_precision_calls")
            return self._sage_original(attn, *args, **kwargs)
        if compiling:
            # Traced by dynamo: no bookkeeping, and no torch-function mode where avoidable (see the module doc).
            rebound = self._sage_rebound
            if rebound is not None:
                return rebound(self._sage_original, attn, *args, **kwargs)
            with _SdpaRouter(session):
                return self._sage_original(attn, *args, **kwargs)
        out = _fused.call(self, attn, args, kwargs)
        if out is not None:
            return out
        router = _SdpaRouter(session)
        with router:
            out = self._sage_original(attn, *args, **kwargs)
        session.count("processor_calls")
        if router.seen == 0:
            session.count("unrouted_processor_calls")
            session.warn_once(
                f"sagegen: the attention processor of {self._sage_name!r} "
                f"({type(self._sage_original).__name__}) made no torch SDPA call, so its attention did not run "
                "on sagegen. Is a non-native diffusers attention backend selected (set_attention_backend or "
                "DIFFUSERS_ATTN_BACKEND)? Reset it to 'native' to route attention through sagegen.")
        return out

    def _dispatch_backend_fns(self):
        """The backend route's (quantized, full-precision) copies of the original's ``__call__``, for calls
        that go to diffusers' dispatcher (sagegen's backend, context parallelism); None where the processor does
        not dispatch or the backend cannot register."""
        if self._sage_dispatch_fns is None:
            from sagegen.patch import dispatch_route as _route

            member = _route.backend_member() if _route.dispatches(self._sage_original) else None
            fns = () if member is None else _route.rebind_pair(self._sage_original, self._sage_session, member)
            object.__setattr__(self, "_sage_dispatch_fns", fns)
        return self._sage_dispatch_fns or None

    def set_full_precision(self, names: frozenset[str]) -> None:
        """Whether this layer runs in full precision under the patch's policy (``names``: the kept layers)."""
        object.__setattr__(self, "_sage_full_precision", self._sage_name in names)

    # Reads fall through to the original processor (diffusers inspects e.g. `_attention_backend`), and writes
    # to attributes the original has go to it, so diffusers' own setters keep working while patched.
    def __getattr__(self, item):
        if item.startswith("_sage_"):
            raise AttributeError(item)
        return getattr(self._sage_original, item)

    def __setattr__(self, key, value):
        if not key.startswith("_sage_") and hasattr(self._sage_original, key):
            setattr(self._sage_original, key, value)
        else:
            object.__setattr__(self, key, value)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(wraps={type(self._sage_original).__name__}, module={self._sage_name!r}, "
                f"config={self._sage_session.config})")


class SageModuleProcessorBase(SageProcessorBase, torch.nn.Module):
    """The wrapper for processors that are `nn.Module`s (IP-Adapter): the original stays a registered submodule
    (as ``processor.wrapped``), so `.to()` and state dicts still see its weights while patched."""

    def __init__(self, original, name: str, session: PatchSession, backend_fns=None):
        torch.nn.Module.__init__(self)
        SageProcessorBase.__init__(self, original, name, session, backend_fns)
        torch.nn.Module.__setattr__(self, "wrapped", original)

    def __getattr__(self, item):
        try:
            return torch.nn.Module.__getattr__(self, item)
        except AttributeError:
            return SageProcessorBase.__getattr__(self, item)

    def __setattr__(self, key, value):
        if key.startswith("_sage_") or key in ("training",):
            object.__setattr__(self, key, value)
        else:
            SageProcessorBase.__setattr__(self, key, value)

    __repr__ = SageProcessorBase.__repr__


_CLASS_CACHE: dict[type, type] = {}


def wrapper_class(original_cls: type) -> type:
    """A wrapper class whose ``__call__`` has the original processor's signature.

    diffusers' attention modules filter the keyword arguments they pass on by
    ``inspect.signature(processor.__call__)`` (dropping e.g. ``image_rotary_emb`` if it is not there), so the
    wrapper must present the same parameters.
    """
    cls = _CLASS_CACHE.get(original_cls)
    if cls is not None:
        return cls
    base = SageModuleProcessorBase if issubclass(original_cls, torch.nn.Module) else SageProcessorBase

    def __call__(self, attn, *args, **kwargs):
        if torch.compiler.is_compiling():
            return self._sage_call(attn, args, kwargs)
        with sharing():  # FP8 projections of one input (Q, K, V) quantize it once (`sagegen.linear.shared`)
            return self._sage_call(attn, args, kwargs)

    try:
        __call__.__signature__ = inspect.signature(original_cls.__call__)
    except (TypeError, ValueError):
        pass
    cls = type(f"Sage{original_cls.__name__}", (base,), {"__call__": __call__, "__module__": __name__,
                                                         "__qualname__": f"Sage{original_cls.__name__}"})
    _CLASS_CACHE[original_cls] = cls
    return cls


def wrap(original, name: str, session: PatchSession, backend_fns=None):
    return wrapper_class(type(original))(original, name, session, backend_fns)


def is_wrapper(processor) -> bool:
    return isinstance(processor, SageProcessorBase)
