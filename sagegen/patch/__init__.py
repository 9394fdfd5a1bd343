"""The diffusers patcher: `patch`, `unpatch`, `patched`, `is_patched`, `PrecisionPolicy`.

Importing this package does not import diffusers; it only needs the objects you pass in.
"""

from .api import (
    SUPPORTED_MODELS,
    attention_modules,
    is_patched,
    patch,
    patch_info,
    patched,
    reset_stats,
    reset_steps,
    set_attention_override,
    sparse_density,
    step_history,
    unpatch,
)
from .policy import PrecisionPolicy

__all__ = ["patch", "unpatch", "patched", "is_patched", "patch_info", "reset_stats", "reset_steps",
           "step_history", "sparse_density", "set_attention_override", "attention_modules", "PrecisionPolicy", "SUPPORTED_MODELS"]
