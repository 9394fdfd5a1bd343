"""Flux's blocks with their element-wise work fused: one `residual_norm` pass per norm and residual.

diffusers' ``FluxTransformerBlock`` (double stream) is SD3's joint block with rotary embeddings: per stream a
LayerNorm with the modulation ``* (1 + scale) + shift``, gate products and residual adds, each a separate bf16
kernel. It runs through `fused_blocks_sd3.ada_zero_body` (three passes per stream). ``FluxSingleTransformerBlock``:

    h = cat(text, image);  n = LN(h)·(1+scale)+shift             -> proj_mlp, attention   (one pass)
    h = h + proj_out(cat(attn, GELU(mlp)))·gate                                          (one pass)

instead of LayerNorm, (1 + scale), product and sum, then product and sum. On an H200 these element-wise
kernels were ~45 ms of a 1024² Flux step's ~165 ms
(bench/results/archive/model-step-flux.1-dev-profile-triton-h200-2026-11-21.json).

In the single block, ``n`` feeds ``proj_mlp`` and the Q/K/V projections: with FP8 linears the block runs in one
`sharing` scope, so ``n`` is quantized once for all four (`sagegen.linear.shared`), and an FP8 ``proj_out``
quantizes ``cat(attn, GELU(mlp))`` from the two tensors (`linear_fusion`: no GELU output, no concatenation).

Values: the stock ops round every intermediate to bf16, the pass computes in fp32 and rounds once, so outputs
differ from stock by the bf16 rounding of intermediates (tests/test_fused_blocks_flux.py bounds it against an
fp64 run). Norms of other kinds or with affine weights, fp32 models, compile, autograd and CPU outside the
interpreter take the stock forward. `fused_blocks` swaps the classes and puts them back.
"""

from __future__ import annotations

import torch

from ..linear.shared import sharing
from . import fused_blocks_sd3 as _sd3
from .fused_common import TEXT_LEN, diffusers_class

_MODULE = "diffusers.models.transformers.transformer_flux"


def _cls(name: str):
    return diffusers_class(_MODULE, name)


def double_fusable(block) -> bool:
    """Exactly diffusers' FluxTransformerBlock with the norms the fused forward reproduces."""
    cls = _cls("FluxTransformerBlock")
    if cls is None or type(block) is not cls:
        return False
    dim = getattr(block.norm2, "normalized_shape", (None,))[0]
    return (isinstance(dim, int) and _sd3._ada_zero(block.norm1, dim) and _sd3._ada_zero(block.norm1_context, dim)
            and _sd3._plain_norm(block.norm2, dim) and _sd3._plain_norm(block.norm2_context, dim))


def single_fusable(block) -> bool:
    """Exactly diffusers' FluxSingleTransformerBlock with AdaLayerNormZeroSingle over a plain LayerNorm."""
    from diffusers.models.normalization import AdaLayerNormZeroSingle

    cls = _cls("FluxSingleTransformerBlock")
    if cls is None or type(block) is not cls:
        return False
    norm = block.norm
    dim = getattr(getattr(norm, "norm", None), "normalized_shape", (None,))[0]
    return (type(norm) is AdaLayerNormZeroSingle and isinstance(dim, int) and _sd3._plain_norm(norm.norm, dim)
            and isinstance(norm.linear, torch.nn.Module))


def double_forward(self, stock, can_run, residual_norm, hidden_states, encoder_hidden_states, temb,
                   image_rotary_emb=None, joint_attention_kwargs=None):
    """`FluxTransformerBlock.forward` through `residual_norm` passes."""
    if not _sd3.joint_inputs_ok(can_run, hidden_states, encoder_hidden_states, temb):
        return stock(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb, joint_attention_kwargs)
    return _sd3.ada_zero_body(self, residual_norm, hidden_states, encoder_hidden_states, temb,
                              lambda n, cn: self.attn(hidden_states=n, encoder_hidden_states=cn,
                                                      image_rotary_emb=image_rotary_emb,
                                                      **(joint_attention_kwargs or {})),
                              clip_fp16=True)


def single_forward(self, stock, can_run, residual_norm, hidden_states, encoder_hidden_states, temb,
                   image_rotary_emb=None, joint_attention_kwargs=None):
    """`FluxSingleTransformerBlock.forward` through two `residual_norm` passes."""
    if not _sd3.joint_inputs_ok(can_run, hidden_states, encoder_hidden_states, temb):
        return stock(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb, joint_attention_kwargs)
    text_len = encoder_hidden_states.shape[1]
    h = torch.cat([encoder_hidden_states, hidden_states], dim=1)
    norm = self.norm
    shift, scale, gate = (p.unsqueeze(1) for p in norm.linear(norm.silu(temb)).chunk(3, dim=1))
    _, n = residual_norm(h, scale=scale, shift=shift, eps=norm.norm.eps)
    with sharing():  # proj_mlp and the Q/K/V projections read the same n: one FP8 quantization of it
        mlp = self.proj_mlp(n)
        attn = _single_attention(self.attn, text_len, n, image_rotary_emb, joint_attention_kwargs)
    if getattr(self.proj_out, "fuse_cat_gelu", False):  # FP8: GELU and concatenation inside the quantization
        y = self.proj_out.cat_gelu(attn, mlp)
    else:
        y = self.proj_out(torch.cat([attn, self.act_mlp(mlp)], dim=2))
    h, _ = residual_norm(h, y, gate, norm=False)
    if h.dtype == torch.float16:
        h = h.clip(-65504, 65504)
    return h[:, :text_len], h[:, text_len:]


def _single_attention(attn, text_len: int, n, image_rotary_emb, joint_attention_kwargs):
    """The single block's attention over its [text, image] rows ``n``. The processor gets one joint tensor, so
    the text length travels as a module attribute for the call (eager only): under context parallelism the
    fused call hands the split these (text, image) lengths (`fused_joint.flux_call`)."""
    eager = not torch.compiler.is_compiling()
    if eager:
        attn.__dict__[TEXT_LEN] = text_len
    try:
        return attn(hidden_states=n, image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))
    finally:
        if eager:
            attn.__dict__.pop(TEXT_LEN, None)
