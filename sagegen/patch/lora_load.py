"""Loading a LoRA into a pipeline patched with FP8 linears.

peft wraps ``nn.Linear`` layers and refuses an `FP8Linear`, and diffusers reads the transformer's state dict
before it loads (Flux's loader looks up each target's bf16 weight there; a patched layer's weight waits outside
the module tree). So a load runs with the original bf16 linears back in place (`linear_swap.remove`: the same
objects, the same bits) and the linears are swapped again afterwards with the same policy: the new LoRA layers'
bases run FP8 like the rest, each quantized from its bf16 weight (`lora_fp8` then keeps them current on merges).

The entry points are the ones diffusers' loaders go through, given as instance attributes while patched (`install`;
`release` deletes them): the pipeline's ``load_lora_weights`` and each denoiser's ``load_lora_adapter`` and
``add_adapter``. A call made while nothing is patched in FP8 runs the class's method untouched. Cost: one
re-quantization of the patched layers per load, with the bf16 weights on the GPU meanwhile (as unpatched).
"""

from __future__ import annotations

import contextlib
import types

import torch

from sagegen.patch import linear_swap

_PIPELINE = ("load_lora_weights",)
_DENOISER = ("load_lora_adapter", "add_adapter")


def _denoisers_of(pipe) -> list[torch.nn.Module]:
    components = getattr(pipe, "components", None) or {}
    return [m for m in components.values() if isinstance(m, torch.nn.Module)]


@contextlib.contextmanager
def lifted(models: list[torch.nn.Module], what: str):
    """The original bf16 linears in place of the FP8 ones for the block, swapped again after it (also on error)."""
    saved = {id(m): (m, s) for m in models if (s := linear_swap.settings(m)) is not None}
    for model, s in saved.values():
        if s["policy"].bf16_copies == "drop":
            raise RuntimeError(f"sagegen: {what} after sagegen.patch(..., linear='fp8') with "
                               "LinearPolicy(bf16_copies='drop'): the bf16 weights a LoRA is loaded beside were "
                               "dropped; load LoRAs before patching, or patch with bf16_copies='cpu' (the default)")
    for model, _ in saved.values():
        linear_swap.remove(model)
    try:
        yield
    finally:
        for model, s in saved.values():
            linear_swap.restore(model, s, loads=1)


def _run(owner, method: str, models: list[torch.nn.Module], args, kwargs):
    with lifted(models, method):
        return getattr(type(owner), method)(owner, *args, **kwargs)


def _load_lora_weights(self, *args, **kwargs):
    return _run(self, "load_lora_weights", _denoisers_of(self), args, kwargs)


def _load_lora_adapter(self, *args, **kwargs):
    return _run(self, "load_lora_adapter", [self], args, kwargs)


def _add_adapter(self, *args, **kwargs):
    return _run(self, "add_adapter", [self], args, kwargs)


_OVERRIDES = {"load_lora_weights": _load_lora_weights, "load_lora_adapter": _load_lora_adapter,
              "add_adapter": _add_adapter}


def _set(owner, names: tuple[str, ...]) -> None:
    for name in names:
        if callable(getattr(type(owner), name, None)):
            # bound to the owner (a deepcopy rebinds it to the copy); object.__setattr__: past diffusers' config hooks
            object.__setattr__(owner, name, types.MethodType(_OVERRIDES[name], owner))


def install(transformers: list[torch.nn.Module], pipe=None) -> None:
    """Route LoRA loads through `lifted` where any of ``transformers`` runs FP8 linears."""
    if not any(linear_swap.settings(t) is not None for t in transformers):
        return
    for transformer in transformers:
        _set(transformer, _DENOISER)
    if pipe is not None:
        _set(pipe, _PIPELINE)


def release(transformers: list[torch.nn.Module], pipe=None) -> None:
    for owner in [*transformers, pipe]:
        if owner is None:
            continue
        for name in (*_DENOISER, *_PIPELINE):
            method = owner.__dict__.get(name)
            if getattr(method, "__func__", None) is _OVERRIDES[name]:
                del owner.__dict__[name]
