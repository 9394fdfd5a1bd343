"""The diffusers patcher: `patch`, `unpatch`, `patched`, `is_patched`, `PrecisionPolicy`.

Importing this package does not import diffusers; it only needs the objects you pass in.
"""

import sys

from sagegen.patch.patcher import (SUPPORTED_MODELS, attention_modules, is_patched, patch, patch_info, patched,
                                   reset_stats, reset_steps, set_attention_override, sparse_density, step_history,
                                   unpatch)
from sagegen.patch.precision_policy import PrecisionPolicy

__all__ = ["patch", "unpatch", "patched", "is_patched", "patch_info", "reset_stats", "reset_steps",
           "step_history", "sparse_density", "set_attention_override", "attention_modules", "PrecisionPolicy",
           "SUPPORTED_MODELS"]


class _CallableModule(type(sys)):
    """`sagegen.patch(pipe)` works even when `sagegen.patch` is this package rather than the function.

    `sagegen/__init__.py` loads its names lazily; importing `sagegen.patch.<module>` before anyone asked for
    `sagegen.patch` binds the attribute to this package, so the package forwards calls to `patch`.
    """

    def __call__(self, *args, **kwargs):
        return patch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
