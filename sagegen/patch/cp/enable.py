"""Turn on context parallelism for a diffusers transformer with a CP-capable attention backend (sagegen's), leaving
diffusers' process-global default backend as it was."""

from __future__ import annotations

import contextlib

from sagegen.patch.cp.plans import check_cp_config, check_cp_support, cp_plan_for, install_model_hooks


def check_heads(num_heads: int | None, ulysses: int) -> None:
    if num_heads is not None and ulysses > 1 and num_heads % ulysses:
        raise ValueError(f"--cp ulysses={ulysses} needs the model's attention heads ({num_heads}) to be a multiple "
                         f"of the Ulysses degree; use a degree that divides {num_heads}, or ring=")


@contextlib.contextmanager
def keeping_global_backend():
    """diffusers' ``set_attention_backend`` also makes its backend the process-global default, which every other
    model without a backend of its own then runs; this puts the previous default back afterwards (the
    parallelised model's processors keep theirs)."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    from sagegen.backend.registry import set_global_backend

    previous = _AttentionBackendRegistry._active_backend
    try:
        yield
    finally:
        set_global_backend(_AttentionBackendRegistry, previous)


def enable_context_parallel(transformer, *, ulysses: int = 1, ring: int = 1, backend: str | None = "sagegen",
                            mesh=None):
    """``transformer.enable_parallelism(config=ContextParallelConfig(ulysses, ring))`` with ``backend`` as the
    attention backend, sagegen's plan where diffusers has none, and the hooks that plan needs. Needs
    torch.distributed initialised with ulysses * ring ranks, or ``mesh``: a device mesh with "ring" and "ulysses"
    dimensions (and others, e.g. CFG parallelism's "cfg") that this rank's split runs over. Returns the
    transformer."""
    from diffusers import ContextParallelConfig

    check_cp_config(ulysses, ring)
    check_cp_support(transformer)
    check_heads(getattr(transformer.config, "num_attention_heads", None), ulysses)
    if backend == "sagegen":
        from sagegen.backend.registry import register_diffusers_backend

        register_diffusers_backend()       # idempotent; diffusers may have been imported after sagegen
    with keeping_global_backend():
        if backend is not None:
            transformer.set_attention_backend(backend)
        extra = {}
        if mesh is not None:
            if "mesh" not in getattr(ContextParallelConfig, "__dataclass_fields__", {}):
                raise ValueError("this diffusers' ContextParallelConfig takes no device mesh, which combining CFG "
                                 "parallelism with Ulysses or Ring needs (diffusers >= 0.37)")
            extra["mesh"] = mesh
        transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=ulysses, ring_degree=ring, **extra),
                                       cp_plan=cp_plan_for(transformer))
    install_model_hooks(transformer, transformer._parallel_config)
    return transformer
