"""CogVideoX's blocks with their element-wise work fused: three `residual_norm` passes per stream.

diffusers' ``CogVideoXBlock`` normalises the video and the text stream with one affine LayerNorm
(``CogVideoXLayerNormZero``: its linear makes shift, scale and gate of both streams), modulates, adds the gated
attention output, normalises again, runs the feed-forward over the concatenated streams and adds its gated
halves back: per stream about a dozen bf16 kernels over the hidden state. Here, per stream:

    n = LN(x)·(1+scale)+shift                                  -> attention
    x = x + attn·gate;  n = LN(x)·(1+scale2)+shift2            -> ff(cat(text, video))   (one pass)
    x = x + ff[stream]·gate2                                                             (one pass)

Values: the stock ops round the normalised row and every intermediate to bf16, the passes compute in fp32 and
round once (tests/test_fused_blocks_cogvideox.py bounds the difference against an fp32 run). Norms without
affine weights or of another kind, fp32 models, compile, autograd and CPU outside the interpreter take the
stock forward.
"""

from __future__ import annotations

import torch

from sagegen.patch.families import sd3 as _sd3
from sagegen.patch.fusion.prologue import diffusers_class


def _cls():
    return diffusers_class("diffusers.models.transformers.cogvideox_transformer_3d", "CogVideoXBlock")


def _norm_zero(norm, dim: int) -> bool:
    from diffusers.models.normalization import CogVideoXLayerNormZero

    ln = getattr(norm, "norm", None)
    return (type(norm) is CogVideoXLayerNormZero and type(ln) is torch.nn.LayerNorm
            and tuple(ln.normalized_shape) == (dim,) and ln.weight is not None and ln.bias is not None)


def fusable(block) -> bool:
    """Exactly diffusers' CogVideoXBlock with affine LayerNorms in both CogVideoXLayerNormZero."""
    cls = _cls()
    if cls is None or type(block) is not cls:
        return False
    dim = getattr(getattr(block.norm1, "norm", None), "normalized_shape", (None,))[0]
    return isinstance(dim, int) and _norm_zero(block.norm1, dim) and _norm_zero(block.norm2, dim)


def _modulation(norm, temb):
    """shift, scale, gate (video) and the text's, each [B, 1, C], as CogVideoXLayerNormZero splits them."""
    return [p[:, None, :] for p in norm.linear(norm.silu(temb)).chunk(6, dim=1)]


def fused_forward(self, stock, can_run, residual_norm, hidden_states, encoder_hidden_states, temb,
                  image_rotary_emb=None, attention_kwargs=None):
    """`CogVideoXBlock.forward` through `residual_norm` passes."""
    if not _sd3.joint_inputs_ok(can_run, hidden_states, encoder_hidden_states, temb):
        return stock(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb, attention_kwargs)
    text_len = encoder_hidden_states.size(1)
    x, c = hidden_states.contiguous(), encoder_hidden_states.contiguous()
    ln1, ln2 = self.norm1.norm, self.norm2.norm
    shift, scale, gate, c_shift, c_scale, c_gate = _modulation(self.norm1, temb)
    _, n = residual_norm(x, weight=ln1.weight, bias=ln1.bias, eps=ln1.eps, scale=scale, shift=shift)
    _, cn = residual_norm(c, weight=ln1.weight, bias=ln1.bias, eps=ln1.eps, scale=c_scale, shift=c_shift)
    attn, c_attn = self.attn1(hidden_states=n, encoder_hidden_states=cn, image_rotary_emb=image_rotary_emb,
                              **(attention_kwargs or {}))
    shift, scale, gate_ff, c_shift, c_scale, c_gate_ff = _modulation(self.norm2, temb)
    x, n = residual_norm(x, attn, gate, weight=ln2.weight, bias=ln2.bias, eps=ln2.eps, scale=scale, shift=shift)
    c, cn = residual_norm(c, c_attn, c_gate, weight=ln2.weight, bias=ln2.bias, eps=ln2.eps, scale=c_scale,
                          shift=c_shift)
    ff = self.ff(torch.cat([cn, n], dim=1))
    x, _ = residual_norm(x, ff[:, text_len:], gate_ff, norm=False)
    c, _ = residual_norm(c, ff[:, :text_len], c_gate_ff, norm=False)
    return x, c
