"""sagegen: SageAttention2-style quantized attention in Triton for diffusion models."""

from .api import sageattn
from .config import DIFFUSION_CONFIG, SUPPORTED_HEAD_DIMS, SageConfig
# The diffusers patcher. Note: this binds `sagegen.patch` to the function; the package stays importable as
# `sagegen.patch.<module>` (e.g. `from sagegen.patch.policy import PrecisionPolicy`).
from .patch import PrecisionPolicy, is_patched, patch, patch_info, patched, unpatch  # noqa: E402
# diffusers' "sagegen" attention backend (docs/diffusers-backend.md). Nothing here imports diffusers.
from .patch.diffusers_backend import (  # noqa: E402
    backend_config,
    backend_stats,
    get_backend_config,
    reset_backend_stats,
    restore_backend_config,
    set_backend_config,
)
from .patch.diffusers_registry import DiffusersBackendUnavailable, register_diffusers_backend  # noqa: E402
from .patch.diffusers_registry import install as _install_diffusers_backend  # noqa: E402
from .patch.use_backend import use_backend  # noqa: E402

__version__ = "0.1.0"

__all__ = ["sageattn", "SageConfig", "DIFFUSION_CONFIG", "SUPPORTED_HEAD_DIMS", "__version__"]
__all__ += ["patch", "unpatch", "patched", "is_patched", "patch_info", "PrecisionPolicy"]
__all__ += ["set_backend_config", "restore_backend_config", "backend_config", "get_backend_config",
            "backend_stats", "reset_backend_stats", "use_backend", "register_diffusers_backend",
            "DiffusersBackendUnavailable"]

# Registers "sagegen" in diffusers' attention registry now if diffusers' dispatcher is loaded, else when it is.
_install_diffusers_backend()
