"""LTX-Video's blocks with their element-wise work fused: four `residual_norm` passes (RMSNorm mode) per block.

diffusers' ``LTXVideoTransformerBlock.forward``:

    n1 = RMSNorm(x)·(1+scale_msa)+shift_msa                -> attn1 (self-attention)  (one pass)
    x = x + attn1·gate_msa                                  -> attn2 (cross-attention) (one pass; + FP8 copy)
    x = x + attn2;  n2 = RMSNorm(x)·(1+scale_mlp)+shift_mlp -> ff                      (one pass)
    x = x + ff·gate_mlp                                                                (one pass)

each line several bf16 kernels in the stock forward (~30 ms of a 173 ms 704x512x161 sagegen step on an H200,
lab/NOTES.md v5.7). The six modulation vectors (per sample or per token: image-to-video conditions the first
frame's tokens with their own timestep) are the stock forward's ``scale_shift_table + temb`` views.

Values: the stock ops round the normalised row and every intermediate to bf16, the passes compute in fp32 and
round once (tests/patch/families/test_fused_blocks_ltx.py bounds the difference against an fp32 run). Norms with
weights, a modulation whose dtype differs from the activations' (the stock forward would then promote to fp32), fp32
models, compile, autograd and CPU outside the interpreter take the stock forward.
"""

from __future__ import annotations

import torch

from sagegen.linear.shared import sharing
from sagegen.patch import fp8_handoff as _fp8_out
from sagegen.patch.fusion.prologue import diffusers_class
from sagegen.patch.family_table import FamilyCode, register


def _cls():
    return diffusers_class("diffusers.models.transformers.transformer_ltx", "LTXVideoTransformerBlock")


def _plain_rms(norm, dim: int) -> bool:
    from diffusers.models.normalization import RMSNorm

    return type(norm) is RMSNorm and norm.weight is None and tuple(getattr(norm, "dim", (dim,))) == (dim,)


def fusable(block) -> bool:
    """Exactly diffusers' LTXVideoTransformerBlock with RMSNorms without weights and a [6, C] modulation table."""
    cls = _cls()
    if cls is None or type(block) is not cls:
        return False
    table = getattr(block, "scale_shift_table", None)
    if not isinstance(table, torch.Tensor) or table.ndim != 2 or table.shape[0] != 6:
        return False
    dim = table.shape[1]
    return _plain_rms(block.norm1, dim) and _plain_rms(block.norm2, dim)


def _modulation(self, temb, x):
    """The six [B, 1 or S, C] vectors as the stock forward derives them; None where the passes cannot take them."""
    B, S, C = x.shape
    if temb.ndim != 3 or temb.shape[0] != B or temb.shape[1] not in (1, S) or temb.shape[2] != 6 * C:
        return None
    ada = self.scale_shift_table[None, None].to(temb.device) + temb.reshape(B, temb.size(1), 6, -1)
    if ada.dtype != x.dtype:  # the stock forward would promote the residual stream: not reproduced
        return None
    return ada.unbind(dim=2)


def fused_forward(self, stock, can_run, residual_norm, hidden_states, encoder_hidden_states, temb,
                  image_rotary_emb=None, encoder_attention_mask=None):
    """`LTXVideoTransformerBlock.forward` through four `residual_norm` passes."""
    mods = _modulation(self, temb, hidden_states) if can_run(hidden_states) and torch.is_tensor(temb) else None
    if mods is None:
        return stock(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb, encoder_attention_mask)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods
    x = hidden_states.contiguous()
    _, n = residual_norm(x, scale=scale_msa, shift=shift_msa, eps=self.norm1.eps, rms=True)
    y = self.attn1(hidden_states=n, encoder_hidden_states=None, image_rotary_emb=image_rotary_emb)
    # cross-attention's Q projection reads this residual sum (as does the next pass): where it runs FP8, the
    # pass writes the sum's per-token FP8 copy too, and the projection takes it (fp8_out.offer)
    to_q = self.attn2.to_q
    want_copy = _fp8_out.CROSS_Q_FP8 and _fp8_out.takes_fp8_rows(to_q, x.shape[0] * x.shape[1])
    x, copy = residual_norm(x, y, gate_msa, norm=False, fp8_out=want_copy)
    with sharing():
        if copy is not None:
            _fp8_out.offer(to_q, x, copy)
        y = self.attn2(x, encoder_hidden_states=encoder_hidden_states, image_rotary_emb=None,
                       attention_mask=encoder_attention_mask)
    x, n = residual_norm(x, y, scale=scale_mlp, shift=shift_mlp, eps=self.norm2.eps, rms=True)
    x, _ = residual_norm(x, self.ff(n), gate_mlp, norm=False)
    return x


def _fused_call_for(processor):
    from sagegen.patch.families import ltx_call  # imports diffusers' LTX module: only for a model that has it

    return ltx_call.fused_call_for(processor)


register(FamilyCode("ltx", blocks=((fusable, fused_forward),),
                    dispatch_calls={"LTXVideoAttnProcessor.__call__": _fused_call_for}))
