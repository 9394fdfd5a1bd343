"""`sagegen.patch` / `unpatch` / `patched` / `is_patched` / `patch_info`: sagegen attention for diffusers denoisers.

Any diffusers pipeline or transformer can be patched. For a pipeline, every denoiser is patched: ``transformer``
and any ``transformer_<n>``, e.g. Wan2.2-A14B's ``transformer_2``. Text encoders and the VAE keep their own
attention. Every attention module of a denoiser takes one of three routes (`targets`):

- ``fused``: the families sagegen knows (CogVideoX, HunyuanVideo, Mochi, Flux, SD3/SD3.5, Wan) keep their
  fused Q/K prologue processors;
- ``backend``: processors that call diffusers' ``dispatch_attention_fn`` run diffusers' ``"sagegen"`` backend
  per module, with this patch's config and policy (`dispatch_route`). diffusers' process-global default is
  never set;
- ``sdpa``: processors that call ``F.scaled_dot_product_attention`` have that call answered by sageattn
  (`wrapper`, `session`).

`unpatch` puts the very same processor objects back, restores each processor's ``_attention_backend``, and
removes the step hook, so outputs are bit-identical to before.

HunyuanVideo's text key-padding mask reaches SDPA as a boolean [B, 1, 1, N] mask, which `sageattn` applies
per key inside the kernel; its token refiner's square mask is passed as a full boolean mask. fp32 models:
q/k/v are cast to bf16 (``fp32_dtype``) for the quantized attention and the result is cast back to fp32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections import Counter

import torch

from sagegen.config import SageConfig, check_config
import sagegen.patch.families  # noqa: F401 (registers every family in sagegen.patch.family_table)
from sagegen.patch import compile_report
from sagegen.patch import dispatch_route as _route
from sagegen.patch.fusion import blocks as _blocks
from sagegen.patch import graphs as _graphs
from sagegen.patch import linear_swap as _linear
from sagegen.patch import lora_load as _lora_load
from sagegen.patch import session as _session
from sagegen.patch import wrapper as _proc
from sagegen.patch.graph_counts import ForwardCounters
from sagegen.patch.precision_policy import PrecisionPolicy, resolve_blocks
from sagegen.patch.sparse_policy import SparseState, resolve_sparse
from sagegen.patch.steps import StepTracker, pipeline_scheduler_source
from sagegen.patch.targets import (ROUTES, SUPPORTED_MODELS, attention_modules, denoisers, family_of,  # noqa: F401 -- SUPPORTED_MODELS and attention_modules are re-exported
                                   is_fused_processor, set_processor)

_STATE_ATTR = "_sagegen_patch"
_BACKENDS = ("auto", "triton", "reference")
_FP32_DTYPES = (torch.bfloat16, torch.float16)


@dataclasses.dataclass
class _PatchState:
    session: _session.PatchSession
    policy: PrecisionPolicy
    originals: dict[str, object]          # attention-module name -> original processor
    tracker: StepTracker | None = None
    backend_originals: dict[str, object] = dataclasses.field(default_factory=dict)  # name -> _attention_backend


def patch(obj, config: SageConfig | dict | None = None, *, policy: PrecisionPolicy | None = None,
          backend: str = "auto", allow_generic: bool = True, fp32_dtype: torch.dtype = torch.bfloat16,
          fuse_prologue: bool = True, linear: str | None = None, linear_policy=None, sparse=None,
          cuda_graphs: bool = False):
    """Route the attention of a diffusers pipeline's denoisers (or of one transformer) to sagegen.

    Args:
        obj: a diffusers pipeline, or a transformer model itself. Patched in place and returned.
        config: a `SageConfig`, or a dict of fields overriding ``sagegen.DIFFUSION_CONFIG`` (V-smoothing on and
            the rest of the SageAttention2 numerics). ``None``: ``DIFFUSION_CONFIG``.
        policy: a `PrecisionPolicy` naming blocks and/or first/last steps that keep full-precision attention
            (all routes; on the backend route those calls run PyTorch SDPA inside the backend).
        backend: passed to `sagegen.sageattn`. ``"auto"``: the Triton kernel on a supported GPU, except for
            calls below sageattn's measured speed crossover (``kernels.backends.auto_prefers_sdpa``), which run
            PyTorch SDPA because it is faster there (counted as ``routed_auto_sdpa`` on the SDPA route); the
            emulation on CPU. ``"triton"`` forces the quantized kernel; ``"reference"`` the emulation.
        allow_generic: accepted for compatibility and ignored: every model is patched now (see the routes).
        fp32_dtype: the dtype q/k/v of an fp32 model are cast to for the kernel (bf16 or fp16).
        fuse_prologue: in eager mode, run the Q/K norms and rotary embeddings of CogVideoX, Mochi, Flux,
            SD3/SD3.5, HunyuanVideo and Wan processors as one Triton pass writing straight into (joint) Q/K/V
            buffers (`sagegen.patch.families.cogvideox`, `joint`, `wan`; counted as ``fused_qk_prologue`` in
            `patch_info`), and the blocks' modulated norms and residual adds as one pass each (Wan, SD3,
            Flux, Qwen-Image, LTX-Video, CogVideoX: `sagegen.patch.fusion.blocks`; ``fused_blocks`` in
            `patch_info`). False: diffusers' own code runs around attention (the same values up to rounding).
        linear: ``None`` (default): the denoiser's ``nn.Linear`` layers are left alone. ``"fp8"``: they run
            as FP8 GEMMs (`sagegen.patch.linear_swap`, docs/fp8-linear.md); needs an sm89+ GPU (on the CPU
            the emulation runs; on older GPUs ``config.fallback`` decides: error / emulation / bf16).
        linear_policy: a `sagegen.linear.LinearPolicy` (which layers stay bf16, granularity, outliers);
            ``None``: its defaults (first and last block, embedders and final projection in bf16).
        sparse: block-sparse attention (off by default): a `sagegen.SparseConfig` or its text
            (``"topk=0.5"``, ``"cdf=0.95"``, ``"sta"``, ``"calib=FILE"``; `sagegen.sparse.text`). Dense stay:
            the first ``dense_steps`` (25%) of the steps, the ``dense_blocks`` (the first block),
            cross-attention and calls under ``min_tokens`` keys. `sparse_density(obj)` reports what ran.
            It applies on every route (on the backend route, sparse calls run the SDPA route's path). Under
            context parallelism only on Wan's fused route with a Ulysses-only split (docs/context-parallel.md).
        cuda_graphs: replay each denoiser's forward as a CUDA graph (`sagegen.patch.graphs`): the first call
            of a shape runs eagerly, the second is captured, later ones replay. It takes the host's launch
            cost out of eager steps (FP8 linears at ~4k tokens are host-bound without it); it costs one
            activation-sized memory pool per shape. Calls that cannot be captured run eagerly (warned, counted
            in ``patch_info(...)["cuda_graphs"]``). Not with ``sparse`` (its per-call density records).

    Patching an already patched object again updates its config/policy/backend and wraps any processor that
    was replaced in the meantime; it never wraps twice. Returns ``obj``.

    Notes: patch after ``fuse_qkv_projections()`` / ``set_attn_processor`` (they replace processors). A step
    policy reads the timestep once per transformer call (one host sync) and its Python branch splits
    ``torch.compile`` graphs; without step rules the patched model compiles without graph breaks. The step
    state belongs to the pipeline: do not run one patched model from several threads at once with a step policy.
    """
    transformers, pipe = denoisers(obj)
    config = check_config(config)
    if policy is None:
        policy = PrecisionPolicy()
    if not isinstance(policy, PrecisionPolicy):
        raise TypeError(f"policy must be a sagegen.PrecisionPolicy or None, got {type(policy).__name__}")
    if backend not in _BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; use one of {_BACKENDS}")
    if not isinstance(fuse_prologue, bool):
        raise TypeError(f"fuse_prologue must be True or False, got {fuse_prologue!r}")
    if fp32_dtype not in _FP32_DTYPES:
        raise ValueError(f"fp32_dtype={fp32_dtype!r} is not supported; use torch.bfloat16 or torch.float16")
    _linear.check_mode(linear, linear_policy)
    if not isinstance(cuda_graphs, bool):
        raise TypeError(f"cuda_graphs must be True or False, got {cuda_graphs!r}")
    if policy.last_steps and pipe is None and policy.num_steps is None:
        raise ValueError("PrecisionPolicy.last_steps needs the number of denoising steps: patch the pipeline "
                         "(its scheduler knows it) or set PrecisionPolicy(num_steps=...)")
    sparse_cfg = resolve_sparse(sparse)
    if sparse_cfg is not None and sparse_cfg.dense_steps > 0 and pipe is None and policy.num_steps is None:
        raise ValueError("sparse dense_steps needs the number of denoising steps: patch the pipeline (its "
                         "scheduler knows it), set PrecisionPolicy(num_steps=...), or SparseConfig(dense_steps=0)")
    if cuda_graphs and sparse_cfg is not None:
        raise ValueError("cuda_graphs=True does not combine with sparse=... (replays would skip the per-call "
                         "density records); use one or the other")

    plans = []  # everything is checked before anything changes
    for attr, transformer in transformers.items():
        modules = attention_modules(transformer)
        if not modules:
            where = f" ({attr})" if attr else ""
            raise ValueError(f"{type(transformer).__name__}{where} has no attention module with a processor to patch")
        sparse_state = (SparseState(sparse_cfg, family_of(transformer), transformer, list(modules))
                        if sparse_cfg else None)
        plans.append((transformer, modules, resolve_blocks(policy, transformer, list(modules)), sparse_state))

    states = [_patch_one(t, modules, full, config, policy, backend, fp32_dtype, fuse_prologue)
              for t, modules, full, _ in plans]
    for state in states:
        if state.tracker is not None:
            state.tracker.detach()
            state.tracker = None
    # sparse: steps counted for dense_steps, and with a pipeline always (the density table is per step)
    if policy.uses_steps or (sparse_cfg is not None and (sparse_cfg.dense_steps > 0 or pipe is not None)):
        source = pipeline_scheduler_source(pipe) if pipe is not None else None
        tracker = StepTracker([s.session for s in states], policy, source)
        for (transformer, _, _, _), state in zip(plans, states):
            tracker.attach(transformer)
            state.tracker = tracker
    for (transformer, modules, _, sparse_state), state in zip(plans, states):
        _linear.apply(transformer, linear, linear_policy, fallback=config.fallback, backend=backend,
                      attention_names=list(modules))
        _install_sparse(state.session, sparse_state, state.tracker, transformer)
        if cuda_graphs:  # last: FP8 layers swapped in above change the parameters the graphs read
            _graphs.enable(transformer, state_fn=functools.partial(_graph_state, state.session),
                           counters=ForwardCounters(state.session.stats, transformer))
        else:
            _graphs.disable(transformer)
    _lora_load.release(list(transformers.values()), pipe)
    _lora_load.install(list(transformers.values()), pipe)  # LoRAs loaded from now on: beside FP8 bases too
    return obj


def _graph_state(session) -> tuple:
    """The Python-side state a patched forward reads per call: a change selects (or captures) another graph."""
    return session.step_full_precision, id(session.attention_override)


def _install_sparse(session, sparse_state, tracker, transformer) -> None:
    if session.sparse is not None:
        session.sparse.detach()
    session.sparse = sparse_state
    if sparse_state is not None:
        sparse_state.tracker = tracker
        sparse_state.attach(transformer)


def sparse_density(obj) -> dict:
    """Realized block density of a patch with ``sparse=`` (per step and layer, per step, overall; one host
    sync); {} when not patched sparse. With several denoisers: {attribute: summary}."""
    summaries = {attr: state.session.sparse.summary() for attr, state in _states(obj).items()
                 if state.session.sparse is not None}
    if len(summaries) == 1:
        return next(iter(summaries.values()))
    return summaries


def _patch_one(transformer, modules, full_names, config, policy, backend, fp32_dtype, fuse_prologue) -> _PatchState:
    state: _PatchState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        session = _session.PatchSession(family=family_of(transformer), config=config, backend=backend,
                                     fp32_dtype=fp32_dtype)
        state = _PatchState(session=session, policy=policy, originals={})
        object.__setattr__(transformer, _STATE_ATTR, state)
    else:
        session = state.session
        session.config, session.backend, session.fp32_dtype = config, backend, fp32_dtype
        state.policy = policy
    session.fuse_qk_prologue = fuse_prologue
    if fuse_prologue:
        _blocks.install(transformer)
    else:
        _blocks.remove(transformer)
    session.full_precision_names = full_names
    session.backend_settings = _route.settings_for(session, False)
    session.backend_settings_full = _route.settings_for(session, True)

    member = None
    for name, module in modules.items():
        current = module.processor
        if _proc.is_wrapper(current):
            current.set_full_precision(full_names)  # a re-patch may keep other layers in full precision
            continue
        backend_fns = None
        if session.family == "generic" and _route.dispatches(current):
            member = member or _route.backend_member()
            if member is not None:  # else (a diffusers sagegen cannot register in): the SDPA route
                backend_fns = _route.rebind_pair(current, session, member)
                state.backend_originals[name] = current._attention_backend
                current._attention_backend = member
        state.originals[name] = current
        set_processor(module, _proc.wrap(current, name, session, backend_fns))
    return state


def unpatch(obj):
    """Undo `patch`: the original processor objects (with their own ``_attention_backend``) go back and the step
    hook is removed, on every patched denoiser. Returns ``obj``.

    Unpatching an object that is not patched does nothing. A processor that was replaced after patching
    (e.g. by ``set_attn_processor``) is left as the user set it.
    """
    transformers, pipe = denoisers(obj)
    _lora_load.release(list(transformers.values()), pipe)
    for transformer in transformers.values():
        state: _PatchState | None = getattr(transformer, _STATE_ATTR, None)
        if state is None:
            continue
        modules = attention_modules(transformer)
        for name, original in state.originals.items():
            module = modules.get(name)
            if module is not None and _proc.is_wrapper(module.processor):
                set_processor(module, original)
            if name in state.backend_originals:
                original._attention_backend = state.backend_originals[name]
        if state.tracker is not None:
            state.tracker.detach()
        _linear.remove(transformer)
        _blocks.remove(transformer)
        _graphs.disable(transformer)
        _install_sparse(state.session, None, None, transformer)
        object.__delattr__(transformer, _STATE_ATTR)
    return obj


@contextlib.contextmanager
def patched(obj, config: SageConfig | dict | None = None, *, policy: PrecisionPolicy | None = None, **kwargs):
    """``with sagegen.patched(pipe): ...`` patches on entry and unpatches on exit (also on error).

    If ``obj`` was already patched before the block, its previous patch (config and policy) is restored on
    exit rather than removed.
    """
    previous = _states(obj)
    saved = None
    if previous:
        attr, state = next(iter(previous.items()))
        s = state.session
        saved = dict(config=s.config, policy=state.policy, backend=s.backend, fp32_dtype=s.fp32_dtype,
                     fuse_prologue=s.fuse_qk_prologue, sparse=s.sparse.cfg if s.sparse is not None else None)
        model = _with_models(obj, previous)[attr][0]
        saved["linear"], saved["linear_policy"] = _linear.current(model)
        saved["cuda_graphs"] = _graphs.info(model) is not None
    patch(obj, config, policy=policy, **kwargs)
    try:
        yield obj
    finally:
        if saved is None:
            unpatch(obj)
        else:
            patch(obj, saved.pop("config"), **saved)


def is_patched(obj) -> bool:
    """Whether ``obj`` (a pipeline or transformer) is patched and still has sagegen processors installed."""
    try:
        transformers, _ = denoisers(obj)
    except (TypeError, ValueError):
        return False
    return any(getattr(t, _STATE_ATTR, None) is not None and
               any(_proc.is_wrapper(m.processor) for m in attention_modules(t).values())
               for t in transformers.values())


def patch_info(obj) -> dict:
    """A summary of a patch: family, config, policy, the route each attention module took (``routes``: counts;
    ``modules``: name -> route), counters (routed / fallback / full-precision calls), the step tracker's last
    index and total. For a pipeline with several denoisers, module names carry the denoiser's attribute
    (``transformer_2.blocks.0.attn1``), counts are summed, and ``denoisers`` holds each one's own summary.
    Empty dict if not patched."""
    states = _states(obj)
    if not states:
        return {}
    infos = {attr: _info(transformer, state) for attr, (transformer, state) in _with_models(obj, states).items()}
    if len(infos) == 1:
        return next(iter(infos.values()))
    merged = dict(next(iter(infos.values())))
    merged["modules"] = {f"{attr}.{n}": r for attr, i in infos.items() for n, r in i["modules"].items()}
    merged["full_precision_modules"] = sorted(f"{attr}.{n}" for attr, i in infos.items()
                                              for n in i["full_precision_modules"])
    for key in ("routes", "stats"):
        merged[key] = dict(sum((Counter(i[key]) for i in infos.values()), Counter()))
    for key in ("wrapped_modules", "attention_modules", "fused_blocks"):
        merged[key] = sum(i[key] for i in infos.values())
    merged["denoisers"] = infos
    return merged


def _info(transformer, state: _PatchState) -> dict:
    s = state.session
    modules = attention_modules(transformer)
    routes = {name: _module_route(m.processor, s) for name, m in modules.items() if _proc.is_wrapper(m.processor)}
    info = {
        "family": s.family, "config": s.config.to_dict(), "backend": s.backend,
        "policy": dataclasses.asdict(state.policy),
        "wrapped_modules": len(routes),
        "attention_modules": len(modules),
        "routes": {r: n for r in ROUTES if (n := sum(v == r for v in routes.values()))},
        "modules": routes,
        "full_precision_modules": sorted(s.full_precision_names),
        "stats": dict(s.stats),
        "fused_blocks": _blocks.fused_count(transformer),
    }
    if s.sparse is not None:
        info["sparse"] = s.sparse.cfg.to_dict()
    if state.tracker is not None:
        info["step"] = {"index": state.tracker.index, "total": state.tracker.total}
    info["linear"] = _linear.info(transformer)
    info["cuda_graphs"] = _graphs.info(transformer)
    info["compile"] = compile_report.describe(s, info["fused_blocks"], info["linear"])
    return info


def _module_route(wrapper, session) -> str:
    if wrapper._sage_backend_fns is not None:
        return "backend"
    if session.family != "generic" and session.fuse_qk_prologue and is_fused_processor(wrapper._sage_original):
        return "fused"
    return "sdpa"


def set_attention_override(obj, fn) -> None:
    """For benchmarks and analysis: answer the routed attention calls of a patched object with
    ``fn(q, k, v, attn_mask, is_causal, scale) -> out`` ([B, H, N, D] tensors, fp16/bf16) instead of sageattn
    (e.g. a no-op returning zeros, to bound attention's share of a step). ``None`` restores sageattn."""
    states = _states(obj)
    if not states:
        raise ValueError("set_attention_override needs a patched object; call sagegen.patch first")
    if fn is not None and not callable(fn):
        raise TypeError(f"fn must be callable or None, got {type(fn).__name__}")
    for state in states.values():
        state.session.attention_override = fn


def reset_stats(obj) -> None:
    """Zero the counters of a patched object, its FP8 layers' call counts included (and forget the step
    tracker's history)."""
    for transformer, state in _with_models(obj, _states(obj)).values():
        state.session.stats.clear()
        _linear.reset_counts(transformer)
        if state.session.sparse is not None:
            state.session.sparse.records.clear()
        if state.tracker is not None:
            state.tracker.history.clear()


def reset_steps(obj) -> None:
    """Restart the step counter of a patched bare transformer (the next call is step 0)."""
    for state in _states(obj).values():
        if state.tracker is not None:
            state.tracker.reset()


def step_history(obj) -> list[tuple[int, bool]]:
    """(step index, full precision) for each denoiser call seen since patching (step policies only; the
    denoisers of one pipeline share one history)."""
    for state in _states(obj).values():
        if state.tracker is not None:
            return list(state.tracker.history)
    return []


def _states(obj) -> dict[str, _PatchState]:
    transformers, _ = denoisers(obj)
    return {attr: state for attr, t in transformers.items()
            if (state := getattr(t, _STATE_ATTR, None)) is not None}


def _with_models(obj, states: dict[str, _PatchState]) -> dict:
    transformers, _ = denoisers(obj)
    return {attr: (transformers[attr], state) for attr, state in states.items()}
