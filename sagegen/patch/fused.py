"""Fused replacements for the work a processor does around attention, used by the patch in eager mode.

CogVideoX: its processor normalises Q and K (LayerNorm over the head dim) and rotates the video tokens
(``apply_rotary_emb``), about a dozen eager kernels over fp32 copies of Q and K per layer: ~0.2 s of a
CogVideoX-5b step on an H200 (bench/results/model-step-cogvideox-5b-profile-*.json), more than the
quantization pass. `cogvideox_call` runs the same processor with those steps as one Triton pass
(`kernels.triton_qk_prologue`) and the attention routed as usual; everything else is diffusers' code path
step for step. It answers None (the caller then runs the wrapped original) for anything it does not
reproduce exactly: another processor class, an attention mask, norms other than an affine LayerNorm over the
head dim, rotary embeddings of another form, fp32 models, or tensors the kernel cannot run on.
Under torch.compile the original runs (inductor fuses those elementwise steps itself).
"""

from __future__ import annotations

import inspect

import torch

from ..api import triton_interpret

_HALF = (torch.float16, torch.bfloat16)


def _layer_norm_params(norm, head_dim: int):
    """(weight, bias, eps) of an affine nn.LayerNorm over the head dim; None for no norm; False otherwise."""
    if norm is None:
        return None
    if (type(norm) is torch.nn.LayerNorm and tuple(norm.normalized_shape) == (head_dim,)
            and norm.weight is not None and norm.bias is not None):
        return norm.weight, norm.bias, norm.eps
    return False


def _rope_pair(rope, n_rot: int, head_dim: int):
    """(cos, sin) as apply_rotary_emb(use_real=True) takes them, [n_rot, head_dim] each; None; or False."""
    if rope is None:
        return None
    if (isinstance(rope, (tuple, list)) and len(rope) == 2 and all(isinstance(t, torch.Tensor) for t in rope)
            and all(tuple(t.shape) == (n_rot, head_dim) for t in rope)):
        return rope[0], rope[1]
    return False


def cogvideox_call(original, session, attn, args, kwargs):
    """CogVideoXAttnProcessor2_0.__call__ with Q/K norm and rotary embeddings fused; None where not applicable."""
    from ..kernels.triton_qk_prologue import layer_norm_rope

    try:
        from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0
    except ImportError:
        return None
    if type(original) is not CogVideoXAttnProcessor2_0:  # exactly diffusers' class: its code path is mirrored
        return None
    try:
        bound = inspect.signature(type(original).__call__).bind(original, attn, *args, **kwargs)
    except TypeError:
        return None
    a = bound.arguments
    hidden_states, encoder_hidden_states = a.get("hidden_states"), a.get("encoder_hidden_states")
    if a.get("attention_mask") is not None or not isinstance(hidden_states, torch.Tensor):
        return None
    if not isinstance(encoder_hidden_states, torch.Tensor) or hidden_states.dim() != 3:
        return None
    weight, out_features = getattr(attn.to_q, "weight", None), getattr(attn.to_k, "out_features", None)
    if not isinstance(weight, torch.Tensor) or not isinstance(out_features, int):
        return None  # projections that are not plain linear layers: the stock path
    if weight.dtype not in _HALF or not (hidden_states.is_cuda or triton_interpret()):
        return None
    heads = attn.heads
    head_dim = out_features // heads
    text_len = encoder_hidden_states.size(1)
    norm_q, norm_k = _layer_norm_params(attn.norm_q, head_dim), _layer_norm_params(attn.norm_k, head_dim)
    rope = _rope_pair(a.get("image_rotary_emb"), hidden_states.size(1), head_dim)
    if norm_q is False or norm_k is False or rope is False or (rope is None and norm_q is None and norm_k is None):
        return None

    hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
    batch_size = hidden_states.shape[0]
    query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
    query, key, value = (t.view(batch_size, -1, heads, head_dim).transpose(1, 2) for t in (query, key, value))
    query = layer_norm_rope(query, norm_q, rope, text_len)
    key = layer_norm_rope(key, norm_k, None if attn.is_cross_attention else rope, text_len)
    hidden_states = session.route((query, key, value), {"attn_mask": None, "dropout_p": 0.0, "is_causal": False})
    hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, heads * head_dim)
    hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
    encoder_hidden_states, hidden_states = hidden_states.split(
        [text_len, hidden_states.size(1) - text_len], dim=1)
    return hidden_states, encoder_hidden_states
