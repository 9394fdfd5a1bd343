"""peft's LoRA layers, recognised by their shape (``base_layer`` beside ``lora_A`` / ``lora_B``), so that this
layer needs no peft import: diffusers' ``load_lora_weights`` wraps each targeted ``nn.Linear`` in one.

Their ``base_layer`` may run in FP8 (`sagegen.patch.lora_fp8`): peft's forward computes ``base_layer(x)`` and adds
the bf16 LoRA branch to it. Everything else inside the wrapper (``lora_A``, ``lora_B``, DoRA's magnitude) stays
bf16.
"""

from __future__ import annotations

import torch


def is_lora_layer(module: torch.nn.Module) -> bool:
    return hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "lora_B")


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """name -> peft LoRA layer, for every one in ``model``."""
    return {name: m for name, m in model.named_modules() if is_lora_layer(m)}


def variant(layer: torch.nn.Module) -> str | None:
    """Why the base of this LoRA layer cannot run FP8, or None: a LoRA variant (DoRA and its kin) whose forward
    and merge read the base's bf16 weight itself."""
    if any(getattr(layer, "use_dora", {}).values()):
        return "DoRA"
    kinds = getattr(layer, "lora_variant", None)
    if kinds:
        return ", ".join(sorted({type(v).__name__ for v in kinds.values()}))
    return None


def merged(layer: torch.nn.Module) -> bool:
    return bool(getattr(layer, "merged_adapters", None))
