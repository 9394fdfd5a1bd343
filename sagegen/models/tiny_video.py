"""Tiny random-weight pipelines of the newer diffusers video families, built fully offline (see `tiny`).

``build_tiny_video_pipeline(kind)`` returns a real diffusers pipeline whose every component is built here:
* ``wan2.1``: ``WanPipeline`` (Wan2.1-T2V layout: one transformer, 16-channel VAE, 8× spatial / 4× temporal);
* ``wan2.2-a14b``: ``WanPipeline`` with ``transformer`` and ``transformer_2`` (the high- and low-noise
  experts, switched at ``boundary_ratio`` 0.875 as Wan2.2-T2V-A14B);
* ``wan2.2-ti2v``: ``WanPipeline(expand_timesteps=True)`` with Wan2.2-TI2V-5B's 48-channel residual VAE
  (16× spatial) and per-token timesteps;
* ``ltx-video``: ``LTXPipeline`` with a tiny LTX VAE (4× spatial and temporal instead of 32×/8×) and the
  tiny LTX-Video denoiser of `tiny_classes` (T5 text with a padding mask, cross-attention, CFG batched);
* ``qwen-image``: ``QwenImagePipeline`` (an image model) with a tiny Qwen2.5-VL text encoder, a 4× Qwen-Image
  VAE and the tiny Qwen-Image denoiser (joint text-image attention; true CFG with a negative prompt);
* ``hunyuanvideo-1.5``: ``HunyuanVideo15Pipeline`` (text-to-video) with a tiny Qwen2.5-VL text model (chat
  template, 1000 padded text slots after the template), a tiny ByT5 glyph encoder, a 16× VAE, its CFG guider.

The transformers keep what sagegen cares about: head dim 64 (a kernel size), Wan's real attention processor
(Q/K RMSNorm across heads, pairwise rotary embeddings, cross-attention to the 512 text tokens the processor
expects). Text encoders are tiny UMT5 encoders over the in-memory T5 tokenizer (`_tiny_tokenizers`).
Sizes follow diffusers' own pipeline tests (tests/pipelines/wan), with head dim 64 instead of 12.
"""

from __future__ import annotations

import torch

from sagegen.models import _tiny_tokenizers as tok
from sagegen.models.tiny import HEAD_DIM, _cast, _seeded, _variance_preserving_init

TINY_VIDEO_KINDS = ("wan2.1", "wan2.2-a14b", "wan2.2-ti2v", "ltx-video", "qwen-image", "hunyuanvideo-1.5")

# Call arguments for a run of seconds on a CPU. Wan's VAE: 4× temporal (frames 4k+1), 8× spatial (16× for
# TI2V's); the transformer patches 2×2, so 32 px → 2×2 tokens per latent frame (TI2V: 64 px → 2×2).
TINY_VIDEO_CALL_DEFAULTS: dict[str, dict] = {
    "wan2.1": dict(height=32, width=32, num_frames=9, num_inference_steps=4, guidance_scale=5.0),
    "wan2.2-a14b": dict(height=32, width=32, num_frames=9, num_inference_steps=4, guidance_scale=4.0,
                        guidance_scale_2=3.0),
    "wan2.2-ti2v": dict(height=64, width=64, num_frames=9, num_inference_steps=4, guidance_scale=5.0),
    "ltx-video": dict(height=32, width=32, num_frames=9, num_inference_steps=4, guidance_scale=3.0),
    "qwen-image": dict(height=32, width=32, num_inference_steps=4, true_cfg_scale=4.0),
    "hunyuanvideo-1.5": dict(height=32, width=32, num_frames=9, num_inference_steps=4),  # guidance: its guider
}

TEXT_TOKENS = {"wan": 512}  # Wan's processor hard-codes 512 text tokens (image context = the rest)
_T5_DIM = 32


def _check_kind(kind: str) -> str:
    if not isinstance(kind, str) or kind.lower() not in TINY_VIDEO_KINDS:
        raise ValueError(f"kind={kind!r} is not a tiny video pipeline; choose one of {TINY_VIDEO_KINDS}")
    return kind.lower()


def tiny_wan_config(*, in_channels: int = 16) -> dict:
    """A 2-layer WanTransformer3DModel config: 2 heads of dim 64, Wan's qk norm and cross-attention norm."""
    return dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=HEAD_DIM, in_channels=in_channels,
                out_channels=in_channels, text_dim=_T5_DIM, freq_dim=256, ffn_dim=64, num_layers=2,
                cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32)


def build_tiny_wan_transformer(*, seed: int = 0, dtype: torch.dtype = torch.float32,
                               in_channels: int = 16) -> torch.nn.Module:
    """Only a tiny Wan denoiser (random variance-preserving weights, deterministic in ``seed``)."""
    from diffusers import WanTransformer3DModel

    with _seeded(seed * 1000 + 1):
        model = WanTransformer3DModel(**tiny_wan_config(in_channels=in_channels))
        _variance_preserving_init(model)
    return _cast(model, dtype).eval()


_CLASS_OF_KIND = {"ltx-video": "ltx", "qwen-image": "qwenimage", "hunyuanvideo-1.5": "hunyuanvideo15"}


def tiny_denoiser_config(kind: str) -> dict:
    """The config of a tiny video pipeline's denoiser (``transformer``; Wan2.2-A14B's ``transformer_2`` is the
    same shape), known without building anything."""
    kind = _check_kind(kind)
    if kind.startswith("wan"):
        return tiny_wan_config(in_channels=48 if kind == "wan2.2-ti2v" else 16)
    from sagegen.models.tiny_classes import tiny_class_config

    return tiny_class_config(_CLASS_OF_KIND[kind])


def build_tiny_denoiser(kind: str, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Only the tiny denoiser of a video pipeline kind (as `build_tiny_video_pipeline` builds it)."""
    kind = _check_kind(kind)
    if kind.startswith("wan"):
        return build_tiny_wan_transformer(seed=seed, dtype=dtype, in_channels=48 if kind == "wan2.2-ti2v" else 16)
    from sagegen.models.tiny_classes import build_tiny_class

    return build_tiny_class(_CLASS_OF_KIND[kind], seed=seed, dtype=dtype)


def _umt5(tokenizer, seed: int):
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(vocab_size=len(tokenizer), d_model=_T5_DIM, d_kv=16, d_ff=2 * _T5_DIM, num_layers=2,
                        num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=32,
                        feed_forward_proj="gated-gelu", dropout_rate=0.0, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
    with _seeded(seed):
        return UMT5EncoderModel(config).eval()


def _wan_vae(seed: int, *, ti2v: bool):
    from diffusers import AutoencoderKLWan

    with _seeded(seed):
        if ti2v:  # Wan2.2's 48-channel residual VAE: 2×2 patchify inside, 16× spatial in all
            return AutoencoderKLWan(base_dim=3, z_dim=48, in_channels=12, out_channels=12, is_residual=True,
                                    patch_size=2, latents_mean=[0.0] * 48, latents_std=[1.0] * 48,
                                    dim_mult=[1, 1, 1, 1], num_res_blocks=1, scale_factor_spatial=16,
                                    scale_factor_temporal=4, temperal_downsample=[False, True, True]).eval()
        return AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                temperal_downsample=[False, True, True]).eval()


def _wan(kind: str, seed: int):
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    tokenizer = tok.t5_tokenizer(512)
    ti2v = kind == "wan2.2-ti2v"
    channels = 48 if ti2v else 16
    extra = {}
    if kind == "wan2.2-a14b":  # the low-noise expert: a second transformer of the same shape
        extra = dict(transformer_2=build_tiny_wan_transformer(seed=seed + 7, in_channels=channels),
                     boundary_ratio=0.875)
    if ti2v:
        extra = dict(expand_timesteps=True)
    # shift 5.0 for 480p (3.0 for 720p) per the Wan2.1 card; flow prediction as the real scheduler config
    return WanPipeline(tokenizer=tokenizer, text_encoder=_umt5(tokenizer, seed * 1000 + 3),
                       vae=_wan_vae(seed * 1000 + 2, ti2v=ti2v), scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
                       transformer=build_tiny_wan_transformer(seed=seed, in_channels=channels), **extra)


def _ltx(seed: int):
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXPipeline

    from sagegen.models.tiny import _t5
    from sagegen.models.tiny_classes import build_tiny_class

    tokenizer = tok.t5_tokenizer(128)
    with _seeded(seed * 1000 + 2):  # (diffusers' LTX pipeline test VAE: 4x spatial, 4x temporal)
        vae = AutoencoderKLLTXVideo(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8,) * 4,
                                    decoder_block_out_channels=(8,) * 4, layers_per_block=(1,) * 5,
                                    decoder_layers_per_block=(1,) * 5,
                                    spatio_temporal_scaling=(True, True, False, False),
                                    decoder_spatio_temporal_scaling=(True, True, False, False),
                                    decoder_inject_noise=(False,) * 5, upsample_residual=(False,) * 4,
                                    upsample_factor=(1,) * 4, timestep_conditioning=False, patch_size=1,
                                    patch_size_t=1, encoder_causal=True, decoder_causal=False).eval()
    vae.use_framewise_encoding = vae.use_framewise_decoding = False
    return LTXPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, tokenizer=tokenizer,
                       text_encoder=_t5(tokenizer, seed * 1000 + 3),
                       transformer=build_tiny_class("ltx", seed=seed, dtype=torch.float32))


def _qwen_image(seed: int):
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from sagegen.models.tiny_classes import build_tiny_class, tiny_class_config

    tokenizer = tok.qwen_tokenizer()
    width = tiny_class_config("qwenimage")["joint_attention_dim"]  # the text encoder's hidden size
    config = Qwen2_5_VLConfig(
        text_config=dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=len(tokenizer), rope_theta=1_000_000.0,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         rope_scaling={"mrope_section": [2, 2, 4], "rope_type": "default", "type": "default"}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=width),
        hidden_size=width, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)
    with _seeded(seed * 1000 + 3):
        text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    with _seeded(seed * 1000 + 2):  # (diffusers' Qwen-Image pipeline test VAE: 4x spatial, 4 channels)
        vae = AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                     temperal_downsample=[False, True], latents_mean=[0.0] * 4,
                                     latents_std=[1.0] * 4).eval()
    return QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                             tokenizer=tokenizer, transformer=build_tiny_class("qwenimage", seed=seed,
                                                                               dtype=torch.float32))


_CHAT_TEMPLATE = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n{{ m['content'] }}"
                  "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant"
                  "<|end_header_id|>\n{% endif %}")


def _hunyuanvideo15(seed: int):
    from diffusers import (AutoencoderKLHunyuanVideo15, ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler,
                           HunyuanVideo15Pipeline)
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    from sagegen.models.tiny import _t5
    from sagegen.models.tiny_classes import build_tiny_class, tiny_class_config

    config = tiny_class_config("hunyuanvideo15")
    tokenizer = tok.qwen_tokenizer(2048)  # 1000 text slots + the 108 template tokens the pipeline crops
    tokenizer.chat_template = _CHAT_TEMPLATE
    width = config["text_embed_dim"]
    with _seeded(seed * 1000 + 3):
        text_encoder = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
            hidden_size=width, intermediate_size=2 * width, num_hidden_layers=3, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=2048,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            rope_scaling={"mrope_section": [2, 2, 4], "rope_type": "default", "type": "default"})).eval()
    tokenizer_2 = ByT5Tokenizer()
    with _seeded(seed * 1000 + 2):
        vae = AutoencoderKLHunyuanVideo15(latent_channels=config["out_channels"], block_out_channels=(8,) * 5,
                                          layers_per_block=1).eval()
    return HunyuanVideo15Pipeline(
        text_encoder=text_encoder, tokenizer=tokenizer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
        transformer=build_tiny_class("hunyuanvideo15", seed=seed, dtype=torch.float32),
        text_encoder_2=_t5(tokenizer_2, seed * 1000 + 4, d_model=config["text_embed_2_dim"]),
        tokenizer_2=tokenizer_2, guider=ClassifierFreeGuidance(guidance_scale=6.0))


def build_tiny_video_pipeline(kind: str, *, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A complete tiny random-weight pipeline of ``kind`` (one of `TINY_VIDEO_KINDS`), on the CPU.

    Deterministic in ``seed``; ``dtype`` applies to every component. Call it with
    ``**TINY_VIDEO_CALL_DEFAULTS[kind]`` for a run of seconds on a CPU.
    """
    kind = _check_kind(kind)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype={dtype!r} is not supported; use torch.float32, torch.float16 or torch.bfloat16")
    builders = {"ltx-video": _ltx, "qwen-image": _qwen_image, "hunyuanvideo-1.5": _hunyuanvideo15}
    pipe = builders.get(kind, lambda s: _wan(kind, s))(seed)
    if dtype != torch.float32:
        for component in pipe.components.values():
            if isinstance(component, torch.nn.Module):
                _cast(component, dtype)
    return pipe
