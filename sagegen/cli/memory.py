"""What a `run` / `compare` / `calibrate` needs in memory, from its sizes, checked before any model loads.

`needs` counts only what must exist at once, so that it refuses what cannot fit and never a run that would:
the transformer's activations in one block (hidden states, norm output, Q/K/V and attention output, or the
MLP's input and inner width) for the CFG batch at the preset's latent geometry (`sagegen.models.geometry`),
the emulated attention's score chunk on the CPU, the latents, the VAE's last layer on one frame, the decoded
frames on the device and the frames kept for saving on the host (the pipeline's float32 array, two float32
copies while converting to 8-bit, and the 8-bit frames), and the transformer's weights where its config is
known. Text encoders, the rest of the VAE and fragmentation are not counted; a run near the limit can still
fail, but not one many times too large, which used to grow until the kernel killed it or fail after the load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sagegen.cli.errors import UsageProblem

GiB = 2**30
PROCESS_BYTES = int(1.5 * GiB)  # Python, torch and diffusers (~0.7 GiB measured) and the allocator's slack
_CHUNK_ELEMS = 1 << 26  # the attention emulation's fp32 score chunk (sagegen.kernels.reference)
_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass
class Needs:
    """Bytes by part, on the accelerator (empty on the CPU) and on the host."""

    device: dict[str, int] = field(default_factory=dict)
    host: dict[str, int] = field(default_factory=dict)


def needs(preset, settings: dict, *, on_gpu: bool, variants=("sage",), offload: str = "none", cp_world: int = 1,
          weights: dict[str, int] | None = None, process: int = 0) -> Needs:
    """What the run needs at once (see the module doc); `weights` (name -> bytes) live where the model runs,
    `process` is a margin for the process itself, on the host."""
    from sagegen.models.geometry import geometry

    h, w, f = settings["height"], settings["width"], settings.get("frames") if preset.is_video else None
    b = _BYTES.get(settings.get("dtype") or preset.dtype, 2)
    g = geometry(preset)
    step = g.vae_temporal if g else max(1, preset.frame_step)
    frames_out = (f - 1) // step * step + 1 if f else 1
    pixels = frames_out * h * w * 3
    run: dict[str, int] = {}
    if g is not None:
        batch = g.cfg_batch if (settings.get("guidance") or 0) > 1 else 1
        tokens = -(-(g.tokens(h, w, f) + g.text_tokens) // max(1, cp_world))  # CP splits the sequence
        run["activations"] = batch * tokens * max(6 * g.hidden, 2 * g.hidden + 2 * g.ffn) * b
        if not on_gpu and "sage" in variants:
            run["attention scores"] = max(_CHUNK_ELEMS, 64 * batch * g.heads * tokens) * 4 * 2
        lf, lh, lw = g.latent_grid(h, w, f)
        run["latents"] = 3 * batch * g.latent_channels * lf * lh * lw * 4  # latents, prediction, next step
    if not settings.get("vae_tiling"):
        # its last layer's input and output on one frame: 96-128 channels in the released VAEs (Wan's 96)
        run["VAE decode"] = 2 * (8 if preset.tiny else 96) * h * w * b
    run["decoded frames"] = 2 * pixels * b
    host = {"frames kept for saving": pixels * (4 + 4 + 4 + 1)}
    if process:
        host["the process"] = process
    if not on_gpu:
        return Needs(host={**run, **(weights or {}), **host})
    (run if offload == "none" else host).update(weights or {})  # offloaded weights wait in host memory
    return Needs(device=run, host=host)


def gpu_bytes(device: str) -> int | None:
    """Total memory of the GPU this process runs on, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda" if device == "auto" else device)
    index = dev.index if dev.index is not None else int(os.environ.get("LOCAL_RANK", "0"))
    return torch.cuda.get_device_properties(index % torch.cuda.device_count()).total_memory


def known_weights(preset, settings: dict, *, random_weights: bool, model_path,
                  on_gpu: bool = True) -> dict[str, int]:
    """The weights sagegen can size without loading: the full-size transformer (each expert of Wan2.2-A14B)
    from its published config; with --random-weights also the VAE (built in float32, then cast). A CPU run of
    hub weights that are not downloaded counts none: the load then says how to get them, which comes first."""
    from sagegen.cli import estimate

    if preset.tiny or model_path is not None:
        return {}
    if not (on_gpu or random_weights):
        from sagegen.models.loading import cached_snapshot

        if cached_snapshot(preset)[0] is None:
            return {}
    dtype = settings.get("dtype") or preset.dtype
    one = estimate.transformer_bytes(preset, dtype)
    if one is None:
        return {}
    from sagegen.models.arch import ARCHS
    from sagegen.models.geometry import arch_name

    experts = ARCHS[arch_name(preset)].notes.get("experts", 1)
    out = {f"{preset.name}'s transformer weights ({dtype})": one * experts}
    if random_weights:
        out["the full-size VAE"] = estimate.vae_bytes(preset)
    return out


def check_fits(preset, settings: dict, *, on_gpu: bool, device: str = "auto", variants=("sage",),
               offload: str = "none", cp_world: int = 1, random_weights: bool = False, model_path=None,
               given: tuple[str, ...] = ()) -> None:
    """Refuse (UsageProblem, exit 2) a run whose `needs` exceed the GPU's memory or the host's available memory
    and swap. `given`: the size options on the command line (named in the message)."""
    problem = fit_problem(preset, settings, on_gpu=on_gpu, device=device, variants=variants, offload=offload,
                          cp_world=cp_world, random_weights=random_weights, model_path=model_path, given=given)
    if problem:
        raise UsageProblem(*problem)


def fit_problem(preset, settings: dict, *, on_gpu: bool, device: str = "auto", variants=("sage",),
                offload: str = "none", cp_world: int = 1, random_weights: bool = False, model_path=None,
                given: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """(message, option) when the run cannot fit, else None (see `check_fits`)."""
    from sagegen.cli import estimate

    weights = known_weights(preset, settings, random_weights=random_weights, model_path=model_path, on_gpu=on_gpu)
    # --random-weights: a margin that the weights alone left out (Flux's 22.2 GiB started with 22 available)
    kw = {"on_gpu": on_gpu, "variants": variants, "offload": offload, "cp_world": cp_world, "weights": weights,
          "process": PROCESS_BYTES if random_weights and weights else 0}
    need = needs(preset, settings, **kw)
    for place, parts, have in (("GPU", need.device, gpu_bytes(device) if on_gpu else None),
                               ("host", need.host, estimate.available_bytes())):
        total = sum(parts.values())
        if have is None or total <= have:
            continue
        where = (f"the GPU has {have / GiB:.1f} GiB" if place == "GPU" else
                 f"this machine has {have / GiB:.1f} GiB available (memory and swap)")
        shown = ", ".join(f"{k} {v / GiB:.1f} GiB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
                          if v >= 0.05 * GiB)
        head = (f"{preset.name} at {_size_text(preset, settings)} needs at least {total / GiB:.1f} GiB of {place} "
                f"memory ({shown}), and {where}")
        if sum(v for k, v in parts.items() if k in weights or k == "the process") > have:
            return head + _weights_advice(place, random_weights), _weights_option(place, random_weights)
        sizes = "/".join(given) or ("--frames/--height/--width" if preset.is_video else "--height/--width")
        return head + _size_advice(preset, settings, place, have, kw), sizes
    return None


def _size_text(preset, settings: dict) -> str:
    frames = settings.get("frames") if preset.is_video else None
    return f"{settings['width']}x{settings['height']}" + (f", {frames} frames" if frames else "")


def _weights_option(place: str, random_weights: bool) -> str:
    return "--random-weights" if random_weights else ("--offload" if place == "GPU" else "--device")


def _weights_advice(place: str, random_weights: bool) -> str:
    if place == "GPU":
        return "; use a GPU with more memory, or --offload model (the weights wait on the CPU)"
    return (": the run would be killed. Use a GPU (--device cuda) or a tiny-* preset"
            + ("" if random_weights else ", or a machine with more memory"))


def _size_advice(preset, settings: dict, place: str, have: int, kw: dict) -> str:
    """Which size would fit: the most frames at this height and width (video), else smaller sides."""
    tiling = "" if settings.get("vae_tiling") or place != "GPU" else "; --vae-tiling decodes in tiles"
    split = "; --cp splits the sequence over GPUs" if place == "GPU" and kw["cp_world"] == 1 else ""
    if not preset.is_video:
        return f"; use a smaller --height/--width{tiling}{split}"
    step = max(1, preset.frame_step)

    def fits(k: int) -> bool:
        n = needs(preset, dict(settings, frames=k * step + 1), **kw)
        return sum((n.device if place == "GPU" else n.host).values()) <= have

    if not fits(0):
        return f"; even 1 frame does not fit at this height and width: use a smaller --height/--width{tiling}{split}"
    lo, hi = 0, max(1, (settings.get("frames") or 1) // step)
    while lo < hi:  # the largest k whose k*step+1 frames fit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return (f"; at this height and width memory allows at most about {lo * step + 1} frames (--frames)"
            f"{tiling}{split}")


def memory_problem(preset, settings: dict) -> str | None:
    """Why a full-size random-weights run on the CPU cannot fit in this machine's memory (its weights, VAE,
    activations and frames at its sizes, and the process: `sagegen.cli.memory`), or None."""
    full = dict(preset.defaults(), **{k: v for k, v in settings.items() if v is not None})
    problem = fit_problem(preset, full, on_gpu=False, random_weights=True)
    return problem[0] if problem else None
