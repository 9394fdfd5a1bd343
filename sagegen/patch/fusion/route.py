"""Which fused prologue serves a patched processor's family (`call`): looked up in the family table, so that
this module and the family modules need not import each other."""

from __future__ import annotations

from sagegen.patch.family_table import family


def call(processor, attn, args, kwargs):
    """The family's fused processor call for a patched processor (`processors.SageProcessorBase`), or None to
    run the original. Never with an attention override: an attention-free analysis run keeps diffusers' own
    code around attention, so it measures the stock model's non-attention time."""
    session = processor._sage_session
    code = family(session.family)
    family_call = code.prologue if code is not None else None
    if family_call is None or not session.fuse_qk_prologue or session.attention_override is not None:
        return None
    out = family_call(processor._sage_original, session, attn, args, kwargs)
    if out is not None:
        session.count("processor_calls")
        session.count("fused_qk_prologue")
    return out
