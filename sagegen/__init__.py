"""sagegen: SageAttention2-style quantized attention in Triton for diffusion models."""

from .api import sageattn
from .config import DIFFUSION_CONFIG, SUPPORTED_HEAD_DIMS, SageConfig

__version__ = "0.1.0"

__all__ = ["sageattn", "SageConfig", "DIFFUSION_CONFIG", "SUPPORTED_HEAD_DIMS", "__version__"]
