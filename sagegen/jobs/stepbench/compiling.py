"""How `sagegen bench --compile` compiles a transformer: the whole model (``torch.compile(model)``) or, with
``--compile-scope regional``, diffusers' regional compilation (``model.compile_repeated_blocks(fullgraph=True)``:
each repeated transformer block compiled once and reused, minutes less of compiling for the large models; what
diffusers recommends for Flux, Wan and HunyuanVideo)."""

from __future__ import annotations

import torch


def repeated_blocks(arch_cls: str) -> list[str]:
    """diffusers' ``_repeated_blocks`` of the transformer class ``arch_cls`` ([] if it has none)."""
    import diffusers

    return list(getattr(getattr(diffusers, arch_cls, None), "_repeated_blocks", None) or [])


def compiled(model: torch.nn.Module, scope: str, backend: str, mode: str | None):
    """(the callable to time, a function that undoes the compilation): the regional scope compiles the model's
    blocks in place, and the next variant must start from the eager model."""
    if scope == "full":
        return torch.compile(model, backend=backend, mode=mode), lambda: None
    model.compile_repeated_blocks(backend=backend, mode=mode, fullgraph=True)
    return model, lambda: uncompile(model)


def uncompile(model: torch.nn.Module) -> None:
    """Drop what ``Module.compile`` (and so ``compile_repeated_blocks``) installed: every submodule eager again."""
    for module in model.modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            module._compiled_call_impl = None
