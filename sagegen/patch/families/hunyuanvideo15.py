"""HunyuanVideo-1.5: its main-block joint attention with a key-padding mask instead of a query x key mask on the
backend route (`hunyuanvideo15_call`), and sagegen's context-parallel plan, processor and text-splitting hook
(`hunyuanvideo15_cp`). Both import diffusers' HunyuanVideo-1.5 module, so they are loaded only when a model
uses them: this module registers the family and looks them up on demand.
"""

from __future__ import annotations

from sagegen.patch.family_table import FamilyCode, register

MODEL = "HunyuanVideo15Transformer3DModel"


def _key_mask_call_for(processor):
    from sagegen.patch.families import hunyuanvideo15_call

    return hunyuanvideo15_call.key_mask_call_for(processor)


def _cp_plan() -> dict:
    from sagegen.patch.families import hunyuanvideo15_cp

    return hunyuanvideo15_cp.hunyuan_video15_plan()


def _cp_hooks(model, parallel_config) -> None:
    from sagegen.patch.families import hunyuanvideo15_cp

    hunyuanvideo15_cp.install_hunyuan_video15(model, parallel_config)


register(FamilyCode("hunyuanvideo15", dispatch_calls={"HunyuanVideo15AttnProcessor2_0.__call__": _key_mask_call_for},
                    cp_plans={MODEL: _cp_plan}, cp_hooks={MODEL: _cp_hooks}))
