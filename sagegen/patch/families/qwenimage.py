"""Qwen-Image's double-stream blocks with their element-wise work fused: three `residual_norm` passes per stream.

diffusers' ``QwenImageTransformerBlock`` runs, per stream (image and text), a LayerNorm without affine weights,
the modulation ``* (1 + scale) + shift`` from its ``img_mod`` / ``txt_mod`` linear, the gated residual add after
the joint attention, a second modulated LayerNorm and the gated residual after the MLP, each as separate bf16
kernels: ~30 ms of a 1328² sagegen step of 238 ms on an H200 (bench/results/prof-qwen-image in NOTES v5.7).
The fused forward is `families.sd3.joint_body`, the same passes as SD3's and Flux's blocks.

The per-token modulation of Qwen-Image-Edit (``modulate_index``, ``zero_cond_t``), norms with affine weights,
fp32 models, compile, autograd and CPU outside the interpreter take the stock forward. Values: the stock ops round
every intermediate to bf16, the passes round once (tests/patch/families/test_fused_blocks_qwen.py bounds the difference
against an fp64 run).
"""

from __future__ import annotations

import torch

from sagegen.patch.families import sd3 as _sd3
from sagegen.patch.fusion.prologue import diffusers_class
from sagegen.patch.family_table import FamilyCode, register


def _cls():
    return diffusers_class("diffusers.models.transformers.transformer_qwenimage", "QwenImageTransformerBlock")


def fusable(block) -> bool:
    """Exactly diffusers' QwenImageTransformerBlock with plain LayerNorms and a SiLU + Linear modulation."""
    cls = _cls()
    if cls is None or type(block) is not cls or getattr(block, "zero_cond_t", False):
        return False
    dim = getattr(block, "dim", None)
    norms = (block.img_norm1, block.img_norm2, block.txt_norm1, block.txt_norm2)
    mods = (block.img_mod, block.txt_mod)
    return (isinstance(dim, int) and all(_sd3._plain_norm(n, dim) for n in norms)
            and all(isinstance(m, torch.nn.Sequential) and len(m) == 2 and isinstance(m[0], torch.nn.SiLU)
                    for m in mods))


def _modulation(mod, temb):
    """(shift, scale, gate, shift2, scale2, gate2) as [B, 1, C] views, as the block's ``_modulate`` splits them."""
    return [p.unsqueeze(1) for p in mod(temb).chunk(6, dim=-1)]


def fused_forward(self, stock, can_run, residual_norm, hidden_states, encoder_hidden_states,
                  encoder_hidden_states_mask, temb, image_rotary_emb=None, joint_attention_kwargs=None,
                  modulate_index=None):
    """`QwenImageTransformerBlock.forward` through `residual_norm` passes."""
    if modulate_index is not None or not _sd3.joint_inputs_ok(can_run, hidden_states, encoder_hidden_states, temb):
        return stock(self, hidden_states, encoder_hidden_states, encoder_hidden_states_mask, temb, image_rotary_emb,
                     joint_attention_kwargs, modulate_index)

    def attend(n, cn):
        return self.attn(hidden_states=n, encoder_hidden_states=cn,
                         encoder_hidden_states_mask=encoder_hidden_states_mask, image_rotary_emb=image_rotary_emb,
                         **(joint_attention_kwargs or {}))

    eps = (self.img_norm1.eps, self.txt_norm1.eps, self.img_norm2.eps, self.txt_norm2.eps)
    return _sd3.joint_body(residual_norm, hidden_states, encoder_hidden_states, _modulation(self.img_mod, temb),
                           _modulation(self.txt_mod, temb), eps, attend, self.img_mlp, self.txt_mlp,
                           clip_text=True, clip_image=True)


def _fused_call_for(processor):
    from sagegen.patch.families import qwenimage_call  # imports diffusers' Qwen-Image module: only when used

    return qwenimage_call.fused_call_for(processor)


register(FamilyCode("qwenimage", blocks=((fusable, fused_forward),),
                    dispatch_calls={"QwenDoubleStreamAttnProcessor2_0.__call__": _fused_call_for}))
