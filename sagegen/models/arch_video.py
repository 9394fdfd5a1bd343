"""Full-size architectures of the newer families (Wan 2.1 / 2.2) and their one-step forward inputs, merged into
`sagegen.models.arch` (``ARCHS``, ``example_inputs``). Plain data here, so that this module imports nothing of
``arch`` (no cycle).

Configs are the published diffusers ``transformer/config.json`` of each hub repository (cited per entry).
Tokens per sample (self-attention; Wan's text is cross-attention, 512 tokens): Wan2.1-T2V-1.3B 480×832×81
21·30·52 = 32,760; Wan2.1-T2V-14B and Wan2.2-T2V-A14B 720×1280×81 21·45·80 = 75,600; Wan2.2-TI2V-5B
704×1280×121 (16× VAE) 31·22·40 = 27,280. Wan runs classifier-free guidance as two transformer calls per step
(conditional, then unconditional), so ``batch`` is 1 and a step costs two of the measured calls.
"""

from __future__ import annotations

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

VIDEO_ALIASES = {"wan": "wan2.1-t2v-1.3b", "wan2.1": "wan2.1-t2v-1.3b", "wan2.1-14b": "wan2.1-t2v-14b",
                 "wan2.2": "wan2.2-t2v-a14b", "wan2.2-5b": "wan2.2-ti2v-5b"}

# diffusers class -> family, for example inputs of a built model object
MODEL_FAMILIES = {"WanTransformer3DModel": "wan"}

# families whose text tokens join the image tokens in one attention (so they count in tokens_per_sample)
CROSS_ATTENTION_TEXT = frozenset({"wan"})


def vae_factors(family: str, config: dict) -> tuple[int, int]:
    """(spatial, temporal) compression of the family's VAE for a transformer config."""
    if family == "wan":  # Wan2.2-TI2V's VAE compresses 16× (48 latent channels); Wan2.1's 8×
        return (16 if config.get("in_channels") == 48 else 8), 4
    raise ValueError(f"unknown family {family!r}")


def latent_tokens(family: str, config: dict, height: int, width: int, frames: int | None) -> int:
    spatial, temporal = vae_factors(family, config)
    p_t, p_h, p_w = config["patch_size"]
    lf = (frames - 1) // temporal + 1 if frames else 1
    return (lf // p_t) * (height // spatial // p_h) * (width // spatial // p_w)


def wan_inputs(config: dict, *, batch: int, height: int, width: int, frames: int | None, text_tokens: int,
               randn, device: torch.device, dtype: torch.dtype) -> dict:
    """WanTransformer3DModel kwargs of one CFG half (the pipeline calls the transformer once for the prompt and
    once for the negative prompt): latents [B, C, F', H', W'], the 512-token UMT5 embeddings, timestep 500.
    Wan2.2-TI2V (48 channels) passes one timestep per latent token, as its pipeline does (expand_timesteps)."""
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


INPUT_BUILDERS = {"wan": wan_inputs}
