"""Fused prologues for the joint-attention processors of SD3/SD3.5, Flux and HunyuanVideo (see `fused`).

SD3/SD3.5: the joint processor RMS-normalises Q and K of the image and the text tokens (diffusers' RMSNorm:
five eager kernels each) and concatenates Q, K and V along the tokens: ~25 kernels per layer, ~14% of an
SD3.5-large step. `sd3_call` writes the normalised Q and K and V straight into joint buffers.

Flux: the same joint layout (text first) with torch.nn.RMSNorm and diffusers' apply_rotary_emb over the
joint tokens in fp32 (`flux_call`), in the double- and single-stream blocks. HunyuanVideo (`hunyuan_call`):
video tokens first, diffusers' RMSNorm, rotary embeddings on the video tokens only, its text mask passed on.

Each writes the normalised (and rotated) Q and K, and V, of the two token streams straight into joint
[B, tokens, H, D] buffers and routes one attention call; None (the caller runs the original) for anything it
does not reproduce exactly.
"""

from __future__ import annotations

import torch

from sagegen.patch.fusion.prologue import (_cp_dispatch, _native_dispatch)


def _diffusers_rms_params(norm, head_dim: int, dtype: torch.dtype):
    """(weight or None, eps) of diffusers' RMSNorm over the head dim with no bias and, if any, a weight of the
    activations' half dtype (the case whose roundings `rms_norm_rope(round_before_weight=True)` reproduces);
    None for no norm; False otherwise."""
    if norm is None:
        return None
    if (type(norm).__name__ == "RMSNorm" and type(norm).__module__.startswith("diffusers.")
            and tuple(getattr(norm, "dim", ())) == (head_dim,) and getattr(norm, "bias", None) is None
            and isinstance(getattr(norm, "eps", None), float)):
        weight = getattr(norm, "weight", None)
        if weight is None or (isinstance(weight, torch.Tensor) and weight.dtype == dtype
                              and tuple(weight.shape) == (head_dim,)):
            return weight, norm.eps
    return False


def _parallel_route(original, session):
    """None: the fused call routes its attention itself (diffusers' native or sagegen's backend); under
    diffusers' context parallelism, `_cp_dispatch`'s function (the joint buffers are this rank's
    [video, text] or [text, image] tokens, which is what the stock processor hands the dispatcher); False:
    another backend was chosen, the stock processor runs."""
    if _native_dispatch(original):
        return None
    parallel = _cp_dispatch(original, session, sparse=True)
    return False if parallel is None else parallel


def _torch_rms_params(norm, head_dim: int, dtype: torch.dtype):
    """(weight or None, eps) of a torch.nn.RMSNorm over the head dim; None for no norm; False otherwise."""
    if norm is None:
        return None
    if type(norm) is torch.nn.RMSNorm and tuple(norm.normalized_shape) == (head_dim,):
        weight = norm.weight
        if weight is None or tuple(weight.shape) == (head_dim,):
            return weight, (norm.eps if norm.eps is not None else torch.finfo(dtype).eps)
    return False
