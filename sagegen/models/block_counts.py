"""How many main blocks a preset's transformer has, known from its config without building it.

The precision policy's integer ``blocks`` entries index these blocks (`sagegen.patch.precision_policy.main_blocks`:
the entries of the transformer's top-level ModuleLists, in execution order). For the supported
families those lists are ``transformer_blocks`` (Wan: ``blocks``; ``num_layers``) and, for Flux and
HunyuanVideo, ``single_transformer_blocks`` (``num_single_layers``); tests/cli/test_cli_checks.py checks this
against the built tiny models.
"""

from __future__ import annotations

from sagegen.models.presets import Preset


def transformer_config(preset: Preset) -> dict | None:
    """The denoiser's config as sagegen builds it (tiny presets, --random-weights, the published config)."""
    if preset.tiny:
        from sagegen.models import tiny, tiny_video

        kind = preset.name.removeprefix("tiny-")  # as models.loading picks the tiny builder
        if kind in tiny_video.TINY_VIDEO_KINDS:
            return tiny_video.tiny_denoiser_config(kind)
        return tiny.tiny_transformer_config(preset.family)
    from sagegen.models.arch import ARCHS

    arch = ARCHS.get(preset.name)
    return dict(arch.config) if arch is not None else None


def block_count(preset: Preset) -> int | None:
    """The number of main blocks, or None when sagegen does not know the preset's config."""
    config = transformer_config(preset)
    if config is None:
        return None
    return int(config.get("num_layers", 0)) + int(config.get("num_single_layers", 0))
