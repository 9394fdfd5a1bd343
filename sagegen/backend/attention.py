"""sagegen's attention as a diffusers attention backend (the function diffusers' dispatcher calls).

`sagegen.backend.registry` registers `sagegen_attention` under the name ``"sagegen"`` in diffusers'
private backend registry; this module holds the function and its settings, and imports nothing of diffusers.

How the dispatcher calls it (diffusers 0.42): ``dispatch_attention_fn`` passes query/key/value in diffusers'
[B, S, H, D] layout and keeps only the keywords this function's signature names (it silently drops the rest),
so every keyword a model can hand over is a parameter here and is honoured:

- ``attn_mask``: [B, S_kv] (a key-padding mask, as diffusers' native backend reads it), or anything that
  broadcasts to [B, H, S_q, S_kv] as in PyTorch SDPA ([B, 1, 1, S_kv], [B, 1, S_q, S_kv], [B, H, 1, S_kv],
  ...); bool (True = attend) or additive float.
- ``scale``, ``is_causal``, ``enable_gqa`` (fewer K/V heads than query heads), ``return_lse`` (natural-log
  log-sum-exp, fp32, [B, S_q, H], the layout diffusers' context-parallel templates merge).
- fp32 inputs run the kernel on a bf16 (``fp32_dtype``) copy and the result is cast back to fp32.
- Calls the kernel cannot take run exactly on PyTorch SDPA (the *fallback*), counted per reason in
  `backend_stats`: a head dim outside ``sagegen.SUPPORTED_HEAD_DIMS`` (``fallback:head_dim``), dropout > 0
  (``fallback:dropout``), inputs that require grad (``fallback:grad``), odd dtypes or shapes.
- ``_parallel_config`` (context parallelism, `enable_parallelism`): handed to ``sagegen.parallel``, with
  ``_sagegen_segments`` (a fused joint call's (video, text) lengths: see `context_parallel_attention`).

Which `SageConfig` a call uses: the settings ``sagegen.patch`` passes for the module it patched (through the
dispatcher's ``attention_kwargs``, as ``_sagegen_settings``), else the process-wide settings of
`set_backend_config` (default ``sagegen.DIFFUSION_CONFIG``, backend ``"auto"``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections import Counter

import torch
import torch.nn.functional as F

from sagegen import api as _api
from sagegen.config import DIFFUSION_CONFIG, SageConfig, check_config
from sagegen.kernels.spec import value_checks_allowed
from sagegen.backend.calls import simplify_mask, unsupported

BACKEND_NAME = "sagegen"
_KERNEL_BACKENDS = ("auto", "triton", "reference")
_HALF = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class BackendSettings:
    """What the ``"sagegen"`` diffusers backend runs: the numerics (`SageConfig`), `sageattn`'s ``backend``,
    the dtype fp32 inputs are cast to, and whether the call keeps full precision (PyTorch SDPA; set by
    ``sagegen.patch`` for the modules and steps a `PrecisionPolicy` names). A patch also passes its own
    counters (``stats``), which count its calls besides the process-wide `backend_stats`."""

    config: SageConfig = DIFFUSION_CONFIG
    backend: str = "auto"
    fp32_dtype: torch.dtype = torch.bfloat16
    full_precision: bool = False
    stats: Counter | None = dataclasses.field(default=None, compare=False, repr=False)  # a patch's counters
    # ``block_mask(q, k, attn_mask, scale, **window)`` ([B, H, N, D] views of every key: a Ulysses split, or a
    # Ring's one call over the gathered keys, whose window gives ``q_offset``) -> a BlockSparse or None (dense):
    # ``sagegen.patch(..., sparse=)`` under context parallelism
    block_mask: object = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.config, SageConfig):
            raise TypeError(f"config must be a sagegen.SageConfig, got {type(self.config).__name__}")
        if self.backend not in _KERNEL_BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not supported; use one of {_KERNEL_BACKENDS}")
        if self.fp32_dtype not in _HALF:
            raise ValueError(f"fp32_dtype={self.fp32_dtype!r} is not supported; use torch.bfloat16 or "
                             "torch.float16")


_settings = BackendSettings()
_stats: Counter = Counter()


def set_backend_config(config: SageConfig | dict | None = None, *, backend: str = "auto",
                       fp32_dtype: torch.dtype = torch.bfloat16) -> BackendSettings:
    """Choose what diffusers' ``"sagegen"`` backend runs when it is selected through diffusers' own API
    (``set_attention_backend("sagegen")``, ``attention_backend("sagegen")``). Process-wide; returns the previous
    settings (pass them to `restore_backend_config` to go back). ``config``: a `SageConfig`, a dict of fields
    overriding ``DIFFUSION_CONFIG``, or None for ``DIFFUSION_CONFIG``. Modules patched by ``sagegen.patch`` use
    the config given to ``patch`` instead."""
    global _settings
    previous = _settings
    _settings = BackendSettings(check_config(config), backend, fp32_dtype)
    return previous


def restore_backend_config(settings: BackendSettings) -> None:
    """Put back settings returned by `set_backend_config`."""
    global _settings
    if not isinstance(settings, BackendSettings):
        raise TypeError(f"settings must be a BackendSettings (from set_backend_config), got "
                        f"{type(settings).__name__}")
    _settings = settings


@contextlib.contextmanager
def backend_config(config: SageConfig | dict | None = None, *, backend: str = "auto",
                   fp32_dtype: torch.dtype = torch.bfloat16):
    """``with sagegen.backend_config(cfg): ...``: `set_backend_config` for the block, restored on exit."""
    previous = set_backend_config(config, backend=backend, fp32_dtype=fp32_dtype)
    try:
        yield _settings
    finally:
        restore_backend_config(previous)


def get_backend_config() -> BackendSettings:
    """The process-wide settings of the ``"sagegen"`` backend."""
    return _settings


def backend_stats() -> dict[str, int]:
    """Counts of the ``"sagegen"`` backend's calls since the last reset (eager calls; calls run by compiled
    code are not counted): ``routed`` (quantized kernel), ``full_precision`` (a policy kept SDPA),
    ``fallback`` plus ``fallback:<reason>`` (ran on PyTorch SDPA, e.g. ``fallback:head_dim``), and
    ``context_parallel``."""
    return dict(_stats)


def reset_backend_stats() -> None:
    _stats.clear()


def _count(key: str, settings: BackendSettings | None = None) -> None:
    if not torch.compiler.is_compiling():  # dynamo would guard on the counts and recompile every call
        _stats[key] += 1
        if settings is not None and settings.stats is not None:
            settings.stats[key] += 1


# -- the backend function ------------------------------------------------------------------------------------
def sagegen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                      scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False,
                      _parallel_config=None, _sagegen_settings: BackendSettings | None = None,
                      _sagegen_segments: tuple[int, ...] | None = None):
    """diffusers' attention-backend call ([B, S, H, D] tensors) answered by `sagegen.sageattn`. See the
    module doc for what each argument does; returns [B, S_q, H, D] (and the [B, S_q, H] fp32 natural-log LSE
    with ``return_lse``)."""
    settings = _sagegen_settings if _sagegen_settings is not None else _settings
    attn_mask = key_padding_4d(attn_mask, query, key)
    if _parallel_config is not None:
        return _context_parallel(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                 return_lse, _parallel_config, settings, _sagegen_segments)
    return local_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                           scale=scale, enable_gqa=enable_gqa, return_lse=return_lse, settings=settings)


def key_padding_4d(attn_mask, query: torch.Tensor, key: torch.Tensor):
    """diffusers' native backend reads a 2-D mask [B, S_kv] as a key-padding mask [B, 1, 1, S_kv] (SDPA alone
    would broadcast it as [S_q, S_kv]); the same here, so both backends agree."""
    if (isinstance(attn_mask, torch.Tensor) and attn_mask.ndim == 2 and attn_mask.shape[0] == query.shape[0]
            and attn_mask.shape[1] == key.shape[1]):
        return attn_mask[:, None, None, :]
    return attn_mask


def local_attention(query, key, value, *, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False, return_lse=False, settings: BackendSettings | None = None,
                    window: dict | None = None):
    """One process's attention in [B, S, H, D]: sageattn, or exactly PyTorch SDPA where the kernel cannot
    take the call or the settings keep full precision. ``attn_mask`` is 4-D or broadcasts like SDPA's.
    ``window``: keywords for ``settings.block_mask`` (a Ring's one call: ``q_offset``)."""
    settings = settings if settings is not None else _settings
    q_h, k_h, v_h = (t.transpose(1, 2) if isinstance(t, torch.Tensor) else t for t in (query, key, value))
    bound = dict(query=q_h, key=k_h, value=v_h, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                 scale=scale, enable_gqa=enable_gqa)
    reason = unsupported(bound)
    if reason is not None or settings.full_precision:
        if reason is None:
            _count("full_precision")  # a patch counts its own full-precision calls (full_precision_calls)
        else:
            _count("fallback", settings)
            _count(f"fallback:{reason}", settings)
        return exact_attention(q_h, k_h, v_h, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse)
    in_dtype = query.dtype
    q, k, v = query, key, value
    if in_dtype not in _HALF:  # fp32 model: quantized attention on a bf16/fp16 copy, the result cast back
        q, k, v = (t.to(settings.fp32_dtype) for t in (q, k, v))
    if q.device.type != "cuda":  # the emulation (CPU) needs contiguous inputs; the GPU kernels read strides
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    rows = None
    if value_checks_allowed():  # value-dependent reduction: eager only, not under capture (see patch.wrapper's doc)
        attn_mask, rows = simplify_mask(attn_mask, q.shape[1])
    if rows is not None:
        rows = rows.transpose(1, 2)  # [B, 1, S_q, 1] -> [B, S_q, 1, 1] for the [B, S, H, D] output
    block_mask = None
    if settings.block_mask is not None:
        block_mask = settings.block_mask(q.transpose(1, 2), k.transpose(1, 2), attn_mask, scale, **(window or {}))
    result = _api.sageattn(q, k, v, tensor_layout="NHD", is_causal=bool(is_causal), sm_scale=scale,
                           attn_mask=attn_mask, return_lse=return_lse, config=settings.config,
                           backend=settings.backend, block_mask=block_mask)
    _count("routed", settings)
    out, lse = result if return_lse else (result, None)
    if rows is not None:
        out = out * rows  # query rows with no key: zeros, as sageattn gives fully masked rows
    out = out if out.dtype == in_dtype else out.to(in_dtype)
    if return_lse:
        return out, lse.transpose(1, 2).contiguous()  # [B, H, S_q] -> [B, S_q, H]
    return out


def exact_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse):
    """PyTorch SDPA on [B, H, S, D] views; returns [B, S, H, D] (and the fp32 LSE [B, S_q, H])."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    out = out.transpose(1, 2)
    if not return_lse:
        return out
    return out, _exact_lse(q, k, attn_mask, is_causal, scale).transpose(1, 2).contiguous()


def _exact_lse(q, k, attn_mask, is_causal, scale, rows_per_chunk: int = 1024) -> torch.Tensor:
    """Natural-log log-sum-exp of the scaled, masked scores, [B, H, S_q] fp32, in chunks of query rows."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    n_q, n_k = q.shape[2], k.shape[2]
    chunks = []
    for i in range(0, n_q, rows_per_chunk):
        s = torch.matmul(q[:, :, i:i + rows_per_chunk].float(), k.float().transpose(-1, -2)) * scale
        if attn_mask is not None:
            m = attn_mask[..., i:i + rows_per_chunk, :] if attn_mask.dim() >= 2 and attn_mask.shape[-2] > 1 \
                else attn_mask
            s = s.masked_fill(~m, -math.inf) if m.dtype == torch.bool else s + m.float()
        if is_causal:
            rows = torch.arange(i, i + s.shape[-2], device=q.device)[:, None]
            s = s.masked_fill(torch.arange(n_k, device=q.device)[None, :] > rows, -math.inf)
        chunks.append(torch.logsumexp(s, dim=-1))
    return torch.cat(chunks, dim=-1)


def _context_parallel(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                      parallel_config, settings, segments=None):
    """Hand a context-parallel call to ``sagegen.parallel.context_parallel_attention(query, key, value, *,
    attn_mask, scale, return_lse, parallel_config, local_attention)``: this rank's [B, S_local, H, D] tensors,
    the mask as diffusers gave it except that a 2-D key-padding mask arrives as [B, 1, 1, S_kv], and
    ``local_attention(q, k, v, *, attn_mask=None, scale=None, return_lse=False)``, which returns [B, S, H, D]
    (and the fp32 natural-log LSE [B, S, H]) computed with this call's settings."""
    if dropout_p:
        raise ValueError(f"sagegen's context parallelism is inference-only: dropout_p must be 0, got {dropout_p}")
    if is_causal:
        raise ValueError("sagegen's context parallelism does not support is_causal=True (diffusers' context-"
                         "parallel templates reject it too)")
    if enable_gqa and query.shape[2] != key.shape[2]:
        raise ValueError("sagegen's context parallelism does not support grouped-query attention "
                         f"({query.shape[2]} query heads, {key.shape[2]} key/value heads)")
    try:
        from sagegen.parallel import context_parallel_attention
        from sagegen.parallel.local import part_backend
    except ImportError as exc:
        raise NotImplementedError(
            "diffusers asked the 'sagegen' attention backend for context parallelism (enable_parallelism), but "
            "this sagegen build has no sagegen.parallel module; run without enable_parallelism or update "
            "sagegen") from exc
    _count("context_parallel", settings)

    def local(q, k, v, *, attn_mask=None, scale=None, return_lse=False, q_offset=None, call_rows=None):
        # a Ring's one call: the queries are a window of the gathered keys (a sparse joint call's keys in one
        # process's order, its parts in calls of their own, routed as their whole call: ring_in_order below)
        window = None if q_offset is None else {"q_offset": q_offset}
        part = settings if call_rows is None else dataclasses.replace(
            settings, backend=part_backend(settings.backend, q, k, call_rows))
        return local_attention(q, k, v, attn_mask=attn_mask, scale=scale, return_lse=return_lse,
                               settings=part, window=window)

    # A Ring attends once over the gathered keys: equal to one GPU where Q's quantization blocks align, ~7%
    # faster and less memory than chunk by chunk with the LSE merge (lab/NOTES.md v6.8), and where a block-
    # sparse predictor sees every key. SAGEGEN_RING_ONE_CALL=0 walks the chunks (dense calls only). A joint
    # call's keys are gathered in one process's order (its output then one GPU's, and 1 GB less a GPU than
    # the chunk order's key compaction at HunyuanVideo 720p: NOTES v7.0); SAGEGEN_RING_IN_ORDER=0 keeps chunk
    # order for dense calls. A sparse joint call attends part by part, where its text rules hold.
    sparse = settings.block_mask is not None
    one_call = sparse or os.environ.get(RING_ONE_CALL_ENV, "1") != "0"
    in_order = sparse or os.environ.get(RING_IN_ORDER_ENV, "1") != "0"
    return context_parallel_attention(query, key, value, attn_mask=attn_mask, scale=scale, return_lse=return_lse,
                                      parallel_config=parallel_config, local_attention=local, segments=segments,
                                      ring_one_call=one_call, ring_in_order=in_order, ring_part_calls=sparse)


RING_ONE_CALL_ENV = "SAGEGEN_RING_ONE_CALL"
RING_IN_ORDER_ENV = "SAGEGEN_RING_IN_ORDER"
