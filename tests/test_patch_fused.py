"""The patch's fused CogVideoX Q/K prologue (sagegen/patch/fused.py): the same output as routing the stock
processor, on the tiny random-weight CogVideoX (rotary embeddings, LayerNorm Q/K norms), and the fallbacks."""

from __future__ import annotations

import torch

import sagegen
from patch_support import rel_l1
from sagegen.models.arch import example_inputs
from sagegen.models.tiny import build_tiny_transformer
from sagegen.patch import patch_info, set_attention_override

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the Triton kernels run in the interpreter


def _session(model):
    proc = next(m.processor for m in model.modules() if hasattr(m, "processor"))
    return proc._sage_session


def _run(model, inputs, fuse: bool):
    with torch.no_grad(), sagegen.patched(model, backend="triton"):
        _session(model).fuse_qk_prologue = fuse
        out = model(**inputs)[0]
        return out, dict(patch_info(model)["stats"])


def test_fused_prologue_matches_the_routed_stock_processor(seed):
    model = build_tiny_transformer("cogvideox", dtype=torch.bfloat16).to(DEVICE)
    inputs = example_inputs(model, batch=2, height=32, width=32, frames=9, text_tokens=13, dtype=torch.bfloat16,
                            device=DEVICE, seed=seed % 1000)
    assert "image_rotary_emb" in inputs
    fused, stats_fused = _run(model, inputs, True)
    routed, stats_routed = _run(model, inputs, False)
    layers = len(model.transformer_blocks)
    assert stats_fused["fused_qk_prologue"] == layers and stats_fused["routed"] == layers
    assert "fused_qk_prologue" not in stats_routed and stats_routed["routed"] == layers
    # Same roundings as the eager norm + rotary code; what differs is the rounding of LayerNorm statistics.
    # (Mostly bit-identical; a value that rounds the other way can move one INT8 block: ~1e-3 seen.)
    assert rel_l1(fused, routed) < 5e-3, rel_l1(fused, routed)
    with torch.no_grad():
        stock = model(**inputs)[0]
    assert 0 < rel_l1(fused, stock) < 0.05
    # An attention override (the benchmark's attention-free run) keeps diffusers' own code around it.
    with torch.no_grad(), sagegen.patched(model):
        set_attention_override(model, lambda q, k, v, mask, causal, scale: torch.zeros_like(q))
        model(**inputs)
        assert "fused_qk_prologue" not in patch_info(model)["stats"]


def test_fused_prologue_steps_aside_for_fp32_models_and_masks(seed):
    model = build_tiny_transformer("cogvideox", dtype=torch.float32).to(DEVICE)
    inputs = example_inputs(model, batch=1, height=32, width=32, frames=9, text_tokens=13, dtype=torch.float32,
                            device=DEVICE, seed=seed % 1000)
    _, stats = _run(model, inputs, True)
    assert "fused_qk_prologue" not in stats and stats["routed"] == len(model.transformer_blocks)

    from sagegen.patch import fused

    model = build_tiny_transformer("cogvideox", dtype=torch.bfloat16).to(DEVICE)
    attn = next(m for m in model.modules() if hasattr(m, "processor"))
    hs = torch.randn(1, 8, attn.to_q.in_features, dtype=torch.bfloat16, device=DEVICE)
    with sagegen.patched(model):
        proc = attn.processor
        call = lambda *args, **kw: fused.cogvideox_call(proc.original, proc._sage_session, attn, args, kw)
        assert call(hs, hs[:, :5]) is not None  # no rotary embeddings: the LayerNorms alone
        assert call(hs, hs[:, :5], attention_mask=torch.ones(1, 1, 13, 13, dtype=torch.bool, device=DEVICE)) is None
        wrong_n = (torch.ones(7, 64, device=DEVICE), torch.zeros(7, 64, device=DEVICE))
        assert call(hs, hs[:, :5], image_rotary_emb=wrong_n) is None
        attn.norm_q, saved = torch.nn.Identity(), attn.norm_q
        try:
            assert call(hs, hs[:, :5]) is None  # a norm it does not reproduce
        finally:
            attn.norm_q = saved
