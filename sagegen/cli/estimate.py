"""A full-size model run on the CPU (``--random-weights`` without a GPU), judged before it starts: a rough time
estimate, so that the user is warned before waiting hours (the transformer's matmul work at this CPU's measured
float32 matmul rate; bfloat16 and the attention emulation are slower, the machine's load may differ: an order of
magnitude), the bytes of its weights and VAE, and whether it fits in this machine's memory at all (else the
kernel kills the run minutes later; `sagegen.cli.memory` counts the rest)."""

from __future__ import annotations

import time


def step_flops(preset, settings: dict) -> float | None:
    """Multiply-add work of one denoising step of the full-size transformer (linear layers and attention,
    ignoring norms, embeddings and the VAE), or None when the architecture is not known."""
    from sagegen.models.arch import ARCHS, tokens_per_sample

    arch = ARCHS.get(preset.name)
    if arch is None:
        return None
    cfg = arch.config
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    layers = cfg.get("num_layers", 0) + cfg.get("num_single_layers", 0)
    t = tokens_per_sample(preset.name, height=settings["height"], width=settings["width"],
                          frames=settings.get("frames"))
    batch = arch.batch if settings.get("guidance", 0) > 1 or arch.batch == 1 else 1
    # per block: q, k, v, o (4 d^2) and a 4x MLP (8 d^2) per token; attention 2 T^2 d for QK^T and for PV
    return float(batch * layers * (2 * 12 * d * d * t + 4 * t * t * d))


def cpu_flops_per_s(seconds: float = 0.1) -> float:
    """This CPU's float32 matmul rate, measured for about `seconds` (an optimistic rate for bfloat16)."""
    import torch

    a = torch.randn(512, 512)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ a
        n += 1
    return n * 2 * 512**3 / (time.perf_counter() - t0)


def _human(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def cpu_warning(preset, settings: dict, n_samples: int, n_variants: int) -> str | None:
    """The warning for a full-size random-weights run on the CPU, with a lower bound of its duration."""
    flops = step_flops(preset, settings)
    if flops is None:
        return None
    rate = cpu_flops_per_s()
    per_sample = flops * settings["steps"] / rate
    total = per_sample * n_samples * n_variants
    return (f"--random-weights builds the full-size {preset.name} and no GPU is in use: the transformer alone "
            f"needs about {_human(per_sample)} per sample on this CPU ({flops * settings['steps']:.1e} FLOPs at "
            f"{rate / 1e9:.0f} GFLOP/s measured just now), {_human(total)} for this run, plus the VAE and the "
            "model load. Use a GPU "
            "(--device cuda) or a tiny-* preset for a quick check; Ctrl-C stops it.")


def transformer_bytes(preset, dtype: str) -> int | None:
    """Bytes of the full-size transformer's weights in ``dtype`` (counted on the meta device: nothing is
    allocated), or None when the architecture is not known."""
    import torch

    from sagegen.models.arch import build_transformer
    from sagegen.models.geometry import arch_name

    name = arch_name(preset)
    if name is None:
        return None
    size = {"bfloat16": 2, "float16": 2, "float32": 4}.get(dtype, 2)
    model = build_transformer(name, dtype=torch.bfloat16, device="meta")
    return sum(p.numel() for p in model.parameters()) * size


def available_bytes() -> int | None:
    """Memory this machine can still give (MemAvailable + free swap, /proc/meminfo), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
    except (OSError, ValueError, IndexError):
        return None
    if "MemAvailable" not in info:
        return None
    return info["MemAvailable"] + info.get("SwapFree", 0)


def vae_bytes(preset) -> int:
    """Bytes of the family's full-size VAE as `--random-weights` builds it: in float32, then cast (counted on
    the meta device)."""
    from types import SimpleNamespace

    import torch

    from sagegen.models.geometry import denoiser_config
    from sagegen.models.random_weights import full_vae

    config = denoiser_config(preset) or {}
    with torch.device("meta"):
        vae = full_vae(preset.family, 0, SimpleNamespace(in_channels=config.get("in_channels", 16)))
    return sum(p.numel() for p in vae.parameters()) * 4
