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
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(h).float(), torch.arange(w).float(), indexing="ij"), -1)
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
