"""The run's LoRAs (``--lora PATH[:SCALE]``, `settings["lora"]`): loaded into the pipeline once, after it is
built and before any variant runs, so that the stock and the sagegen variant generate with the same adapters
and sagegen patches a pipeline that already holds them (either order works: docs/lora.md)."""

from __future__ import annotations

from sagegen.linear.peft_layers import lora_layers


def load(pipe, loras: list[dict]) -> dict:
    """Load each LoRA as adapter ``lora<i>`` and activate them all at their scales; returns what the variants'
    setup records: the adapter names, their scales and the LoRA layers of the denoisers."""
    if not callable(getattr(pipe, "load_lora_weights", None)):
        raise RuntimeError(f"--lora: {type(pipe).__name__} has no LoRA loader (diffusers' load_lora_weights)")
    names = []
    for i, lora in enumerate(loras):
        name = f"lora{i}"
        pipe.load_lora_weights(lora["path"], adapter_name=name)
        names.append(name)
    scales = [float(lora["scale"]) for lora in loras]
    pipe.set_adapters(names, adapter_weights=scales)
    components = getattr(pipe, "components", {}) or {}
    layers = sum(len(lora_layers(m)) for k, m in components.items()
                 if k.startswith("transformer") and hasattr(m, "named_modules"))
    return {"adapters": names, "scales": scales, "layers": layers}
