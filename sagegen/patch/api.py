"""`sagegen.patch` / `unpatch` / `patched` / `is_patched`: sagegen attention for a diffusers denoiser.

Only the denoising transformer is patched (``pipe.transformer``); text encoders and the VAE keep their own
attention. Every attention module of the transformer (every submodule with an attention ``processor``) gets
its processor wrapped (see `sagegen.patch.processors`); `unpatch` puts the very same processor objects back
and removes the step hook, leaving no global state behind (none is ever changed).

Which models call what (diffusers 0.42; the routing covers both, see `processors`):

=================================  ==========================================  ==============================
model class                        attention processor(s)                      attention call
=================================  ==========================================  ==============================
CogVideoXTransformer3DModel        CogVideoXAttnProcessor2_0 (Fused...)        F.scaled_dot_product_attention
HunyuanVideoTransformer3DModel     HunyuanVideoAttnProcessor2_0;               dispatch_attention_fn (>=0.35;
                                   token refiner: AttnProcessor2_0             SDPA before); refiner: SDPA
MochiTransformer3DModel            MochiAttnProcessor2_0 (per-sample loop)     F.scaled_dot_product_attention
FluxTransformer2DModel             FluxAttnProcessor (FluxAttnProcessor2_0     dispatch_attention_fn (>=0.35;
                                   before 0.35), FluxIPAdapterAttnProcessor    SDPA before)
SD3Transformer2DModel              JointAttnProcessor2_0 (attn, and attn2 of   F.scaled_dot_product_attention
                                   SD3.5-medium's dual-attention layers)
=================================  ==========================================  ==============================

HunyuanVideo's text key-padding mask reaches SDPA as a boolean [B, 1, 1, N] mask, which `sageattn` applies
per key inside the kernel (exactly: masked keys get zero weight); its token refiner's square mask is passed
as a full boolean mask.

fp32 models: sagegen's kernels take fp16/bf16, so q/k/v of an fp32 model are cast to bf16 (``fp32_dtype``)
for the quantized attention and the result is cast back to fp32.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from ..config import DIFFUSION_CONFIG, SageConfig
from . import linear_patch as _linear
from . import processors as _proc
from .policy import PrecisionPolicy, resolve_blocks
from .sparse_policy import SparseState, resolve_sparse
from .steps import StepTracker, pipeline_scheduler_source

# Supported denoisers: class name -> family. Subclasses are recognised through their MRO.
SUPPORTED_MODELS = {
    "CogVideoXTransformer3DModel": "cogvideox",
    "HunyuanVideoTransformer3DModel": "hunyuanvideo",
    "MochiTransformer3DModel": "mochi",
    "FluxTransformer2DModel": "flux",
    "SD3Transformer2DModel": "sd3",
    "WanTransformer3DModel": "wan",
}
_STATE_ATTR = "_sagegen_patch"
_BACKENDS = ("auto", "triton", "reference")
_FP32_DTYPES = (torch.bfloat16, torch.float16)


@dataclasses.dataclass
class _PatchState:
    session: _proc.PatchSession
    policy: PrecisionPolicy
    originals: dict[str, object]          # attention-module name -> original processor
    tracker: StepTracker | None = None


def patch(obj, config: SageConfig | dict | None = None, *, policy: PrecisionPolicy | None = None,
          backend: str = "auto", allow_generic: bool = False, fp32_dtype: torch.dtype = torch.bfloat16,
          fuse_prologue: bool = True, linear: str | None = None, linear_policy=None, sparse=None):
    """Route the attention of a diffusers pipeline's denoising transformer (or of a transformer) to sagegen.

    Args:
        obj: a diffusers pipeline with a ``transformer`` (CogVideoX, HunyuanVideo, Mochi, Flux, SD3/SD3.5, Wan) or
            such a transformer model itself. Patched in place and returned.
        config: a `SageConfig`, or a dict of fields overriding ``sagegen.DIFFUSION_CONFIG`` (V-smoothing on and
            the rest of the SageAttention2 numerics). ``None``: ``DIFFUSION_CONFIG``.
        policy: a `PrecisionPolicy` naming blocks and/or first/last steps that keep full-precision attention.
        backend: passed to `sagegen.sageattn`. ``"auto"``: the Triton kernel on a supported GPU, except for
            calls below sageattn's measured speed crossover (``kernels.backends.auto_prefers_sdpa``: batch·heads·
            Nq·Nk per head dim, ~4.3k-5k tokens at 48 batch·heads; e.g. Flux at 1024², HunyuanVideo's
            256-token text refiner), which run PyTorch SDPA because it is faster there (counted as
            ``routed_auto_sdpa`` in `patch_info`); the emulation on CPU.
            ``"triton"`` forces the quantized kernel for every call; ``"reference"`` the emulation.
        allow_generic: patch a transformer class that is not in ``SUPPORTED_MODELS`` too, by the same generic
            route (every processor's SDPA call goes to sagegen). Off by default: unknown models raise.
        fp32_dtype: the dtype q/k/v of an fp32 model are cast to for the kernel (bf16 or fp16).
        fuse_prologue: in eager mode, run the Q/K norms and rotary embeddings of CogVideoX, Mochi, Flux,
            SD3/SD3.5, HunyuanVideo and Wan processors as one Triton pass writing straight into (joint) Q/K/V
            buffers (`sagegen.patch.fused`, `fused_joint`, `fused_wan`; counted as ``fused_qk_prologue`` in
            `patch_info`). False: diffusers' own code runs around attention (the same values up to rounding
            order).
        linear: ``None`` (default): the denoiser's ``nn.Linear`` layers are left alone. ``"fp8"``: they run
            as FP8 GEMMs (`sagegen.patch.linear_patch`, docs/fp8-linear.md); needs an sm89+ GPU (on the CPU
            the emulation runs; on older GPUs ``config.fallback`` decides: error / emulation / bf16).
        linear_policy: a `sagegen.linear.LinearPolicy` (which layers stay bf16, granularity, outliers);
            ``None``: its defaults (first and last block, embedders and final projection in bf16).
        sparse: block-sparse attention (off by default): a `sagegen.SparseConfig` or its text
            (``"topk=0.5"``, ``"cdf=0.95"``, ``"sta"``, ``"calib=FILE"``; `sagegen.sparse.text`). Dense stay:
            the first ``dense_steps`` (25%) of the steps, the ``dense_blocks`` (the first block),
            cross-attention and calls under ``min_tokens`` keys. `sparse_density(obj)` reports what ran.

    Patching an already patched object again updates its config/policy/backend and wraps any processor that
    was replaced in the meantime; it never wraps twice. Returns ``obj``.

    Notes: patch after ``fuse_qkv_projections()`` / ``set_attn_processor`` (they replace processors). A step
    policy reads the timestep once per transformer call (one host sync) and its Python branch splits
    ``torch.compile`` graphs; without step rules the patched model compiles without graph breaks. The step
    state belongs to the transformer: do not run one patched transformer from several threads at once with
    a step policy.
    """
    transformer, pipe = _resolve(obj)
    family = _family(transformer, allow_generic)
    config = _check_config(config)
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
    if policy.last_steps and pipe is None and policy.num_steps is None:
        raise ValueError("PrecisionPolicy.last_steps needs the number of denoising steps: patch the pipeline "
                         "(its scheduler knows it) or set PrecisionPolicy(num_steps=...)")

    sparse_cfg = resolve_sparse(sparse)
    if sparse_cfg is not None and sparse_cfg.dense_steps > 0 and pipe is None and policy.num_steps is None:
        raise ValueError("sparse dense_steps needs the number of denoising steps: patch the pipeline (its "
                         "scheduler knows it), set PrecisionPolicy(num_steps=...), or SparseConfig(dense_steps=0)")

    modules = attention_modules(transformer)
    if not modules:
        raise ValueError(f"{type(transformer).__name__} has no attention module with a processor to patch")
    full_names = resolve_blocks(policy, transformer, list(modules))
    sparse_state = SparseState(sparse_cfg, family, transformer, list(modules)) if sparse_cfg else None

    state: _PatchState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        session = _proc.PatchSession(family=family, config=config, backend=backend, fp32_dtype=fp32_dtype)
        state = _PatchState(session=session, policy=policy, originals={})
        object.__setattr__(transformer, _STATE_ATTR, state)
    else:
        session = state.session
        session.config, session.backend, session.fp32_dtype = config, backend, fp32_dtype
        state.policy = policy
    session.fuse_qk_prologue = fuse_prologue
    session.full_precision_names = full_names

    for name, module in modules.items():
        current = module.processor
        if _proc.is_wrapper(current):
            continue
        state.originals[name] = current
        _set_processor(module, _proc.wrap(current, name, session))

    if state.tracker is not None:
        state.tracker.detach()
        state.tracker = None
    # sparse: steps counted for dense_steps, and with a pipeline always (the density table is per step)
    if policy.uses_steps or (sparse_state is not None and (sparse_state.cfg.dense_steps > 0 or pipe is not None)):
        source = pipeline_scheduler_source(pipe) if pipe is not None else None
        state.tracker = StepTracker(session, policy, source)
        state.tracker.attach(transformer)
    _linear.apply(transformer, linear, linear_policy, fallback=config.fallback, backend=backend,
                  attention_names=list(modules))
    _install_sparse(session, sparse_state, state.tracker, transformer)
    return obj


def _install_sparse(session, sparse_state, tracker, transformer) -> None:
    if session.sparse is not None:
        session.sparse.detach()
    session.sparse = sparse_state
    if sparse_state is not None:
        sparse_state.tracker = tracker
        sparse_state.attach(transformer)


def sparse_density(obj) -> dict:
    """Realized block density of a patch with ``sparse=`` (per step and layer, per step, overall; one host
    sync); {} when not patched sparse."""
    transformer, _ = _resolve(obj)
    state: _PatchState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None or state.session.sparse is None:
        return {}
    return state.session.sparse.summary()


def unpatch(obj):
    """Undo `patch`: the original processor objects go back and the step hook is removed. Returns ``obj``.

    Unpatching an object that is not patched does nothing. A processor that was replaced after patching
    (e.g. by ``set_attn_processor``) is left as the user set it.
    """
    transformer, _ = _resolve(obj)
    state: _PatchState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        return obj
    modules = attention_modules(transformer)
    for name, original in state.originals.items():
        module = modules.get(name)
        if module is not None and _proc.is_wrapper(module.processor):
            _set_processor(module, original)
    if state.tracker is not None:
        state.tracker.detach()
    _linear.remove(transformer)
    _install_sparse(state.session, None, None, transformer)
    object.__delattr__(transformer, _STATE_ATTR)
    return obj


@contextlib.contextmanager
def patched(obj, config: SageConfig | dict | None = None, *, policy: PrecisionPolicy | None = None, **kwargs):
    """``with sagegen.patched(pipe): ...`` patches on entry and unpatches on exit (also on error).

    If ``obj`` was already patched before the block, its previous patch (config and policy) is restored on
    exit rather than removed.
    """
    transformer, _ = _resolve(obj)
    previous: _PatchState | None = getattr(transformer, _STATE_ATTR, None)
    saved = None
    if previous is not None:
        s = previous.session
        saved = dict(config=s.config, policy=previous.policy, backend=s.backend, fp32_dtype=s.fp32_dtype,
                     fuse_prologue=s.fuse_qk_prologue, sparse=s.sparse.cfg if s.sparse is not None else None)
        saved["linear"], saved["linear_policy"] = _linear.current(transformer)
    patch(obj, config, policy=policy, **kwargs)
    try:
        yield obj
    finally:
        if saved is None:
            unpatch(obj)
        else:
            patch(obj, saved.pop("config"), allow_generic=True, **saved)


def is_patched(obj) -> bool:
    """Whether ``obj`` (a pipeline or transformer) is patched and still has sagegen processors installed."""
    try:
        transformer, _ = _resolve(obj)
    except (TypeError, ValueError):
        return False
    if getattr(transformer, _STATE_ATTR, None) is None:
        return False
    return any(_proc.is_wrapper(m.processor) for m in attention_modules(transformer).values())


def patch_info(obj) -> dict:
    """A summary of a patch: family, config, policy, counters (routed / fallback / full-precision calls), the
    step tracker's last index and total. Empty dict if not patched."""
    transformer, _ = _resolve(obj)
    state: _PatchState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        return {}
    s = state.session
    modules = attention_modules(transformer)
    info = {
        "family": s.family, "config": s.config.to_dict(), "backend": s.backend,
        "policy": dataclasses.asdict(state.policy),
        "wrapped_modules": sum(_proc.is_wrapper(m.processor) for m in modules.values()),
        "attention_modules": len(modules),
        "full_precision_modules": sorted(s.full_precision_names),
        "stats": dict(s.stats),
    }
    if s.sparse is not None:
        info["sparse"] = s.sparse.cfg.to_dict()
    if state.tracker is not None:
        info["step"] = {"index": state.tracker.index, "total": state.tracker.total}
    info["linear"] = _linear.info(transformer)
    return info


def set_attention_override(obj, fn) -> None:
    """For benchmarks and analysis: answer the routed attention calls of a patched object with
    ``fn(q, k, v, attn_mask, is_causal, scale) -> out`` ([B, H, N, D] tensors, fp16/bf16) instead of sageattn
    (e.g. a no-op returning zeros, to bound attention's share of a step). ``None`` restores sageattn."""
    transformer, _ = _resolve(obj)
    state: _PatchState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        raise ValueError("set_attention_override needs a patched object; call sagegen.patch first")
    if fn is not None and not callable(fn):
        raise TypeError(f"fn must be callable or None, got {type(fn).__name__}")
    state.session.attention_override = fn


def reset_stats(obj) -> None:
    """Zero the counters of a patched object (and forget the step tracker's history)."""
    transformer, _ = _resolve(obj)
    state: _PatchState | None = getattr(transformer, _STATE_ATTR, None)
    if state is not None:
        state.session.stats.clear()
        if state.session.sparse is not None:
            state.session.sparse.records.clear()
        if state.tracker is not None:
            state.tracker.history.clear()


def reset_steps(obj) -> None:
    """Restart the step counter of a patched bare transformer (the next call is step 0)."""
    transformer, _ = _resolve(obj)
    state: _PatchState | None = getattr(transformer, _STATE_ATTR, None)
    if state is not None and state.tracker is not None:
        state.tracker.reset()


def step_history(obj) -> list[tuple[int, bool]]:
    """(step index, full precision) for each transformer call seen since patching (step policies only)."""
    transformer, _ = _resolve(obj)
    state: _PatchState | None = getattr(transformer, _STATE_ATTR, None)
    return list(state.tracker.history) if state is not None and state.tracker is not None else []


# -- helpers -------------------------------------------------------------------------------------------------
def attention_modules(transformer: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Every submodule with an attention processor, by qualified name, in module order."""
    found = {}
    for name, module in transformer.named_modules():
        if module is transformer or name.endswith(".processor") or name == "processor":
            continue
        processor = module.__dict__.get("processor", None)
        if processor is None:
            processor = module._modules.get("processor") if isinstance(module, torch.nn.Module) else None
        if processor is not None and callable(processor):
            found[name] = module
    return found


def _set_processor(module: torch.nn.Module, processor) -> None:
    setter = getattr(module, "set_processor", None)
    if callable(setter):
        setter(processor)
    else:
        module.processor = processor


def _resolve(obj) -> tuple[torch.nn.Module, object | None]:
    if isinstance(obj, torch.nn.Module):
        return obj, None
    transformer = getattr(obj, "transformer", None)
    if isinstance(transformer, torch.nn.Module):
        return transformer, obj
    if getattr(obj, "unet", None) is not None:
        raise ValueError(f"{type(obj).__name__} denoises with a UNet; sagegen.patch supports transformer "
                         f"pipelines: {_supported()}")
    raise TypeError(f"sagegen.patch needs a diffusers pipeline with a `transformer` or a transformer model, "
                    f"got {type(obj).__name__}")


def _family(transformer: torch.nn.Module, allow_generic: bool) -> str:
    for cls in type(transformer).__mro__:
        if cls.__name__ in SUPPORTED_MODELS:
            return SUPPORTED_MODELS[cls.__name__]
    if allow_generic:
        return "generic"
    raise ValueError(f"sagegen.patch does not know {type(transformer).__name__}; supported: {_supported()}. "
                     "Pass allow_generic=True to route its processors' SDPA calls to sagegen anyway "
                     "(unvalidated for that model).")


def _supported() -> str:
    return ", ".join(f"{name} ({family})" for name, family in SUPPORTED_MODELS.items())


def _check_config(config) -> SageConfig:
    if config is None:
        return DIFFUSION_CONFIG
    if isinstance(config, SageConfig):
        return config
    if isinstance(config, dict):
        fields = {f.name for f in dataclasses.fields(SageConfig)}
        unknown = sorted(set(config) - fields)
        if unknown:
            raise ValueError(f"config has unknown SageConfig field(s) {unknown}; fields are {sorted(fields)}")
        return DIFFUSION_CONFIG.replace(**config)
    raise TypeError(f"config must be a sagegen.SageConfig, a dict of SageConfig fields or None, got "
                    f"{type(config).__name__}")
