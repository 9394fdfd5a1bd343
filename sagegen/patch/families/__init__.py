"""Each model family's patcher code, one module per family: its fused Q/K prologue (the fused route), its fused
block norms and residuals, its equivalents on the backend route, GELU fusion and context-parallel plans. Each
module registers a `sagegen.patch.family_table.FamilyCode` when imported; importing this package imports them
all. Code that imports diffusers' model modules sits in ``<family>_call`` / ``<family>_cp`` modules, loaded
only when a model needs them. Shared machinery: `sagegen.patch.fusion`; the class -> family table:
`sagegen.models.families`.
"""

from sagegen.patch.families import (cogvideox, flux, hunyuanvideo, hunyuanvideo15, ltx, mochi,  # noqa: F401
                                    qwenimage, sd3, wan)
