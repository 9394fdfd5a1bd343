"""Qwen-Image's fused Q/K prologue on the backend route (`patch.qwenimage`): the kernel with Qwen's complex
rotary tables against diffusers' eager ops, the fused processor against the routed stock one (key-padding
mask included), its fallbacks, exact unpatch and compile."""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.support.dispatch_models import tiny_qwenimage
from tests.support.patching import half_model_with_distinct_norms, rel_l1
from sagegen.kernels.triton_qk_prologue import rms_norm_rope
from sagegen.patch import patch_info, set_attention_override
from sagegen.patch.fusion import blocks as fused_blocks
from sagegen.patch.families.qwenimage_call import _pair_tables

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the Triton kernels run in the interpreter


def _model(seed=0):
    return half_model_with_distinct_norms(*tiny_qwenimage(seed), DEVICE, seed)


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0].float()


def _qwen_tables(n: int, head_dim: int) -> torch.Tensor:
    """A complex64 table [n, D/2] of unit rotations with Qwen's kind of angles (positions x frequencies)."""
    freqs = 1.0 / 10000 ** (torch.arange(head_dim // 2, dtype=torch.float64) / (head_dim // 2))
    angles = torch.arange(n, dtype=torch.float64)[:, None] * freqs[None, :] + torch.rand(n, 1, dtype=torch.float64)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64).to(DEVICE)


@pytest.mark.parametrize("heads,d,weight", [(3, 64, True), (2, 32, False), (2, 128, True)])
def test_kernel_reads_complex_tables_as_diffusers_rotates(seed, heads, d, weight):
    """diffusers' RMSNorm (bf16 weight) then apply_rotary_emb_qwen(use_real=False), against rms_norm_rope with
    the complex table read in place, written into a slice of a joint buffer."""
    from diffusers.models.normalization import RMSNorm
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    B, N = 2, 37
    x = (torch.randn(B, N, heads, d, device=DEVICE) * 2 + 0.3).to(torch.bfloat16)
    norm = RMSNorm(d, eps=1e-6, elementwise_affine=weight).to(DEVICE)
    if weight:
        with torch.no_grad():
            norm.weight.copy_(torch.rand(d) + 0.5)
    norm = norm.to(torch.bfloat16)
    table = _qwen_tables(N, d)
    with torch.no_grad():
        normed = norm(x)
        ref = apply_rotary_emb_qwen(normed, table, use_real=False)
        buf = torch.full((B, N + 5, heads, d), 9.0, dtype=torch.bfloat16, device=DEVICE)
        rms_norm_rope(x.transpose(1, 2), (norm.weight, norm.eps), _pair_tables(table, N, heads, d),
                      out=buf[:, 5:].transpose(1, 2), round_before_weight=True)
    out = buf[:, 5:]
    assert (buf[:, :5] == 9).all()  # the slice, nothing else
    diff = (out.float() - ref.float()).abs()
    # torch's complex product may contract a product into an FMA, and the norm's sum runs in another order:
    # a bf16 step of the pair's magnitude on a few elements, never more
    pair = normed.float().abs().unflatten(-1, (-1, 2)).amax(-1, keepdim=True).expand(-1, -1, -1, -1, 2).flatten(-2)
    assert (diff <= (pair + ref.float().abs()) * 2.0 ** -7).all()
    assert (diff > 0).float().mean() < 0.02
    assert not torch.equal(out, normed)  # it did rotate


def test_pair_tables_refuse_other_forms():
    t = _qwen_tables(5, 32)
    assert _pair_tables(t, 5, 2, 32)[0].shape == (5, 2, 16)
    assert _pair_tables(t.to(torch.complex128), 5, 2, 32) is False
    assert _pair_tables(t, 6, 2, 32) is False
    assert _pair_tables(torch.view_as_real(t), 5, 2, 32) is False


def test_fused_model_matches_routed_stock_with_the_text_mask_and_unpatches_exactly():
    """The whole tiny model (two padded text tokens: the key-padding mask path), bf16: fused prologue vs the
    routed stock processor (same quantized attention) and vs unpatched stock; the route stays "backend"."""
    model, inputs = _model()
    stock = _run(model, inputs)
    with sagegen.patched(model, backend="triton", fuse_prologue=False):
        fused_blocks.install(model)  # the blocks' passes on both sides: this compares the Q/K prologue
        routed = _run(model, inputs)
        assert patch_info(model)["stats"].get("fused_qk_prologue", 0) == 0
    with sagegen.patched(model, backend="triton"):
        fused = _run(model, inputs)
        info = patch_info(model)
        assert info["routes"] == {"backend": 2}
        assert info["stats"]["fused_qk_prologue"] == 2  # one per block
    if DEVICE == "cpu":  # the interpreter's products round as torch's CPU ops: the same bits
        assert torch.equal(fused, routed)
    else:  # the GPU's complex product may use an FMA: a bf16 step on a few elements
        assert rel_l1(fused, routed) < 2e-3, rel_l1(fused, routed)
    assert 0 < rel_l1(fused, stock) < 0.05, rel_l1(fused, stock)
    assert torch.equal(_run(model, inputs), stock)  # unpatched: bit-identical


def test_text_mask_is_honoured():
    """Changing what sits in the padded text tokens must not change the output (they are masked keys)."""
    model, inputs = _model(seed=1)
    with sagegen.patched(model, backend="triton"):
        out = _run(model, inputs)
        noisy = dict(inputs, encoder_hidden_states=inputs["encoder_hidden_states"].clone())
        noisy["encoder_hidden_states"][:, 5:] = 50.0
        assert torch.equal(_run(model, noisy), out)
        assert patch_info(model)["stats"]["fused_qk_prologue"] == 4


def test_fallbacks_run_the_routed_stock_call():
    """Full precision (policy), an attention override and fp32 weights take the stock processor's code."""
    model, inputs = _model()
    stock = _run(model, inputs)
    with sagegen.patched(model, backend="triton", policy=sagegen.PrecisionPolicy(blocks=[0, 1])):
        fused_blocks.remove(model)  # (the blocks' passes round differently: patch.fused_blocks_qwen)
        assert torch.equal(_run(model, inputs), stock)  # full precision: diffusers' own SDPA, bit for bit
        assert patch_info(model)["stats"].get("fused_qk_prologue", 0) == 0
    calls = []

    def override(q, k, v, mask, is_causal, scale):
        calls.append(mask)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    with sagegen.patched(model, backend="triton"):
        set_attention_override(model, override)
        assert rel_l1(_run(model, inputs), stock) < 1e-2 and len(calls) == 2
        assert patch_info(model)["stats"].get("fused_qk_prologue", 0) == 0
    fp32, fp32_inputs = tiny_qwenimage()
    with sagegen.patched(fp32, backend="triton"):
        _run(fp32.to(DEVICE), {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in fp32_inputs.items()})
        assert patch_info(fp32)["stats"].get("fused_qk_prologue", 0) == 0
