"""peft LoRA layers whose ``base_layer`` runs in FP8: merging an adapter in or out re-quantizes the base.

With ``linear="fp8"``, a LoRA-wrapped linear keeps peft's wrapper and only its ``base_layer`` becomes an
`FP8Linear` (`sagegen.linear.select_linears`): peft's forward computes ``base_layer(x)`` (FP8) plus the bf16
LoRA branch, so ``set_adapters``, adapter weights, ``enable_lora`` / ``disable_lora`` and ``delete_adapters``
need nothing from sagegen.

Merging (``fuse_lora``, ``unfuse_lora``, peft's ``merge`` / ``unmerge``) writes the LoRA product into the base's
bf16 weight in place (``base_layer.weight.data += delta``), which the FP8 copy would not see; and that weight
waits on the host while patched (``LinearPolicy.bf16_copies="cpu"``). So each such LoRA layer gets ``merge`` and
``unmerge`` as instance attributes (`install`; `release` deletes them): they bring the bf16 weight to the FP8
layer's device, run peft's own method, re-quantize into the same FP8 buffers (`FP8Linear.requantize`) and park
the weight again. diffusers calls exactly these two methods, so every path (pipeline, model, peft, the
implicit unmerge of a disabled merged adapter) takes them.

Loading a LoRA after patching (peft refuses to wrap an `FP8Linear`) is handled one level up
(`sagegen.patch.linear_swap`): the linears go back to bf16 for the load and are swapped again after it.
"""

from __future__ import annotations

import contextlib
import types

import torch

from sagegen.linear import FP8Linear
from sagegen.linear.peft_layers import lora_layers, merged

_METHODS = ("merge", "unmerge")
_MARK = "_sagegen_lora_fp8"  # on a LoRA layer whose merge/unmerge are ours


def _merge(self, safe_merge: bool = False, adapter_names=None) -> None:
    # (diffusers reads this signature to decide whether to pass adapter_names)
    with _bf16_beside(self):
        type(self).merge(self, safe_merge=safe_merge, adapter_names=adapter_names)


def _unmerge(self) -> None:
    with _bf16_beside(self):
        type(self).unmerge(self)


@contextlib.contextmanager
def _bf16_beside(layer: torch.nn.Module):
    """The bf16 weight of the layer's FP8 base on the GPU while peft merges into it; then re-quantized."""
    fp8 = layer._modules.get("base_layer")
    if not isinstance(fp8, FP8Linear):  # unpatched since (release was skipped): peft's own method alone
        yield
        return
    original = fp8.linear
    if original.weight.is_meta:
        raise RuntimeError("sagegen: this model was patched with LinearPolicy(bf16_copies='drop'): no bf16 weights "
                           "are left to merge a LoRA into; fuse_lora before sagegen.patch, or patch with "
                           "bf16_copies='cpu' (the default)")
    home, device = original.weight.device, fp8.w_q.device
    if home != device:
        original.to(device)  # in place: the same Parameter objects, so unpatch restores these very tensors
    try:
        yield
    finally:
        fp8.requantize()
        if home != device:
            original.to(home)


def install(model: torch.nn.Module) -> int:
    """Give every LoRA layer with an FP8 base the re-quantizing ``merge`` / ``unmerge``; returns their count."""
    count = 0
    for layer in lora_layers(model).values():
        if isinstance(layer._modules.get("base_layer"), FP8Linear):
            object.__setattr__(layer, "merge", types.MethodType(_merge, layer))
            object.__setattr__(layer, "unmerge", types.MethodType(_unmerge, layer))
            object.__setattr__(layer, _MARK, True)
            count += 1
    return count


def release(model: torch.nn.Module) -> None:
    """Undo `install`: peft's class methods answer again."""
    for layer in lora_layers(model).values():
        if layer.__dict__.pop(_MARK, False):
            for name in _METHODS:
                layer.__dict__.pop(name, None)


def info(model: torch.nn.Module, requantized: int, bf16_reasons: dict[str, str]) -> dict:
    """The LoRA layers of a patched model: how many, how many run their base in FP8 and which bases stay bf16
    (with the reason, from ``bf16_reasons``), how many have an adapter merged, and the FP8 re-quantizations that
    merges caused since patching."""
    layers = lora_layers(model)
    return {"layers": len(layers),
            "fp8_base_layers": sum(isinstance(m._modules.get("base_layer"), FP8Linear) for m in layers.values()),
            "bf16_base_layers": {f"{n}.base_layer": bf16_reasons.get(f"{n}.base_layer", "unknown")
                                 for n, m in layers.items() if not isinstance(m._modules.get("base_layer"), FP8Linear)},
            "merged_layers": sum(merged(m) for m in layers.values()),
            "adapters": sorted({a for m in layers.values() for a in getattr(m, "lora_A", {}).keys()}),
            "requantized": requantized}
