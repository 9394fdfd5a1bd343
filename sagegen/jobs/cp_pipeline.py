"""Context parallelism for a loaded pipeline, per attention variant (what `sagegen run/compare --cp` uses).

diffusers' enable_parallelism is one-way, so CP is enabled once (with sagegen's backend) and the variants
switch the attention backend of the parallelised transformer: ``sage`` -> sagegen, ``sdpa`` -> diffusers'
stock backend that can do this split (``native`` runs Ulysses only; Ring needs a backend that returns the
LSE: ``_native_cudnn`` on CUDA).
"""

from __future__ import annotations

import contextlib

import torch

from sagegen.patch.cp.enable import enable_context_parallel, keeping_global_backend


def sagegen_backend_name(backend: str = "auto", config=None) -> str:
    """Register sagegen's diffusers backend ("sagegen"), give it ``config`` and ``backend`` (process-wide, see
    `sagegen.set_backend_config`) and return its name."""
    from sagegen.backend.registry import register_diffusers_backend
    from sagegen.backend.attention import set_backend_config

    member = register_diffusers_backend()
    set_backend_config(config, backend=backend)
    return member.value


def stock_backend_name(cp: dict, device: torch.device) -> str:
    if cp.get("ring", 1) == 1:
        return "native"
    if device.type != "cuda":
        raise ValueError("the stock attention under Ring needs CUDA (diffusers' _native_cudnn); on the CPU use "
                         "--cp ulysses=N or --attention sage only")
    return "_native_cudnn"


def cpu_host_device_count() -> None:
    """diffusers picks its device as ``rank % torch.accelerator.device_count()``: 0 on a CPU-only host. Give
    such a host one (CPU) device; a no-op where an accelerator exists."""
    if torch.accelerator.device_count() == 0:
        torch.accelerator.device_count = lambda: 1


def denoisers(pipe) -> list:
    """The pipeline's denoising transformers (Wan2.2-A14B has ``transformer`` and ``transformer_2``)."""
    return [m for m in (getattr(pipe, "transformer", None), getattr(pipe, "transformer_2", None)) if m is not None]


def enable_pipeline_cp(pipe, cp: dict, *, backend: str = "auto", config=None, guidance: float | None = None) -> str:
    """Enable CP ({"ulysses": U, "ring": R}, and "cfg": 2 for CFG parallelism) on every denoiser of ``pipe`` with
    sagegen's backend; returns its name."""
    cpu_host_device_count()
    name = sagegen_backend_name(backend, config)
    ulysses, ring = cp.get("ulysses", 1), cp.get("ring", 1)
    if cp.get("cfg", 1) > 1:
        from sagegen.patch.cp.cfg import enable_cfg_parallel

        enable_cfg_parallel(pipe, cfg=cp["cfg"], ulysses=ulysses, ring=ring, backend=name, guidance=guidance)
        return name
    for model in denoisers(pipe):
        enable_context_parallel(model, ulysses=ulysses, ring=ring, backend=name)
    return name


@contextlib.contextmanager
def cp_variant(pipe, variant: str, cp: dict, device: torch.device, sagegen_name: str, setup: dict):
    """Run ``variant`` ("sage" or "sdpa") on the parallelised transformer."""
    from sagegen.backend.attention import backend_stats, reset_backend_stats

    name = sagegen_name if variant == "sage" else stock_backend_name(cp, device)
    with keeping_global_backend():
        for model in denoisers(pipe):
            model.set_attention_backend(name)
    setup["cp"] = {**cp, "attention_backend": name}
    reset_backend_stats()
    yield
    if variant == "sage":   # how many attention calls went through sagegen's CP (and fell back), warm-up included
        # (a patch inside this context counts its own calls, written first: they are kept)
        setup["attention_calls"] = {**backend_stats(), **setup.get("attention_calls", {})}
