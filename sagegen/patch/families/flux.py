"""Flux's blocks with their element-wise work fused: one `residual_norm` pass per norm and residual.

diffusers' ``FluxTransformerBlock`` (double stream) is SD3's joint block with rotary embeddings: per stream a
LayerNorm with the modulation ``* (1 + scale) + shift``, gate products and residual adds, each a separate bf16
kernel. It runs through `families.sd3.ada_zero_body` (three passes per stream). ``FluxSingleTransformerBlock``:

    h = cat(text, image);  n = LN(h)·(1+scale)+shift             -> proj_mlp, attention   (one pass)
    h = h + proj_out(cat(attn, GELU(mlp)))·gate                                          (one pass)

instead of LayerNorm, (1 + scale), product and sum, then product and sum. On an H200 these element-wise
kernels were ~45 ms of a 1024² Flux step's ~165 ms
(bench/results/archive/model-step-flux.1-dev-profile-triton-h200-2026-11-21.json).

In the single block, ``n`` feeds ``proj_mlp`` and the Q/K/V projections: with FP8 linears the block runs in one
`sharing` scope, so ``n`` is quantized once for all four (`sagegen.linear.shared`), and an FP8 ``proj_out``
quantizes ``cat(attn, GELU(mlp))`` from the two tensors (`gelu_fp8`: no GELU output, no concatenation).

Values: the stock ops round every intermediate to bf16, the pass computes in fp32 and rounds once, so outputs
differ from stock by the bf16 rounding of intermediates (tests/patch/families/test_fused_blocks_flux.py bounds
it against an fp64 run). Norms of other kinds or with affine weights, fp32 models, compile, autograd and CPU outside the
interpreter take the stock forward. `fused_blocks` swaps the classes and puts them back.
"""

from __future__ import annotations

import torch

from sagegen.linear.shared import sharing
from sagegen.patch.families import sd3 as _sd3
from sagegen.patch.fusion.prologue import TEXT_LEN, diffusers_class
from sagegen.api import triton_interpret
from sagegen.patch import fp8_handoff as fp8_out
from sagegen.patch.family_table import FamilyCode, register
from sagegen.patch.fusion.joint import _parallel_route, _torch_rms_params
from sagegen.patch.fusion.prologue import _HALF, _arguments, _joint_attention, _rope_pair, qkv_projections

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
    fused call hands the split these (text, image) lengths (`joint.flux_call`)."""
    eager = not torch.compiler.is_compiling()
    if eager:
        attn.__dict__[TEXT_LEN] = text_len
    try:
        return attn(hidden_states=n, image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))
    finally:
        if eager:
            attn.__dict__.pop(TEXT_LEN, None)


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
    if parallel is not None and not joint_text:  # a single block's [text, image] rows (`families.flux`)
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


register(FamilyCode("flux", prologue=flux_call,
                    blocks=((double_fusable, double_forward), (single_fusable, single_forward))))
