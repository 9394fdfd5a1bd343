"""Tiny random-weight diffusers pipelines for the five supported families, built fully offline in code.

``build_tiny_pipeline(family)`` returns a real diffusers pipeline (``CogVideoXPipeline``,
``HunyuanVideoPipeline``, ``MochiPipeline``, ``FluxPipeline``, ``StableDiffusion3Pipeline``) whose every
component is built here: small tokenizers made from an in-memory vocabulary (`_tiny_tokenizers`), tiny text
encoders, a tiny VAE with the real spatial/temporal compression, the family's scheduler, and a tiny denoising
transformer of the real class. Weights are random but deterministic in ``seed``. Nothing is downloaded.

The transformers keep what matters to sagegen: head dim 64 (a supported kernel size), the real attention
processors and masks (CogVideoX's rotary joint attention, HunyuanVideo's text key-padding mask and token
refiner, Mochi's per-sample valid-token attention, Flux's double and single stream blocks, SD3.5's joint
attention plus SD3.5-medium's extra image-only attention ``attn2`` in layer 0). The text encoders' attention
also uses head dim 64, so a test can see that the patcher leaves it alone.

`TINY_CALL_DEFAULTS` gives call arguments that run in seconds on a CPU (and match the ``tiny-*`` presets).
"""

from __future__ import annotations

import contextlib

import torch

from sagegen.models import _tiny_tokenizers as tok

TINY_FAMILIES = ("cogvideox", "hunyuanvideo", "mochi", "flux", "sd3")

# Pipeline call arguments that keep a generation to seconds on a CPU. VAE factors: 8 spatial in all five;
# 4 temporal (CogVideoX, HunyuanVideo) and 6 (Mochi), so frames are 4k+1 / 6k+1.
TINY_CALL_DEFAULTS: dict[str, dict] = {
    "cogvideox": dict(height=32, width=32, num_frames=9, num_inference_steps=4, guidance_scale=6.0),
    "hunyuanvideo": dict(height=32, width=32, num_frames=9, num_inference_steps=4, guidance_scale=6.0),
    "mochi": dict(height=32, width=32, num_frames=7, num_inference_steps=4, guidance_scale=4.5),
    "flux": dict(height=64, width=64, num_inference_steps=4, guidance_scale=3.5),
    "sd3": dict(height=64, width=64, num_inference_steps=4, guidance_scale=4.5),
}

HEAD_DIM = 64
_TEXT_HIDDEN = 64  # text encoders: one head of dim 64


@contextlib.contextmanager
def _seeded(seed: int):
    """Deterministic initialisation without disturbing the caller's global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _check_family(family: str) -> str:
    if not isinstance(family, str) or family.lower() not in TINY_FAMILIES:
        raise ValueError(f"family={family!r} is not a tiny pipeline family; choose one of {TINY_FAMILIES}")
    return family.lower()


# -- text encoders -------------------------------------------------------------------------------------------
def _t5(tokenizer, seed: int, d_model: int = 32):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=len(tokenizer), d_model=d_model, d_kv=16, d_ff=2 * d_model, num_layers=2,
                      num_heads=max(1, d_model // 16), relative_attention_num_buckets=8,
                      relative_attention_max_distance=32, feed_forward_proj="gated-gelu", dropout_rate=0.0,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id)
    with _seeded(seed):
        return T5EncoderModel(config).eval()


def _clip(tokenizer, seed: int, *, projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=_TEXT_HIDDEN, intermediate_size=2 * _TEXT_HIDDEN,
                            num_hidden_layers=2, num_attention_heads=_TEXT_HIDDEN // HEAD_DIM,
                            max_position_embeddings=tokenizer.model_max_length, projection_dim=_TEXT_HIDDEN,
                            hidden_act="gelu", bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    with _seeded(seed):
        return cls(config).eval()


def _llama(tokenizer, seed: int):
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=_TEXT_HIDDEN, intermediate_size=2 * _TEXT_HIDDEN,
                         num_hidden_layers=3, num_attention_heads=_TEXT_HIDDEN // HEAD_DIM, num_key_value_heads=1,
                         max_position_embeddings=tokenizer.model_max_length, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with _seeded(seed):
        return LlamaModel(config).eval()


# -- VAEs ----------------------------------------------------------------------------------------------------
def _image_vae(seed: int, *, scaling_factor: float, shift_factor: float):
    from diffusers import AutoencoderKL

    with _seeded(seed):
        return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                             up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(32,) * 4,
                             layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=64,
                             scaling_factor=scaling_factor, shift_factor=shift_factor, use_quant_conv=False,
                             use_post_quant_conv=False).eval()


# -- the five pipelines --------------------------------------------------------------------------------------
def tiny_transformer_config(family: str) -> dict:
    """The tiny denoiser's config (also used by `sagegen.models.arch`-style tests)."""
    family = _check_family(family)
    if family == "cogvideox":  # CogVideoX-5b style: rotary embeddings, joint text+video attention
        return dict(num_attention_heads=2, attention_head_dim=HEAD_DIM, in_channels=4, out_channels=4,
                    time_embed_dim=32, text_embed_dim=32, num_layers=2, sample_width=4, sample_height=4,
                    sample_frames=9, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=226,
                    use_rotary_positional_embeddings=True)
    if family == "hunyuanvideo":
        return dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=HEAD_DIM, num_layers=1,
                    num_single_layers=1, num_refiner_layers=1, mlp_ratio=2.0, patch_size=2, patch_size_t=1,
                    qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=_TEXT_HIDDEN,
                    pooled_projection_dim=_TEXT_HIDDEN, rope_theta=256.0, rope_axes_dim=(16, 24, 24))
    if family == "mochi":
        return dict(patch_size=2, num_attention_heads=2, attention_head_dim=HEAD_DIM, num_layers=2,
                    pooled_projection_dim=32, in_channels=12, qk_norm="rms_norm", text_embed_dim=32,
                    time_embed_dim=32, activation_fn="swiglu", max_sequence_length=256)
    if family == "flux":  # FLUX.1-dev style (guidance embedding); one double- and one single-stream block
        return dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=HEAD_DIM,
                    num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=_TEXT_HIDDEN,
                    guidance_embeds=True, axes_dims_rope=(16, 24, 24))
    # sd3: layer 0 is SD3.5-medium style (dual attention: attn2 on image tokens only), layer 1 SD3.5-large style
    return dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=HEAD_DIM,
                num_attention_heads=2, joint_attention_dim=2 * _TEXT_HIDDEN, caption_projection_dim=2 * HEAD_DIM,
                pooled_projection_dim=2 * _TEXT_HIDDEN, out_channels=4, pos_embed_max_size=16,
                dual_attention_layers=(0,), qk_norm="rms_norm")


_TRANSFORMER_CLASSES = {
    "cogvideox": "CogVideoXTransformer3DModel",
    "hunyuanvideo": "HunyuanVideoTransformer3DModel",
    "mochi": "MochiTransformer3DModel",
    "flux": "FluxTransformer2DModel",
    "sd3": "SD3Transformer2DModel",
}


def build_tiny_transformer(family: str, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Only the tiny denoising transformer of a family (random weights, deterministic in ``seed``)."""
    import diffusers

    family = _check_family(family)
    cls = getattr(diffusers, _TRANSFORMER_CLASSES[family])
    with _seeded(seed * 1000 + 1):
        model = cls(**tiny_transformer_config(family))
        _variance_preserving_init(model)
    return _cast(model, dtype).eval()


def _variance_preserving_init(model: torch.nn.Module) -> None:
    """Linear weights ~ N(0, 1/fan_in), biases 0 (under the caller's seed).

    PyTorch's default init (uniform, variance 1/(3 fan_in)) shrinks activations layer by layer, so in a
    random tiny transformer attention barely changes the output (zeroing it moved the noise prediction by only
    4-8%). With variance-preserving weights attention matters (zeroing it moves the output by 30-90%), so tests
    comparing sagegen with SDPA through these models measure something.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, module.in_features ** -0.5)
                if module.bias is not None:
                    module.bias.zero_()


def build_tiny_pipeline(family: str, *, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A complete tiny random-weight diffusers pipeline of ``family`` (one of `TINY_FAMILIES`), on the CPU.

    Deterministic in ``seed``; ``dtype`` applies to every component. Text prompts work (real tokenizers).
    Call it with ``**TINY_CALL_DEFAULTS[family]`` for a run of seconds on a CPU.
    """
    family = _check_family(family)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype={dtype!r} is not supported; use torch.float32, torch.float16 or torch.bfloat16")
    builder = {"cogvideox": _cogvideox, "hunyuanvideo": _hunyuanvideo, "mochi": _mochi, "flux": _flux,
               "sd3": _sd3}[family]
    pipe = builder(seed)
    if dtype != torch.float32:
        for name, component in pipe.components.items():
            if isinstance(component, torch.nn.Module) and not (name == "vae" and family in FLOAT32_VAE):
                _cast(component, dtype)
    return pipe


# Tiny VAEs kept in float32 whatever the pipeline's dtype. Mochi's VAE decodes with 3D convolutions, which in
# bfloat16 run 6-10x slower on CPUs without native bfloat16 support (measured with oneDNN off: 8.8 s vs 1.3 s
# for 13 frames); the decode was nearly all of a tiny-mochi smoke run. sagegen's kernels never see the VAE.
FLOAT32_VAE = ("mochi",)


def _float32_input(module: torch.nn.Module, args: tuple):
    """Forward pre-hook: the pipeline hands the VAE latents in its own dtype; decode them in the VAE's
    (float32 unless the caller cast the VAE)."""
    dtype = next(module.parameters()).dtype
    return tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def _cast(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    # nn.Module.to itself: diffusers' ModelMixin.to warns about fp32-kept modules (none here) on every cast.
    return torch.nn.Module.to(module, dtype=dtype)


def _cogvideox(seed: int):
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXPipeline

    tokenizer = tok.t5_tokenizer(226)
    with _seeded(seed * 1000 + 2):
        vae = AutoencoderKLCogVideoX(in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
                                     up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8,) * 4,
                                     latent_channels=4, layers_per_block=1, norm_num_groups=2,
                                     temporal_compression_ratio=4, sample_height=32, sample_width=32).eval()
    scheduler = CogVideoXDDIMScheduler(beta_schedule="scaled_linear", prediction_type="v_prediction",
                                       timestep_spacing="trailing", rescale_betas_zero_snr=True, clip_sample=False,
                                       set_alpha_to_one=True, snr_shift_scale=1.0)
    return CogVideoXPipeline(tokenizer=tokenizer, text_encoder=_t5(tokenizer, seed * 1000 + 3), vae=vae,
                             transformer=build_tiny_transformer("cogvideox", seed=seed), scheduler=scheduler)


def _hunyuanvideo(seed: int):
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline

    tokenizer, tokenizer_2 = tok.llama_tokenizer(1024), tok.clip_tokenizer(77)
    with _seeded(seed * 1000 + 2):
        vae = AutoencoderKLHunyuanVideo(in_channels=3, out_channels=3, latent_channels=4,
                                        block_out_channels=(8,) * 4, layers_per_block=1, norm_num_groups=4,
                                        spatial_compression_ratio=8, temporal_compression_ratio=4,
                                        mid_block_add_attention=True).eval()
    return HunyuanVideoPipeline(text_encoder=_llama(tokenizer, seed * 1000 + 3), tokenizer=tokenizer,
                                transformer=build_tiny_transformer("hunyuanvideo", seed=seed), vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                                text_encoder_2=_clip(tokenizer_2, seed * 1000 + 4, projection=False),
                                tokenizer_2=tokenizer_2)


def _mochi(seed: int):
    from diffusers import AutoencoderKLMochi, FlowMatchEulerDiscreteScheduler, MochiPipeline

    tokenizer = tok.t5_tokenizer(256)
    with _seeded(seed * 1000 + 2):
        vae = AutoencoderKLMochi(in_channels=15, out_channels=3, encoder_block_out_channels=(32,) * 4,
                                 decoder_block_out_channels=(32,) * 4, latent_channels=12,
                                 layers_per_block=(1, 1, 1, 1, 1), temporal_expansions=(1, 2, 3),
                                 spatial_expansions=(2, 2, 2),
                                 add_attention_block=(False, False, False, False, False)).eval()
    vae.decoder.register_forward_pre_hook(_float32_input)  # see FLOAT32_VAE
    pipe = MochiPipeline(scheduler=FlowMatchEulerDiscreteScheduler(invert_sigmas=True), vae=vae,
                         text_encoder=_t5(tokenizer, seed * 1000 + 3), tokenizer=tokenizer,
                         transformer=build_tiny_transformer("mochi", seed=seed))
    pipe.default_height = pipe.default_width = 32
    return pipe


def _flux(seed: int):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    tokenizer, tokenizer_2 = tok.clip_tokenizer(77), tok.t5_tokenizer(512)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                                                max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
    pipe = FluxPipeline(scheduler=scheduler,
                        vae=_image_vae(seed * 1000 + 2, scaling_factor=0.3611, shift_factor=0.1159),
                        text_encoder=_clip(tokenizer, seed * 1000 + 3, projection=False), tokenizer=tokenizer,
                        text_encoder_2=_t5(tokenizer_2, seed * 1000 + 4), tokenizer_2=tokenizer_2,
                        transformer=build_tiny_transformer("flux", seed=seed))
    pipe.default_sample_size = 8  # 64 px by default instead of 1024
    return pipe


def _sd3(seed: int):
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    tokenizer, tokenizer_2, tokenizer_3 = tok.clip_tokenizer(77), tok.clip_tokenizer(77), tok.t5_tokenizer(256)
    return StableDiffusion3Pipeline(
        transformer=build_tiny_transformer("sd3", seed=seed),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_image_vae(seed * 1000 + 2, scaling_factor=1.5305, shift_factor=0.0609),
        text_encoder=_clip(tokenizer, seed * 1000 + 3, projection=True), tokenizer=tokenizer,
        text_encoder_2=_clip(tokenizer_2, seed * 1000 + 4, projection=True), tokenizer_2=tokenizer_2,
        text_encoder_3=_t5(tokenizer_3, seed * 1000 + 5, d_model=2 * _TEXT_HIDDEN), tokenizer_3=tokenizer_3)
