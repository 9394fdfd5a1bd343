"""Context parallelism for a loaded pipeline, per attention variant (what `sagegen run/compare --cp` uses).

diffusers' enable_parallelism is one-way, so CP is enabled once (with sagegen's backend) and the variants
switch the attention backend of the parallelised transformer: ``sage`` -> sagegen, ``sdpa`` -> diffusers'
stock backend that can do this split (``native`` runs Ulysses only; Ring needs a backend that returns the
LSE: ``_native_cudnn`` on CUDA).
"""

from __future__ import annotations

import contextlib

import torch

from .enable import enable_context_parallel


def sagegen_backend_name(backend: str = "auto", config=None) -> str:
    """sagegen's diffusers backend, once it is registered and routes ``_parallel_config`` here; until then the
    stand-in (sagegen.parallel.stand_in_backend)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    if "sagegen" in AttentionBackendName._value2member_map_ and \
            _AttentionBackendRegistry._is_context_parallel_available(AttentionBackendName("sagegen")):
        return "sagegen"
    from .stand_in_backend import register_stand_in_backend

    return register_stand_in_backend(backend=backend, config=config)


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


def enable_pipeline_cp(pipe, cp: dict, *, backend: str = "auto", config=None) -> str:
    """Enable CP ({"ulysses": U, "ring": R}) on ``pipe.transformer`` with sagegen's backend; returns its name."""
    cpu_host_device_count()
    name = sagegen_backend_name(backend, config)
    enable_context_parallel(pipe.transformer, ulysses=cp.get("ulysses", 1), ring=cp.get("ring", 1), backend=name)
    return name


@contextlib.contextmanager
def cp_variant(pipe, variant: str, cp: dict, device: torch.device, sagegen_name: str, setup: dict):
    """Run ``variant`` ("sage" or "sdpa") on the parallelised transformer."""
    name = sagegen_name if variant == "sage" else stock_backend_name(cp, device)
    pipe.transformer.set_attention_backend(name)
    setup["cp"] = {**cp, "attention_backend": name}
    yield
