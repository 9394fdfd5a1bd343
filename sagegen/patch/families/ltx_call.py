"""LTX-Video's attention with the Q/K RMSNorms (across heads) and rotary embeddings fused, on the backend route.

diffusers' ``LTXVideoAttnProcessor`` normalises Q and K over all heads (``torch.nn.RMSNorm(H·D)``) and, in
self-attention, rotates them with fp32 tables of one (cos, sin) per channel [B, N, H·D] (``x·cos +
rotate(x)·sin`` over fp32 copies: about eight eager kernels per tensor). `fused_call` writes each normalised
(and rotated) tensor into an attention buffer in one Triton pass (`kernels.triton_heads_rms_rope`,
``per_channel_rope``), with the eager roundings, and otherwise makes exactly the stock processor's calls (the
text mask prepared by ``attn.prepare_attention_mask``, the same ``dispatch_attention_fn`` call).

As in `qwenimage`, the backend route runs a copy whose globals it sets (``dispatch_attention_fn``,
``_SAGEGEN_SESSION``, ``_STOCK_CALL``); the routed stock call runs under torch.compile, on CPU without the
Triton interpreter, for fp32 models, other norms or tables, or an attention override. Under context
parallelism the fused call runs on the rank's tokens and rows of the tables, as diffusers' plan splits them.
Imports diffusers.
"""

from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor

from sagegen.patch import fp8_handoff as fp8_out
from sagegen.patch.fusion.prologue import _backend_copy_can_fuse
from sagegen.patch.families.wan import _heads_rms_params
from sagegen.patch.rebind import equivalent_for

_SAGEGEN_SESSION = None  # set in the backend route's copy
_STOCK_CALL = None       # set in the backend route's copy


def _channel_tables(rope, shape: tuple[int, int, int]):
    """(cos, sin) fp32 [B, N, H·D] as LTX's apply_rotary_emb reads them; None; False for another form."""
    if rope is None:
        return None
    if (isinstance(rope, (tuple, list)) and len(rope) == 2
            and all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 and tuple(t.shape) == shape
                    for t in rope)):
        return rope[0], rope[1]
    return False


def fused_call(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
    """``LTXVideoAttnProcessor.__call__`` with the Q/K prologue fused (see the module doc).
    hidden_states [B, N, C] (encoder_hidden_states [B, M, C_text] for cross-attention) -> [B, N, C]."""
    session = _SAGEGEN_SESSION
    args = (self, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
    # under context parallelism each rank holds its tokens' rows of the rotary tables (diffusers' LTX plan)
    if not _backend_copy_can_fuse(session, self, hidden_states, getattr(attn.to_q, "weight", None), split_ok=True):
        return _STOCK_CALL(*args)
    context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
    heads, dtype = attn.heads, hidden_states.dtype
    inner = getattr(attn.to_q, "out_features", None)
    if not isinstance(inner, int) or inner % heads or getattr(attn.to_k, "out_features", None) != inner \
            or not isinstance(context, torch.Tensor) or context.dim() != 3 or (inner // heads) % 2:
        return _STOCK_CALL(*args)
    norms = [_heads_rms_params(getattr(attn, n, None), inner, dtype) for n in ("norm_q", "norm_k")]
    tables = _channel_tables(image_rotary_emb, (hidden_states.shape[0], hidden_states.shape[1], inner))
    if any(n is False for n in norms) or tables is False or (tables is not None and context is not hidden_states):
        return _STOCK_CALL(*args)

    from sagegen.kernels.triton_heads_rms_rope import heads_rms_norm_rope

    batch_size, sequence_length = context.shape[:2]
    if attention_mask is not None:  # as the stock processor prepares it
        attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
        attention_mask = attention_mask.view(batch_size, heads, -1, attention_mask.shape[-1])
    query, key, value = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
    if any(t.dtype != dtype for t in (query, key, value)):
        return _STOCK_CALL(*args)  # (the projections already ran: never a supported model)
    query, key, value = (t.unflatten(2, (heads, -1)) for t in (query, key, value))
    query = heads_rms_norm_rope(query, norms[0], tables, per_channel_rope=True)
    key = heads_rms_norm_rope(key, norms[1], tables, per_channel_rope=True)
    session.count("fused_qk_prologue")
    rows = fp8_out.backend_copy_attention(session, self, attn.to_out[0], query, key, value, attention_mask,
                                          query.shape[0] * query.shape[1])
    if rows is not None:  # e4m3 for the FP8 output projection (fp8_out)
        return attn.to_out[1](fp8_out.project(attn.to_out[0], rows))
    out = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
                                backend=self._attention_backend, parallel_config=self._parallel_config)
    out = out.flatten(2, 3).to(query.dtype)
    return attn.to_out[1](attn.to_out[0](out))


def fused_call_for(processor):
    """`fused_call` where ``processor`` runs the stock ``LTXVideoAttnProcessor.__call__`` (of the signature it mirrors);
    None otherwise (the processor's own ``__call__`` runs)."""
    return equivalent_for(processor, LTXVideoAttnProcessor.__call__, fused_call)
