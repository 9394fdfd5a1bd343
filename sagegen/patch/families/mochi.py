"""Mochi's fused prologue: its processor RMS-normalises Q and K of the video and the text tokens, rotates the
video tokens in fp32, then runs attention once per sample over the video plus that sample's valid text tokens
(``torch.cat`` of Q, K and V, ``F.pad`` and ``torch.cat`` of the outputs): ~30 eager kernels and six copies of
Q/K/V-sized tensors per layer. `mochi_call` writes normalised and rotated Q and K straight into one joint
[B, video + text, H, D] buffer per tensor and runs one batched attention with the invalid text tokens as a
key-padding mask (a valid prefix of the joint keys, so the Gluon kernel skips them). Text queries past a
sample's valid tokens give zeros, as the stock per-sample padding does. Only text masks that keep a prefix of
the tokens are taken (the stock code compacts the valid tokens to the front; for a prefix that is the
identity); anything else runs the original. Mochi runs its attention eagerly under torch.compile as well
(a data-dependent ``nonzero`` breaks the graph), so this path serves compiled Mochi too.
"""

from __future__ import annotations

import torch

from sagegen.patch import fp8_handoff as fp8_out
from sagegen.patch.family_table import FamilyCode, register
from sagegen.patch.fusion.prologue import _arguments, _joint_attention, _kernel_can_run, _rope_pair, qkv_projections
from sagegen.kernels.spec import value_checks_allowed


def _rms_norm_params(norm, head_dim: int):
    """(weight or None, eps) of diffusers' MochiRMSNorm over the head dim; None for no norm; False otherwise."""
    if norm is None:
        return None
    if (type(norm).__name__ == "MochiRMSNorm" and tuple(getattr(norm, "dim", ())) == (head_dim,)
            and isinstance(getattr(norm, "eps", None), float)):
        weight = getattr(norm, "weight", None)
        if weight is None or (isinstance(weight, torch.Tensor) and tuple(weight.shape) == (head_dim,)):
            return weight, norm.eps
    return False


def _prefix_lengths(mask: torch.Tensor, batch: int, text_len: int):
    """Valid text tokens per sample [B] when the mask [B, T] keeps a prefix of them; else None (one sync)."""
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (batch, text_len) or not value_checks_allowed():
        return None
    valid = mask != 0
    lengths = valid.sum(1)
    prefix = torch.arange(text_len, device=mask.device)[None, :] < lengths[:, None]
    return lengths if bool((valid == prefix).all()) else None


def mochi_call(original, session, attn, args, kwargs):
    """MochiAttnProcessor2_0.__call__ with Q/K norms and rotary embeddings fused into a joint buffer and one
    batched attention call; None where not applicable."""
    a = _arguments(original, "diffusers.models.attention_processor.MochiAttnProcessor2_0", attn, args, kwargs)
    if a is None:
        return None
    hidden_states, encoder_hidden_states = a.get("hidden_states"), a.get("encoder_hidden_states")
    if not (isinstance(hidden_states, torch.Tensor) and isinstance(encoder_hidden_states, torch.Tensor)
            and hidden_states.dim() == 3 and encoder_hidden_states.dim() == 3):
        return None
    out_features = getattr(attn.to_q, "out_features", None)
    if not isinstance(out_features, int) or not _kernel_can_run(getattr(attn.to_q, "weight", None), hidden_states):
        return None
    heads = attn.heads
    head_dim = out_features // heads
    batch, n_video, n_text = hidden_states.size(0), hidden_states.size(1), encoder_hidden_states.size(1)
    norms = [_rms_norm_params(getattr(attn, name, None), head_dim)
             for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k")]
    rope = _rope_pair(a.get("image_rotary_emb"), n_video, heads, head_dim // 2)
    if any(n is False for n in norms) or rope is False or head_dim % 2:
        return None
    lengths = _prefix_lengths(a.get("attention_mask"), batch, n_text)
    if lengths is None:
        return None

    device = hidden_states.device
    video = qkv_projections(attn, hidden_states)
    text = (attn.add_q_proj(encoder_hidden_states), attn.add_k_proj(encoder_hidden_states),
            attn.add_v_proj(encoder_hidden_states))
    text_valid = torch.arange(n_text, device=device)[None, :] < lengths[:, None].to(device)
    keys = torch.cat([torch.ones(batch, n_video, dtype=torch.bool, device=device), text_valid], dim=1)
    out = _joint_attention(session, [(video, slice(0, n_video), norms[:2], rope),
                                     (text, slice(n_video, None), norms[2:], None)],
                           heads, head_dim, keys[:, None, None, :],
                           fp8_out=fp8_out.wanted(attn.to_out[0], batch * n_video))
    hidden_states = fp8_out.tokens(out, slice(0, n_video))
    encoder_hidden_states = fp8_out.dense(fp8_out.tokens(out, slice(n_video, None)))
    encoder_hidden_states = encoder_hidden_states * text_valid[..., None].to(encoder_hidden_states.dtype)  # stock
    hidden_states = attn.to_out[1](fp8_out.project(attn.to_out[0], hidden_states))
    if hasattr(attn, "to_add_out"):
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
    return hidden_states, encoder_hidden_states


register(FamilyCode("mochi", prologue=mochi_call))
