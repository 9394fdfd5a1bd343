"""HunyuanVideo's single blocks with an FP8 ``proj_out`` that quantizes ``cat(attention, GELU(mlp))`` itself.

diffusers' ``HunyuanVideoSingleTransformerBlock.forward`` runs ``mlp = GELU(proj_mlp(n))``, then
``proj_out(cat([attn, mlp], dim=2))``: at 720p (119k tokens) the GELU output and the concatenation are ~10 GB
of memory traffic a block. Where ``proj_out`` is an `FP8Linear` and ``act_mlp`` the tanh GELU, `gelu_fp8`
swaps the block's class for a subclass whose forward is diffusers' own, except that it hands the attention output
and the pre-GELU tensor to ``proj_out.cat_gelu`` (the quantization kernel reads both and computes the GELU).
Swapping the class keeps diffusers' hooks working (as `fused_blocks` does); the subclass runs the stock forward
under torch.compile and whenever the mark is off. `restore` puts the class back.
"""

from __future__ import annotations

import torch

from sagegen.patch.fusion.prologue import diffusers_class, forward_subclass, swap_class
import torch.distributed as dist

from sagegen.patch import fp8_handoff as fp8_out
from sagegen.patch.family_table import FamilyCode, register
from sagegen.patch.fusion.joint import _diffusers_rms_params, _parallel_route
from sagegen.patch.fusion.prologue import _arguments, _joint_attention, _kernel_can_run, _rope_pair, qkv_projections

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


def hunyuan_call(original, session, attn, args, kwargs):
    """HunyuanVideoAttnProcessor2_0.__call__ (dual- and single-stream blocks) with the Q/K RMSNorms and the
    video tokens' rotary embeddings written into joint buffers; None where not applicable."""
    a = _arguments(original, "diffusers.models.transformers.transformer_hunyuan_video.HunyuanVideoAttnProcessor2_0",
                   attn, args, kwargs)
    if a is None:
        return None
    parallel = _parallel_route(original, session)
    if parallel is False:
        return None
    hidden_states, encoder_hidden_states = a.get("hidden_states"), a.get("encoder_hidden_states")
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 3:
        return None
    if not isinstance(encoder_hidden_states, torch.Tensor) or encoder_hidden_states.dim() != 3:
        return None  # (both block kinds of the model pass the text)
    out_features = getattr(attn.to_q, "out_features", None)
    weight = getattr(attn.to_q, "weight", None)
    dtype = hidden_states.dtype
    if not isinstance(out_features, int) or not _kernel_can_run(weight, hidden_states) or dtype != weight.dtype:
        return None
    heads = attn.heads
    head_dim = out_features // heads
    dual = attn.add_q_proj is not None
    names = ("norm_q", "norm_k") + (("norm_added_q", "norm_added_k") if dual else ())
    norms = [_diffusers_rms_params(getattr(attn, n, None), head_dim, dtype) for n in names]
    n_vid = hidden_states.shape[1]
    rope = _rope_pair(a.get("image_rotary_emb"), n_vid, head_dim)
    if any(n is False for n in norms) or rope is False or head_dim % 2:
        return None

    vid, txt = slice(0, n_vid), slice(n_vid, None)
    if dual:
        parts = [(qkv_projections(attn, hidden_states), vid, norms[:2], rope),
                 ((attn.add_q_proj(encoder_hidden_states), attn.add_k_proj(encoder_hidden_states),
                   attn.add_v_proj(encoder_hidden_states)), txt, norms[2:], None)]
    else:  # single-stream: one projection of the joint tokens; the video part rotated, the text part not
        joint_in = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        q, k, v = qkv_projections(attn, joint_in)
        parts = [((q[:, vid], k[:, vid], v[:, vid]), vid, norms, rope),
                 ((q[:, txt], k[:, txt], v[:, txt]), txt, norms, None)]
    mask = a.get("attention_mask")
    if parallel is None and isinstance(mask, torch.Tensor) and mask.dim() == 2:
        mask = mask[:, None, None, :]  # [B, S], as the routed dispatcher reads it (the CP dispatcher reads it too)
    to_out = getattr(attn, "to_out", None)
    fp8 = to_out is not None and fp8_out.wanted(to_out[0], hidden_states.shape[0] * n_vid)
    out = _joint_attention(session, parts, heads, head_dim, mask, parallel=parallel, round_before_weight=True,
                           per_channel_rope=True, fp8_out=fp8)
    out, encoder_out = fp8_out.tokens(out, vid), fp8_out.dense(fp8_out.tokens(out, txt))
    if to_out is not None:
        out = to_out[1](fp8_out.project(to_out[0], out))
    if getattr(attn, "to_add_out", None) is not None:
        encoder_out = attn.to_add_out(encoder_out)
    return out, encoder_out


def hunyuan_video_plan() -> dict:
    """sagegen's context-parallel plan for HunyuanVideo (diffusers has none): the patch embedding's and the text
    embedder's outputs and the rotary tables are split; the joint key mask is rebuilt per rank (`install_cp_mask`)."""
    from diffusers.models._modeling_parallel import ContextParallelInput as In
    from diffusers.models._modeling_parallel import ContextParallelOutput as Out

    return {
        "x_embedder": {0: In(split_dim=1, expected_dims=3, split_output=True)},       # video tokens [B, N, C]
        "context_embedder": {0: In(split_dim=1, expected_dims=3, split_output=True)},  # text tokens [B, L, C]
        "rope": {0: In(split_dim=0, expected_dims=2, split_output=True),               # cos, sin [N, D]
                 1: In(split_dim=0, expected_dims=2, split_output=True)},
        "proj_out": Out(gather_dim=1, expected_dims=3),
    }


class _HunyuanVideoMask:
    """HunyuanVideo builds its key mask [B, 1, 1, N + L] as [all video (True), text valid-prefix] from the
    global text mask. A rank holds video tokens n_l and text tokens l_l (chunk ``rank`` of each): its key
    mask is [True * n_l, text_mask[:, rank * l_l:(rank + 1) * l_l]], rebuilt here for every block call."""

    def __init__(self, group):
        self.group = group
        self.text_mask = None
        self.cache = None

    def capture_hook(self):
        from diffusers.hooks import ModelHook

        state = self

        class Capture(ModelHook):
            def pre_forward(self, module, *args, **kwargs):
                mask = kwargs.get("encoder_attention_mask", args[3] if len(args) > 3 else None)
                state.text_mask, state.cache = mask, None
                return args, kwargs

        return Capture()

    def block_hook(self):
        from diffusers.hooks import ModelHook

        state = self

        class BlockMask(ModelHook):
            def pre_forward(self, module, *args, **kwargs):
                args = list(args)
                token_replace = kwargs.get("token_replace_emb", args[5] if len(args) > 5 else None)
                if token_replace is not None:
                    raise NotImplementedError("HunyuanVideo's image-to-video token replacement (first-frame "
                                              "modulation) is not supported under context parallelism")
                mask = state.local_mask(args[0] if args else kwargs["hidden_states"],
                                        args[1] if len(args) > 1 else kwargs["encoder_hidden_states"])
                if "attention_mask" in kwargs or len(args) <= 3:
                    kwargs["attention_mask"] = mask
                else:
                    args[3] = mask
                return tuple(args), kwargs

        return BlockMask()

    def local_mask(self, hidden: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        n_l, l_l = hidden.shape[1], text.shape[1]
        if self.cache is None or self.cache.shape[-1] != n_l + l_l:
            # as the model does: the first sum(text_mask) text tokens are valid, whatever the mask's pattern
            rank = dist.get_rank(self.group)
            valid = self.text_mask.to(hidden.device).sum(dim=1, dtype=torch.int)[:, None]
            text_idx = torch.arange(rank * l_l, (rank + 1) * l_l, device=hidden.device)[None, :]
            video = torch.ones(valid.shape[0], n_l, dtype=torch.bool, device=hidden.device)
            self.cache = torch.cat([video, text_idx < valid], dim=1)[:, None, None, :]
        return self.cache


def install_cp_mask(model, parallel_config) -> None:
    """The hook that rebuilds HunyuanVideo's joint key mask per rank from the text mask (`_HunyuanVideoMask`)."""
    from diffusers.hooks import HookRegistry

    cp = getattr(parallel_config, "context_parallel_config", parallel_config)
    state = _HunyuanVideoMask(cp._flattened_mesh.get_group())
    HookRegistry.check_if_exists_or_initialize(model).register_hook(state.capture_hook(), "sagegen_cp_mask")
    for block in [*model.transformer_blocks, *model.single_transformer_blocks]:
        HookRegistry.check_if_exists_or_initialize(block).register_hook(state.block_hook(), "sagegen_cp_mask")


register(FamilyCode("hunyuanvideo", prologue=hunyuan_call, gelu_blocks=(is_block, install, restore),
                    cp_plans={"HunyuanVideoTransformer3DModel": hunyuan_video_plan},
                    cp_hooks={"HunyuanVideoTransformer3DModel": install_cp_mask}))
