"""Wan's fused Q/K prologue: the RMSNorm-across-heads + pairwise rotary kernel against diffusers' eager ops
(`kernels.triton_heads_rms_rope`), and `patch.fused_wan.wan_call` against the routed stock processor, with
its fallbacks, on one layer and through the tiny Wan transformer."""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.support.patching import assert_one_layer_as_close_as_routed, rel_l1
from sagegen.kernels.triton_heads_rms_rope import heads_rms_norm_rope
from sagegen.models.tiny_video import build_tiny_wan_transformer
from sagegen.patch import patch_info
from sagegen.patch.families import wan as fused_wan

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the Triton kernels run in the interpreter


def _wan_tables(n_frames: int, h: int, w: int, head_dim: int, dtype: torch.dtype):
    """Wan's own rotary tables [1, N, 1, D] (diffusers' WanRotaryPosEmbed) for a latent of that size."""
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    cos, sin = WanRotaryPosEmbed(head_dim, (1, 2, 2), 32)(torch.zeros(1, 1, n_frames, 2 * h, 2 * w))
    return cos.to(DEVICE, dtype), sin.to(DEVICE, dtype)


def _eager_wan(x, norm, tables, heads):
    """What WanAttnProcessor does to a projection [B, N, H·D]: norm_q, unflatten, its apply_rotary_emb."""
    q = (norm(x) if norm is not None else x).unflatten(2, (heads, -1))
    if tables is None:
        return q
    x1, x2 = q.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = tables[0][..., 0::2], tables[1][..., 1::2]
    out = torch.empty_like(q)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(q)


@pytest.mark.parametrize("d,heads,table_dtype,weight", [
    (64, 3, torch.float32, True), (64, 2, torch.float64, True), (128, 2, torch.bfloat16, True),
    (48, 3, torch.float32, False)])
def test_heads_rms_norm_rope_matches_wan_eager_ops(seed, d, heads, table_dtype, weight):
    """RMSNorm over all heads (torch.nn.RMSNorm(H·D), bf16) then Wan's rotation computed in the tables' dtype,
    written into a slice of a wider buffer through a transposed view."""
    B, F, h, w = 2, 3, 3, 5
    N = F * h * w
    x = (torch.randn(B, N, heads * d, device=DEVICE) * 3 + 0.5).to(torch.bfloat16)
    norm = torch.nn.RMSNorm(heads * d, eps=1e-6, elementwise_affine=weight).to(DEVICE)
    if weight:
        with torch.no_grad():
            norm.weight.copy_(torch.rand(heads * d) + 0.5)
    norm = norm.to(torch.bfloat16)
    tables = _wan_tables(F, h, w, d, table_dtype)
    flat = (tables[0][0, :, 0, 0::2], tables[1][0, :, 0, 1::2])
    with torch.no_grad():
        ref = _eager_wan(x, norm, tables, heads)
        buf = torch.full((B, heads, N + 4, d), 7.0, dtype=torch.bfloat16, device=DEVICE)
        out = heads_rms_norm_rope(x.unflatten(2, (heads, d)), (norm.weight, norm.eps), flat,
                                  out=buf[:, :, 4:].transpose(1, 2))
    assert out.data_ptr() == buf[:, :, 4:].data_ptr() and (buf[:, :, :4] == 7).all()  # the slice, nothing else
    diff = (out.float() - ref.float()).abs()
    # The norm's fp32 statistics are summed in another order than torch's: a value can round the other way
    # (one bf16 step of the pair it came from); mostly bit-identical.
    normed = norm(x).unflatten(2, (heads, -1)).float().abs()
    pair = normed.unflatten(-1, (-1, 2)).amax(-1, keepdim=True).expand(-1, -1, -1, -1, 2).flatten(-2)
    bound = (pair + ref.float().abs()) * 2.0**-7
    assert (diff <= bound).all(), float((diff / bound).max())
    assert (diff > 0).float().mean() < 0.02
    assert not torch.equal(out, norm(x).unflatten(2, (heads, -1)))  # it did rotate
    with torch.no_grad():  # the rotation alone reproduces the eager ops bit for bit (no FMA contraction)
        assert torch.equal(heads_rms_norm_rope(x.unflatten(2, (heads, d)), None, flat),
                           _eager_wan(x, None, tables, heads))


def test_heads_rms_norm_rope_rejects_bad_arguments():
    x = torch.zeros(1, 10, 2, 64, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="x:"):
        heads_rms_norm_rope(x.float(), None, None)
    with pytest.raises(ValueError, match="rope"):
        heads_rms_norm_rope(x, None, (torch.zeros(10, 64), torch.zeros(10, 64)))  # per-channel table form
    with pytest.raises(ValueError, match="rope"):
        half = torch.zeros(10, 32, dtype=torch.float16)  # half tables of another dtype than x
        heads_rms_norm_rope(x, None, (half, half))
    with pytest.raises(ValueError, match="norm"):
        heads_rms_norm_rope(x, (torch.ones(64, dtype=torch.bfloat16, device=DEVICE), 1e-6), None)
    with pytest.raises(ValueError, match="out:"):
        heads_rms_norm_rope(x, None, None, out=torch.zeros(1, 9, 2, 64, dtype=torch.bfloat16, device=DEVICE))


def _layer_inputs(model, batch=2, frames=2, h=4, w=4, text=512):
    attn = model.blocks[0].attn1
    dim = attn.to_q.in_features
    n = frames * h * w
    hs = torch.randn(batch, n, dim, dtype=torch.bfloat16, device=DEVICE)
    ehs = torch.randn(batch, text, dim, dtype=torch.bfloat16, device=DEVICE)
    return hs, ehs, _wan_tables(frames, h, w, attn.inner_dim // attn.heads, torch.float32)


@pytest.mark.parametrize("which", ["attn1", "attn2"])
def test_fused_wan_one_layer_and_fallbacks(seed, which):
    """Self-attention (norms + rotary) and text cross-attention (norms) of one Wan block, against the stock
    processor routed through sagegen and against the unquantized stock processor."""
    model = build_tiny_wan_transformer(dtype=torch.bfloat16).to(DEVICE)
    attn = getattr(model.blocks[0], which)
    hs, ehs, tables = _layer_inputs(model)
    args = (hs, None, None, tables) if which == "attn1" else (hs, ehs, None, None)
    with torch.no_grad(), sagegen.patched(model, backend="triton"):
        proc = attn.processor
        call = lambda *a, **kw: fused_wan.wan_call(proc.original, proc._sage_session, attn, a, kw)
        stock = proc.original(attn, *args)
        proc._sage_session.fuse_qk_prologue = False
        routed = proc(attn, *args)
        out = call(*args)
        assert out is not None and out.shape == stock.shape and out.dtype == stock.dtype
        assert_one_layer_as_close_as_routed(out, routed, stock)
        # fallbacks: what it does not reproduce runs the original
        assert call(hs, args[1], torch.ones(2, 1, 1, args[0].shape[1], dtype=torch.bool, device=DEVICE),
                    args[3]) is None  # a mask
        if which == "attn1":
            wrong = (tables[0][:, :-1], tables[1][:, :-1])
            assert call(hs, None, None, wrong) is None  # tables for another length
            assert call(hs, ehs, None, tables) is None  # rotary in cross-attention: not what Wan does
        proc.original._attention_backend = "flash"  # another diffusers backend: the stock path
        try:
            assert call(*args) is None
        finally:
            proc.original._attention_backend = None
        attn.norm_q, saved = torch.nn.LayerNorm(attn.inner_dim).to(DEVICE, torch.bfloat16), attn.norm_q
        try:
            assert call(*args) is None  # a norm it does not reproduce
        finally:
            attn.norm_q = saved
        attn.norm_k.float()  # an fp32 norm weight (torch would return fp32): the stock path
        try:
            assert call(*args) is None
        finally:
            attn.norm_k.to(torch.bfloat16)
        attn.add_k_proj = torch.nn.Linear(4, 4)  # I2V's image K/V: the stock path
        try:
            assert call(*args) is None
        finally:
            attn.add_k_proj = None


def _model_inputs(model, batch=2, frames=5, h=32, w=32, text=512, seed=0):
    gen = torch.Generator().manual_seed(seed)
    c = model.config
    lf = (frames - 1) // 4 + 1
    latents = torch.randn(batch, c.in_channels, lf, h // 8, w // 8, generator=gen)
    return dict(hidden_states=latents.to(DEVICE, torch.bfloat16),
                timestep=torch.full((batch,), 500.0, device=DEVICE),
                encoder_hidden_states=torch.randn(batch, text, c.text_dim, generator=gen).to(DEVICE, torch.bfloat16),
                return_dict=False)


def test_fused_wan_through_the_tiny_model(seed):
    """Every attention of the tiny Wan transformer takes the fused prologue (self- and cross-attention), and
    the output stays as close to the stock model as the routed stock processors are."""
    model = build_tiny_wan_transformer(dtype=torch.bfloat16, seed=seed % 100).to(DEVICE)
    inputs = _model_inputs(model, seed=seed % 1000)
    with torch.no_grad():
        stock = model(**inputs)[0]
        with sagegen.patched(model, backend="triton", fuse_prologue=True):
            fused = model(**inputs)[0]
            stats_fused = dict(patch_info(model)["stats"])
        with sagegen.patched(model, backend="triton", fuse_prologue=False):
            routed = model(**inputs)[0]
            stats_routed = dict(patch_info(model)["stats"])
    layers = len(model.blocks)
    assert stats_fused["fused_qk_prologue"] == 2 * layers and stats_fused["routed"] == 2 * layers
    assert "fused_qk_prologue" not in stats_routed and stats_routed["routed"] == 2 * layers
    quant_err = rel_l1(routed, stock)
    assert 0 < quant_err < 0.05
    # The two routes round the normed, rotated Q/K differently before quantizing; where that flips quantized
    # values the outputs part by a share of the quantization error (0-0.7x over 12 seeds; 0.65x at seed
    # 1357692424). A wrong prologue would part them by far more.
    assert rel_l1(fused, routed) < quant_err, (rel_l1(fused, routed), quant_err)
    assert rel_l1(fused, stock) < 1.15 * quant_err, (rel_l1(fused, stock), quant_err)
