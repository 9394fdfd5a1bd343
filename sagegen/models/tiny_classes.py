"""Tiny random-weight denoisers of the newer diffusers model classes, with one step's forward inputs, for CPU
tests of the patch on each class: LTX-Video, LTX-2 (video + audio), Qwen-Image, HunyuanVideo-1.5, Flux.2 and
SkyReels-V2 (Wan's tiny denoiser is in `tiny_video`).

Sizes follow diffusers' own model tests (tests/models/transformers/test_models_transformer_*.py) with the head
dim raised to 64, a kernel size, so attention really runs on sagegen's kernel. Deterministic in ``seed``.
"""

from __future__ import annotations

import torch

from sagegen.models.tiny import HEAD_DIM, _cast, _seeded, _variance_preserving_init

TINY_CLASSES = ("ltx", "ltx2", "qwenimage", "hunyuanvideo15", "flux2", "skyreels_v2")

_CLASS_NAMES = {"ltx": "LTXVideoTransformer3DModel", "ltx2": "LTX2VideoTransformer3DModel",
                "qwenimage": "QwenImageTransformer2DModel", "hunyuanvideo15": "HunyuanVideo15Transformer3DModel",
                "flux2": "Flux2Transformer2DModel", "skyreels_v2": "SkyReelsV2Transformer3DModel"}
_HEADS = 2
_INNER = _HEADS * HEAD_DIM


def tiny_class_config(name: str) -> dict:
    if name == "ltx":
        return dict(in_channels=8, out_channels=8, num_attention_heads=_HEADS, attention_head_dim=HEAD_DIM,
                    cross_attention_dim=_INNER, num_layers=2, caption_channels=32, qk_norm="rms_norm_across_heads")
    if name == "ltx2":
        return dict(in_channels=4, out_channels=4, num_attention_heads=_HEADS, attention_head_dim=HEAD_DIM,
                    cross_attention_dim=_INNER, audio_in_channels=4, audio_out_channels=4,
                    audio_num_attention_heads=_HEADS, audio_attention_head_dim=HEAD_DIM,
                    audio_cross_attention_dim=_INNER, num_layers=2, qk_norm="rms_norm_across_heads",
                    caption_channels=32, rope_double_precision=False)
    if name == "qwenimage":
        return dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=HEAD_DIM,
                    num_attention_heads=_HEADS, joint_attention_dim=32, axes_dims_rope=(16, 24, 24))
    if name == "hunyuanvideo15":
        return dict(in_channels=9, out_channels=4, num_attention_heads=_HEADS, attention_head_dim=HEAD_DIM,
                    num_layers=2, num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1,
                    text_embed_dim=32, text_embed_2_dim=16, image_embed_dim=16, rope_axes_dim=(16, 24, 24),
                    task_type="t2v")
    if name == "flux2":
        return dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=HEAD_DIM,
                    num_attention_heads=_HEADS, joint_attention_dim=32, timestep_guidance_channels=256,
                    axes_dims_rope=(16, 16, 16, 16))
    if name == "skyreels_v2":
        return dict(patch_size=(1, 2, 2), num_attention_heads=_HEADS, attention_head_dim=HEAD_DIM, in_channels=4,
                    out_channels=4, text_dim=32, freq_dim=256, ffn_dim=64, num_layers=2, cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    raise ValueError(f"name={name!r} is not a tiny model class; choose one of {TINY_CLASSES}")


def build_tiny_class(name: str, *, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    import diffusers

    config = tiny_class_config(name)
    with _seeded(seed * 1000 + 11):
        model = getattr(diffusers, _CLASS_NAMES[name])(**config)
        _variance_preserving_init(model)
    return _cast(model, dtype).eval()


def tiny_class_inputs(name: str, model, *, batch: int = 2, seed: int = 0) -> dict:
    """One step's forward kwargs for the tiny model (a text padding mask where the class takes one)."""
    gen = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    c = model.config
    mask = torch.ones(batch, 12, dtype=torch.long)
    mask[0, 9:] = 0  # the first sample's last three text tokens are padding
    t = torch.full((batch,), 500.0)
    if name == "ltx":
        return dict(hidden_states=randn(batch, 2 * 4 * 4, c.in_channels), encoder_hidden_states=randn(batch, 12, 32),
                    timestep=t, encoder_attention_mask=mask, num_frames=2, height=4, width=4,
                    rope_interpolation_scale=(8 / 25.0, 32, 32), return_dict=False)
    if name == "ltx2":
        return dict(hidden_states=randn(batch, 2 * 4 * 4, 4), audio_hidden_states=randn(batch, 9, 4),
                    encoder_hidden_states=randn(batch, 12, 32), audio_encoder_hidden_states=randn(batch, 12, 32),
                    timestep=t, encoder_attention_mask=mask.bool(), num_frames=2, height=4, width=4,
                    audio_num_frames=9, fps=25.0, return_dict=False)
    if name == "qwenimage":
        return dict(hidden_states=randn(batch, 16, c.in_channels), encoder_hidden_states=randn(batch, 12, 32),
                    encoder_hidden_states_mask=mask, timestep=(t / 1000).to(dtype), img_shapes=[[(1, 4, 4)]] * batch,
                    return_dict=False)
    if name == "hunyuanvideo15":
        return dict(hidden_states=randn(batch, c.in_channels, 2, 4, 4), timestep=t.to(dtype),
                    encoder_hidden_states=randn(batch, 12, 32), encoder_attention_mask=mask,
                    encoder_hidden_states_2=randn(batch, 6, 16), encoder_attention_mask_2=torch.zeros(batch, 6).long(),
                    image_embeds=torch.zeros(batch, 5, 16, dtype=dtype), return_dict=False)
    if name == "flux2":
        img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(4), torch.arange(4), torch.arange(1))
        txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(12))
        return dict(hidden_states=randn(batch, 16, 4), encoder_hidden_states=randn(batch, 12, 32),
                    img_ids=img_ids[None].expand(batch, -1, -1), txt_ids=txt_ids[None].expand(batch, -1, -1),
                    timestep=torch.full((batch,), 0.5), guidance=torch.full((batch,), 4.0), return_dict=False)
    if name == "skyreels_v2":
        return dict(hidden_states=randn(batch, 4, 2, 8, 8), timestep=t, encoder_hidden_states=randn(batch, 12, 32),
                    return_dict=False)
    raise ValueError(f"name={name!r} is not a tiny model class; choose one of {TINY_CLASSES}")
