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

from ..linear.shared import sharing
from . import fp8_out
from .fused_common import (_HALF, _arguments, _cp_dispatch, _diffusers_class, _kernel_can_run, _native_dispatch,
                           qkv_projections)

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
    layer = _layer(attn, dtype, hidden_states.shape[1], rotary)
    if layer is None:
        return None

    if encoder_hidden_states is None and not getattr(attn, "fused_projections", False):
        query, key, value = qkv_projections(attn, hidden_states)  # (with FP8 linears: one GEMM)
    else:
        query, key, value = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
    if any(t.dtype != dtype for t in (query, key, value)):
        return None
    return _attend(session, attn, layer, query, key, value, parallel if encoder_hidden_states is None else None)


def _layer(attn, dtype: torch.dtype, n_tokens: int, rotary):
    """(heads, head_dim, (Q norm, K norm), rotary tables) of a Wan attention module the fused call reproduces;
    None otherwise."""
    heads, inner_dim = attn.heads, getattr(attn, "inner_dim", None)
    if not isinstance(inner_dim, int) or inner_dim % heads or getattr(attn, "kv_inner_dim", None) != inner_dim:
        return None
    head_dim = inner_dim // heads
    norms = [_heads_rms_params(getattr(attn, n, None), inner_dim, dtype) for n in ("norm_q", "norm_k")]
    tables = _wan_tables(rotary, n_tokens, head_dim)
    if any(n is False for n in norms) or tables is False or head_dim % 2:
        return None
    return heads, head_dim, norms, tables


def _attend(session, attn, layer, query, key, value, parallel):
    """The fused Q/K norms (and rotation), the attention and the output projection, from the projections
    [B, N, H·D]; ``parallel``: diffusers' context-parallel dispatch (self-attention only) or None."""
    from ..kernels.triton_heads_rms_rope import heads_rms_norm_rope

    heads, head_dim, norms, tables = layer
    dtype = query.dtype
    query, key, value = (t.unflatten(2, (heads, head_dim)) for t in (query, key, value))
    query = heads_rms_norm_rope(query, norms[0], tables)
    key = heads_rms_norm_rope(key, norms[1], tables)
    if parallel is not None:
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


def _hooked(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` runs more than its class's forward: torch hooks (its own or global),
    diffusers' hook registry, or a forward set on the instance (accelerate)."""
    from torch.nn.modules import module as _torch_module

    return bool(module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__
                or getattr(module, "_diffusers_hook", None) is not None
                or _torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks)


def cross_attention_fp8(attn, encoder_hidden_states, x: torch.Tensor):
    """For a fused Wan block (`fused_blocks`) about to call ``attn``, its cross-attention, on the normalised
    hidden state of x's shape [B, S, C]: a function ``run(n_fp8, scales)`` that returns the module's output from
    that state's per-token FP8 copy (the norm's `residual_norm(fp8_out=True)`), where the patched processor would
    run this fused call with an FP8 Q projection anyway (Q is the norm's only reader: the quantization pass is
    gone, lab/NOTES.md v8.1). None wherever anything could differ: another processor or settings for the
    layer (full precision, another backend, context parallelism, an analysis override), hooks on the module or
    its Q projection, a Q projection that quantizes its input otherwise, I2V's image K/V, other norms."""
    processor = getattr(attn, "processor", None)
    session = getattr(processor, "_sage_session", None)
    if (session is None or session.family != "wan" or not session.fuse_qk_prologue
            or session.attention_override is not None or session.step_full_precision
            or processor._sage_full_precision or processor._sage_backend_fns is not None):
        return None
    original = processor._sage_original
    if not any(_diffusers_class(path) is type(original) for path in _PROCESSORS) or not _native_dispatch(original):
        return None
    to_q, dtype, rows = attn.to_q, x.dtype, x.shape[0] * x.shape[1]
    if (_hooked(attn) or _hooked(to_q) or getattr(attn, "add_k_proj", None) is not None
            or getattr(attn, "fused_projections", False) or not fp8_out.takes_fp8_rows(to_q, rows)):
        return None
    if not (isinstance(encoder_hidden_states, torch.Tensor) and encoder_hidden_states.dim() == 3
            and encoder_hidden_states.dtype == dtype and _kernel_can_run(to_q.weight, x)
            and all(getattr(getattr(attn, n, None), "weight", None) is not None
                    and getattr(attn, n).weight.dtype == dtype for n in ("to_q", "to_k", "to_v"))):
        return None
    layer = _layer(attn, dtype, x.shape[1], None)
    if layer is None:
        return None

    def run(n_fp8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        with sharing():  # (as the processor wrapper: K and V of one text state share one quantization)
            session.current_name = processor._sage_name
            query = to_q.forward_fp8(n_fp8, scales, dtype)
            key, value = attn.to_k(encoder_hidden_states), attn.to_v(encoder_hidden_states)
            out = _attend(session, attn, layer, query, key, value, None)
        session.count("processor_calls")
        session.count("fused_qk_prologue")
        session.count("cross_q_from_norm")
        return out

    return run
