"""sagegen: SageAttention2-style quantized attention in Triton for diffusion models.

The public names are loaded on first use (PEP 562), so that `import sagegen.cli` (the `sagegen` command's
help, version and usage errors) does not pay for importing torch, Triton and the patcher.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the submodule that defines it
_LAZY = {
    "sageattn": "sagegen.api",
    "BlockSparse": "sagegen.kernels.block_sparse",  # block-sparse masks for sageattn(block_mask=), docs/block-sparse.md
    "SageConfig": "sagegen.config",
    "DIFFUSION_CONFIG": "sagegen.config",
    "SUPPORTED_HEAD_DIMS": "sagegen.config",
    # block-sparse attention: predicted / static masks (sagegen.sparse; importing it registers its custom op)
    "SparseConfig": "sagegen.sparse",
    # The diffusers patcher. `sagegen.patch` is the function; the package stays importable as
    # `sagegen.patch.<module>` (e.g. `from sagegen.patch.precision_policy import PrecisionPolicy`), and when the package
    # was imported first the module itself is callable (see sagegen/patch/__init__.py).
    "patch": "sagegen.patch",
    "unpatch": "sagegen.patch",
    "patched": "sagegen.patch",
    "is_patched": "sagegen.patch",
    "PrecisionPolicy": "sagegen.patch",
    "LinearPolicy": "sagegen.linear",  # FP8 linears: sagegen.patch(pipe, linear="fp8"), docs/fp8-linear.md
    "patch_info": "sagegen.patch",
    "sparse_density": "sagegen.patch",  # realized block-sparse density per step and layer (docs/sparse.md)
    # diffusers' "sagegen" attention backend (docs/diffusers-backend.md). Nothing here imports diffusers.
    "set_backend_config": "sagegen.backend.attention",
    "restore_backend_config": "sagegen.backend.attention",
    "backend_config": "sagegen.backend.attention",
    "get_backend_config": "sagegen.backend.attention",
    "backend_stats": "sagegen.backend.attention",
    "reset_backend_stats": "sagegen.backend.attention",
    "use_backend": "sagegen.backend.use",
}

__all__ = ["sageattn", "SageConfig", "DIFFUSION_CONFIG", "SUPPORTED_HEAD_DIMS", "__version__"]
__all__ += ["BlockSparse", "SparseConfig"]
__all__ += ["patch", "unpatch", "patched", "is_patched", "patch_info", "sparse_density", "PrecisionPolicy",
            "LinearPolicy"]
__all__ += ["set_backend_config", "restore_backend_config", "backend_config", "get_backend_config",
            "backend_stats", "reset_backend_stats", "use_backend", "register_diffusers_backend",
            "DiffusersBackendUnavailable"]

# Registers "sagegen" in diffusers' attention registry now if diffusers' dispatcher is loaded, else when it is
# (a one-shot import hook; this module imports neither torch nor diffusers).
from sagegen.backend.registry import DiffusersBackendUnavailable, register_diffusers_backend  # noqa: E402
from sagegen.backend.registry import install as _install_diffusers_backend  # noqa: E402

_install_diffusers_backend()


def __getattr__(name: str):
    source = _LAZY.get(name)
    if source is None:
        raise AttributeError(f"module 'sagegen' has no attribute {name!r}")
    value = getattr(importlib.import_module(source, __name__), name)
    globals()[name] = value  # importing the subpackage bound `sagegen.patch` to it; the function wins
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
