"""`sagegen.use_backend(model)`: diffusers' ``"sagegen"`` backend on one model, leaving no global state behind.

diffusers' ``ModelMixin.set_attention_backend(name)`` sets every processor's ``_attention_backend`` *and* the
process-global active backend, which ``reset_attention_backend`` does not undo: after it, every other model in
the process whose processors have no backend of their own runs that backend too. `use_backend` sets only the
processors of the model it is given, and `restore` (or leaving its ``with`` block) puts back each processor's
previous backend and the previous `set_backend_config` settings.
"""

from __future__ import annotations

import torch

from sagegen.backend.attention import restore_backend_config, set_backend_config
from sagegen.backend.registry import register_diffusers_backend


class use_backend:  # noqa: N801 -- used like a function or a context manager, as torch.no_grad
    """Route ``model``'s attention (every processor that dispatches through diffusers) to the ``"sagegen"``
    backend, like ``model.set_attention_backend("sagegen")`` but without touching diffusers' process-global
    active backend.

    ``config``/``backend``/``fp32_dtype``: when any is given, `sagegen.set_backend_config` is applied for as
    long as this is in effect (process-wide: the bare backend has no per-model state; ``sagegen.patch`` gives
    per-model configs and precision policies). Use as ``with sagegen.use_backend(pipe.transformer): ...``, or
    call it and later ``.restore()``.
    """

    def __init__(self, model: torch.nn.Module, config=None, *, backend: str | None = None,
                 fp32_dtype: torch.dtype | None = None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"use_backend needs a diffusers model (torch.nn.Module), got {type(model).__name__}; "
                            "for a pipeline pass pipe.transformer")
        member = register_diffusers_backend()
        processors = [m.processor for m in model.modules()
                      if getattr(m, "processor", None) is not None and hasattr(m.processor, "_attention_backend")]
        if not processors:
            raise ValueError(f"{type(model).__name__} has no attention processor that dispatches through diffusers' "
                             "attention backends; use sagegen.patch(model) instead")
        self._saved_settings = None
        if config is not None or backend is not None or fp32_dtype is not None:
            self._saved_settings = set_backend_config(config, backend=backend or "auto",
                                                      fp32_dtype=fp32_dtype or torch.bfloat16)
        self._saved = [(p, p._attention_backend) for p in processors]
        for p in processors:
            p._attention_backend = member
        self.modules = len(processors)

    def restore(self) -> None:
        """Put back every processor's previous backend and the previous backend settings. Idempotent."""
        for processor, previous in reversed(self._saved):
            processor._attention_backend = previous
        self._saved = []
        if self._saved_settings is not None:
            restore_backend_config(self._saved_settings)
            self._saved_settings = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.restore()
