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

from sagegen.api import triton_interpret
from sagegen.patch import fp8_handoff as fp8_out
from sagegen.patch.fusion.prologue import (_HALF, TEXT_LEN, _arguments, _cp_dispatch, _joint_attention, _kernel_can_run,
                                           _native_dispatch, _rope_pair, qkv_projections)


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


def sd3_call(original, session, attn, args, kwargs):
    """JointAttnProcessor2_0.__call__ with the Q/K RMSNorms written into joint buffers (no concatenations);
    None where not applicable."""
    a = _arguments(original, "diffusers.models.attention_processor.JointAttnProcessor2_0", attn, args, kwargs)
    if a is None:  # (its attention_mask is ignored below, as the stock processor ignores it)
        return None
    hidden_states, encoder_hidden_states = a.get("hidden_states"), a.get("encoder_hidden_states")
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 3:
        return None
    if encoder_hidden_states is not None and (not isinstance(encoder_hidden_states, torch.Tensor)
                                              or encoder_hidden_states.dim() != 3):
        return None
    weight, inner_dim = getattr(attn.to_q, "weight", None), getattr(attn.to_k, "out_features", None)
    dtype = hidden_states.dtype
    if not isinstance(inner_dim, int) or not _kernel_can_run(weight, hidden_states) or dtype != weight.dtype:
        return None
    heads = attn.heads
    head_dim = inner_dim // heads
    names = ("norm_q", "norm_k") + (("norm_added_q", "norm_added_k") if encoder_hidden_states is not None else ())
    norms = [_diffusers_rms_params(getattr(attn, n, None), head_dim, dtype) for n in names]
    if any(n is False for n in norms):
        return None

    n_img = hidden_states.shape[1]
    parts = [(qkv_projections(attn, hidden_states), slice(0, n_img), norms[:2], None)]
    if encoder_hidden_states is not None:
        parts.append(((attn.add_q_proj(encoder_hidden_states), attn.add_k_proj(encoder_hidden_states),
                       attn.add_v_proj(encoder_hidden_states)), slice(n_img, None), norms[2:], None))
    fp8 = fp8_out.wanted(attn.to_out[0], hidden_states.shape[0] * n_img)
    out = _joint_attention(session, parts, heads, head_dim, round_before_weight=True, fp8_out=fp8)
    if encoder_hidden_states is not None:
        out, encoder_out = fp8_out.tokens(out, slice(0, n_img)), fp8_out.tokens(out, slice(n_img, None))
        encoder_out = fp8_out.dense(encoder_out)
        if not attn.context_pre_only:
            encoder_out = attn.to_add_out(encoder_out)
    out = attn.to_out[1](fp8_out.project(attn.to_out[0], out))
    return (out, encoder_out) if encoder_hidden_states is not None else out


def _torch_rms_params(norm, head_dim: int, dtype: torch.dtype):
    """(weight or None, eps) of a torch.nn.RMSNorm over the head dim; None for no norm; False otherwise."""
    if norm is None:
        return None
    if type(norm) is torch.nn.RMSNorm and tuple(norm.normalized_shape) == (head_dim,):
        weight = norm.weight
        if weight is None or tuple(weight.shape) == (head_dim,):
            return weight, (norm.eps if norm.eps is not None else torch.finfo(dtype).eps)
    return False


def flux_call(original, session, attn, args, kwargs):
    """FluxAttnProcessor.__call__ with Q/K RMSNorms and rotary embeddings written into joint buffers (no
    concatenations, no fp32 copies); None where not applicable."""
    a = _arguments(original, "diffusers.models.transformers.transformer_flux.FluxAttnProcessor", attn, args, kwargs)
    if a is None:
        return None
    parallel = _parallel_route(original, session)
    if parallel is False:
        return None
    from diffusers.models.transformers.transformer_flux import _get_qkv_projections
    hidden_states, encoder_hidden_states = a.get("hidden_states"), a.get("encoder_hidden_states")
    if a.get("attention_mask") is not None or not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 3:
        return None
    joint_text = getattr(attn, "added_kv_proj_dim", None) is not None
    if joint_text != (encoder_hidden_states is not None):
        return None  # shapes the stock processor itself does not combine this way
    if joint_text and (not isinstance(encoder_hidden_states, torch.Tensor) or encoder_hidden_states.dim() != 3):
        return None
    dtype, head_dim = hidden_states.dtype, getattr(attn, "head_dim", None)
    if dtype not in _HALF or not isinstance(head_dim, int) or head_dim % 2 or not (
            hidden_states.is_cuda or triton_interpret()):
        return None
    names = ("norm_q", "norm_k") + (("norm_added_q", "norm_added_k") if joint_text else ())
    norms = [_torch_rms_params(getattr(attn, n, None), head_dim, dtype) for n in names]
    if any(n is False for n in norms):
        return None
    n_img = hidden_states.shape[1]
    n_txt = encoder_hidden_states.shape[1] if joint_text else 0
    total = n_txt + n_img
    rope = _rope_pair(a.get("image_rotary_emb"), total, head_dim)
    if rope is False:
        return None

    if getattr(attn, "fused_projections", False):
        projections = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
    else:  # diffusers' unfused projections, the image's as one FP8 GEMM where the patch stacked them
        e = encoder_hidden_states if joint_text else None
        projections = qkv_projections(attn, hidden_states) + (
            (attn.add_q_proj(e), attn.add_k_proj(e), attn.add_v_proj(e)) if e is not None else (None,) * 3)
    if any(t is not None and t.dtype != dtype for t in projections):
        return None
    heads = projections[0].shape[-1] // head_dim
    parts = [(projections[:3], slice(n_txt, None), norms[:2])]
    if joint_text:
        parts.append((projections[3:], slice(0, n_txt), norms[2:]))
    parts = [(qkv, rows, n, (rope[0][rows], rope[1][rows]) if rope is not None else None) for qkv, rows, n in parts]
    segments = None
    if parallel is not None and not joint_text:  # a single block's [text, image] rows (`fused_blocks_flux`)
        text_len = attn.__dict__.get(TEXT_LEN)
        segments = (text_len, n_img - text_len) if isinstance(text_len, int) and 0 < text_len < n_img else None
    # (a single block's output goes to its proj_out with the MLP's: bf16)
    fp8 = joint_text and fp8_out.wanted(attn.to_out[0], hidden_states.shape[0] * n_img)
    out = _joint_attention(session, parts, heads, head_dim, parallel=parallel, segments=segments,
                           per_channel_rope=True, fp8_out=fp8)
    if not joint_text:
        return out
    if isinstance(out, fp8_out.Fp8Rows):
        encoder_out = fp8_out.dense(fp8_out.tokens(out, slice(0, n_txt)))
        out = attn.to_out[1](fp8_out.project(attn.to_out[0], fp8_out.tokens(out, slice(n_txt, None))))
        return out, attn.to_add_out(encoder_out)
    encoder_out, out = out.split_with_sizes([n_txt, n_img], dim=1)
    out = attn.to_out[1](attn.to_out[0](out.contiguous()))
    return out, attn.to_add_out(encoder_out.contiguous())


def hunyuan_call(original, session, attn, args, kwargs):
    """HunyuanVideoAttnProcessor2_0.__call__ (dual- and single-stream blocks) with the Q/K RMSNorms and the
    video tokens' rotary embeddings written into joint buffers; None where not applicable."""
    a = _arguments(original, "diffusers.models.transformers.transformer_hunyuan_video.HunyuanVideoAttnProcessor2_0",
                   attn, args, kwargs)
    if a is None:
        return None
    parallel = _parallel_route(original, session)
    if parallel is False:
        return None
    hidden_states, encoder_hidden_states = a.get("hidden_states"), a.get("encoder_hidden_states")
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 3:
        return None
    if not isinstance(encoder_hidden_states, torch.Tensor) or encoder_hidden_states.dim() != 3:
        return None  # (both block kinds of the model pass the text)
    out_features = getattr(attn.to_q, "out_features", None)
    weight = getattr(attn.to_q, "weight", None)
    dtype = hidden_states.dtype
    if not isinstance(out_features, int) or not _kernel_can_run(weight, hidden_states) or dtype != weight.dtype:
        return None
    heads = attn.heads
    head_dim = out_features // heads
    dual = attn.add_q_proj is not None
    names = ("norm_q", "norm_k") + (("norm_added_q", "norm_added_k") if dual else ())
    norms = [_diffusers_rms_params(getattr(attn, n, None), head_dim, dtype) for n in names]
    n_vid = hidden_states.shape[1]
    rope = _rope_pair(a.get("image_rotary_emb"), n_vid, head_dim)
    if any(n is False for n in norms) or rope is False or head_dim % 2:
        return None

    vid, txt = slice(0, n_vid), slice(n_vid, None)
    if dual:
        parts = [(qkv_projections(attn, hidden_states), vid, norms[:2], rope),
                 ((attn.add_q_proj(encoder_hidden_states), attn.add_k_proj(encoder_hidden_states),
                   attn.add_v_proj(encoder_hidden_states)), txt, norms[2:], None)]
    else:  # single-stream: one projection of the joint tokens; the video part rotated, the text part not
        joint_in = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        q, k, v = qkv_projections(attn, joint_in)
        parts = [((q[:, vid], k[:, vid], v[:, vid]), vid, norms, rope),
                 ((q[:, txt], k[:, txt], v[:, txt]), txt, norms, None)]
    mask = a.get("attention_mask")
    if parallel is None and isinstance(mask, torch.Tensor) and mask.dim() == 2:
        mask = mask[:, None, None, :]  # [B, S], as the routed dispatcher reads it (the CP dispatcher reads it too)
    to_out = getattr(attn, "to_out", None)
    fp8 = to_out is not None and fp8_out.wanted(to_out[0], hidden_states.shape[0] * n_vid)
    out = _joint_attention(session, parts, heads, head_dim, mask, parallel=parallel, round_before_weight=True,
                           per_channel_rope=True, fp8_out=fp8)
    out, encoder_out = fp8_out.tokens(out, vid), fp8_out.dense(fp8_out.tokens(out, txt))
    if to_out is not None:
        out = to_out[1](fp8_out.project(to_out[0], out))
    if getattr(attn, "to_add_out", None) is not None:
        encoder_out = attn.to_add_out(encoder_out)
    return out, encoder_out
