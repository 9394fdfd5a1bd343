"""Qwen-Image's joint attention with the Q/K RMSNorms and rotary embeddings fused, on the backend route.

diffusers' ``QwenDoubleStreamAttnProcessor2_0`` normalises Q and K of the image and the text tokens per head
(diffusers' RMSNorm, five eager kernels each), rotates them by complex multiplication over fp32 copies (four
more each) and concatenates Q, K and V along the tokens, text first: about 45 kernels around each attention
call, in a step whose eager time at 1328² (7k tokens) is mostly host time. `fused_call` writes the normalised
and rotated Q and K, and V, of both streams straight into joint [B, tokens, H, D] buffers, one Triton pass per
tensor (`kernels.triton_qk_prologue.rms_norm_rope`, which reads the complex table in place as one (cos, sin)
per channel pair, broadcast over the heads), and makes the stock processor's ``dispatch_attention_fn`` call.
The roundings are the eager ones (the norm rounded before and after its bf16 weight, the rotation in fp32 with
every product rounded; torch's complex kernel may contract one product into an FMA, a bf16 step on a few
elements).

The backend route (`dispatch_route.rebind_backend`) runs a copy of `fused_call` whose globals it sets:
``dispatch_attention_fn`` (the routed dispatcher), ``_SAGEGEN_SESSION`` (the patch session: `fuse_prologue`,
counters; None in the full-precision copy) and ``_STOCK_CALL`` (the routed copy of the stock ``__call__``).
The stock call runs whenever the fused one would not reproduce it: under torch.compile, on CPU without the
Triton interpreter, for fp32 models, another norm, table or mask form, or an attention override. Under
diffusers' context parallelism the fused call runs on the rank's tokens and table rows and hands the split its
(text, image) segments, so a Ulysses split attends in one process's token order. Imports diffusers.
"""

from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

from sagegen.patch import fp8_handoff as fp8_out
from sagegen.patch.fusion.prologue import _backend_copy_can_fuse, _joint_buffers, split_segments
from sagegen.patch.fusion.joint import _diffusers_rms_params
from sagegen.patch.rebind import equivalent_for

_SAGEGEN_SESSION = None  # set in the backend route's copy
_STOCK_CALL = None       # set in the backend route's copy


def _pair_tables(freqs, n: int, heads: int, head_dim: int):
    """(cos, sin) [n, H, D/2] views of a complex64 rotary table [n, D/2] (no copy); False for another form."""
    if not (isinstance(freqs, torch.Tensor) and freqs.dtype == torch.complex64
            and tuple(freqs.shape) == (n, head_dim // 2)):
        return False
    pairs = torch.view_as_real(freqs)  # [n, D/2, 2]: (real, imag) = (cos, sin)
    return tuple(pairs[..., i].unsqueeze(1).expand(n, heads, head_dim // 2) for i in (0, 1))


def _fusable(session, self, attn, hidden_states, encoder_hidden_states, attention_mask) -> bool:
    # (the session is passed in: this helper's globals are the module's, not the route's copy's)
    if attention_mask is not None or not (isinstance(encoder_hidden_states, torch.Tensor)
                                          and encoder_hidden_states.dim() == 3):
        return False  # (the stock call raises for a mask or a missing text stream)
    # under context parallelism: each rank's text and image tokens and table rows (diffusers' Qwen-Image plan)
    return _backend_copy_can_fuse(session, self, hidden_states, getattr(attn.to_q, "weight", None), split_ok=True)


def fused_call(self, attn, hidden_states, encoder_hidden_states=None, encoder_hidden_states_mask=None,
               attention_mask=None, image_rotary_emb=None):
    """``QwenDoubleStreamAttnProcessor2_0.__call__`` with the Q/K prologue fused (see the module doc).
    hidden_states [B, N_img, C], encoder_hidden_states [B, N_txt, C] -> (image [B, N_img, C], text [B, N_txt, C])."""
    args = (self, attn, hidden_states, encoder_hidden_states, encoder_hidden_states_mask, attention_mask,
            image_rotary_emb)
    if not _fusable(_SAGEGEN_SESSION, self, attn, hidden_states, encoder_hidden_states, attention_mask):
        return _STOCK_CALL(*args)
    dtype = hidden_states.dtype
    head_dim = attn.inner_dim // attn.heads
    names = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")
    norms = [_diffusers_rms_params(getattr(attn, n, None), head_dim, dtype) for n in names]
    if any(n is False for n in norms) or head_dim % 2:
        return _STOCK_CALL(*args)
    n_img, n_txt = hidden_states.shape[1], encoder_hidden_states.shape[1]
    image = (attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states))
    text = (attn.add_q_proj(encoder_hidden_states), attn.add_k_proj(encoder_hidden_states),
            attn.add_v_proj(encoder_hidden_states))
    heads = image[0].shape[-1] // head_dim  # (a rank's share of the heads under tensor parallelism)
    tables = (None, None)
    if image_rotary_emb is not None:
        img_freqs, txt_freqs = image_rotary_emb
        tables = (_pair_tables(img_freqs, n_img, heads, head_dim), _pair_tables(txt_freqs, n_txt, heads, head_dim))
    if (any(t.dtype != dtype or t.shape[-1] != heads * head_dim for t in image + text)
            or any(t is False for t in tables)):
        return _STOCK_CALL(*args)  # (the projections already ran: rare shapes only, never a supported model)

    mask = None
    if encoder_hidden_states_mask is not None:  # as the stock processor builds it: text mask, image all valid
        image_mask = torch.ones((hidden_states.shape[0], n_img), dtype=torch.bool, device=hidden_states.device)
        mask = torch.cat([encoder_hidden_states_mask, image_mask], dim=1)[:, None, None, :]
    q, k, v = _joint_buffers([(text, slice(0, n_txt), norms[2:], tables[1]),
                              (image, slice(n_txt, None), norms[:2], tables[0])],
                             heads, head_dim, round_before_weight=True)
    out = fp8_out.backend_copy_attention(_SAGEGEN_SESSION, self, attn.to_out[0], q, k, v, mask,
                                         hidden_states.shape[0] * n_img)
    if out is None:
        out = dispatch_attention_fn(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False,
                                    backend=self._attention_backend, parallel_config=self._parallel_config,
                                    attention_kwargs=split_segments(self, n_txt, n_img))
        out = out.flatten(2, 3).to(dtype)
    else:  # e4m3 for the FP8 output projection (fp8_out); the text rows dequantized for theirs
        img_out = fp8_out.project(attn.to_out[0], fp8_out.tokens(out, slice(n_txt, None)))
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)
        _SAGEGEN_SESSION.count("fused_qk_prologue")
        return img_out, attn.to_add_out(fp8_out.dense(fp8_out.tokens(out, slice(0, n_txt))))
    img_out = attn.to_out[0](out[:, n_txt:].contiguous())
    if len(attn.to_out) > 1:
        img_out = attn.to_out[1](img_out)
    _SAGEGEN_SESSION.count("fused_qk_prologue")
    return img_out, attn.to_add_out(out[:, :n_txt].contiguous())


def fused_call_for(processor):
    """`fused_call` where ``processor`` runs the stock ``QwenDoubleStreamAttnProcessor2_0.__call__`` (of the
    signature it mirrors); None otherwise (the processor's own ``__call__`` runs)."""
    return equivalent_for(processor, QwenDoubleStreamAttnProcessor2_0.__call__, fused_call)
