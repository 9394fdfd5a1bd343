"""The patcher's *backend route*: attention modules whose processor calls diffusers' ``dispatch_attention_fn``
run diffusers' ``"sagegen"`` backend, configured per patched transformer.

Per module, never through diffusers' process-global default: `patch` sets the original processor's
``_attention_backend`` to the ``"sagegen"`` member (remembering the old value for `unpatch`), and the wrapper
calls a copy of the processor's ``__call__`` whose ``dispatch_attention_fn`` adds this patch's
`BackendSettings` (config, kernel backend, fp32 dtype, full precision or not, the patch's counters) to the
call's ``attention_kwargs``. diffusers' own dispatcher then runs as usual (checks, context parallelism) and
hands the settings to `diffusers_backend.sagegen_attention` as the keyword ``_sagegen_settings``. A copy with a
closure, rather than state set around the call, keeps the route stateless, so ``torch.compile`` traces it in
one graph; a `PrecisionPolicy` picks between two such copies (quantized, full precision) per call.

Where sagegen has an equivalent of a processor's ``__call__`` that spares the backend work, the copy is made of
that instead (`call_for`): HunyuanVideo-1.5's main blocks hand over a key mask [B, 1, 1, S] rather than the
[B, 1, S, S] mask the stock processor builds on every call (`hunyuanvideo15`); Qwen-Image's joint attention
and LTX-Video's attention get their Q/K norms and rotary embeddings fused (`qwenimage`, `ltx`), falling back to
the routed stock call (``_STOCK_CALL`` in the copy's globals). The processor object itself is never replaced:
the copy runs with it as ``self``.
"""

from __future__ import annotations


from sagegen.backend.attention import BackendSettings
from sagegen.patch import family_table
from sagegen.patch.rebind import call_function, names_global, with_globals

DISPATCH = "dispatch_attention_fn"


def dispatches(processor) -> bool:
    """Whether the processor's ``__call__`` calls diffusers' ``dispatch_attention_fn`` and carries a per-module
    backend (``_attention_backend``), i.e. can take the backend route."""
    fn = call_function(processor)
    return (fn is not None and hasattr(processor, "_attention_backend") and names_global(fn, DISPATCH)
            and callable(fn.__globals__.get(DISPATCH)))


def backend_member():
    """diffusers' ``"sagegen"`` backend member, registering it if needed; None where this diffusers cannot
    register it (the patch then takes the SDPA route for these modules)."""
    from sagegen.backend.registry import DiffusersBackendUnavailable, register_diffusers_backend

    try:
        return register_diffusers_backend()
    except (DiffusersBackendUnavailable, ImportError):
        return None


def call_for(processor):
    """The function whose copy the backend route runs for ``processor``: sagegen's equivalent where it has
    one, else the processor's own ``__call__``."""
    fn = call_function(processor)
    equivalent_for = family_table.dispatch_call_for(getattr(fn, "__qualname__", None))
    if equivalent_for is not None:  # a family's equivalent (its module, and diffusers' model module, load now)
        return equivalent_for(processor) or fn
    return fn


def settings_for(session, full_precision: bool) -> BackendSettings:
    return BackendSettings(config=session.config, backend=session.backend, fp32_dtype=session.fp32_dtype,
                           full_precision=full_precision, stats=session.stats)


def rebind_pair(original, session, member) -> tuple:
    """(quantized, full-precision) `rebind_backend` copies: what a wrapper picks from per call by its policy."""
    return tuple(rebind_backend(original, session, member, full) for full in (False, True))


def rebind_backend(original, session, member, full_precision: bool):
    """A copy of the processor's ``__call__`` (`call_for`) whose dispatcher calls run the ``"sagegen"`` backend
    with the session's settings (read per call, so a re-patch with another config takes effect)."""
    fn, stock = call_for(original), call_function(original)
    dispatch = fn.__globals__[DISPATCH]
    attr = "backend_settings_full" if full_precision else "backend_settings"

    def dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                              enable_gqa=False, attention_kwargs=None, *, backend=None, parallel_config=None):
        # A backend chosen for this module after patching (set_attention_backend("flash")) is left alone.
        if backend is None or backend == member:
            override = session.attention_override
            if override is not None and parallel_config is None and not full_precision:
                return _overridden(session, override, query, key, value, attn_mask, is_causal, scale)
            if session.sparse is not None and parallel_config is None and not full_precision:
                return _sparse(session, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            settings = getattr(session, attr)
            if parallel_config is not None and not full_precision:
                # split by diffusers' context parallelism: a joint call's segments (HunyuanVideo-1.5's) give
                # one process's token order under Ulysses
                from sagegen.patch.sparse_policy import split_settings

                settings = split_settings(session, settings, ordered="_sagegen_segments" in (attention_kwargs or {}))
            attention_kwargs = {**(attention_kwargs or {}), "_sagegen_settings": settings}
            backend = member
        return dispatch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, attention_kwargs,
                        backend=backend, parallel_config=parallel_config)

    replacements = {DISPATCH: dispatch_attention_fn}
    if fn is not stock:  # sagegen's equivalent may step aside to the routed stock call; it reads the session
        replacements["_STOCK_CALL"] = with_globals(stock, {DISPATCH: dispatch_attention_fn})
        replacements["_SAGEGEN_SESSION"] = None if full_precision else session
    return with_globals(fn, replacements)


def _sparse(session, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """``sparse=`` on the backend route: the call takes the SDPA route's path (the sparse policy's block mask,
    its fallbacks and counts) on [B, H, N, D] views, as a processor that calls SDPA would."""
    from sagegen.backend.attention import key_padding_4d

    attn_mask = key_padding_4d(attn_mask, query, key)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out = session.route((q, k, v), dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=bool(is_causal),
                                        scale=scale, enable_gqa=enable_gqa))
    return out.transpose(1, 2)


def _overridden(session, override, query, key, value, attn_mask, is_causal, scale):
    """`set_attention_override` on the backend route: the override takes [B, H, N, D] tensors."""
    from sagegen.backend.attention import key_padding_4d

    session.count("overridden")
    attn_mask = key_padding_4d(attn_mask, query, key)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out = override(q, k, v, attn_mask, bool(is_causal), scale)
    return out.transpose(1, 2).to(query.dtype)
