"""``sagegen env``: GPUs, versions, and which kernel variant ``backend="auto"`` would use, and why."""

from __future__ import annotations

import json
import os
import platform
from typing import Annotated

import typer

from sagegen.cli.errors import cli_command


def kernel_choice(device) -> dict:
    """What `sageattn(backend="auto")` with the diffusion config runs on `device`, and why."""
    from sagegen.config import DIFFUSION_CONFIG
    from sagegen.kernels.dispatch import FP8_CAPABILITY, describe_cuda

    if device.type != "cuda":
        interp = os.environ.get("TRITON_INTERPRET") == "1"
        return {"variant": "reference", "detail": "PyTorch emulation of the same numerics",
                "why": "CPU tensors: the Triton kernels need an NVIDIA GPU with compute capability >= 8.0"
                       + (" (TRITON_INTERPRET=1: backend='triton' runs in Triton's interpreter)" if interp else "")}
    import torch

    ok, why = describe_cuda(device)
    if not ok:
        return {"variant": DIFFUSION_CONFIG.fallback, "detail": f"fallback ({DIFFUSION_CONFIG.fallback})",
                "why": why}
    from sagegen.kernels.dispatch import AUTO_MIN_WORK, crossover_note

    cap = torch.cuda.get_device_capability(device)
    short = "; " + crossover_note()
    if cap[0] == 9:
        return {"variant": "triton", "detail": "INT8 Q·Kᵀ + FP8 P·V with FP32 two-level accumulation; the Hopper "
                "Gluon kernel (gluon_attn.py) for unmasked, key-padded and GQA calls, the Triton kernel for "
                "causal and dense masks (SAGEGEN_KERNEL=triton forces it)",
                "why": why + short, "auto_min_work": AUTO_MIN_WORK}
    if cap >= FP8_CAPABILITY:
        return {"variant": "triton", "detail": "INT8 Q·Kᵀ + FP8 P·V with FP32 two-level accumulation",
                "why": why + short, "auto_min_work": AUTO_MIN_WORK}
    return {"variant": "triton", "detail": "INT8 Q·Kᵀ + FP16 P·V (no FP8 tensor cores below 8.9)",
            "why": why + short, "auto_min_work": AUTO_MIN_WORK}


def integrations() -> dict:
    """What this diffusers and this install support: sagegen's attention backend, context parallelism (`--cp`)
    and the MP4 encoder that video presets need. Each entry: {"ok": bool, "detail": str}."""
    out = {}
    try:
        import diffusers
    except ImportError as e:
        return {"diffusers": {"ok": False, "detail": f"not installed ({e})"}}
    from sagegen.backend.registry import DiffusersBackendUnavailable, register_diffusers_backend
    from sagegen.patch.cp.plans import ContextParallelUnsupported, check_cp_config

    try:
        out["attention_backend"] = {"ok": True, "detail": f"'sagegen' registered as {register_diffusers_backend()}"}
    except DiffusersBackendUnavailable as e:
        out["attention_backend"] = {"ok": False, "detail": str(e)}
    try:
        check_cp_config(2, 1)
        try:
            check_cp_config(2, 2)
            out["context_parallel"] = {"ok": True, "detail": f"diffusers {diffusers.__version__}: Ulysses, Ring, both"}
        except ContextParallelUnsupported as e:
            out["context_parallel"] = {"ok": True, "detail": f"Ulysses or Ring, not both ({e})"}
    except ContextParallelUnsupported as e:
        out["context_parallel"] = {"ok": False, "detail": str(e)}
    from sagegen.runs.encode import find_ffmpeg

    path, problem = find_ffmpeg()
    out["video_encoder"] = ({"ok": True, "detail": path} if problem is None
                            else {"ok": False, "detail": f"{problem} (pip install imageio-ffmpeg)"})
    return out


def environment() -> dict:
    import torch

    from sagegen.jobs import ranks as distributed
    from sagegen.runs.manifest import versions
    from sagegen.models.loading import hf_cache_dir, hf_offline

    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            dev = torch.device("cuda", i)
            props = torch.cuda.get_device_properties(dev)
            gpus.append({"index": i, "name": props.name, "capability": f"{props.major}.{props.minor}",
                         "memory_gib": round(props.total_memory / 2**30, 1), "kernel": kernel_choice(dev)})
    return {
        "platform": platform.platform(), "versions": versions(),
        "cuda": {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
                 "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0},
        "gpus": gpus, "cpu_kernel": kernel_choice(torch.device("cpu")),
        "huggingface": {"cache": str(hf_cache_dir()), "offline": hf_offline(),
                        "token": bool(os.environ.get("HF_TOKEN"))},
        "distributed": distributed.info().to_dict(),
        "integrations": integrations(),
    }


@cli_command
def env_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    check_hub: Annotated[bool, typer.Option("--check-hub", help="Also test whether the Hugging Face hub "
                                                                "answers (3 s at most).")] = False,
) -> None:
    """Show GPUs, versions, and which kernel variant `auto` picks on each device, and why.

    Examples: sagegen env; sagegen env --check-hub; sagegen env --json > env.json
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    info = environment()
    if check_hub:
        from sagegen.models.loading import hub_reachable

        ok, why = hub_reachable()
        info["huggingface"]["hub"] = {"reachable": ok, "detail": why}
    console = Console(highlight=False, soft_wrap=as_json)
    if as_json:
        console.print_json(json.dumps(info))
        return
    versions = Table(title="versions", title_justify="left", show_header=False)
    for k, v in info["versions"].items():
        versions.add_row(k, v or "[dim]not installed[/]")
    versions.add_row("platform", info["platform"])
    versions.add_row("torch CUDA", str(info["cuda"]["torch_cuda"]))
    console.print(versions)
    kernels = Table(title="attention kernel (backend='auto')", title_justify="left")
    for col in ("device", "memory", "capability", "uses", "why"):
        kernels.add_column(col)
    for g in info["gpus"]:
        kernels.add_row(f"cuda:{g['index']} {g['name']}", f"{g['memory_gib']} GiB", g["capability"],
                        f"{g['kernel']['variant']}: {g['kernel']['detail']}", g["kernel"]["why"])
    cpu = info["cpu_kernel"]
    kernels.add_row("cpu", "—", "—", f"{cpu['variant']}: {cpu['detail']}", cpu["why"])
    console.print(kernels)
    support = Table(title="diffusers integration", title_justify="left", show_header=False)
    for name, item in info["integrations"].items():
        support.add_row(name.replace("_", " "), "[green]yes[/]" if item["ok"] else "[red]no[/]",
                        Text(item["detail"]))
    console.print(support)
    if not info["gpus"]:
        console.print("No CUDA GPU visible to PyTorch: sagegen runs its PyTorch emulation (correct but slow); "
                      "speed measurements need a GPU.", style="yellow", markup=False)
    hf = info["huggingface"]
    line = f"Hugging Face cache: {hf['cache']} · offline: {'yes' if hf['offline'] else 'no'}"
    if "hub" in hf:
        line += f" · hub: {'reachable' if hf['hub']['reachable'] else hf['hub']['detail']}"
    console.print(line, markup=False)
    d = info["distributed"]
    if d["world_size"] > 1:
        console.print(f"launched by {d['launcher']}: rank {d['rank']} of {d['world_size']}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("env")(env_command)
