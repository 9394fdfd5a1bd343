"""``--random-weights``: a preset's full-size pipeline with random weights, for speed at real shapes.

The denoising transformer is the real architecture at full size (`sagegen.models.arch.build_transformer`),
and the VAE is the family's real VAE configuration, both randomly initialised. The text encoders (T5-XXL,
Llama, CLIP: billions of parameters that take no part in attention speed) are left out: each sample gets
random prompt embeddings of the exact shapes those encoders produce, seeded by the sample's seed. Outputs
are noise; what is measured is the denoising loop (and the decode) at the model's real sequence lengths.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from sagegen.models.presets import Preset

# The sequence lengths the real text encoders produce (diffusers pipelines' max_sequence_length defaults).
_TEXT_LEN = {"cogvideox": 226, "hunyuanvideo": 256, "mochi": 256, "sd3": 77 + 256, "wan": 512}


@contextlib.contextmanager
def _seeded(seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def full_vae(family: str, seed: int, transformer_config=None):
    """The family's full-size VAE, randomly initialised (configs as in the released checkpoints)."""
    import diffusers

    with _seeded(seed):
        if family == "wan" and getattr(transformer_config, "in_channels", 16) == 48:  # Wan2.2-TI2V-5B's VAE
            return diffusers.AutoencoderKLWan(base_dim=160, decoder_base_dim=256, z_dim=48, in_channels=12,
                                              out_channels=12, is_residual=True, patch_size=2,
                                              scale_factor_spatial=16, latents_mean=[0.0] * 48,
                                              latents_std=[1.0] * 48).eval()
        if family == "wan":  # Wan2.1's VAE (also Wan2.2-A14B's): the class defaults
            return diffusers.AutoencoderKLWan().eval()
        if family == "cogvideox":
            return diffusers.AutoencoderKLCogVideoX().eval()
        if family == "hunyuanvideo":
            return diffusers.AutoencoderKLHunyuanVideo().eval()
        if family == "mochi":
            return diffusers.AutoencoderKLMochi().eval()
        if family in ("flux", "sd3"):
            scale, shift = (0.3611, 0.1159) if family == "flux" else (1.5305, 0.0609)
            return diffusers.AutoencoderKL(
                down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=16,
                scaling_factor=scale, shift_factor=shift, use_quant_conv=False, use_post_quant_conv=False).eval()
    raise ValueError(f"no full-size VAE for family {family!r}")


def scheduler(family: str):
    import diffusers

    if family == "cogvideox":
        return diffusers.CogVideoXDDIMScheduler(beta_schedule="scaled_linear", prediction_type="v_prediction",
                                                timestep_spacing="trailing", rescale_betas_zero_snr=True,
                                                clip_sample=False, set_alpha_to_one=True)
    if family == "hunyuanvideo":
        return diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0)
    if family == "wan":  # (the released repos use UniPC with flow_shift 3-5; any flow scheduler times the same)
        return diffusers.FlowMatchEulerDiscreteScheduler(shift=5.0)
    if family == "mochi":
        return diffusers.FlowMatchEulerDiscreteScheduler(invert_sigmas=True)
    if family == "flux":
        return diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                                                         max_shift=1.15, base_image_seq_len=256,
                                                         max_image_seq_len=4096)
    return diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)


def _transformer(preset: Preset, dtype, device, seed: int):
    try:
        from sagegen.models import arch
    except ImportError as e:
        raise RuntimeError(f"--random-weights needs sagegen.models.arch, which this checkout lacks ({e}); "
                           "update sagegen or load real weights") from e
    return arch.build_transformer(preset.name, dtype=dtype, device=device, seed=seed)


def embeddings_fn(family: str, config, dtype, device, text_len: int | None) -> Callable[[str, int], dict]:
    """Per-sample random prompt embeddings with the shapes the real text encoders give this transformer."""
    def randn(gen, *shape):
        return (torch.randn(*shape, generator=gen) * 0.5).to(device=device, dtype=dtype)

    def make(prompt: str, seed: int) -> dict[str, Any]:
        gen = torch.Generator("cpu").manual_seed(10_000_019 + seed)
        if family == "cogvideox":
            n = text_len or getattr(config, "max_text_seq_length", _TEXT_LEN[family])
            return {"prompt_embeds": randn(gen, 1, n, config.text_embed_dim),
                    "negative_prompt_embeds": randn(gen, 1, n, config.text_embed_dim)}
        if family == "hunyuanvideo":
            n = text_len or _TEXT_LEN[family]
            return {"prompt_embeds": randn(gen, 1, n, config.text_embed_dim),
                    "pooled_prompt_embeds": randn(gen, 1, config.pooled_projection_dim),
                    "prompt_attention_mask": torch.ones(1, n, dtype=torch.long, device=device)}
        if family == "mochi":
            n = text_len or _TEXT_LEN[family]
            mask = torch.ones(1, n, dtype=torch.long, device=device)
            return {"prompt_embeds": randn(gen, 1, n, config.text_embed_dim), "prompt_attention_mask": mask,
                    "negative_prompt_embeds": randn(gen, 1, n, config.text_embed_dim),
                    "negative_prompt_attention_mask": mask.clone()}
        if family == "wan":  # UMT5-XXL, padded to 512 tokens by the pipeline
            n = text_len or _TEXT_LEN[family]
            return {"prompt_embeds": randn(gen, 1, n, config.text_dim),
                    "negative_prompt_embeds": randn(gen, 1, n, config.text_dim)}
        if family == "flux":
            n = text_len or 512
            return {"prompt_embeds": randn(gen, 1, n, config.joint_attention_dim),
                    "pooled_prompt_embeds": randn(gen, 1, config.pooled_projection_dim)}
        n = text_len or _TEXT_LEN["sd3"]
        return {"prompt_embeds": randn(gen, 1, n, config.joint_attention_dim),
                "negative_prompt_embeds": randn(gen, 1, n, config.joint_attention_dim),
                "pooled_prompt_embeds": randn(gen, 1, config.pooled_projection_dim),
                "negative_pooled_prompt_embeds": randn(gen, 1, config.pooled_projection_dim)}

    return make


def build_random_pipeline(preset: Preset, *, dtype, seed: int = 0, device="cpu", transformer=None, vae=None,
                          text_len: int | None = None):
    """(pipeline without text encoders, per-sample call overrides) for `preset` at full size.

    `transformer` / `vae` replace the full-size ones (tests use tiny ones to exercise the same path)."""
    import diffusers

    family = preset.family
    if transformer is None:
        transformer = _transformer(preset, dtype, device, seed)
    if vae is None:
        vae = full_vae(family, seed + 1, transformer.config)
    torch.nn.Module.to(vae, dtype=dtype)  # (diffusers' .to warns about fp32-kept modules: these have none)
    parts: dict[str, Any] = {"transformer": transformer, "vae": vae, "scheduler": scheduler(family)}
    encoders = {"cogvideox": ("tokenizer", "text_encoder"),
                "hunyuanvideo": ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2"),
                "mochi": ("tokenizer", "text_encoder"), "wan": ("tokenizer", "text_encoder"),
                "flux": ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2"),
                "sd3": ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2", "tokenizer_3",
                        "text_encoder_3")}[family]
    parts.update({name: None for name in encoders})
    if family == "wan":
        parts.update(_wan_parts(preset, transformer, dtype, device, seed))
    pipe = getattr(diffusers, preset.pipeline)(**parts)
    if text_len is None and preset.max_sequence_length and family == "flux":
        text_len = preset.max_sequence_length
    return pipe, embeddings_fn(family, transformer.config, dtype, device, text_len)


def _wan_parts(preset: Preset, transformer, dtype, device, seed: int) -> dict[str, Any]:
    """Wan2.2-A14B's second expert (transformer_2, random, same shape) and switch point; TI2V's per-token
    timesteps."""
    if getattr(transformer.config, "in_channels", 16) == 48:
        return {"expand_timesteps": True}
    if "a14b" in preset.name:  # a copy of the same shape with other random weights
        import copy

        from sagegen.models.arch import random_init_
        return {"transformer_2": random_init_(copy.deepcopy(transformer), seed=seed + 17), "boundary_ratio": 0.875}
    return {}
