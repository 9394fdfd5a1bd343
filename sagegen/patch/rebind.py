"""The compile path's routing: a copy of a diffusers processor's ``__call__`` whose globals answer
``F.scaled_dot_product_attention`` and ``dispatch_attention_fn`` with a patch session's routing.

Dynamo inlines such a copy as plain Python, so ``torch.ops.sagegen.sageattn`` lands in the graph; the
torch-function mode that eager calls use is fragile while dynamo traces (see `wrapper`).
"""

from __future__ import annotations

import inspect
import types

import torch.nn.functional as F


def rebind(original, session):
    """The original processor's ``__call__`` function re-created over a copy of its module's globals in which
    ``F`` (``torch.nn.functional``) answers ``scaled_dot_product_attention`` with ``session.route`` and
    ``dispatch_attention_fn`` routes diffusers' native backend the same way; None where the function names
    neither (the torch-function mode then routes it under compile too).

    Used only while dynamo traces: there the torch-function mode is fragile (torch 2.11 graph-breaks on Tensor
    methods implemented in Python, e.g. ``unflatten``, while a mode is active, and the code resumed after such
    a break ran plain SDPA). Calling through a substitute function is ordinary Python that dynamo inlines.
    The copy has no ``__name__``, so dynamo reads the globals from the copy rather than from the module.
    """
    fn = call_function(original)
    if fn is None:
        return None
    replacements = {}
    if fn.__globals__.get("F") is F:
        replacements["F"] = _routed_functional(session)
    dispatch = fn.__globals__.get("dispatch_attention_fn")
    if callable(dispatch):
        replacements["dispatch_attention_fn"] = _routed_dispatch(session, dispatch)
    return with_globals(fn, replacements) if replacements else None


def call_function(processor) -> types.FunctionType | None:
    """The plain function behind ``type(processor).__call__``, or None."""
    fn = inspect.getattr_static(type(processor), "__call__", None)
    fn = getattr(fn, "__func__", fn)
    return fn if isinstance(fn, types.FunctionType) else None


def equivalent_for(processor, stock: types.FunctionType, equivalent: types.FunctionType):
    """``equivalent`` where ``processor`` runs exactly ``stock`` as its ``__call__`` and both take the same
    parameters (a diffusers release that changed the stock signature gets its own code); else None."""
    if call_function(processor) is not stock:
        return None
    same = tuple(inspect.signature(stock).parameters) == tuple(inspect.signature(equivalent).parameters)
    return equivalent if same else None


def names_global(fn: types.FunctionType, name: str) -> bool:
    """Whether ``fn``'s code (or code nested in it) reads the global ``name``."""
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        if name in code.co_names:
            return True
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return False


def with_globals(fn: types.FunctionType, replacements: dict) -> types.FunctionType:
    """``fn`` re-created over a copy of its globals with ``replacements`` applied."""
    scope = dict(fn.__globals__)
    scope.update(replacements)
    scope.pop("__name__", None)
    new = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    return new


def _routed_functional(session) -> types.ModuleType:
    """A copy of the ``torch.nn.functional`` namespace whose SDPA is ``session.route``."""
    ns = types.ModuleType("torch.nn.functional")
    ns.__dict__.update(F.__dict__)

    def scaled_dot_product_attention(*args, **kwargs):
        return session.route(args, kwargs)

    ns.scaled_dot_product_attention = scaled_dot_product_attention
    return ns


def _routed_dispatch(session, dispatch):
    """``dispatch_attention_fn`` for a rebound processor: diffusers' native backend ([B, N, H, D] tensors,
    permuted to SDPA's [B, H, N, D], a [B, Nk] mask read as [B, 1, 1, Nk]) goes to ``session.route``;
    anything else (another backend, context parallelism, extra attention kwargs) to diffusers unchanged."""

    def dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                              enable_gqa=False, attention_kwargs=None, *, backend=None, parallel_config=None):
        if backend is None and parallel_config is None and not attention_kwargs and native_active():
            if (attn_mask is not None and attn_mask.ndim == 2 and attn_mask.shape[0] == query.shape[0]
                    and attn_mask.shape[1] == key.shape[1]):
                attn_mask = attn_mask[:, None, None, :]
            q, k, v = (t.permute(0, 2, 1, 3) for t in (query, key, value))
            out = session.route((q, k, v), dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                                scale=scale, enable_gqa=enable_gqa))
            return out.permute(0, 2, 1, 3)
        return dispatch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, attention_kwargs,
                        backend=backend, parallel_config=parallel_config)

    return dispatch_attention_fn


def native_active() -> bool:
    try:
        from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry
    except ImportError:
        return False
    name, _ = _AttentionBackendRegistry.get_active_backend()
    return name == AttentionBackendName.NATIVE
