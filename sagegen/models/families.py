"""Which model family a diffusers denoiser class belongs to: the one class -> family table.

Matched by class name through the MRO (a subclass is its base's family), so nothing here imports diffusers.
`FUSED` lists the families whose attention processors the patcher replaces with fused ones
(`sagegen.patch.SUPPORTED_MODELS`); `ROUTED` the others whose full-size configs sagegen knows
(`sagegen.models.arch_video`), patched by route. A family's patcher code lives in `sagegen.patch.families`.
"""

from __future__ import annotations

# Denoisers with fused processors: class name -> family.
FUSED = {
    "CogVideoXTransformer3DModel": "cogvideox",
    "HunyuanVideoTransformer3DModel": "hunyuanvideo",
    "MochiTransformer3DModel": "mochi",
    "FluxTransformer2DModel": "flux",
    "SD3Transformer2DModel": "sd3",
    "WanTransformer3DModel": "wan",
    "SkyReelsV2Transformer3DModel": "wan",  # Wan 2.1's attention and block code, line for line
}
# Denoisers patched by route whose configs the architecture tables know: class name -> family.
ROUTED = {
    "LTXVideoTransformer3DModel": "ltx",
    "QwenImageTransformer2DModel": "qwenimage",
    "HunyuanVideo15Transformer3DModel": "hunyuanvideo15",
}


def family_of_class(cls: type, table: dict[str, str] | None = None) -> str | None:
    """The family of ``cls`` (or of its nearest base in ``table``, default every family), else None."""
    table = {**FUSED, **ROUTED} if table is None else table
    return next((table[c.__name__] for c in cls.__mro__ if c.__name__ in table), None)
