"""A preset's latent geometry, known from its denoiser config without building anything: how a requested
height x width x frames becomes latents and transformer tokens, and how wide each token is.

`sagegen.cli.memory` sizes a run from it before any model loads; tests/cli/test_cli_memory.py checks it against
`arch.tokens_per_sample` for every full-size preset and against the latents that each tiny pipeline makes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sagegen.models.presets import Preset

# (spatial, temporal) compression of each family's released VAE
_VAE = {"cogvideox": (8, 4), "hunyuanvideo": (8, 4), "mochi": (8, 6), "flux": (8, 1), "sd3": (8, 1),
        "wan": (8, 4), "ltx": (32, 8), "qwenimage": (8, 1), "hunyuanvideo15": (16, 4)}
_TINY_VAE = {"ltx": (4, 4), "qwenimage": (4, 1)}  # the tiny pipelines whose VAE compresses less (tiny_video)
_PACKED = ("flux", "qwenimage")  # the pipeline packs 2x2 latent pixels into one token
_CFG_BATCHED = ("cogvideox", "mochi", "sd3", "ltx")  # conditional and unconditional in one batch of 2
# padded text tokens that join the video tokens in one attention (Wan and LTX attend to text apart)
_JOINT_TEXT = {"cogvideox": 226, "hunyuanvideo": 256, "mochi": 256, "flux": 512, "sd3": 77 + 256,
               "qwenimage": 128, "hunyuanvideo15": 1000 + 729 + 256}


@dataclass(frozen=True)
class Geometry:
    vae_spatial: int        # pixels per latent pixel, per side
    vae_temporal: int       # frames per latent frame (1: images)
    patch: int              # latent pixels per token, per side (packing included)
    patch_t: int            # latent frames per token
    latent_channels: int
    hidden: int             # the transformer's width (heads x head dim)
    heads: int
    ffn: int                # its MLP's inner width
    text_tokens: int        # text tokens in the same attention as the latent tokens
    cfg_batch: int          # samples per transformer call when guidance is on

    def latent_grid(self, height: int, width: int, frames: int | None) -> tuple[int, int, int]:
        """(latent frames, latent height, latent width), as the pipelines compute them."""
        lf = (frames - 1) // self.vae_temporal + 1 if frames else 1
        if lf % self.patch_t:  # CogVideoX1.5's pipeline pads the latent frames to its temporal patch
            lf += self.patch_t - lf % self.patch_t
        return lf, height // self.vae_spatial, width // self.vae_spatial

    def tokens(self, height: int, width: int, frames: int | None) -> int:
        """Latent tokens of one sample (text tokens not included)."""
        lf, lh, lw = self.latent_grid(height, width, frames)
        return (lf // self.patch_t) * (lh // self.patch) * (lw // self.patch)

    def frames_out(self, frames: int | None) -> int:
        """Frames the VAE decodes (1 for images): k * temporal + 1, whatever was asked."""
        return (frames - 1) // self.vae_temporal * self.vae_temporal + 1 if frames else 1


def arch_name(preset: Preset) -> str | None:
    """The full-size architecture (`arch.ARCHS`) of a hub preset, by its name or an alias (hunyuanvideo-1.5 is
    hunyuanvideo-1.5-720p), or None."""
    if preset.tiny:
        return None
    from sagegen.models.arch import get_arch

    for name in (preset.name, *preset.aliases):
        try:
            return get_arch(name).name
        except ValueError:
            pass
    return None


def denoiser_config(preset: Preset) -> dict | None:
    """The denoiser config sagegen builds (tiny presets) or cites (`arch.ARCHS`) for the preset, or None."""
    from sagegen.models.block_counts import transformer_config

    config = transformer_config(preset)
    if config is None and arch_name(preset) is not None:
        from sagegen.models.arch import ARCHS

        config = dict(ARCHS[arch_name(preset)].config)
    return config


def geometry(preset: Preset) -> Geometry | None:
    """The preset's geometry, or None when sagegen knows no config for it."""
    config = denoiser_config(preset)
    if config is None or preset.family not in _VAE:
        return None
    family = preset.family
    spatial, temporal = (_TINY_VAE.get(family) if preset.tiny else None) or _VAE[family]
    if family == "wan" and config.get("in_channels") == 48:  # Wan2.2-TI2V's VAE is 16x
        spatial = 16
    p = config.get("patch_size") or 1
    patch, patch_t = (p[1], p[0]) if isinstance(p, (tuple, list)) else (p, config.get("patch_size_t") or 1)
    if family in _PACKED:
        patch = 2
    if not preset.is_video:
        temporal = 1
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    ffn = config.get("ffn_dim") or int(hidden * (config.get("mlp_ratio") or 4))
    channels = max(config.get("in_channels") or 0, config.get("out_channels") or 0, 1)
    if family in _PACKED:  # in_channels counts the packed 2x2
        channels = max(1, channels // 4)
    text = _JOINT_TEXT.get(family, 0)
    if family == "flux" and preset.max_sequence_length:
        text = preset.max_sequence_length
    return Geometry(vae_spatial=spatial, vae_temporal=temporal, patch=patch, patch_t=patch_t,
                    latent_channels=channels, hidden=hidden, heads=config["num_attention_heads"], ffn=ffn,
                    text_tokens=text, cfg_batch=2 if family in _CFG_BATCHED else 1)
