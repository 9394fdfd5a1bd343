"""Fused replacements for the work a processor does around attention, used by the patch in eager mode.

CogVideoX: its processor normalises Q and K (LayerNorm over the head dim) and rotates the video tokens
(``apply_rotary_emb``), about a dozen eager kernels over fp32 copies of Q and K per layer: ~0.2 s of a
CogVideoX-5b step on an H200 (bench/results/archive/model-step-cogvideox-5b-profile-*.json), more than the
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

SD3/SD3.5, Flux and HunyuanVideo: the same idea for their joint attention, in `joint`.

CogVideoX's blocks with their element-wise work fused: three `residual_norm` passes per stream.

diffusers' ``CogVideoXBlock`` normalises the video and the text stream with one affine LayerNorm
(``CogVideoXLayerNormZero``: its linear makes shift, scale and gate of both streams), modulates, adds the gated
attention output, normalises again, runs the feed-forward over the concatenated streams and adds its gated
halves back: per stream about a dozen bf16 kernels over the hidden state. Here, per stream:

    n = LN(x)·(1+scale)+shift                                  -> attention
    x = x + attn·gate;  n = LN(x)·(1+scale2)+shift2            -> ff(cat(text, video))   (one pass)
    x = x + ff[stream]·gate2                                                             (one pass)

Values: the stock ops round the normalised row and every intermediate to bf16, the passes compute in fp32 and
round once (tests/patch/families/test_fused_blocks_cogvideox.py bounds the difference against an fp32 run).
Norms without affine weights or of another kind, fp32 models, compile, autograd and CPU outside the interpreter take the
stock forward.
"""

from __future__ import annotations

import torch

from sagegen.patch import fp8_handoff as fp8_out
from sagegen.patch.families import sd3 as _sd3
from sagegen.patch.fusion.prologue import _arguments, _kernel_can_run, _rope_pair, qkv_projections
from sagegen.patch.fusion.prologue import diffusers_class
from sagegen.patch.family_table import FamilyCode, register


def _layer_norm_params(norm, head_dim: int):
    """(weight, bias, eps) of an affine nn.LayerNorm over the head dim; None for no norm; False otherwise."""
    if norm is None:
        return None
    if (type(norm) is torch.nn.LayerNorm and tuple(norm.normalized_shape) == (head_dim,)
            and norm.weight is not None and norm.bias is not None):
        return norm.weight, norm.bias, norm.eps
    return False


def cogvideox_call(original, session, attn, args, kwargs):
    """CogVideoXAttnProcessor2_0.__call__ with Q/K norm and rotary embeddings fused; None where not applicable."""
    from sagegen.kernels.triton_qk_prologue import layer_norm_rope

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
    query, key, value = qkv_projections(attn, hidden_states)
    query, key, value = (t.view(batch_size, -1, heads, head_dim).transpose(1, 2) for t in (query, key, value))
    query = layer_norm_rope(query, norm_q, rope, text_len)
    key = layer_norm_rope(key, norm_k, None if attn.is_cross_attention else rope, text_len)
    fp8 = fp8_out.wanted(attn.to_out[0], batch_size * hidden_states.shape[1])
    rows = fp8_out.attention(session, query, key, value) if fp8 else None
    if rows is not None:  # an e4m3 output for the FP8 projection (patch/fp8_out.py)
        hidden_states = attn.to_out[1](fp8_out.project(attn.to_out[0], rows))
    else:
        hidden_states = session.route((query, key, value), {"attn_mask": None, "dropout_p": 0.0,
                                                            "is_causal": False})
        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, heads * head_dim)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
    encoder_hidden_states, hidden_states = hidden_states.split(
        [text_len, hidden_states.size(1) - text_len], dim=1)
    return hidden_states, encoder_hidden_states


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


register(FamilyCode("cogvideox", prologue=cogvideox_call, blocks=((fusable, fused_forward),)))
