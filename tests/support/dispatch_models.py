"""Tiny diffusers transformers whose processors call `dispatch_attention_fn`, with inputs for one forward.

Configs follow the shape of diffusers' own test configs, with head dims the kernel supports (32 or 64) so
the quantized path (not the fallback) is what the tests see.
"""

from __future__ import annotations

import torch


def tiny_wan(seed: int = 0, **overrides):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    cfg = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=32, in_channels=4, out_channels=4,
               text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2, rope_max_seq_len=32)
    cfg.update(overrides)
    model = WanTransformer3DModel(**cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    inputs = dict(hidden_states=torch.randn(1, 4, 2, 8, 8, generator=g), timestep=torch.tensor([500]),
                  encoder_hidden_states=torch.randn(1, 5, 16, generator=g), return_dict=False)
    return model, inputs


def tiny_flux(seed: int = 0):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    model = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                   attention_head_dim=32, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=(4, 14, 14)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    h = w = 4
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(h).float(), torch.arange(w).float(),
                                         indexing="ij"), -1)
    inputs = dict(hidden_states=torch.randn(1, h * w, 4, generator=g),
                  encoder_hidden_states=torch.randn(1, 7, 32, generator=g),
                  pooled_projections=torch.randn(1, 32, generator=g), timestep=torch.tensor([0.5]),
                  img_ids=img_ids.reshape(-1, 3).float(), txt_ids=torch.zeros(7, 3), return_dict=False)
    return model, inputs


def tiny_qwenimage(seed: int = 0):
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(seed)
    model = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                        attention_head_dim=32, num_attention_heads=2, joint_attention_dim=16,
                                        axes_dims_rope=(8, 12, 12)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    txt = 7
    mask = torch.ones(1, txt, dtype=torch.long)
    mask[:, 5:] = 0  # two padded text tokens: the model builds a key-padding mask from them
    inputs = dict(hidden_states=torch.randn(1, 16, 16, generator=g),
                  encoder_hidden_states=torch.randn(1, txt, 16, generator=g), encoder_hidden_states_mask=mask,
                  timestep=torch.tensor([0.5]), img_shapes=[(1, 4, 4)], return_dict=False)
    return model, inputs


def _gen(seed):
    return torch.Generator().manual_seed(seed + 1)


def tiny_wan22_ti2v(seed: int = 0):
    """Wan2.2-TI2V-5B's shape of model (same class, 48 latent channels; the pipeline expands timesteps)."""
    torch.manual_seed(seed)
    model, inputs = tiny_wan(seed, in_channels=8, out_channels=8)
    inputs["hidden_states"] = torch.randn(1, 8, 2, 8, 8, generator=_gen(seed))
    return model, inputs


def tiny_skyreels_v2(seed: int = 0):
    from diffusers import SkyReelsV2Transformer3DModel

    torch.manual_seed(seed)
    model = SkyReelsV2Transformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=32,
                                         in_channels=4, out_channels=4, text_dim=16, freq_dim=32, ffn_dim=32,
                                         num_layers=2, rope_max_seq_len=32).eval()
    g = _gen(seed)
    inputs = dict(hidden_states=torch.randn(1, 4, 2, 8, 8, generator=g), timestep=torch.tensor([500]),
                  encoder_hidden_states=torch.randn(1, 6, 16, generator=g), return_dict=False)
    return model, inputs


def tiny_ltx(seed: int = 0):
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    model = LTXVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=32,
                                       cross_attention_dim=64, num_layers=1, caption_channels=16).eval()
    g = _gen(seed)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False  # padded prompt tokens: LTX hands the backend a key-padding mask
    inputs = dict(hidden_states=torch.randn(2, 2 * 4 * 4, 4, generator=g),
                  encoder_hidden_states=torch.randn(2, 6, 16, generator=g), timestep=torch.tensor([500, 500]),
                  encoder_attention_mask=mask, num_frames=2, height=4, width=4, return_dict=False)
    return model, inputs


def tiny_ltx2(seed: int = 0):
    from diffusers import LTX2VideoTransformer3DModel

    torch.manual_seed(seed)
    model = LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=32,
        cross_attention_dim=64, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=32, audio_cross_attention_dim=64, num_layers=1, caption_channels=16,
        rope_double_precision=False).eval()
    g = _gen(seed)
    inputs = dict(hidden_states=torch.randn(1, 2 * 4 * 4, 4, generator=g),
                  audio_hidden_states=torch.randn(1, 5, 4, generator=g),
                  encoder_hidden_states=torch.randn(1, 6, 16, generator=g),
                  audio_encoder_hidden_states=torch.randn(1, 6, 16, generator=g),
                  timestep=torch.tensor([500.0]), encoder_attention_mask=torch.ones(1, 6, dtype=torch.bool),
                  num_frames=2, height=4, width=4, audio_num_frames=5, fps=25.0, return_dict=False)
    return model, inputs


def tiny_hunyuanvideo15(seed: int = 0):
    from diffusers import HunyuanVideo15Transformer3DModel

    torch.manual_seed(seed)
    model = HunyuanVideo15Transformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=32, num_layers=1,
        num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16,
        text_embed_2_dim=8, image_embed_dim=12, rope_axes_dim=(8, 12, 12), target_size=16, task_type="t2v").eval()
    g = _gen(seed)
    mask = torch.ones(1, 6)
    mask[:, 4:] = 0
    inputs = dict(hidden_states=torch.randn(1, 4, 1, 8, 8, generator=g), timestep=torch.tensor([1.0]),
                  encoder_hidden_states=torch.randn(1, 6, 16, generator=g),
                  encoder_hidden_states_2=torch.randn(1, 4, 8, generator=g), encoder_attention_mask=mask,
                  encoder_attention_mask_2=torch.ones(1, 4), image_embeds=torch.zeros(1, 3, 12), return_dict=False)
    return model, inputs


def tiny_flux2(seed: int = 0):
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(seed)
    model = Flux2Transformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                    attention_head_dim=32, num_attention_heads=2, joint_attention_dim=32,
                                    timestep_guidance_channels=32, axes_dims_rope=(8, 8, 8, 8)).eval()
    g = _gen(seed)
    h = w = 4
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.arange(1))[None]
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(8))[None]
    inputs = dict(hidden_states=torch.randn(1, h * w, 4, generator=g),
                  encoder_hidden_states=torch.randn(1, 8, 32, generator=g), img_ids=img_ids, txt_ids=txt_ids,
                  timestep=torch.tensor([1.0]), guidance=torch.tensor([1.0]), return_dict=False)
    return model, inputs


# name -> builder; every class of issue 18 that diffusers 0.42 ships
DISPATCH_MODELS = {
    "wan2.1": tiny_wan, "wan2.2-ti2v": tiny_wan22_ti2v, "skyreels-v2": tiny_skyreels_v2, "ltx-video": tiny_ltx,
    "ltx-2": tiny_ltx2, "hunyuanvideo-1.5": tiny_hunyuanvideo15, "flux.2": tiny_flux2, "qwen-image": tiny_qwenimage,
}
