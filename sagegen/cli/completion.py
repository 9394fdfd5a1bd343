"""Shell completion of model names (`sagegen --install-completion`): from the preset table alone, so that a
TAB answers at once (no torch, no diffusers)."""

from __future__ import annotations


def complete_model(incomplete: str) -> list[tuple[str, str]]:
    """Preset names and aliases starting with what was typed (any case), each with what it is."""
    from sagegen.models.presets import PRESETS

    typed = incomplete.lower()
    found: dict[str, str] = {}
    for preset in PRESETS.values():
        about = preset.hub_id or "built-in tiny model, random weights"
        for name in (preset.name, *preset.aliases):
            if name.lower().startswith(typed):
                found.setdefault(name, about if name == preset.name else f"alias of {preset.name}")
    return sorted(found.items())
