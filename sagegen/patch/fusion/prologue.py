"""What the fused prologues of `fused` (CogVideoX, Mochi) and `joint` (SD3/SD3.5, Flux, HunyuanVideo)
share: argument binding, the checks that decide whether a fused call may run, and the joint-buffer attention
call. A module of its own so that neither family module imports the other."""

from __future__ import annotations

import functools
import importlib
import inspect
import types

import torch

from sagegen.api import triton_interpret
from sagegen.linear.stacked import stacked_forward
from sagegen.patch.fp8_handoff import attention as fp8_attention
from sagegen.patch.rebind import native_active

_HALF = (torch.float16, torch.bfloat16)


def diffusers_class(module: str, name: str):
    """diffusers' class ``name`` in ``module``; None if this diffusers lacks it."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def forward_subclass(cls: type, fused, marker: str, cache: dict, module: str) -> type:
    """A subclass of ``cls`` whose forward is ``fused(self, stock_forward, *args, **kwargs)``, made once per class
    (``cache``), flagged by the class attribute ``marker`` and placed in ``module``. It keeps ``cls``'s name, so
    class-name lookups (no-split modules, hooks) still match; swapping an instance's class (not its
    ``forward``) keeps diffusers' hooks working."""
    sub = cache.get(cls)
    if sub is None:
        stock = cls.forward

        def forward(self, *args, **kwargs):
            # a closure over the stock function: dynamo inlines it (it cannot trace ``type.forward`` lookups)
            return fused(self, stock, *args, **kwargs)

        try:  # the stock parameters for whoever inspects the class (diffusers' context-parallel hooks find an
            # argument's position by it: a block patched before enable_parallelism raised "not found")
            forward.__signature__ = inspect.signature(stock)
        except (TypeError, ValueError):
            pass

        sub = type(cls.__name__, (cls,), {"forward": forward, "__module__": module, marker: True,
                                          "__qualname__": cls.__qualname__})
        _share_block_metadata(cls, sub)
        cache[cls] = sub
    return sub


def _share_block_metadata(base: type, sub: type) -> None:
    """Give ``sub`` the entry ``base`` has in diffusers' ``TransformerBlockRegistry``: diffusers' cache hooks
    (FirstBlockCache, MagCache, ...) look a block up by its exact class, and refused the fused subclass ("not
    registered"). The entry is ``base``'s own object (its ``_cls`` stays ``base``: diffusers reads the forward's
    signature from it, and the subclass's forward takes ``*args``). Private diffusers API: skipped where absent."""
    try:
        from diffusers.hooks._helpers import TransformerBlockRegistry
    except ImportError:
        return
    registry = getattr(TransformerBlockRegistry, "_registry", None)
    if not isinstance(registry, dict):
        return
    try:
        metadata = TransformerBlockRegistry.get(base)
    except (ValueError, KeyError):
        return
    registry[sub] = metadata


def swap_class(module: torch.nn.Module, cls: type) -> None:
    """Set ``module``'s class to ``cls`` (a `forward_subclass` of it, or back to its base). A hook installed
    before the swap holds the bound ``forward`` of the class it saw, so the block would keep that forward
    whatever its class: diffusers' hooks (enable_parallelism's splits, sagegen's CP mask hooks; the innermost
    reference of its ``HookRegistry`` is ``_fn_refs[0]``) and accelerate's (``_old_forward``). Such a
    reference is re-pointed at ``cls``'s forward. (Private attributes of both libraries: re-pointed only where
    found in that form.)"""
    old = type(module)
    module.__class__ = cls
    refs = getattr(getattr(module, "_diffusers_hook", None), "_fn_refs", None) or []
    holders = [(refs[0], "original_forward"), (refs[0], "forward")] if refs else []
    holders.append((module, "_old_forward"))
    for holder, attr in holders:
        bound = getattr(holder, attr, None)
        if getattr(bound, "__self__", None) is module and getattr(bound, "__func__", None) is old.forward:
            setattr(holder, attr, types.MethodType(cls.forward, module))


def _arguments(original, cls_path: str, attn, args, kwargs):
    """The call's arguments by name when ``original`` is exactly diffusers' class ``cls_path`` (whose code
    path the fused call mirrors; a subclass may differ); None otherwise. Only arguments the call passed are
    there (as ``inspect.BoundArguments.arguments``: no defaults)."""
    cls = _diffusers_class(cls_path)
    if cls is None or type(original) is not cls:
        return None
    signature, names, required = _call_signature(cls)
    if names is None:  # *args or **kwargs in the signature: inspect binds it
        try:
            return signature.bind(original, attn, *args, **kwargs).arguments
        except TypeError:
            return None
    # Plain parameters: the binding by hand, ~10x cheaper than Signature.bind (an attention call's host time
    # counts: eager image steps wait on the host); the same answers, TypeError cases included (None)
    if len(args) + 2 > len(names):
        return None
    bound = dict(zip(names, (original, attn, *args)))
    for key, value in kwargs.items():
        if key in bound or key not in names:
            return None
        bound[key] = value
    return bound if required.issubset(bound) else None


@functools.cache
def _diffusers_class(cls_path: str) -> type | None:
    module, _, name = cls_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


@functools.cache
def _call_signature(cls: type) -> tuple[inspect.Signature, tuple[str, ...] | None, frozenset[str]]:
    """``cls.__call__``'s signature; its parameter names and the required ones, or (None, ...) where it takes
    *args or **kwargs. Once per class: inspect.signature on every attention call was ~2% of an eager Flux
    step's host time on a slow host (bench/results/archive/probe-host-profile-flux-h200-2026-11-26.json)."""
    signature = inspect.signature(cls.__call__)
    params = signature.parameters.values()
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return signature, None, frozenset()
    return (signature, tuple(p.name for p in params),
            frozenset(p.name for p in params if p.default is inspect.Parameter.empty))


def _native_dispatch(original) -> bool:
    """Whether the fused call routes the attention itself: a processor that calls diffusers'
    ``dispatch_attention_fn`` would run the native (SDPA) backend or sagegen's own (the patch's settings then
    take over), without context parallelism. With another backend chosen, the fused call steps aside."""
    if getattr(original, "_parallel_config", None) is not None:
        return False
    backend = getattr(original, "_attention_backend", None)
    if backend is None:
        return native_active() or _is_sagegen(_active_backend())
    return _is_sagegen(backend)


def dispatches_to_sagegen(original) -> bool:
    """Whether the processor's attention goes to diffusers' dispatcher with sagegen's backend (its own or the
    process-wide default), or under context parallelism: then the patch runs it on the backend route with its
    settings (`processors.SageProcessorBase`), not through torch SDPA."""
    if getattr(original, "_parallel_config", None) is not None:
        return True
    backend = getattr(original, "_attention_backend", None)
    return _is_sagegen(backend if backend is not None else _active_backend())


def _active_backend():
    try:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry
    except ImportError:
        return None
    return _AttentionBackendRegistry.get_active_backend()[0]


def _is_sagegen(backend) -> bool:
    """Whether a diffusers backend (an AttentionBackendName member, or None) is sagegen's; by value, so that
    nothing is registered here (this runs inside traced code too)."""
    from sagegen.backend.attention import BACKEND_NAME

    return backend is not None and getattr(backend, "value", backend) == BACKEND_NAME


# a Flux single block's text length, set on its attention module for the call (`families.flux`): its joint
# call under context parallelism hands the split the (text, image) lengths (`joint.flux_call`)
TEXT_LEN = "_sagegen_text_len"


def split_segments(processor, *lengths: int) -> dict | None:
    """``attention_kwargs`` for a joint call (parts of these lengths, in order) that a processor hands to
    diffusers' dispatcher: under context parallelism with sagegen's backend, its segments, so that a Ulysses
    split attends in one process's token order (`parallel.context_parallel_attention`); else None."""
    if getattr(processor, "_parallel_config", None) is None:
        return None
    backend = getattr(processor, "_attention_backend", None)
    return {"_sagegen_segments": tuple(lengths)} if _is_sagegen(backend or _active_backend()) else None


def _cp_dispatch(original, session, sparse: bool = False):
    """Under diffusers' context parallelism (``enable_parallelism``): a function (q, k, v [B, N, H, D] of this
    rank's tokens) -> [B, N, H, D] that hands the fused call's attention to diffusers' dispatcher, which splits
    it over the ranks, with sagegen's backend and this patch's settings. None without context parallelism, or
    when another backend was chosen for the module (left alone, as on the backend route).

    ``sparse``: the call may run the patch's block-sparse policy (self-attention, or a joint call whose
    ``segments`` restore one process's token order). Under Ring sagegen's CP attends once over the gathered
    keys, so self-attention runs sparse there too; a sparse joint call's keys are put in one process's order
    there and each part's queries attend in a call of their own."""
    parallel_config = getattr(original, "_parallel_config", None)
    if parallel_config is None:
        return None
    from sagegen.patch.dispatch_route import backend_member

    member = backend_member()
    backend = getattr(original, "_attention_backend", None)
    if member is None or (backend is not None and backend != member):
        return None
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    settings = session.backend_settings
    if sparse:
        from sagegen.patch.sparse_policy import split_settings

        settings = split_settings(session, settings)

    def attend(query, key, value, attn_mask=None, segments=None):
        """``segments``: the lengths of a joint call's parts ((video, text) or (text, image)), so that the
        split attends over them in one process's order (`parallel.context_parallel_attention`)."""
        kwargs = {"_sagegen_settings": settings}
        if segments is not None:
            kwargs["_sagegen_segments"] = tuple(segments)
        return dispatch_attention_fn(query, key, value, attn_mask=attn_mask, attention_kwargs=kwargs,
                                     backend=member, parallel_config=parallel_config)
    return attend


def _kernel_can_run(weight, hidden_states) -> bool:
    """Half-precision weights of a plain linear projection, on a GPU (or under the Triton interpreter)."""
    return (isinstance(weight, torch.Tensor) and weight.dtype in _HALF
            and (hidden_states.is_cuda or triton_interpret()))


def _rope_pair(rope, *shape: int):
    """(cos, sin), each of the given shape: [n_rot, head_dim] as apply_rotary_emb(use_real=True) takes them,
    or Mochi's [n_rot, heads, head_dim / 2]; None; or False."""
    if rope is None:
        return None
    if (isinstance(rope, (tuple, list)) and len(rope) == 2 and all(isinstance(t, torch.Tensor) for t in rope)
            and all(tuple(t.shape) == shape for t in rope)):
        return rope[0], rope[1]
    return False


def _joint_buffers(parts, heads: int, head_dim: int, **kernel_options) -> list[torch.Tensor]:
    """Joint [B, tokens, H, D] Q/K/V buffers filled from ``parts``, each ((q, k, v) projections [B, n, H·D],
    its token slice, (norm_q, norm_k), rotary tables or None): Q and K normalised (and rotated) straight into
    place by `rms_norm_rope(**kernel_options)`, V copied (so no concatenations). With one part (Flux's and
    HunyuanVideo's single blocks) V, and Q or K without norm and rotation, are the projections' own views."""
    from sagegen.kernels.triton_qk_prologue import rms_norm_rope

    first = parts[0][0][0]
    total = sum(p[0][0].shape[1] for p in parts)
    single = len(parts) == 1
    joint: list = [None, None, None]
    hnd = lambda t: t.transpose(1, 2)  # [B, N, H, D] -> the [B, H, N, D] view the kernel takes

    def buffer(i):
        if joint[i] is None:
            joint[i] = torch.empty(first.shape[0], total, heads, head_dim, dtype=first.dtype, device=first.device)
        return joint[i]

    for (q, k, v), rows, (norm_q, norm_k), table in parts:
        for i, (src, norm) in enumerate(((q, norm_q), (k, norm_k), (v, None))):
            src = src.unflatten(-1, (heads, head_dim))
            if norm is None and (table is None or i == 2):
                if single:
                    joint[i] = src
                else:
                    buffer(i)[:, rows] = src
            else:
                rms_norm_rope(hnd(src), norm, table, out=hnd(buffer(i)[:, rows]), **kernel_options)
    return joint


def _joint_attention(session, parts, heads: int, head_dim: int, mask=None, parallel=None, segments=None,
                     fp8_out: bool = False, **kernel_options):
    """One attention call over the `_joint_buffers` of ``parts``, routed by the session, or handed to
    ``parallel`` (`_cp_dispatch`'s function, with ``mask`` as the processor would pass it and the parts'
    lengths as segments, or ``segments`` for one part that joins several). Returns the attention output
    [B, tokens, H·D]; with ``fp8_out`` (the output projection takes FP8: `fp8_out.wanted`) an `fp8_out.Fp8Rows` where
    the session's kernel writes it."""
    joint = _joint_buffers(parts, heads, head_dim, **kernel_options)
    if fp8_out and parallel is None:
        rows = fp8_attention(session, *(t.transpose(1, 2) for t in joint), mask)
        if rows is not None:
            return rows
    if parallel is not None:
        if segments is None and len(parts) > 1:
            ordered = sorted(parts, key=lambda p: p[1].start or 0)  # (each part's token slice)
            segments = [p[0][0].shape[1] for p in ordered]
        return parallel(*joint, mask, segments).flatten(2, 3).to(joint[0].dtype)
    hnd = lambda t: t.transpose(1, 2)  # [B, N, H, D] -> the [B, H, N, D] view SDPA takes
    out = session.route(tuple(hnd(t) for t in joint), {"attn_mask": mask, "dropout_p": 0.0, "is_causal": False})
    return out.transpose(1, 2).flatten(2, 3).to(joint[0].dtype)


def _backend_copy_can_fuse(session, processor, hidden_states, weight, split_ok: bool = False) -> bool:
    """For sagegen's equivalents of processor calls on the backend route (`qwenimage`, `ltx`): whether the
    fused prologue may run, given the ``session`` the route's copy holds (None in its full-precision copy).
    ``split_ok``: the call may run under diffusers' context parallelism (its rank's tokens and tables)."""
    if (session is None or not session.fuse_qk_prologue or session.attention_override is not None
            or torch.compiler.is_compiling()
            or (not split_ok and getattr(processor, "_parallel_config", None) is not None)):
        return False
    return (isinstance(hidden_states, torch.Tensor) and hidden_states.dim() == 3
            and _kernel_can_run(weight, hidden_states) and hidden_states.dtype == weight.dtype)


def qkv_projections(attn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``attn.to_q(x), attn.to_k(x), attn.to_v(x)``: one FP8 quantization and GEMM where the patch stacked the
    three (`sagegen.linear.stacked`; the outputs are column views of one tensor), else three calls."""
    out = stacked_forward((attn.to_q, attn.to_k, attn.to_v), x)
    return tuple(out) if out is not None else (attn.to_q(x), attn.to_k(x), attn.to_v(x))
