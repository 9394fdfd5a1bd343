"""Context parallelism for HunyuanVideo-1.5 (``HunyuanVideo15Transformer3DModel``): sagegen's plan, a processor
with a key-padding mask, and the hook that splits the text tokens. Imports diffusers (plans.py imports this
module only when needed).

The model's joint sequence is [video tokens, text tokens], the text being [valid image, valid ByT5, valid
Qwen, then every padding token], built inside ``forward`` (no module outputs it, so a plan cannot split it).
Its processor turns the text mask into a query x key mask ``m[i] & m[j]`` over the tokens it holds. Under CP
those are a rank's own tokens, and the mask that a CP attention gathers over the ranks would then mask a valid
query of this rank wherever another rank holds padding at the same position. So, under CP only:

- the plan splits the patch embedding's output (video) and the rotary tables, and gathers ``proj_out``;
- a hook on the first block pads the text to a multiple of the CP world with masked tokens (exact: a masked
  key has no weight) and gives each rank chunk ``rank`` of it; every block then gets that chunk's mask;
- `KeyMaskProcessor` hands the attention a key mask [B, 1, 1, S_local] (which sagegen's CP gathers and
  rotates with the KV chunk) and zeroes the outputs of padding queries afterwards. That equals the model's
  ``m[i] & m[j]`` exactly: a valid query sees the valid keys, a padding query (every key masked) gives 0.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from diffusers.models._modeling_parallel import ContextParallelInput as In
from diffusers.models._modeling_parallel import ContextParallelOutput as Out
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15AttnProcessor2_0


def hunyuan_video15_plan() -> dict:
    return {
        "x_embedder": {0: In(split_dim=1, expected_dims=3, split_output=True)},   # video tokens [B, N, C]
        "rope": {0: In(split_dim=0, expected_dims=2, split_output=True),           # cos, sin [N, D]
                 1: In(split_dim=0, expected_dims=2, split_output=True)},
        "proj_out": Out(gather_dim=1, expected_dims=3),
        # the text is split by `_TextSplit` (it is assembled in forward, after every embedder)
    }


def _project(x: torch.Tensor, heads: int, projections, norms) -> list[torch.Tensor]:
    """[B, S, C] -> q, k, v [B, S, H, D], each normalised by its norm (None: none)."""
    out = []
    for proj, norm in zip(projections, norms):
        t = proj(x).unflatten(2, (heads, -1))
        out.append(norm(t) if norm is not None else t)
    return out


class KeyMaskProcessor(HunyuanVideo15AttnProcessor2_0):
    """HunyuanVideo-1.5's joint attention with a key-padding mask instead of a query x key mask. A subclass of
    diffusers' processor, so that set_attention_backend and enable_parallelism treat it as the model's own."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        q, k, v = _project(hidden_states, attn.heads, (attn.to_q, attn.to_k, attn.to_v),
                           (attn.norm_q, attn.norm_k, None))
        if image_rotary_emb is not None:             # rotary positions on the video tokens only
            q = apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
            k = apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        n_text = 0
        if encoder_hidden_states is not None:
            n_text = encoder_hidden_states.shape[1]
            eq, ek, ev = _project(encoder_hidden_states, attn.heads,
                                  (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj),
                                  (attn.norm_added_q, attn.norm_added_k, None))
            q, k, v = torch.cat([q, eq], 1), torch.cat([k, ek], 1), torch.cat([v, ev], 1)
        valid = None
        if attention_mask is not None:               # text mask of the tokens held; video is always valid
            text = attention_mask.to(q.device).bool()
            valid = F.pad(text, (q.shape[1] - text.shape[1], 0), value=True)
        out = dispatch_attention_fn(
            q, k, v, attn_mask=valid[:, None, None, :] if valid is not None else None, dropout_p=0.0,
            is_causal=False, backend=self._attention_backend, parallel_config=self._parallel_config)
        out = out.flatten(2, 3).to(q.dtype)
        if valid is not None:                        # a padding query sees no key in the model: output 0
            out = out * valid[..., None].to(out.dtype)
        if not n_text:
            return out, encoder_hidden_states
        out, text_out = out[:, :-n_text], out[:, -n_text:]
        if getattr(attn, "to_out", None) is not None:
            out = attn.to_out[1](attn.to_out[0](out))
        if getattr(attn, "to_add_out", None) is not None:
            text_out = attn.to_add_out(text_out)
        return out, text_out


def _arg(args: list, kwargs: dict, index: int, name: str):
    return kwargs[name] if name in kwargs else (args[index] if len(args) > index else None)


def _set_arg(args: list, kwargs: dict, index: int, name: str, value) -> None:
    if name in kwargs or len(args) <= index:
        kwargs[name] = value
    else:
        args[index] = value


class _TextSplit:
    """The text chunk of this rank: set by the first block's hook (which also splits the text tokens), read
    by every other block's hook. Block signature: (hidden_states, encoder_hidden_states, temb,
    attention_mask, freqs_cis)."""

    def __init__(self, group):
        self.group = group
        self.local_mask = None

    def split(self, text: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if mask is None:
            raise ValueError("HunyuanVideo-1.5 under context parallelism needs the text attention mask")
        if mask.shape != text.shape[:2]:
            raise ValueError(f"text mask {tuple(mask.shape)} does not match the text tokens "
                             f"{tuple(text.shape[:2])}")
        pad = -text.shape[1] % world                      # masked extra tokens: no key weight, output unused
        text = F.pad(text, (0, 0, 0, pad))
        mask = F.pad(mask.bool(), (0, pad), value=False)
        return text.chunk(world, 1)[rank], mask.chunk(world, 1)[rank]

    def hook(self, first: bool):
        from diffusers.hooks import ModelHook

        state = self

        class TextSplit(ModelHook):
            def pre_forward(self, module, *args, **kwargs):
                args = list(args)
                if first:
                    text, mask = state.split(_arg(args, kwargs, 1, "encoder_hidden_states"),
                                             _arg(args, kwargs, 3, "attention_mask"))
                    _set_arg(args, kwargs, 1, "encoder_hidden_states", text)
                    state.local_mask = mask
                _set_arg(args, kwargs, 3, "attention_mask", state.local_mask)
                return tuple(args), kwargs

        return TextSplit()


def install_hunyuan_video15(model, parallel_config) -> None:
    """Swap every block's processor for `KeyMaskProcessor` (keeping its backend and CP config) and register
    the text-splitting hooks. Call after ``enable_parallelism``."""
    from diffusers.hooks import HookRegistry

    for block in model.transformer_blocks:
        old = block.attn.processor
        new = KeyMaskProcessor()
        new._attention_backend, new._parallel_config = old._attention_backend, old._parallel_config
        block.attn.set_processor(new)
    cp = getattr(parallel_config, "context_parallel_config", parallel_config)
    state = _TextSplit(cp._flattened_mesh.get_group())
    for i, block in enumerate(model.transformer_blocks):
        HookRegistry.check_if_exists_or_initialize(block).register_hook(state.hook(first=i == 0),
                                                                        "sagegen_cp_text")
