"""Which diffusers transformers can run context-parallel, and the plans sagegen supplies where diffusers has
none. Decided from the class alone, so the CLI can refuse a model before any weights load.

- diffusers' own ``_cp_plan`` (Flux, Flux.2, Wan, LTX, LTX-2, Qwen-Image, ...): used as is.
- HunyuanVideo: sagegen's plan below. It splits the patch embedding's and the text embedder's outputs and
  the rotary tables; the joint key-padding mask the model builds from the *global* text mask cannot be split
  by a plan (its order is [all video, all text], a rank holds [its video, its text]), so a hook rebuilds it
  per rank from the text mask (`_HunyuanVideoMask`).
- HunyuanVideo-1.5: sagegen's plan, processor and text-splitting hook (hunyuanvideo15.py): its own
  processor builds a query x key mask from the tokens a rank holds, which cannot describe other ranks' tokens.
- Models whose attention calls torch SDPA directly (CogVideoX, Mochi, SD3, ...): diffusers' CP cannot reach
  their attention; refused with that reason. So is SkyReels-V2, whose processor passes the CP config to its
  cross-attention too, whose text keys are not split.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# Processors that call F.scaled_dot_product_attention themselves (measured, diffusers 0.42)
_DIRECT_SDPA = {
    "CogVideoXTransformer3DModel": "CogVideoX", "MochiTransformer3DModel": "Mochi",
    "SD3Transformer2DModel": "SD3/SD3.5", "AllegroTransformer3DModel": "Allegro",
    "SanaTransformer2DModel": "Sana", "CogView4Transformer2DModel": "CogView4",
}
_NEEDS_PROCESSOR_CHANGES = {
    "SkyReelsV2Transformer3DModel":
        "its processor hands the context-parallel config to the cross-attention too, whose text keys are not "
        "split over the ranks",
}


class ContextParallelUnsupported(ValueError):
    """This model cannot run context-parallel (the message says why)."""


def _hunyuan_video_plan() -> dict:
    from diffusers.models._modeling_parallel import ContextParallelInput as In
    from diffusers.models._modeling_parallel import ContextParallelOutput as Out

    return {
        "x_embedder": {0: In(split_dim=1, expected_dims=3, split_output=True)},       # video tokens [B, N, C]
        "context_embedder": {0: In(split_dim=1, expected_dims=3, split_output=True)},  # text tokens [B, L, C]
        "rope": {0: In(split_dim=0, expected_dims=2, split_output=True),               # cos, sin [N, D]
                 1: In(split_dim=0, expected_dims=2, split_output=True)},
        "proj_out": Out(gather_dim=1, expected_dims=3),
    }


def _hunyuan_video15_plan() -> dict:
    from sagegen.patch.families.hunyuanvideo15_cp import hunyuan_video15_plan

    return hunyuan_video15_plan()


_SAGEGEN_PLANS = {"HunyuanVideoTransformer3DModel": _hunyuan_video_plan,
                  "HunyuanVideo15Transformer3DModel": _hunyuan_video15_plan}


def check_cp_support(model_cls) -> str:
    """'diffusers' or 'sagegen' (whose plan), or ContextParallelUnsupported saying why. Takes a class (or
    an instance); needs no weights."""
    cls = model_cls if isinstance(model_cls, type) else type(model_cls)
    name = cls.__name__
    if name in _DIRECT_SDPA:
        raise ContextParallelUnsupported(
            f"{_DIRECT_SDPA[name]} ({name}) cannot run context-parallel: its attention processors call "
            "torch's scaled_dot_product_attention directly instead of diffusers' attention dispatcher, so "
            "diffusers' enable_parallelism cannot split its attention. Use prompt sharding (plain torchrun "
            "without --cp) to use several GPUs")
    if name in _NEEDS_PROCESSOR_CHANGES:
        raise ContextParallelUnsupported(f"{name} cannot run context-parallel yet: "
                                         f"{_NEEDS_PROCESSOR_CHANGES[name]}")
    if getattr(cls, "_cp_plan", None):
        return "diffusers"
    if name in _SAGEGEN_PLANS:
        return "sagegen"
    raise ContextParallelUnsupported(
        f"{name} has no context-parallel plan (_cp_plan) in this diffusers version and sagegen supplies none")


def check_cp_config(ulysses: int, ring: int) -> None:
    """That this diffusers has context parallelism and takes this topology (diffusers 0.36 refuses Ulysses and
    Ring together), checked with no weights or processes; else ContextParallelUnsupported saying why."""
    import diffusers

    version = getattr(diffusers, "__version__", "(unknown version)")
    if not (hasattr(diffusers, "ContextParallelConfig") and hasattr(diffusers.ModelMixin, "enable_parallelism")):
        raise ContextParallelUnsupported(
            f"diffusers {version} has no context parallelism (ContextParallelConfig and enable_parallelism came in "
            "0.36); upgrade diffusers, or use prompt sharding (plain torchrun without --cp)")
    try:
        diffusers.ContextParallelConfig(ulysses_degree=ulysses, ring_degree=ring)
    except ValueError as e:
        raise ContextParallelUnsupported(
            f"diffusers {version} refuses ulysses={ulysses}, ring={ring}: {e} (newer diffusers take both)") from None


def cp_plan_for(model) -> dict:
    """The plan to pass to ``enable_parallelism(cp_plan=...)``."""
    if check_cp_support(model) == "diffusers":
        return type(model)._cp_plan
    return _SAGEGEN_PLANS[type(model).__name__]()


def install_model_hooks(model, parallel_config) -> None:
    """Hooks a sagegen plan needs besides splitting and gathering (HunyuanVideo's joint mask; HunyuanVideo-1.5's
    text split and key-mask processor)."""
    if type(model).__name__ == "HunyuanVideo15Transformer3DModel" and check_cp_support(model) == "sagegen":
        from sagegen.patch.families.hunyuanvideo15_cp import install_hunyuan_video15

        install_hunyuan_video15(model, parallel_config)
    if type(model).__name__ == "HunyuanVideoTransformer3DModel" and check_cp_support(model) == "sagegen":
        from diffusers.hooks import HookRegistry

        cp = getattr(parallel_config, "context_parallel_config", parallel_config)
        state = _HunyuanVideoMask(cp._flattened_mesh.get_group())
        HookRegistry.check_if_exists_or_initialize(model).register_hook(state.capture_hook(), "sagegen_cp_mask")
        for block in [*model.transformer_blocks, *model.single_transformer_blocks]:
            HookRegistry.check_if_exists_or_initialize(block).register_hook(state.block_hook(), "sagegen_cp_mask")


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
