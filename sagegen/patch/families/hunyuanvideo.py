"""HunyuanVideo's single blocks with an FP8 ``proj_out`` that quantizes ``cat(attention, GELU(mlp))`` itself.

diffusers' ``HunyuanVideoSingleTransformerBlock.forward`` runs ``mlp = GELU(proj_mlp(n))``, then
``proj_out(cat([attn, mlp], dim=2))``: at 720p (119k tokens) the GELU output and the concatenation are ~10 GB
of memory traffic a block. Where ``proj_out`` is an `FP8Linear` and ``act_mlp`` the tanh GELU, `linear_fusion`
swaps the block's class for a subclass whose forward is diffusers' own, except that it hands the attention output
and the pre-GELU tensor to ``proj_out.cat_gelu`` (the quantization kernel reads both and computes the GELU).
Swapping the class keeps diffusers' hooks working (as `fused_blocks` does); the subclass runs the stock forward
under torch.compile and whenever the mark is off. `restore` puts the class back.
"""

from __future__ import annotations

import torch

from sagegen.patch.fusion.prologue import diffusers_class, forward_subclass, swap_class

_SUBCLASSES: dict[type, type] = {}


def _block_class():
    return diffusers_class("diffusers.models.transformers.transformer_hunyuan_video",
                           "HunyuanVideoSingleTransformerBlock")


def is_block(module: torch.nn.Module) -> bool:
    """Exactly diffusers' HunyuanVideo single block (a subclass may have another forward)."""
    cls = _block_class()
    return cls is not None and type(module) is cls


def _forward(self, stock, hidden_states, encoder_hidden_states, temb, attention_mask=None, image_rotary_emb=None,
             *args, **kwargs):
    if torch.compiler.is_compiling() or not getattr(self.proj_out, "fuse_cat_gelu", False):
        return stock(self, hidden_states, encoder_hidden_states, temb, attention_mask, image_rotary_emb, *args,
                     **kwargs)
    # diffusers' forward (0.42; the transformer also passes token_replace_emb and first_frame_num_tokens, which
    # this block ignores), with GELU + cat + proj_out as one cat_gelu call
    text_seq_length = encoder_hidden_states.shape[1]
    hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
    residual = hidden_states
    norm_hidden_states, gate = self.norm(hidden_states, emb=temb)
    mlp_hidden_states = self.proj_mlp(norm_hidden_states)
    attn_output, context_attn_output = self.attn(
        hidden_states=norm_hidden_states[:, :-text_seq_length, :],
        encoder_hidden_states=norm_hidden_states[:, -text_seq_length:, :],
        attention_mask=attention_mask,
        image_rotary_emb=image_rotary_emb,
    )
    attn_output = torch.cat([attn_output, context_attn_output], dim=1)
    hidden_states = gate.unsqueeze(1) * self.proj_out.cat_gelu(attn_output, mlp_hidden_states)
    hidden_states = hidden_states + residual
    return hidden_states[:, :-text_seq_length, :], hidden_states[:, -text_seq_length:, :]


def install(module: torch.nn.Module) -> None:
    swap_class(module, forward_subclass(type(module), _forward, "_sage_cat_gelu_block", _SUBCLASSES, __name__))


def restore(module: torch.nn.Module) -> None:
    if getattr(type(module), "_sage_cat_gelu_block", False):
        swap_class(module, type(module).__mro__[1])
