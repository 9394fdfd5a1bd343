"""LTX-Video's fused Q/K prologue on the backend route (`patch.ltx`): the across-heads RMSNorm + per-channel
rotary kernel against diffusers' eager ops, the fused processor against the routed stock one (self- and
cross-attention, text mask included), its fallbacks and exact unpatch."""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.support.dispatch_models import tiny_ltx
from tests.support.patching import half_model_with_distinct_norms, rel_l1
from sagegen.kernels.triton_heads_rms_rope import heads_rms_norm_rope
from sagegen.patch import patch_info, set_attention_override
from sagegen.patch.fusion import blocks as fused_blocks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the Triton kernels run in the interpreter


def _model(seed=0):
    return half_model_with_distinct_norms(*tiny_ltx(seed), DEVICE, seed)


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0].float()


def _ltx_tables(batch: int, frames: int, h: int, w: int, dim: int):
    """LTX's own rotary tables (diffusers' LTXVideoRotaryPosEmbed): fp32 (cos, sin) [B, N, dim]."""
    from diffusers.models.transformers.transformer_ltx import LTXVideoRotaryPosEmbed

    rope = LTXVideoRotaryPosEmbed(dim, base_num_frames=20, base_height=2048, base_width=2048, patch_size=1,
                                  patch_size_t=1, theta=10000.0)
    cos, sin = rope(torch.zeros(batch, frames * h * w, dim), frames, h, w)
    return cos.to(DEVICE), sin.to(DEVICE)


@pytest.mark.parametrize("heads,d,weight", [(2, 64, True), (3, 32, False), (2, 48, True)])
def test_kernel_matches_ltx_eager_ops(seed, heads, d, weight):
    """torch.nn.RMSNorm(H·D) in bf16, then LTX's apply_rotary_emb with its own tables, against one pass
    written into a transposed slice of a wider buffer."""
    from diffusers.models.transformers.transformer_ltx import apply_rotary_emb

    B, F, h, w = 2, 2, 3, 5
    N = F * h * w
    x = (torch.randn(B, N, heads * d, device=DEVICE) * 2 + 0.3).to(torch.bfloat16)
    norm = torch.nn.RMSNorm(heads * d, eps=1e-6, elementwise_affine=weight).to(DEVICE)
    if weight:
        with torch.no_grad():
            norm.weight.copy_(torch.rand(heads * d) + 0.5)
    norm = norm.to(torch.bfloat16)
    tables = _ltx_tables(B, F, h, w, heads * d)
    with torch.no_grad():
        normed = norm(x)
        ref = apply_rotary_emb(normed, tables).unflatten(2, (heads, d))
        buf = torch.full((B, heads, N + 3, d), 7.0, dtype=torch.bfloat16, device=DEVICE)
        out = heads_rms_norm_rope(x.unflatten(2, (heads, d)), (norm.weight, norm.eps), tables,
                                  out=buf[:, :, 3:].transpose(1, 2), per_channel_rope=True)
        rotation_only = heads_rms_norm_rope(normed.unflatten(2, (heads, d)), None, tables, per_channel_rope=True)
    assert (buf[:, :, :3] == 7).all()  # the slice, nothing else
    assert torch.equal(rotation_only, ref)  # the rotation alone: the eager ops' bits
    diff = (out.float() - ref.float()).abs()
    # the norm's fp32 statistics are summed in another order than torch's: a value may round the other way
    pair = normed.unflatten(2, (heads, d)).float().abs().unflatten(-1, (-1, 2)).amax(-1, keepdim=True)
    bound = (pair.expand(-1, -1, -1, -1, 2).flatten(-2) + ref.float().abs()) * 2.0 ** -7
    assert (diff <= bound).all() and (diff > 0).float().mean() < 0.02
    assert not torch.equal(ref, normed.unflatten(2, (heads, d)))  # the tables do rotate


def test_kernel_rejects_tables_of_another_form():
    x = torch.zeros(1, 10, 2, 32, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="rope"):  # Wan's pair form where channel tables are asked
        heads_rms_norm_rope(x, None, (torch.zeros(10, 16), torch.zeros(10, 16)), per_channel_rope=True)
    with pytest.raises(ValueError, match="rope"):  # half-precision channel tables
        t = torch.zeros(1, 10, 64, dtype=torch.bfloat16)
        heads_rms_norm_rope(x, None, (t, t), per_channel_rope=True)


def test_fused_model_matches_routed_stock_and_unpatches_exactly():
    """The tiny model (a padded prompt: the cross-attention's text mask), bf16: fused vs the routed stock
    processor (same quantized attention) and vs unpatched stock; the route stays "backend"."""
    model, inputs = _model()
    stock = _run(model, inputs)
    with sagegen.patched(model, backend="triton", fuse_prologue=False):
        fused_blocks.install(model)  # the block's passes on both sides: this compares the Q/K prologue
        routed = _run(model, inputs)
    with sagegen.patched(model, backend="triton"):
        fused = _run(model, inputs)
        info = patch_info(model)
        assert info["routes"] == {"backend": 2}
        assert info["stats"]["fused_qk_prologue"] == 2  # self- and cross-attention of the one block
    if DEVICE == "cpu":  # the interpreter rounds as torch's CPU ops: the same bits but for the norm's sum order
        assert rel_l1(fused, routed) < 1e-3, rel_l1(fused, routed)
    else:
        assert rel_l1(fused, routed) < 2e-3, rel_l1(fused, routed)
    assert 0 < rel_l1(fused, stock) < 0.05, rel_l1(fused, stock)
    assert torch.equal(_run(model, inputs), stock)  # unpatched: bit-identical


def test_text_mask_is_honoured():
    """Large values in sample 1's padded prompt tokens: the fused output follows stock diffusers' (which masks
    them) within the quantization's error, where dropping the mask would change it completely. (Those values
    still enter the keys' quantization scales, on the routed stock path too, so not bit-identical.)"""
    model, inputs = _model(seed=1)
    noisy = dict(inputs, encoder_hidden_states=inputs["encoder_hidden_states"].clone())
    noisy["encoder_hidden_states"][1, 4:] = 30.0
    unmasked = dict(noisy, encoder_attention_mask=torch.ones_like(inputs["encoder_attention_mask"]))
    stock, stock_unmasked = _run(model, noisy), _run(model, unmasked)
    assert rel_l1(stock_unmasked, stock) > 0.5  # the padded tokens matter when unmasked
    with sagegen.patched(model, backend="triton"):
        out = _run(model, noisy)
        assert patch_info(model)["stats"]["fused_qk_prologue"] == 2
    assert rel_l1(out, stock) < 0.05, rel_l1(out, stock)


def test_fallbacks_run_the_routed_stock_call():
    model, inputs = _model()
    stock = _run(model, inputs)
    with sagegen.patched(model, backend="triton", policy=sagegen.PrecisionPolicy(blocks=[0])):
        fused_blocks.remove(model)  # (the block's passes round differently: patch.fused_blocks_ltx)
        assert torch.equal(_run(model, inputs), stock)
        assert patch_info(model)["stats"].get("fused_qk_prologue", 0) == 0
    with sagegen.patched(model, backend="triton"):
        set_attention_override(model, lambda q, k, v, mask, causal, scale: torch.nn.functional
                               .scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale))
        assert rel_l1(_run(model, inputs), stock) < 1e-2
        assert patch_info(model)["stats"].get("fused_qk_prologue", 0) == 0
    fp32, fp32_inputs = tiny_ltx()
    with sagegen.patched(fp32, backend="triton"):
        _run(fp32.to(DEVICE), {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in fp32_inputs.items()})
        assert patch_info(fp32)["stats"].get("fused_qk_prologue", 0) == 0
