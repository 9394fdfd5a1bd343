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

Mochi: its processor RMS-normalises Q and K of the video and the text tokens, rotates the video tokens in
fp32, then runs attention once per sample over the video plus that sample's valid text tokens
(``torch.cat`` of Q, K and V, ``F.pad`` and ``torch.cat`` of the outputs): ~30 eager kernels and six copies
of Q/K/V-sized tensors per layer. `mochi_call` writes normalised and rotated Q and K straight into one joint
[B, video + text, H, D] buffer per tensor and runs one batched attention with the invalid text tokens as a
key-padding mask (a valid prefix of the joint keys, so the Gluon kernel skips them). Text queries past a
sample's valid tokens give zeros, as the stock per-sample padding does. Only text masks that keep a prefix of
the tokens are taken (the stock code compacts the valid tokens to the front; for a prefix that is the
identity); anything else runs the original. Mochi runs its attention eagerly under torch.compile as well
(a data-dependent ``nonzero`` breaks the graph), so this path serves compiled Mochi too.

SD3/SD3.5, Flux and HunyuanVideo: the same idea for their joint attention, in `fused_joint`.
"""

from __future__ import annotations

import importlib
import inspect

import torch

from ..api import triton_interpret
from .rebind import native_active

_HALF = (torch.float16, torch.bfloat16)


def _arguments(original, cls_path: str, attn, args, kwargs):
    """The call's arguments by name when ``original`` is exactly diffusers' class ``cls_path`` (whose code
    path the fused call mirrors; a subclass may differ); None otherwise."""
    module, _, name = cls_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    if type(original) is not cls:
        return None
    try:
        return inspect.signature(cls.__call__).bind(original, attn, *args, **kwargs).arguments
    except TypeError:
        return None


def _native_dispatch(original) -> bool:
    """Whether a processor that calls diffusers' ``dispatch_attention_fn`` would run the native (SDPA) backend,
    the only one the patch routes: with another backend chosen, the fused call steps aside too."""
    return (getattr(original, "_attention_backend", None) is None
            and getattr(original, "_parallel_config", None) is None and native_active())


def _kernel_can_run(weight, hidden_states) -> bool:
    """Half-precision weights of a plain linear projection, on a GPU (or under the Triton interpreter)."""
    return (isinstance(weight, torch.Tensor) and weight.dtype in _HALF
            and (hidden_states.is_cuda or triton_interpret()))


def _layer_norm_params(norm, head_dim: int):
    """(weight, bias, eps) of an affine nn.LayerNorm over the head dim; None for no norm; False otherwise."""
    if norm is None:
        return None
    if (type(norm) is torch.nn.LayerNorm and tuple(norm.normalized_shape) == (head_dim,)
            and norm.weight is not None and norm.bias is not None):
        return norm.weight, norm.bias, norm.eps
    return False


def _rope_pair(rope, *shape: int):
    """(cos, sin), each of the given shape: [n_rot, head_dim] as apply_rotary_emb(use_real=True) takes them,
    or Mochi's [n_rot, heads, head_dim / 2]; None; or False."""
    if rope is None:
        return None
    if (isinstance(rope, (tuple, list)) and len(rope) == 2 and all(isinstance(t, torch.Tensor) for t in rope)
            and all(tuple(t.shape) == shape for t in rope)):
        return rope[0], rope[1]
    return False


def _joint_attention(session, parts, heads: int, head_dim: int, mask=None, **kernel_options) -> torch.Tensor:
    """One attention call over joint [B, tokens, H, D] Q/K/V buffers filled from ``parts``, each
    ((q, k, v) projections [B, n, H·D], its token slice, (norm_q, norm_k), rotary tables or None): Q and K
    normalised (and rotated) straight into place by `rms_norm_rope(**kernel_options)`, V copied (so no
    concatenations). Returns the attention output [B, tokens, H·D]."""
    from ..kernels.triton_qk_prologue import rms_norm_rope

    first = parts[0][0][0]
    total = sum(p[0][0].shape[1] for p in parts)
    joint = [torch.empty(first.shape[0], total, heads, head_dim, dtype=first.dtype, device=first.device)
             for _ in range(3)]
    hnd = lambda t: t.transpose(1, 2)  # [B, N, H, D] -> the [B, H, N, D] view the kernels and SDPA take
    for (q, k, v), rows, (norm_q, norm_k), table in parts:
        for src, norm, dst in ((q, norm_q, joint[0]), (k, norm_k, joint[1])):
            src = src.unflatten(-1, (heads, head_dim))
            if norm is None and table is None:
                dst[:, rows] = src
            else:
                rms_norm_rope(hnd(src), norm, table, out=hnd(dst[:, rows]), **kernel_options)
        joint[2][:, rows] = v.unflatten(-1, (heads, head_dim))
    out = session.route(tuple(hnd(t) for t in joint), {"attn_mask": mask, "dropout_p": 0.0, "is_causal": False})
    return out.transpose(1, 2).flatten(2, 3).to(first.dtype)


def cogvideox_call(original, session, attn, args, kwargs):
    """CogVideoXAttnProcessor2_0.__call__ with Q/K norm and rotary embeddings fused; None where not applicable."""
    from ..kernels.triton_qk_prologue import layer_norm_rope

    a = _arguments(original, "diffusers.models.attention_processor.CogVideoXAttnProcessor2_0", attn, args, kwargs)
    if a is None:
        return None
    hidden_states, encoder_hidden_states = a.get("hidden_states"), a.get("encoder_hidden_states")
    if a.get("attention_mask") is not None or not isinstance(hidden_states, torch.Tensor):
        return None
    if not isinstance(encoder_hidden_states, torch.Tensor) or hidden_states.dim() != 3:
        return None
    out_features = getattr(attn.to_k, "out_features", None)
    if not isinstance(out_features, int) or not _kernel_can_run(getattr(attn.to_q, "weight", None), hidden_states):
        return None  # projections that are not plain linear layers, fp32, CPU: the stock path
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


def call(processor, attn, args, kwargs):
    """The family's fused processor call for a patched processor (`processors.SageProcessorBase`), or None to
    run the original. Never with an attention override: an attention-free analysis run keeps diffusers' own
    code around attention, so it measures the stock model's non-attention time."""
    session = processor._sage_session
    from . import fused_joint

    fused = {"cogvideox": cogvideox_call, "mochi": mochi_call, "sd3": fused_joint.sd3_call,
             "flux": fused_joint.flux_call, "hunyuanvideo": fused_joint.hunyuan_call}.get(session.family)
    if fused is None or not session.fuse_qk_prologue or session.attention_override is not None:
        return None
    out = fused(processor._sage_original, session, attn, args, kwargs)
    if out is not None:
        session.count("processor_calls")
        session.count("fused_qk_prologue")
    return out


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
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (batch, text_len):
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
    video = (attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states))
    text = (attn.add_q_proj(encoder_hidden_states), attn.add_k_proj(encoder_hidden_states),
            attn.add_v_proj(encoder_hidden_states))
    text_valid = torch.arange(n_text, device=device)[None, :] < lengths[:, None].to(device)
    keys = torch.cat([torch.ones(batch, n_video, dtype=torch.bool, device=device), text_valid], dim=1)
    out = _joint_attention(session, [(video, slice(0, n_video), norms[:2], rope),
                                     (text, slice(n_video, None), norms[2:], None)],
                           heads, head_dim, keys[:, None, None, :])
    hidden_states, encoder_hidden_states = out.split_with_sizes((n_video, n_text), dim=1)
    encoder_hidden_states = encoder_hidden_states * text_valid[..., None].to(out.dtype)  # stock: zero padding
    hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
    if hasattr(attn, "to_add_out"):
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
    return hidden_states, encoder_hidden_states

