"""Which fused prologue serves a patched processor's family (`call`), kept apart from the family modules so
that they need not import each other."""

from __future__ import annotations

from sagegen.patch.families import cogvideox as fused
from sagegen.patch.fusion import joint as fused_joint
from sagegen.patch.families import wan as fused_wan

# family -> fn(original processor, session, attn, args, kwargs) -> output, or None to run the original
FAMILY_CALLS = {
    "cogvideox": fused.cogvideox_call,
    "mochi": fused.mochi_call,
    "sd3": fused_joint.sd3_call,
    "flux": fused_joint.flux_call,
    "hunyuanvideo": fused_joint.hunyuan_call,
    "wan": fused_wan.wan_call,
}


def call(processor, attn, args, kwargs):
    """The family's fused processor call for a patched processor (`processors.SageProcessorBase`), or None to
    run the original. Never with an attention override: an attention-free analysis run keeps diffusers' own
    code around attention, so it measures the stock model's non-attention time."""
    session = processor._sage_session
    family_call = FAMILY_CALLS.get(session.family)
    if family_call is None or not session.fuse_qk_prologue or session.attention_override is not None:
        return None
    out = family_call(processor._sage_original, session, attn, args, kwargs)
    if out is not None:
        session.count("processor_calls")
        session.count("fused_qk_prologue")
    return out
