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
- `KeyMaskProcessor` (``sagegen.patch.families.hunyuanvideo15_call``, which `sagegen.patch` uses on every run) hands the
  attention a key mask [B, 1, 1, S_local] (which sagegen's CP gathers and rotates with the KV chunk) and
  zeroes the outputs of padding queries afterwards. That equals the model's ``m[i] & m[j]`` exactly: a valid
  query sees the valid keys, a padding query (every key masked) gives 0.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from diffusers.models._modeling_parallel import ContextParallelInput as In
from diffusers.models._modeling_parallel import ContextParallelOutput as Out

from sagegen.patch.families.hunyuanvideo15_call import KeyMaskProcessor


def hunyuan_video15_plan() -> dict:
    return {
        "x_embedder": {0: In(split_dim=1, expected_dims=3, split_output=True)},   # video tokens [B, N, C]
        "rope": {0: In(split_dim=0, expected_dims=2, split_output=True),           # cos, sin [N, D]
                 1: In(split_dim=0, expected_dims=2, split_output=True)},
        "proj_out": Out(gather_dim=1, expected_dims=3),
        # the text is split by `_TextSplit` (it is assembled in forward, after every embedder)
    }


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
