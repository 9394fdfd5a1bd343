"""The launcher: which attention kernel runs a call, and the call itself (`sage_attention`). On Hopper the
Gluon kernel (`gluon_attn`) where it applies, else the portable Triton kernel (`triton_attn`);
``SAGEGEN_KERNEL`` forces one. A Gluon kernel that fails to build with the installed Triton is remembered, and
the Triton kernel runs from then on. Sits above both kernels; neither imports it."""

from __future__ import annotations

import os
import warnings

import torch
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources, PTXASError

from sagegen.config import SageConfig
from sagegen.kernels import triton_attn
from sagegen.kernels.block_sparse import kernel_tiles
from sagegen.kernels.key_padding import compact_valid_keys, key_prefix_lengths
from sagegen.kernels.spec import LOG2E, MaskSpec, capturing, device_capability, next_power_of_2
from sagegen.kernels.triton_quant import interpreting, quantize

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


def sage_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    *,
    sm_scale: float,
    is_causal: bool = False,
    mask: MaskSpec | None = None,
    config: SageConfig | None = None,
    return_lse: bool = False,
    block_sparse=None,
    out_scale: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Quantized attention written into ``out`` by the kernel that applies: the Gluon kernel on Hopper where it
    covers the call, else the portable Triton kernel (`triton_attn`).

    Args:
        q: [B, Hq, Nq, D]; k, v: [B, Hkv, Nk, D]; fp16/bf16, any strides (views of either layout).
        out: [B, Hq, Nq, D] in q's dtype, any strides; every element is written.
        sm_scale, is_causal, mask, config: as in `sagegen.sageattn` (mask already normalised).
        return_lse: compute the natural-log log-sum-exp.
        out_scale: fp32 [B·Nq + 1]: ``out`` is float8_e4m3fn instead; its scale is written into the first B·Nq
            entries (the same value for every token row) and its inverse into the last (fp8_out.py; needs
            ``pv_precision="fp8"``).

    Returns:
        lse [B, Hq, Nq] fp32 if return_lse else None.
    """
    config = config or SageConfig()
    mask = mask or MaskSpec()
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    capability = device_capability(q.device) if q.is_cuda else None
    block_q, block_k = config.blocks(D, capability)
    d_pad = max(16, next_power_of_2(D))
    key_bias = mask.tensor.float().contiguous() if mask.kind == "key" else None
    choice = os.environ.get(KERNEL_ENV, "auto")
    if choice not in ("auto", "triton", "gluon"):
        raise ValueError(f"{KERNEL_ENV}={choice!r}: expected 'auto', 'triton' or 'gluon'")
    why_not, key_lengths = "SAGEGEN_KERNEL=triton", None
    if choice != "triton":
        blocks = (block_q, block_k)
        why_not = gluon_applies(capability, config, d_pad, blocks, is_causal, MaskSpec() if key_bias is not None
                                else mask)
        if why_not is None and key_bias is not None:  # the host sync only when the mask is all that is left
            if capturing():  # a host sync would fail a CUDA graph capture: the Triton kernel applies any key mask
                why_not = "a key-padding mask while a CUDA graph is being captured (no host check of its form)"
            else:
                key_lengths = key_prefix_lengths(key_bias)
                if key_lengths is None and block_sparse is None:  # valid keys not a prefix: move them first
                    compact = compact_valid_keys(k, v, key_bias)
                    if compact is not None:
                        k, v, key_bias, key_lengths = compact
                        mask, Nk = MaskSpec("key", key_bias), k.shape[2]
                why_not = gluon_applies(capability, config, d_pad, blocks, is_causal, mask, key_lengths)
    if choice == "gluon" and why_not:
        raise RuntimeError(f"{KERNEL_ENV}=gluon but {why_not}")
    use_gluon = why_not is None
    # The Gluon kernel quantizes Q itself (per-token scales only; per-block ones keep the Q pass).
    q_in_kernel = (use_gluon and gluon_quantizes_q() and config.q_granularity == "per_token"
                   and config.qk_rotation == "none")  # the rotation is the Q pass's
    qq = quantize(q, k, v, config, block_q, block_k, d_pad, key_bias,
                  permute_v_keys=use_gluon and gluon_permutes_v(), quantize_q=not q_in_kernel)
    out_inv = None
    if out_scale is not None:
        if config.pv_precision != "fp8" or qq.v_scale is None:
            raise ValueError("an FP8 attention output needs pv_precision='fp8' (V's FP8 range sets its scale)")
        from sagegen.kernels.fp8_out import out_scale as fp8_out_scale

        out_inv = fp8_out_scale(qq.v_scale, qq.v_mean, D, out_scale)
    if use_gluon:
        from sagegen.kernels import gluon_attn

        lse = torch.empty(B, H, Nq, dtype=torch.float32, device=q.device) if return_lse else None
        try:
            tiles = (kernel_tiles(block_sparse, block_q, block_k, Nq, Nk, key_lengths)
                     if block_sparse is not None else None)
            gluon_attn.launch(qq, out, lse, key_lengths, H=H, group=H // Hkv, n_q=Nq, n_k=Nk, d=D,
                              block_m=block_q, block_n=block_k, smooth_v=config.smooth_v,
                              sm_scale_log2=sm_scale * LOG2E,
                              permuted_v=gluon_permutes_v(), q=q if q_in_kernel else None, tiles=tiles,
                              out_inv_scale=out_inv)
            return triton_attn.finish_lse(lse, q, qq, H, Hkv, D, sm_scale) if return_lse else None
        except GLUON_BUILD_ERRORS as exc:  # a Triton whose Gluon cannot build this kernel: the Triton kernel
            if choice == "gluon":
                raise
            _gluon_failed(exc)
            if gluon_permutes_v() or q_in_kernel:
                qq = quantize(q, k, v, config, block_q, block_k, d_pad, key_bias)  # (same V statistics)
    return triton_attn.launch(q, k, qq, out, sm_scale=sm_scale, is_causal=is_causal, mask=mask, config=config,
                              return_lse=return_lse, block_q=block_q, block_k=block_k, d_pad=d_pad,
                              capability=capability, block_sparse=block_sparse, out_inv=out_inv)
