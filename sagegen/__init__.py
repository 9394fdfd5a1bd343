"""sagegen: SageAttention2-style quantized attention in Triton for diffusion models."""

from .api import sageattn
from .kernels.block_sparse import BlockSparse
from .config import DIFFUSION_CONFIG, SUPPORTED_HEAD_DIMS, SageConfig
from .sparse import SparseConfig
# The diffusers patcher. Note: this binds `sagegen.patch` to the function; the package stays importable as
# `sagegen.patch.<module>` (e.g. `from sagegen.patch.policy import PrecisionPolicy`).
from .patch import PrecisionPolicy, is_patched, patch, patched, unpatch  # noqa: E402

__version__ = "0.1.0"

__all__ = ["sageattn", "BlockSparse", "SageConfig", "DIFFUSION_CONFIG", "SUPPORTED_HEAD_DIMS", "__version__"]
__all__ += ["SparseConfig"]
__all__ += ["patch", "unpatch", "patched", "is_patched", "PrecisionPolicy"]
