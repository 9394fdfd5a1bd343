"""Which attention kernel runs a call on Hopper: the Gluon kernel (`gluon_attn`) where it applies, else the
portable Triton kernel (`triton_attn`); ``SAGEGEN_KERNEL`` forces one. A Gluon kernel that fails to build
with the installed Triton is remembered, and the Triton kernel runs from then on."""

from __future__ import annotations

import warnings

import torch
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources, PTXASError

from sagegen.config import SageConfig
from sagegen.kernels.spec import MaskSpec
from sagegen.kernels.triton_quant import interpreting

# Which kernel runs on Hopper: "auto" (the Gluon kernel where it applies, else `triton_attn`'s), "triton"
# (always `triton_attn`'s: the portable kernel, also what the interpreter runs), or "gluon" (fail where it
# does not apply).
KERNEL_ENV = "SAGEGEN_KERNEL"


GLUON_BUILD_ERRORS = (CompilationError, OutOfResources, PTXASError)
_gluon_broken: list[str] = []  # why the Gluon kernel failed to build in this process (then never retried)


def _gluon_failed(exc: Exception) -> None:
    why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}"
    _gluon_broken.append(why)
    warnings.warn(f"sagegen: the Hopper Gluon kernel did not build with this Triton ({why}); using the "
                  "portable Triton kernel from now on", RuntimeWarning, stacklevel=4)


def gluon_permutes_v() -> bool:
    from sagegen.kernels import gluon_attn

    return gluon_attn.PERMUTE_V


def gluon_quantizes_q() -> bool:
    from sagegen.kernels import gluon_attn

    return gluon_attn.QUANT_Q_IN_KERNEL


def gluon_applies(capability, config: SageConfig, d_pad: int, blocks: tuple[int, int], is_causal: bool,
                  mask: MaskSpec, key_lengths: torch.Tensor | None = None) -> str | None:
    """None if `gluon_attn` can run this call, else why not (one line). key_lengths: `key_prefix_lengths`
    of a key-padding mask."""
    if capability is None or capability[0] != 9:
        return "the Gluon kernel is sm90-only"
    if _gluon_broken:
        return f"the Gluon kernel did not build here ({_gluon_broken[0]})"
    if interpreting():
        return "the Triton interpreter runs the Triton kernel"
    if is_causal or mask.kind not in ("none", "key"):
        return "causal and dense-masked calls use the Triton kernel"
    if mask.kind == "key" and key_lengths is None:
        return "key-padding masks other than a valid prefix use the Triton kernel"
    if config.pv_precision != "fp8" or config.k_granularity != "per_block" or config.smooth_q:
        return "fp16 P·V, per-token K scales and Q smoothing use the Triton kernel"
    if d_pad not in (64, 128) or tuple(blocks) != (64, 128):
        return "the Gluon kernel has 64x128 tiles at head dims 64 and 128"
    try:
        from sagegen.kernels import gluon_attn  # noqa: F401
    except Exception as exc:  # a Triton without Gluon's Hopper API
        return f"Gluon unavailable ({type(exc).__name__})"
    return None
