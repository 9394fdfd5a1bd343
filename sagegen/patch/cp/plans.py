"""Which diffusers transformers can run context-parallel, and the plans sagegen supplies where diffusers has
none. Decided from the class alone, so the CLI can refuse a model before any weights load.

- diffusers' own ``_cp_plan`` (Flux, Flux.2, Wan, LTX, LTX-2, Qwen-Image, ...): used as is.
- HunyuanVideo: sagegen's plan below. It splits the patch embedding's and the text embedder's outputs and
  the rotary tables; the joint key-padding mask the model builds from the *global* text mask cannot be split
  by a plan (its order is [all video, all text], a rank holds [its video, its text]), so a hook rebuilds it
  per rank from the text mask (`sagegen.patch.families.hunyuanvideo`).
- HunyuanVideo-1.5: sagegen's plan, processor and text-splitting hook (`sagegen.patch.families.hunyuanvideo15`): its own
  processor builds a query x key mask from the tokens a rank holds, which cannot describe other ranks' tokens.
- Models whose attention calls torch SDPA directly (CogVideoX, Mochi, SD3, ...): diffusers' CP cannot reach
  their attention; refused with that reason. So is SkyReels-V2, whose processor passes the CP config to its
  cross-attention too, whose text keys are not split.
"""

from __future__ import annotations

import sagegen.patch.families  # noqa: F401 (registers every family: the plans below are looked up there)
from sagegen.patch import family_table

# Processors that call F.scaled_dot_product_attention themselves (measured, diffusers 0.42)
_DIRECT_SDPA = {
    "CogVideoXTransformer3DModel": "CogVideoX", "MochiTransformer3DModel": "Mochi",
    "SD3Transformer2DModel": "SD3/SD3.5", "AllegroTransformer3DModel": "Allegro",
    "SanaTransformer2DModel": "Sana", "CogView4Transformer2DModel": "CogView4",
}
_NEEDS_PROCESSOR_CHANGES = {
    "SkyReelsV2Transformer3DModel":
        "its processor hands the context-parallel config to the cross-attention too, whose text keys are not "
        "split over the ranks",
}


class ContextParallelUnsupported(ValueError):
    """This model cannot run context-parallel (the message says why)."""




def check_cp_support(model_cls) -> str:
    """'diffusers' or 'sagegen' (whose plan), or ContextParallelUnsupported saying why. Takes a class (or
    an instance); needs no weights."""
    cls = model_cls if isinstance(model_cls, type) else type(model_cls)
    name = cls.__name__
    if name in _DIRECT_SDPA:
        raise ContextParallelUnsupported(
            f"{_DIRECT_SDPA[name]} ({name}) cannot run context-parallel: its attention processors call "
            "torch's scaled_dot_product_attention directly instead of diffusers' attention dispatcher, so "
            "diffusers' enable_parallelism cannot split its attention. Use prompt sharding (plain torchrun "
            "without --cp) to use several GPUs")
    if name in _NEEDS_PROCESSOR_CHANGES:
        raise ContextParallelUnsupported(f"{name} cannot run context-parallel yet: "
                                         f"{_NEEDS_PROCESSOR_CHANGES[name]}")
    if getattr(cls, "_cp_plan", None):
        return "diffusers"
    if family_table.cp_plan(name) is not None:
        return "sagegen"
    raise ContextParallelUnsupported(
        f"{name} has no context-parallel plan (_cp_plan) in this diffusers version and sagegen supplies none")


def check_cp_config(ulysses: int, ring: int) -> None:
    """That this diffusers has context parallelism and takes this topology (diffusers 0.36 refuses Ulysses and
    Ring together), checked with no weights or processes; else ContextParallelUnsupported saying why."""
    import diffusers

    version = getattr(diffusers, "__version__", "(unknown version)")
    if not (hasattr(diffusers, "ContextParallelConfig") and hasattr(diffusers.ModelMixin, "enable_parallelism")):
        raise ContextParallelUnsupported(
            f"diffusers {version} has no context parallelism (ContextParallelConfig and enable_parallelism came in "
            "0.36); upgrade diffusers, or use prompt sharding (plain torchrun without --cp)")
    try:
        diffusers.ContextParallelConfig(ulysses_degree=ulysses, ring_degree=ring)
    except ValueError as e:
        raise ContextParallelUnsupported(
            f"diffusers {version} refuses ulysses={ulysses}, ring={ring}: {e} (newer diffusers take both)") from None


def cp_plan_for(model) -> dict:
    """The plan to pass to ``enable_parallelism(cp_plan=...)``."""
    if check_cp_support(model) == "diffusers":
        return type(model)._cp_plan
    return family_table.cp_plan(type(model).__name__)()


def install_model_hooks(model, parallel_config) -> None:
    """Hooks a sagegen plan needs besides splitting and gathering (HunyuanVideo's joint mask; HunyuanVideo-1.5's
    text split and key-mask processor), from the family table."""
    hook = family_table.cp_hook(type(model).__name__)
    if hook is not None and check_cp_support(model) == "sagegen":
        hook(model, parallel_config)
