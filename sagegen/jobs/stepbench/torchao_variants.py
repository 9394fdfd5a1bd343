"""`sagegen bench --torchao`: torchao's float8 dynamic quantization of the layers sagegen's FP8 quantizes.

Kept apart from `stepbench` so torchao is imported only when asked for.
"""

from __future__ import annotations

import torch

import sagegen
from sagegen.patch import patch_info
from sagegen.jobs.stepbench.compiling import compiled


def load_torchao():
    """(Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_) from torchao.quantization."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    return Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_


def fp8_layer_names(model, config, backend, args) -> list[str]:
    """The layers ``linear="fp8"`` (with --linear-policy) quantizes, by qualified name (a patch and unpatch)."""
    sagegen.patch(model, config, backend=backend, linear="fp8", linear_policy=args.linear_policy)
    names = list(patch_info(model)["linear"]["fp8_layers"])
    sagegen.unpatch(model)
    return names


def torchao_variants(model, forward, record, args, config, backend, linear_info) -> None:
    """torchao's float8 dynamic per-row quantization of the same layers as sagegen's FP8 (in place, last):
    torchao_fp8 (stock attention) and sagegen_torchao_fp8 (sagegen attention); compiled with --compile."""
    try:
        config_cls, per_row, quantize_ = load_torchao()
    except Exception as exc:  # noqa: BLE001 - reported, not fatal: the other variants are measured
        print(f"torchao variants skipped: torchao does not import ({type(exc).__name__}: {exc})", flush=True)
        return
    names = set(linear_info["fp8_layers"] if linear_info else fp8_layer_names(model, config, backend, args))
    quantize_(model, config_cls(granularity=per_row()),
              filter_fn=lambda module, fqn: fqn in names)
    for attention in ("stock", "sagegen"):
        name = "torchao_fp8" if attention == "stock" else "sagegen_torchao_fp8"
        if attention == "sagegen":
            sagegen.patch(model, config, backend=backend, allow_generic=True)
        if not args.compiled_only:
            record(name, forward(model))
        if args.compile:
            torch._dynamo.reset()
            fn, undo = compiled(model, args.compile_scope, args.compile_backend, args.compile_mode)
            record(f"{name}_compiled", forward(fn))
            undo()
            torch._dynamo.reset()
    sagegen.unpatch(model)
