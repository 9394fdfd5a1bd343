"""Full-size architectures of the newer families (Wan 2.1 / 2.2, LTX-Video, Qwen-Image, HunyuanVideo-1.5)
and their one-step forward inputs, merged into `sagegen.models.arch` (``ARCHS``, ``example_inputs``). Plain
data here, so that this module imports nothing of ``arch`` (no cycle).

Configs are the published diffusers ``transformer/config.json`` of each hub repository (cited per entry).
Tokens per sample (self-attention; Wan's text is cross-attention, 512 tokens): Wan2.1-T2V-1.3B 480×832×81
21·30·52 = 32,760; Wan2.1-T2V-14B and Wan2.2-T2V-A14B 720×1280×81 21·45·80 = 75,600; Wan2.2-TI2V-5B
704×1280×121 (16× VAE) 31·22·40 = 27,280. Wan runs classifier-free guidance as two transformer calls per step
(conditional, then unconditional), so ``batch`` is 1 and a step costs two of the measured calls.
LTX-Video 512×704×161 (32× VAE, 8× in time): 21·16·22 = 7,392 video tokens, CFG batched (batch 2), 128 T5
tokens by cross-attention. Qwen-Image 1328² (16× incl. 2×2 packing): 83² = 6,889 image tokens + the prompt's
text tokens (no padding; 128 assumed) in joint attention, true CFG as two calls. HunyuanVideo-1.5 720p
(target_size 960: 720×1280, 16× VAE) 121 frames: 31·45·80 = 111,600 video tokens + 729 image + 256 ByT5 +
1000 Qwen2.5-VL text slots (masked, valid first) in joint attention; 480p (848×480) 31·30·53 = 49,290.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only (torch is imported where it is used)
    import torch

_WAN_BASE = dict(patch_size=(1, 2, 2), attention_head_dim=128, in_channels=16, out_channels=16, text_dim=4096,
                 freq_dim=256, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None,
                 added_kv_proj_dim=None, rope_max_seq_len=1024, pos_embed_seq_len=None)
_WAN_14B = dict(_WAN_BASE, num_attention_heads=40, ffn_dim=13824, num_layers=40)
_CFG_TWO_CALLS = {"cfg_calls_per_step": 2}

# name, family, diffusers class, config, and Arch's keyword fields (see arch.Arch)
VIDEO_ARCHS: list[dict] = [
    dict(name="wan2.1-t2v-1.3b", family="wan", cls="WanTransformer3DModel",
         config=dict(_WAN_BASE, num_attention_heads=12, ffn_dim=8960, num_layers=30),
         height=480, width=832, frames=81, batch=1, text_tokens=512, notes=_CFG_TWO_CALLS,
         source="Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json"),
    dict(name="wan2.1-t2v-14b", family="wan", cls="WanTransformer3DModel", config=dict(_WAN_14B),
         height=720, width=1280, frames=81, batch=1, text_tokens=512, notes=_CFG_TWO_CALLS,
         source="Wan-AI/Wan2.1-T2V-14B-Diffusers transformer/config.json"),
    # Two experts of this shape (transformer: high noise, transformer_2: low noise); one step runs one of them
    dict(name="wan2.2-t2v-a14b", family="wan", cls="WanTransformer3DModel", config=dict(_WAN_14B),
         height=720, width=1280, frames=81, batch=1, text_tokens=512,
         notes=dict(_CFG_TWO_CALLS, experts=2),
         source="Wan-AI/Wan2.2-T2V-A14B-Diffusers transformer/config.json (= transformer_2/config.json)"),
    dict(name="wan2.2-ti2v-5b", family="wan", cls="WanTransformer3DModel",
         config=dict(_WAN_BASE, num_attention_heads=24, ffn_dim=14336, num_layers=30, in_channels=48,
                     out_channels=48),
         height=704, width=1280, frames=121, batch=1, text_tokens=512,
         notes=dict(_CFG_TWO_CALLS, vae_spatial=16, per_token_timesteps=True),
         source="Wan-AI/Wan2.2-TI2V-5B-Diffusers transformer/config.json"),
]

# LTX-Video 0.9.x (2B): the class defaults are the released config
_LTX = dict(in_channels=128, out_channels=128, patch_size=1, patch_size_t=1, num_attention_heads=32,
            attention_head_dim=64, cross_attention_dim=2048, num_layers=28, activation_fn="gelu-approximate",
            qk_norm="rms_norm_across_heads", norm_elementwise_affine=False, norm_eps=1e-6, caption_channels=4096,
            attention_bias=True, attention_out_bias=True)
_QWEN = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
             num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56))
_HV15 = dict(in_channels=65, out_channels=32, num_attention_heads=16, attention_head_dim=128, num_layers=54,
             num_refiner_layers=2, mlp_ratio=4.0, patch_size=1, patch_size_t=1, qk_norm="rms_norm",
             text_embed_dim=3584, text_embed_2_dim=1472, image_embed_dim=1152, rope_theta=256.0,
             rope_axes_dim=(16, 56, 56), task_type="t2v", use_meanflow=False)
VIDEO_ARCHS += [
    dict(name="ltx-video", family="ltx", cls="LTXVideoTransformer3DModel", config=dict(_LTX),
         height=512, width=704, frames=161, batch=2, text_tokens=128,
         source="Lightricks/LTX-Video transformer/config.json (= LTXVideoTransformer3DModel defaults)"),
    dict(name="qwen-image", family="qwenimage", cls="QwenImageTransformer2DModel", config=dict(_QWEN),
         height=1328, width=1328, batch=1, text_tokens=128, notes=dict(_CFG_TWO_CALLS, text_tokens="assumed"),
         source="Qwen/Qwen-Image transformer/config.json (= QwenImageTransformer2DModel defaults)"),
    dict(name="hunyuanvideo-1.5-720p", family="hunyuanvideo15", cls="HunyuanVideo15Transformer3DModel",
         config=dict(_HV15, target_size=960), height=720, width=1280, frames=121, batch=1, text_tokens=1000,
         notes=_CFG_TWO_CALLS,
         source="hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v transformer/config.json (8.3B: 16 "
                "heads x 128, 54 layers; target_size 960 gives the pipeline's 720x1280 default)"),
    dict(name="hunyuanvideo-1.5-480p", family="hunyuanvideo15", cls="HunyuanVideo15Transformer3DModel",
         config=dict(_HV15, target_size=640), height=480, width=848, frames=121, batch=1, text_tokens=1000,
         notes=_CFG_TWO_CALLS,
         source="hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v transformer/config.json"),
]

VIDEO_ALIASES = {"wan": "wan2.1-t2v-1.3b", "wan2.1": "wan2.1-t2v-1.3b", "wan2.1-14b": "wan2.1-t2v-14b",
                 "wan2.2": "wan2.2-t2v-a14b", "wan2.2-5b": "wan2.2-ti2v-5b", "ltx": "ltx-video",
                 "hunyuanvideo-1.5": "hunyuanvideo-1.5-720p", "hunyuanvideo15": "hunyuanvideo-1.5-720p"}


# families whose text tokens join the image tokens in one attention (so they count in tokens_per_sample)
CROSS_ATTENTION_TEXT = frozenset({"wan", "ltx"})
# HunyuanVideo-1.5's text slots in the joint attention besides the Qwen2.5-VL tokens: SigLIP image + ByT5
_HV15_EXTRA_TEXT = 729 + 256


def vae_factors(family: str, config: dict) -> tuple[int, int]:
    """(spatial, temporal) compression of the family's VAE for a transformer config."""
    if family == "wan":  # Wan2.2-TI2V's VAE compresses 16× (48 latent channels); Wan2.1's 8×
        return (16 if config.get("in_channels") == 48 else 8), 4
    if family == "ltx":
        return 32, 8
    if family == "qwenimage":  # 8× VAE, then 2×2 latent packing (counted here, so patch 1 below)
        return 16, 1
    if family == "hunyuanvideo15":
        return 16, 4
    raise ValueError(f"unknown family {family!r}")


def latent_tokens(family: str, config: dict, height: int, width: int, frames: int | None) -> int:
    spatial, temporal = vae_factors(family, config)
    p = config.get("patch_size", 1)
    p_t, p_h, p_w = p if family == "wan" else (config.get("patch_size_t", 1), p, p)
    if family == "qwenimage":
        p_t = p_h = p_w = 1
    lf = (frames - 1) // temporal + 1 if frames else 1
    return (lf // p_t) * (height // spatial // p_h) * (width // spatial // p_w)


def wan_inputs(config: dict, *, batch: int, height: int, width: int, frames: int | None, text_tokens: int,
               randn, device: torch.device, dtype: torch.dtype, text_mask: torch.Tensor) -> dict:
    """WanTransformer3DModel kwargs of one CFG half (the pipeline calls the transformer once for the prompt and
    once for the negative prompt): latents [B, C, F', H', W'], the 512-token UMT5 embeddings, timestep 500.
    Wan2.2-TI2V (48 channels) passes one timestep per latent token, as its pipeline does (expand_timesteps)."""
    import torch

    spatial, temporal = vae_factors("wan", config)
    lf = (frames - 1) // temporal + 1 if frames else 1
    lh, lw = height // spatial, width // spatial
    kw = dict(hidden_states=randn(batch, config["in_channels"], lf, lh, lw),
              encoder_hidden_states=randn(batch, text_tokens, config["text_dim"]))
    if config.get("in_channels") == 48:
        p_t, p_h, p_w = config["patch_size"]
        n = (lf // p_t) * (lh // p_h) * (lw // p_w)
        kw["timestep"] = torch.full((batch, n), 500.0, device=device)
    else:
        kw["timestep"] = torch.full((batch,), 500.0, device=device)
    return kw


def ltx_inputs(config: dict, *, batch: int, height: int, width: int, frames: int | None, text_tokens: int,
               randn, device: torch.device, dtype: torch.dtype, text_mask: torch.Tensor) -> dict:
    """LTXVideoTransformer3DModel kwargs as LTXPipeline passes them: packed latents [B, N, 128], T5 embeddings
    with their padding mask, the latent grid and the rotary interpolation scale (VAE factors / 25 fps)."""
    import torch

    lf, lh, lw = (frames - 1) // 8 + 1, height // 32, width // 32
    return dict(hidden_states=randn(batch, lf * lh * lw, config["in_channels"]),
                encoder_hidden_states=randn(batch, text_tokens, config["caption_channels"]),
                encoder_attention_mask=text_mask.long(), timestep=torch.full((batch,), 500.0, device=device),
                num_frames=lf, height=lh, width=lw, rope_interpolation_scale=(8 / 25.0, 32, 32))


def qwenimage_inputs(config: dict, *, batch: int, height: int, width: int, frames: int | None, text_tokens: int,
                     randn, device: torch.device, dtype: torch.dtype, text_mask: torch.Tensor) -> dict:
    """QwenImageTransformer2DModel kwargs as QwenImagePipeline passes them: packed latents [B, (H/16)(W/16),
    64], Qwen2.5-VL embeddings (trimmed to the prompt, so all valid, and then the pipeline passes no mask:
    ``encode_prompt`` drops an all-True one), timestep / 1000, the image shapes."""
    import torch

    lh, lw = height // 16, width // 16
    return dict(hidden_states=randn(batch, lh * lw, config["in_channels"]),
                encoder_hidden_states=randn(batch, text_tokens, config["joint_attention_dim"]),
                encoder_hidden_states_mask=None,
                timestep=torch.full((batch,), 0.5, device=device, dtype=dtype), img_shapes=[[(1, lh, lw)]] * batch)


def hunyuanvideo15_inputs(config: dict, *, batch: int, height: int, width: int, frames: int | None,
                          text_tokens: int, randn, device: torch.device, dtype: torch.dtype,
                          text_mask: torch.Tensor) -> dict:
    """HunyuanVideo15Transformer3DModel kwargs of one CFG call (text-to-video): latents with the (zero) image
    condition and mask channels [B, 65, F', H', W'], Qwen2.5-VL embeddings with a key-padding mask, 256 ByT5
    glyph slots (none valid for a prompt without quoted text), zero SigLIP image embeddings (t2v)."""
    import torch

    lf, lh, lw = (frames - 1) // 4 + 1 if frames else 1, height // 16, width // 16
    latents = torch.zeros(batch, config["in_channels"], lf, lh, lw, device=device, dtype=dtype)
    latents[:, : config["out_channels"]] = randn(batch, config["out_channels"], lf, lh, lw)
    return dict(hidden_states=latents, timestep=torch.full((batch,), 500.0, device=device, dtype=dtype),
                encoder_hidden_states=randn(batch, text_tokens, config["text_embed_dim"]),
                encoder_attention_mask=text_mask.long(),
                encoder_hidden_states_2=randn(batch, 256, config["text_embed_2_dim"]),
                encoder_attention_mask_2=torch.zeros(batch, 256, dtype=torch.long, device=device),
                image_embeds=torch.zeros(batch, 729, config["image_embed_dim"], device=device, dtype=dtype))


INPUT_BUILDERS = {"wan": wan_inputs, "ltx": ltx_inputs, "qwenimage": qwenimage_inputs,
                  "hunyuanvideo15": hunyuanvideo15_inputs}
