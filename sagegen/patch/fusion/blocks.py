"""Block fusion: a transformer block's modulated norms and gated residual adds in `residual_norm` passes.

Each family module (`sagegen.patch.families`) registers ``(is_fusable(block), forward)`` pairs in the family
table; `install` swaps every block that passes a check for a subclass whose forward is the family's, with this
module's run check (`_can_run`) and `_residual_norm` handed in. The sub-layers (attention processors, FP8
linears) are called exactly as before. Swapping the class (not the instance's ``forward``) keeps diffusers'
hooks (context parallelism, caching) working whichever was installed first: one installed after wraps the fused
forward; one installed before holds the stock forward it wrapped, which `prologue.swap_class` re-points at the
fused one (and back on `remove`) (tests/kernels/test_residual_norm.py). The subclass runs the stock forward under
torch.compile (inductor fuses these ops itself), on CPU outside the Triton interpreter, when gradients are
recorded, and for anything the family's forward does not reproduce. `remove` restores the class; the outputs
are then bit-identical to stock.
"""

from __future__ import annotations

import torch

from sagegen.api import triton_interpret
from sagegen.patch.family_table import families
from sagegen.patch.fusion.prologue import _HALF, forward_subclass, swap_class

_SUBCLASSES: dict[type, type] = {}


def _can_run(x) -> bool:
    """Eager inference on a GPU (or the interpreter): the kernels have no backward, so a call that records
    gradients runs the stock forward."""
    return (not torch.compiler.is_compiling() and isinstance(x, torch.Tensor) and x.dtype in _HALF
            and x.ndim == 3 and (x.is_cuda or triton_interpret())
            and not (torch.is_grad_enabled() and x.requires_grad))


def _residual_norm(x, y=None, gate=None, fp8_out=False, **kwargs):
    """The kernel where it reproduces the stock ops (a sub-layer output of x's dtype and shape), else the
    eager ops themselves. ``fp8_out``: the normalised rows as (e4m3 copy, per-token scales) from the kernel,
    or with ``norm=False`` that copy of the residual sum; the eager ops give the rows in x's dtype and no copy
    (the caller takes either)."""
    from sagegen.kernels.triton_residual_norm import residual_norm, residual_norm_reference

    if y is not None and (y.dtype != x.dtype or y.shape != x.shape):
        return residual_norm_reference(x, y, gate, **kwargs)
    if y is not None and y.stride(2) != 1:
        y = y.contiguous()
    return residual_norm(x, y, gate, fp8_out=fp8_out, **kwargs)


def _with_kernel(family_forward):
    """A family module's fused forward with this module's run check and `_residual_norm` bound in."""
    def forward(self, stock, *args, **kwargs):
        return family_forward(self, stock, _can_run, _residual_norm, *args, **kwargs)
    return forward




def _fused_kind(block):
    """The fused forward that reproduces ``block``'s (Wan, SkyReels-V2, SD3, Flux, Qwen-Image, LTX-Video,
    CogVideoX), or None."""
    return next((_with_kernel(forward) for code in families() for check, forward in code.blocks if check(block)),
                None)


def _subclass(cls: type, fused) -> type:
    return forward_subclass(cls, fused, "_sage_fused_block", _SUBCLASSES, __name__)


def install(transformer) -> int:
    """Swap every fusable block of ``transformer`` (Wan, SD3, Flux, Qwen-Image, LTX, CogVideoX) to its fused
    subclass; returns how many."""
    count = 0
    for module in transformer.modules():
        if getattr(type(module), "_sage_fused_block", False):
            count += 1
        elif (fused := _fused_kind(module)) is not None:
            swap_class(module, _subclass(type(module), fused))
            count += 1
    return count


def remove(transformer) -> None:
    """Put the original class back on every fused block."""
    for module in transformer.modules():
        if getattr(type(module), "_sage_fused_block", False):
            swap_class(module, type(module).__mro__[1])


def fused_count(transformer) -> int:
    return sum(1 for m in transformer.modules() if getattr(type(m), "_sage_fused_block", False))
