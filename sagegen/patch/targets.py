"""What `sagegen.patch` patches: a pipeline's denoisers, their attention modules, and each module's route.

Routes (``patch_info(obj)["routes"]`` counts them, ``["modules"]`` names each module's):

- ``"fused"``: the families sagegen knows (``SUPPORTED_MODELS``: CogVideoX, HunyuanVideo, Mochi, Flux, SD3/SD3.5,
  Wan and SkyReels-V2) keep their fused processors: in eager mode the Q/K norm + rotary prologue runs as one Triton pass
  (`fused`, `joint`, `wan`), and attention is sageattn.
- ``"backend"``: the processor calls diffusers' ``dispatch_attention_fn``. The module runs diffusers'
  ``"sagegen"`` backend with the patch's settings (`dispatch_route`). Most newer models work this way:
  LTX-Video, LTX-2, Qwen-Image, HunyuanVideo-1.5, Flux.2.
- ``"sdpa"``: the processor calls ``F.scaled_dot_product_attention`` itself. Those calls are intercepted and
  answered by sageattn (`wrapper`, `session`). This covers the known families' other processors too.
"""

from __future__ import annotations

import re

import torch

from sagegen.models.families import FUSED, family_of_class

# Denoisers with fused processors: class name -> family (the table lives with the model knowledge).
SUPPORTED_MODELS = FUSED
# The processor classes whose calls the fused path (`fused.call`) replaces: exactly these, not subclasses.
FUSED_PROCESSORS = frozenset({
    "diffusers.models.attention_processor.CogVideoXAttnProcessor2_0",
    "diffusers.models.attention_processor.MochiAttnProcessor2_0",
    "diffusers.models.attention_processor.JointAttnProcessor2_0",
    "diffusers.models.transformers.transformer_flux.FluxAttnProcessor",
    "diffusers.models.transformers.transformer_hunyuan_video.HunyuanVideoAttnProcessor2_0",
    "diffusers.models.transformers.transformer_wan.WanAttnProcessor",
    "diffusers.models.transformers.transformer_skyreels_v2.SkyReelsV2AttnProcessor",
})
ROUTES = ("fused", "backend", "sdpa")
# Pipeline components that denoise: `transformer`, and e.g. Wan2.2-A14B's `transformer_2` (low-noise expert).
_DENOISER_NAME = re.compile(r"transformer(_\d+)?")


def denoisers(obj) -> tuple[dict[str, torch.nn.Module], object | None]:
    """The denoising transformers of ``obj`` by attribute name (``{"": obj}`` for a bare model), and the
    pipeline (None for a bare model)."""
    if isinstance(obj, torch.nn.Module):
        return {"": obj}, None
    components = getattr(obj, "components", None)
    if not isinstance(components, dict):
        components = {k: v for k, v in vars(obj).items() if not k.startswith("_")} if hasattr(obj, "__dict__") \
            else {}
    found = {name: module for name, module in components.items()
             if _DENOISER_NAME.fullmatch(name) and isinstance(module, torch.nn.Module)}
    if found:
        return dict(sorted(found.items(), key=lambda kv: (len(kv[0]), kv[0]))), obj
    if getattr(obj, "unet", None) is not None:
        raise ValueError(f"{type(obj).__name__} denoises with a UNet; sagegen.patch supports transformer "
                         "pipelines (any diffusers pipeline with a `transformer`)")
    raise TypeError(f"sagegen.patch needs a diffusers pipeline with a `transformer` or a transformer model, "
                    f"got {type(obj).__name__}")


def family_of(transformer: torch.nn.Module) -> str:
    """The fused family of a known model, else ``"generic"`` (every other model is patched by route)."""
    return family_of_class(type(transformer), SUPPORTED_MODELS) or "generic"


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


def set_processor(module: torch.nn.Module, processor) -> None:
    setter = getattr(module, "set_processor", None)
    if callable(setter):
        setter(processor)
    else:
        module.processor = processor


def is_fused_processor(processor) -> bool:
    cls = type(processor)
    return f"{cls.__module__}.{cls.__qualname__}" in FUSED_PROCESSORS


