"""HunyuanVideo-1.5's main-block joint attention with a key-padding mask instead of a query x key mask.

diffusers' ``HunyuanVideo15AttnProcessor2_0`` turns the text mask into ``m[i] & m[j]`` over the joint sequence
[video, text], a boolean [B, 1, S, S] tensor built on every call (S ~ 112k at 720p x 121 frames: ~12.5 GB per
call and sample), and the attention backend then gets a dense 4-D mask. `key_mask_call` computes the same
thing from a key mask [B, 1, 1, S]: a valid query attends to the valid keys, as in the model; a padding query
(every key masked in the model, output 0 on diffusers' backends and sagegen's) gets its output zeroed after
the attention. The projections, norms, rotary embedding and output projections are the model's own modules,
called in the same order, so on any one backend the result equals the stock processor's wherever that backend
gives the same output for a broadcast key mask as for the expanded square mask (sagegen's backend reduces the
square mask to that key mask itself, in eager mode).

Used by `sagegen.patch` (the backend route runs `key_mask_call` with the original processor object as
``self``, so nothing is swapped on the model and `unpatch` has nothing extra to undo) and by
``sagegen.parallel`` (`KeyMaskProcessor` under context parallelism, where the key mask is also what makes a
rank's local mask correct). Imports diffusers.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15AttnProcessor2_0

from sagegen.patch import fp8_handoff as fp8_out
from sagegen.patch.fusion.prologue import split_segments
from sagegen.patch.rebind import call_function

_SAGEGEN_SESSION = None  # the patch session in the backend route's copy (its FP8 output projection)


def _project(x: torch.Tensor, heads: int, projections, norms) -> list[torch.Tensor]:
    """[B, S, C] -> q, k, v [B, S, H, D], each normalised by its norm (None: none)."""
    out = []
    for proj, norm in zip(projections, norms):
        t = proj(x).unflatten(2, (heads, -1))
        out.append(norm(t) if norm is not None else t)
    return out


def key_mask_call(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                  image_rotary_emb=None):
    """``HunyuanVideo15AttnProcessor2_0.__call__`` with a key mask [B, 1, 1, S] and padding queries zeroed
    afterwards (see the module doc). ``self`` is any object with ``_attention_backend`` and
    ``_parallel_config`` (the stock processor or `KeyMaskProcessor`)."""
    q, k, v = _project(hidden_states, attn.heads, (attn.to_q, attn.to_k, attn.to_v),
                       (attn.norm_q, attn.norm_k, None))
    if image_rotary_emb is not None:             # rotary positions on the video tokens only
        q = apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
        k = apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
    n_text = 0
    if encoder_hidden_states is not None:
        n_text = encoder_hidden_states.shape[1]
        eq, ek, ev = _project(encoder_hidden_states, attn.heads,
                              (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj),
                              (attn.norm_added_q, attn.norm_added_k, None))
        q, k, v = torch.cat([q, eq], 1), torch.cat([k, ek], 1), torch.cat([v, ev], 1)
    valid = None
    if attention_mask is not None:               # text mask of the tokens held; video is always valid
        text = attention_mask.to(q.device).bool()
        valid = F.pad(text, (q.shape[1] - text.shape[1], 0), value=True)
    n_video, to_out = q.shape[1] - n_text, getattr(attn, "to_out", None)
    rows = None
    if n_text and to_out is not None:            # e4m3 for an FP8 output projection (patch/fp8_out.py)
        rows = fp8_out.backend_copy_attention(_SAGEGEN_SESSION, self, to_out[0], q, k, v,
                                              valid[:, None, None, :] if valid is not None else None,
                                              q.shape[0] * n_video)
    if rows is not None:
        text_out = fp8_out.dense(fp8_out.tokens(rows, slice(n_video, None)))
        if valid is not None:
            text_out = text_out * valid[:, n_video:, None].to(text_out.dtype)
        out = to_out[1](fp8_out.project(to_out[0], fp8_out.tokens(rows, slice(0, n_video))))
        if getattr(attn, "to_add_out", None) is not None:
            text_out = attn.to_add_out(text_out)
        return out, text_out
    out = dispatch_attention_fn(
        q, k, v, attn_mask=valid[:, None, None, :] if valid is not None else None, dropout_p=0.0,
        is_causal=False, backend=self._attention_backend, parallel_config=self._parallel_config,
        # under CP with sagegen's backend: the (video, text) lengths, so a Ulysses split attends in one
        # process's order (the text padding then stays a valid prefix of the keys)
        attention_kwargs=split_segments(self, q.shape[1] - n_text, n_text) if n_text else None)
    out = out.flatten(2, 3).to(q.dtype)
    if valid is not None:                        # a padding query sees no key in the model: output 0
        out = out * valid[..., None].to(out.dtype)
    if not n_text:
        return out, encoder_hidden_states
    out, text_out = out[:, :-n_text], out[:, -n_text:]
    if getattr(attn, "to_out", None) is not None:
        out = attn.to_out[1](attn.to_out[0](out))
    if getattr(attn, "to_add_out", None) is not None:
        text_out = attn.to_add_out(text_out)
    return out, text_out


class KeyMaskProcessor(HunyuanVideo15AttnProcessor2_0):
    """A processor object running `key_mask_call`. A subclass of diffusers' processor, so that
    set_attention_backend and enable_parallelism treat it as the model's own (context parallelism installs
    it on the main blocks)."""

    __call__ = key_mask_call


def key_mask_call_for(processor) -> types.FunctionType | None:
    """`key_mask_call` where ``processor`` runs the stock ``HunyuanVideo15AttnProcessor2_0.__call__`` (the
    class itself or a subclass that keeps its ``__call__``); None for any other processor, which then runs
    its own ``__call__``."""
    return key_mask_call if call_function(processor) is HunyuanVideo15AttnProcessor2_0.__call__ else None
