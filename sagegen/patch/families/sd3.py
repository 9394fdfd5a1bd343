"""SD3 / SD3.5 joint blocks' element-wise work fused: one `residual_norm` pass per norm and residual.

diffusers' ``JointTransformerBlock.forward`` runs, per stream (image and text), a LayerNorm, the modulation
``* (1 + scale) + shift``, the gate product and the residual add as separate bf16 kernels around attention and
the feed-forward: about ten launches and passes over the hidden state per stream and block, ~20 ms of an
SD3.5-large FP8 step at 1024² on an H100 (lab/NOTES.md v5.4). The fused forward computes, per stream:

    n1 = LN(x)·(1+scale_msa)+shift_msa                       -> joint attention
    x = x + attn·gate_msa;   n2 = LN(x)·(1+scale_mlp)+shift_mlp  -> ff       (one pass)
    x = x + ff·gate_mlp                                                       (one pass)

The modulation vectors come from the block's own ``norm1`` / ``norm1_context`` linear (so FP8 or hooks on it
still apply). Values: the stock ops round every intermediate to bf16 ((1 + scale), the product, the sum); the
pass computes in fp32 and rounds once, so outputs differ from stock by bf16 rounding of intermediates
(tests/patch/families/test_fused_blocks_sd3.py bounds it). Blocks with dual attention (SD3.5-medium's first layers), the
last block (``context_pre_only``), a chunked feed-forward, other norm types, fp32 models, compile, autograd and
CPU outside the interpreter take the stock forward. `fused_blocks` swaps the class and puts it back.
"""

from __future__ import annotations

import importlib

import torch

from sagegen.patch import fp8_handoff as fp8_out
from sagegen.patch.family_table import FamilyCode, register
from sagegen.patch.fusion.joint import _diffusers_rms_params
from sagegen.patch.fusion.prologue import _arguments, _joint_attention, _kernel_can_run, qkv_projections

_SD3_BLOCK = ("diffusers.models.attention", "JointTransformerBlock")


def block_class():
    try:
        return getattr(importlib.import_module(_SD3_BLOCK[0]), _SD3_BLOCK[1])
    except (ImportError, AttributeError):
        return None


def _plain_norm(norm, dim: int) -> bool:
    return (type(norm) is torch.nn.LayerNorm and tuple(norm.normalized_shape) == (dim,)
            and norm.weight is None and norm.bias is None)


def _ada_zero(norm, dim: int) -> bool:
    from diffusers.models.normalization import AdaLayerNormZero

    return (type(norm) is AdaLayerNormZero and getattr(norm, "emb", None) is None and _plain_norm(norm.norm, dim)
            and isinstance(norm.linear, torch.nn.Module))


def fusable(block) -> bool:
    """Whether ``block`` is exactly diffusers' JointTransformerBlock in the form the fused forward reproduces."""
    cls = block_class()
    if cls is None or type(block) is not cls or block.use_dual_attention or block.context_pre_only:
        return False
    dim = getattr(block.norm2, "normalized_shape", (None,))[0]
    return (isinstance(dim, int) and _ada_zero(block.norm1, dim) and _ada_zero(block.norm1_context, dim)
            and _plain_norm(block.norm2, dim) and _plain_norm(block.norm2_context, dim))


def _modulation(norm, temb):
    """shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp as [B, 1, C] views (AdaLayerNormZero's)."""
    emb = norm.linear(norm.silu(temb))
    return [p.unsqueeze(1) for p in emb.chunk(6, dim=1)]


def fused_forward(self, stock, can_run, residual_norm, hidden_states, encoder_hidden_states, temb,
                  joint_attention_kwargs=None):
    """`JointTransformerBlock.forward` with the per-stream element-wise work in `residual_norm` passes."""
    if self._chunk_size is not None or not joint_inputs_ok(can_run, hidden_states, encoder_hidden_states, temb):
        return stock(self, hidden_states, encoder_hidden_states, temb, joint_attention_kwargs)
    return ada_zero_body(self, residual_norm, hidden_states, encoder_hidden_states, temb,
                         lambda n, cn: self.attn(hidden_states=n, encoder_hidden_states=cn,
                                                 **(joint_attention_kwargs or {})))


def joint_inputs_ok(can_run, hidden_states, encoder_hidden_states, temb) -> bool:
    return (can_run(hidden_states) and can_run(encoder_hidden_states) and isinstance(temb, torch.Tensor)
            and temb.ndim == 2 and hidden_states.dtype == temb.dtype)


def ada_zero_body(self, residual_norm, hidden_states, encoder_hidden_states, temb, attend, clip_fp16=False):
    """`joint_body` for the blocks laid out as SD3's (and Flux's double-stream one): AdaLayerNormZero ``norm1`` /
    ``norm1_context`` (their linear makes the six modulation vectors), plain ``norm2`` / ``norm2_context``,
    ``ff`` / ``ff_context``. ``clip_fp16``: clip the fp16 text stream at the end, as Flux's block does."""
    return joint_body(residual_norm, hidden_states, encoder_hidden_states, _modulation(self.norm1, temb),
                      _modulation(self.norm1_context, temb),
                      (self.norm1.norm.eps, self.norm1_context.norm.eps, self.norm2.eps, self.norm2_context.eps),
                      attend, self.ff, self.ff_context, clip_text=clip_fp16)


def joint_body(residual_norm, hidden_states, encoder_hidden_states, mods, c_mods, eps, attend, ff, ff_context, *,
               clip_text=False, clip_image=False):
    """A two-stream DiT block through `residual_norm` passes, three per stream:

        n = LN(x)·(1+scale)+shift -> attention;  x = x + attn·gate, n = LN(x)·(1+scale2)+shift2 -> ff;
        x = x + ff·gate2

    ``mods`` / ``c_mods``: (shift, scale, gate, shift2, scale2, gate2) of the image / text stream, each
    [B, 1, C]; ``eps``: the image and text first norms', then second norms'; ``attend(n, cn)`` returns
    (image, text[, an extra image residual, added after the feed-forward as Flux's IP adapter is])."""
    x, c = hidden_states.contiguous(), encoder_hidden_states.contiguous()
    shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = mods
    c_shift, c_scale, c_gate, c_shift_mlp, c_scale_mlp, c_gate_mlp = c_mods
    _, n = residual_norm(x, scale=scale, shift=shift, eps=eps[0])
    _, cn = residual_norm(c, scale=c_scale, shift=c_shift, eps=eps[1])
    attn, c_attn, *extra = attend(n, cn)
    x, n = residual_norm(x, attn, gate, scale=scale_mlp, shift=shift_mlp, eps=eps[2])
    x, _ = residual_norm(x, ff(n), gate_mlp, norm=False)
    if extra:
        x = x + extra[0]
    c, cn = residual_norm(c, c_attn, c_gate, scale=c_scale_mlp, shift=c_shift_mlp, eps=eps[3])
    c, _ = residual_norm(c, ff_context(cn), c_gate_mlp, norm=False)
    if clip_text and c.dtype == torch.float16:  # (the pass rounded once; this only turns inf into the max)
        c = c.clip(-65504, 65504)
    if clip_image and x.dtype == torch.float16:
        x = x.clip(-65504, 65504)
    return c, x


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


register(FamilyCode("sd3", prologue=sd3_call, blocks=((fusable, fused_forward),)))
