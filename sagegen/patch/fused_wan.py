"""The fused prologue of Wan's attention (Wan 2.1 / 2.2 T2V and TI2V: diffusers ``WanAttnProcessor``; SkyReels-V2,
whose ``SkyReelsV2AttnProcessor`` is the same code).

Per layer the stock processor RMS-normalises Q and K across all heads (``torch.nn.RMSNorm(heads·head_dim)``),
splits the heads, and in self-attention rotates the video tokens' Q and K with Wan's pairwise rotary tables
(``out[..., 0::2] = x1·cos - x2·sin`` ... over an fp32/fp64 copy, about ten eager kernels per tensor).
`wan_call` writes the normalised (and rotated) Q and K straight into [B, N, H, D] attention buffers in one
Triton pass each (`kernels.triton_heads_rms_rope`), V is the projection's view, and one attention call is
routed as usual (under diffusers' context parallelism: handed to diffusers' dispatcher with sagegen's backend and
this patch's settings, which splits it over the ranks). Cross-attention to the text (no rotary) gets the fused
norms the same way. With ``linear="fp8"`` self-attention's Q, K and V run as one GEMM (`sagegen.linear.stacked`).

It answers None (the caller runs the wrapped original) for anything it does not reproduce exactly: another
processor class, an attention mask, I2V's added image K/V (``add_k_proj``), norms other than a
torch.nn.RMSNorm across the heads, rotary tables of another form, another diffusers attention backend chosen for
the module, fp32 models, or tensors the kernel cannot run on. Under torch.compile the original runs.
"""

from __future__ import annotations

import importlib

import torch

from . import fp8_out
from .fused_common import _HALF, _arguments, _cp_dispatch, _kernel_can_run, _native_dispatch, qkv_projections

# processor class -> the module whose `_get_qkv_projections` it calls (both run the code `wan_call` mirrors)
_PROCESSORS = {
    "diffusers.models.transformers.transformer_wan.WanAttnProcessor": "transformer_wan",
    "diffusers.models.transformers.transformer_skyreels_v2.SkyReelsV2AttnProcessor": "transformer_skyreels_v2",
}


def _heads_rms_params(norm, inner_dim: int, dtype: torch.dtype):
    """(weight or None, eps) of a torch.nn.RMSNorm over all heads (``inner_dim``) whose weight, if any, has the
    activations' dtype (another dtype changes the output's dtype in torch); False otherwise."""
    if type(norm) is torch.nn.RMSNorm and tuple(norm.normalized_shape) == (inner_dim,):
        weight = norm.weight
        if weight is None or (tuple(weight.shape) == (inner_dim,) and weight.dtype == dtype):
            return weight, (norm.eps if norm.eps is not None else torch.finfo(dtype).eps)
    return False


def _wan_tables(rotary, n: int, head_dim: int):
    """(cos, sin) [N, D/2] as Wan's rotation reads them (``freqs_cos[..., 0::2]``, ``freqs_sin[..., 1::2]``
    of [1, N, 1, D] tables); None for no tables; False for another form."""
    if rotary is None:
        return None
    if not (isinstance(rotary, (tuple, list)) and len(rotary) == 2
            and all(isinstance(t, torch.Tensor) and tuple(t.shape) == (1, n, 1, head_dim) for t in rotary)):
        return False
    cos, sin = rotary[0][0, :, 0, 0::2], rotary[1][0, :, 0, 1::2]
    if cos.dtype != sin.dtype or cos.dtype not in (torch.float32, torch.float64, *_HALF):
        return False
    return cos, sin


def wan_call(original, session, attn, args, kwargs):
    """WanAttnProcessor.__call__ (or SkyReels-V2's copy of it) with the Q/K RMSNorms (and the rotary embeddings)
    fused; None where not applicable."""
    for path, module in _PROCESSORS.items():
        a = _arguments(original, path, attn, args, kwargs)
        if a is not None:
            break
    if a is None:
        return None
    # under context parallelism diffusers' dispatcher splits the attention over the ranks; else it is routed here
    native = _native_dispatch(original)
    parallel = None if native else _cp_dispatch(original, session, sparse=a.get("encoder_hidden_states") is None)
    if parallel is None and not native:
        return None
    from ..kernels.triton_heads_rms_rope import heads_rms_norm_rope

    _get_qkv_projections = importlib.import_module(f"diffusers.models.transformers.{module}")._get_qkv_projections

    hidden_states, encoder_hidden_states = a.get("hidden_states"), a.get("encoder_hidden_states")
    rotary = a.get("rotary_emb")
    if a.get("attention_mask") is not None or getattr(attn, "add_k_proj", None) is not None:
        return None  # a mask, or I2V's image K/V: the stock path
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 3:
        return None
    if encoder_hidden_states is not None and (not isinstance(encoder_hidden_states, torch.Tensor)
                                              or encoder_hidden_states.dim() != 3 or rotary is not None):
        return None  # (the model rotates only in self-attention)
    weight, dtype = getattr(attn.to_q, "weight", None), hidden_states.dtype
    if not _kernel_can_run(weight, hidden_states) or dtype != weight.dtype:
        return None
    heads, inner_dim = attn.heads, getattr(attn, "inner_dim", None)
    if not isinstance(inner_dim, int) or inner_dim % heads or getattr(attn, "kv_inner_dim", None) != inner_dim:
        return None
    head_dim = inner_dim // heads
    norms = [_heads_rms_params(getattr(attn, n, None), inner_dim, dtype) for n in ("norm_q", "norm_k")]
    tables = _wan_tables(rotary, hidden_states.shape[1], head_dim)
    if any(n is False for n in norms) or tables is False or head_dim % 2:
        return None

    if encoder_hidden_states is None and not getattr(attn, "fused_projections", False):
        query, key, value = qkv_projections(attn, hidden_states)  # (with FP8 linears: one GEMM)
    else:
        query, key, value = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
    if any(t.dtype != dtype for t in (query, key, value)):
        return None
    query, key, value = (t.unflatten(2, (heads, head_dim)) for t in (query, key, value))
    query = heads_rms_norm_rope(query, norms[0], tables)
    key = heads_rms_norm_rope(key, norms[1], tables)
    if parallel is not None and encoder_hidden_states is None:  # (diffusers splits self-attention only)
        out = parallel(query, key, value).flatten(2, 3).to(dtype)
    else:
        hnd = lambda t: t.transpose(1, 2)  # [B, N, H, D] -> the [B, H, N, D] view the kernels and SDPA take
        rows = None
        if fp8_out.wanted(attn.to_out[0], query.shape[0] * query.shape[1]):
            rows = fp8_out.attention(session, hnd(query), hnd(key), hnd(value))
        if rows is not None:  # an e4m3 output for the FP8 projection (patch/fp8_out.py)
            return attn.to_out[1](fp8_out.project(attn.to_out[0], rows))
        out = session.route((hnd(query), hnd(key), hnd(value)),
                            {"attn_mask": None, "dropout_p": 0.0, "is_causal": False})
        out = out.transpose(1, 2).flatten(2, 3).to(dtype)
    return attn.to_out[1](attn.to_out[0](out))
