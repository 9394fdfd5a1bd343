"""CFG parallelism: the conditional and unconditional branches of classifier-free guidance on different ranks.

diffusers ships no such split (0.42), so this is a named, reversible diffusers hook (``sagegen_cfg_parallel``)
on each denoiser, over a torch.distributed group of 2 ranks (the ``cfg`` dimension of the mesh; with Ulysses or
Ring inside each branch, each branch's ranks form diffusers' own context-parallel mesh). Every rank runs the
whole pipeline with the same inputs; only the denoiser calls are split, with one all-gather per step. Pipelines
guide in one of two ways:

* ``"batched"`` (CogVideoX, SD3/SD3.5, LTX-Video, Mochi): one call on ``cat([uncond, cond])``. Rank r runs its
  half of the batch (every tensor argument whose first dimension is the call's batch), and the two halves are
  gathered back in order. Each rank computes half the rows of the same products; the result equals one
  process's up to the order of floating-point sums in kernels that tile differently at half the batch.
* ``"two_calls"`` (Wan 2.x, Qwen-Image, Flux and HunyuanVideo with ``true_cfg_scale``): a call for the
  conditional branch, then one for the unconditional branch, at the same timestep. Rank 0 computes the first,
  rank 1 the second; the first call returns at once on rank 1 with a buffer that the gather fills when the
  second call ends, before the pipeline combines the two. The same computations as one process: bit-identical.

Wan2.2-A14B's two experts share one hook state (a step's two calls go to the same expert). `disable` removes the
hooks. Everything that can be checked without weights is checked by `check_cfg`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

HOOK_NAME = "sagegen_cfg_parallel"
STYLES = ("batched", "two_calls")

# the pipelines' way of guiding, by class name (diffusers 0.35-0.42)
_BATCHED = ("CogVideoXPipeline", "CogVideoXImageToVideoPipeline", "StableDiffusion3Pipeline", "LTXPipeline",
            "LTXImageToVideoPipeline", "MochiPipeline")
_TWO_CALLS = ("WanPipeline", "WanImageToVideoPipeline", "QwenImagePipeline", "FluxPipeline", "HunyuanVideoPipeline")
# guidance distilled into the model (an embedded guidance scale), no unconditional branch by default
_EMBEDDED = {"FluxPipeline": "FLUX.1-dev takes its guidance as an input (guidance distillation)",
             "HunyuanVideoPipeline": "HunyuanVideo takes its guidance as an input (embedded guidance)"}


class CfgParallelError(ValueError):
    """A pipeline, guidance or world size that CFG parallelism cannot split."""


def style_of(pipeline_class: str) -> str | None:
    """How ``pipeline_class`` (a diffusers class name) runs classifier-free guidance: "batched", "two_calls", or
    None when unknown."""
    if pipeline_class in _BATCHED:
        return "batched"
    if pipeline_class in _TWO_CALLS:
        return "two_calls"
    return None


def check_cfg(pipeline_class: str, *, cfg: int, world: int, guidance: float | None, true_cfg: bool = False) -> str:
    """Everything checkable before weights load; returns the style. ``true_cfg``: the pipeline was asked for a
    true (two-call) CFG on an embedded-guidance model (``true_cfg_scale`` > 1 with a negative prompt)."""
    if cfg != 2:
        raise CfgParallelError(f"cfg={cfg}: classifier-free guidance has two branches; use cfg=2")
    if world % cfg:
        raise CfgParallelError(f"cfg=2 needs an even number of processes, got {world}")
    style = style_of(pipeline_class)
    if style is None:
        raise CfgParallelError(f"{pipeline_class} has no known classifier-free guidance to split; CFG parallelism "
                               f"supports {', '.join(sorted(_BATCHED + _TWO_CALLS))}")
    if pipeline_class in _EMBEDDED and not true_cfg:
        raise CfgParallelError(f"{_EMBEDDED[pipeline_class]}: there is no unconditional branch to put on another "
                               "process; use --cp ulysses=N instead")
    if guidance is not None and guidance <= 1.0:
        raise CfgParallelError(f"guidance {guidance} runs no unconditional branch (guidance must be > 1 for "
                               "classifier-free guidance); drop cfg=2 or raise the guidance")
    return style


@dataclasses.dataclass
class _State:
    """Shared by a pipeline's denoisers: which call of a pair comes next, and what the first call left."""
    group: object
    rank: int                   # this process's branch: 0 (conditional / first half) or 1
    style: str
    calls: int = 0
    first: torch.Tensor | None = None       # two_calls: the first call's output (rank 0) or its buffer (rank 1)
    first_timestep: torch.Tensor | None = None
    gathers: int = 0


def _hook_class():
    from diffusers.hooks import ModelHook

    class CfgParallelHook(ModelHook):
        def __init__(self, state: _State):
            super().__init__()
            self.state = state

        def new_forward(self, module, *args, **kwargs):
            forward = self.fn_ref.original_forward
            if self.state.style == "batched":
                return _batched(self.state, forward, args, kwargs)
            return _two_calls(self.state, forward, args, kwargs)

    return CfgParallelHook


def _sample(output):
    """The predicted tensor of a denoiser's output (a tuple or a ``*Output`` with ``sample``)."""
    return output[0] if isinstance(output, (tuple, list)) else output.sample


def _with_sample(output, sample):
    if isinstance(output, tuple):
        return (sample, *output[1:])
    if isinstance(output, list):
        return [sample, *output[1:]]
    output.sample = sample
    return output


def _hidden_states(args, kwargs) -> torch.Tensor:
    x = kwargs.get("hidden_states", args[0] if args else None)
    if not isinstance(x, torch.Tensor):
        raise CfgParallelError("CFG parallelism: the denoiser was called without a hidden_states tensor")
    return x


def _batched(state: _State, forward, args, kwargs):
    batch = _hidden_states(args, kwargs).shape[0]
    if batch % 2:
        raise CfgParallelError(f"CFG parallelism (batched): a denoiser call of batch {batch} is not the [uncond, "
                               "cond] pair; was guidance turned off for this call?")
    half = batch // 2
    lo = state.rank * half

    def take(value):
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch:
            return value[lo:lo + half]
        return value

    out = forward(*(take(a) for a in args), **{k: take(v) for k, v in kwargs.items()})
    mine = _sample(out).contiguous()
    parts = [torch.empty_like(mine) for _ in range(2)]
    dist.all_gather(parts, mine, group=state.group)
    state.gathers += 1
    return _with_sample(out, torch.cat(parts, dim=0))


def _two_calls(state: _State, forward, args, kwargs):
    index = state.calls % 2
    state.calls += 1
    timestep = kwargs.get("timestep")
    if index == 0:
        state.first_timestep = timestep
        if state.rank == 0:
            out = forward(*args, **kwargs)
            state.first = _sample(out)
            return out
        # rank 1: the conditional branch is rank 0's; hand back a buffer that the gather of the next call fills
        x = _hidden_states(args, kwargs)
        state.first = torch.empty_like(x)
        return (state.first,) if not kwargs.get("return_dict", True) else _output_like(state.first)
    if (isinstance(timestep, torch.Tensor) and isinstance(state.first_timestep, torch.Tensor)
            and not torch.equal(timestep, state.first_timestep)):
        raise CfgParallelError("CFG parallelism (two calls): the second call of a step came at another timestep: "
                               "this pipeline did not run an unconditional branch (guidance off?)")
    if state.rank == 1:
        out = forward(*args, **kwargs)
        mine = _sample(out)
    else:
        out, mine = None, None
    theirs = state.first
    # one gather: [rank 0's conditional output, rank 1's unconditional output]
    send = (theirs if state.rank == 0 else mine).contiguous()
    parts = [torch.empty_like(send) for _ in range(2)]
    dist.all_gather(parts, send, group=state.group)
    state.gathers += 1
    if state.rank == 1:
        if state.first.shape != parts[0].shape:
            raise CfgParallelError(f"CFG parallelism (two calls): the denoiser's output {tuple(parts[0].shape)} is "
                                   f"not shaped like its input {tuple(state.first.shape)}")
        state.first.copy_(parts[0])
        state.first = None
        return out
    state.first = None
    uncond = parts[1]
    return (uncond,) if not kwargs.get("return_dict", True) else _output_like(uncond)


def _output_like(sample: torch.Tensor):
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    return Transformer2DModelOutput(sample=sample)


def enable(denoisers: list[torch.nn.Module], group, style: str) -> _State:
    """Split each denoiser's CFG branches over ``group`` (2 ranks); returns the shared state."""
    from diffusers.hooks import HookRegistry

    if style not in STYLES:
        raise ValueError(f"style={style!r}; use one of {STYLES}")
    if dist.get_world_size(group) != 2:
        raise CfgParallelError(f"the CFG group has {dist.get_world_size(group)} ranks; it needs 2")
    state = _State(group=group, rank=dist.get_rank(group), style=style)
    hook_cls = _hook_class()
    for model in denoisers:
        HookRegistry.check_if_exists_or_initialize(model).register_hook(hook_cls(state), HOOK_NAME)
    return state


def disable(denoisers: list[torch.nn.Module]) -> None:
    """Remove the hooks `enable` installed (others are left alone)."""
    for model in denoisers:
        registry = getattr(model, "_diffusers_hook", None)
        if registry is not None and registry.get_hook(HOOK_NAME) is not None:
            registry.remove_hook(HOOK_NAME, recurse=False)


def cfg_mesh(cfg: int, ulysses: int, ring: int, device_type: str):
    """The (cfg, ring, ulysses) device mesh over every rank: the CFG group is ``mesh["cfg"]``, and each branch's
    (ring, ulysses) sub-mesh is the one diffusers' ``ContextParallelConfig(mesh=...)`` splits the sequence over."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (cfg, ring, ulysses), mesh_dim_names=("cfg", "ring", "ulysses"))


def enable_cfg_parallel(pipe, *, cfg: int = 2, ulysses: int = 1, ring: int = 1, backend: str | None = "sagegen",
                        guidance: float | None = None, true_cfg: bool = False) -> _State:
    """Put ``pipe``'s guidance branches on different ranks (torch.distributed initialised with cfg * ulysses *
    ring ranks), with Ulysses / Ring inside each branch when their degrees are > 1 (diffusers' context
    parallelism over each branch's ranks, with ``backend``). ``true_cfg``: a pipeline with embedded guidance
    (FLUX.1-dev, HunyuanVideo) will be called with ``true_cfg_scale`` > 1 and a negative prompt. Returns the
    hook state (``gathers`` counts the exchanges). `disable` (on the denoisers) undoes the CFG split; context
    parallelism is one-way in diffusers."""
    from sagegen.patch.cp.enable import enable_context_parallel

    world = dist.get_world_size()
    if world != cfg * ulysses * ring:
        raise CfgParallelError(f"cfg={cfg} x ulysses={ulysses} x ring={ring} = {cfg * ulysses * ring} processes, "
                               f"but {world} were started")
    style = check_cfg(type(pipe).__name__, cfg=cfg, world=world, guidance=guidance, true_cfg=true_cfg)
    device_type = torch._C._get_accelerator().type  # as diffusers' enable_parallelism picks it
    mesh = cfg_mesh(cfg, ulysses, ring, device_type)
    denoisers = [m for m in (getattr(pipe, "transformer", None), getattr(pipe, "transformer_2", None))
                 if m is not None]
    if ulysses * ring > 1:
        for model in denoisers:
            enable_context_parallel(model, ulysses=ulysses, ring=ring, backend=backend, mesh=mesh)
    return enable(denoisers, mesh["cfg"].get_group(), style)
