"""The patch's fused Q/K prologues (sagegen/patch/families/cogvideox.py) for CogVideoX, Mochi, SD3 and Flux: the same
output as routing the stock processor, on the tiny random-weight models, and the fallbacks."""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.support.patching import assert_one_layer_as_close_as_routed, rel_l1
from sagegen.models.arch import example_inputs
from sagegen.models.tiny import build_tiny_transformer
from sagegen.patch import patch_info, set_attention_override
from sagegen.patch.families import cogvideox as fused
from sagegen.patch.families import flux, hunyuanvideo, mochi, sd3
from sagegen.patch.fusion import blocks as fused_blocks
from sagegen.patch.fusion import prologue as fused_common

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the Triton kernels run in the interpreter


def _session(model):
    proc = next(m.processor for m in model.modules() if hasattr(m, "processor"))
    return proc._sage_session


def _run(model, inputs, fuse: bool, blocks: bool | None = None):
    """The patched model's output and stats; ``blocks``: fuse the block-level norms (SD3, Flux, Wan) whatever
    ``fuse`` says, so that a comparison isolates the Q/K prologue."""
    with torch.no_grad(), sagegen.patched(model, backend="triton", fuse_prologue=fuse):
        if blocks:
            fused_blocks.install(model)
        out = model(**inputs)[0]
        return out, dict(patch_info(model)["stats"])


def _assert_as_close_as_routed(model, inputs, fused, routed):
    """Through a tiny random model a flipped INT8 code (see assert_one_layer_as_close_as_routed) grows: over 10
    seeds the fused-routed distance was 0 for Flux, HunyuanVideo and SD3 and up to 0.46x the quantization error
    for Mochi (Wan: 0.70x). The bound is that error itself, as for Wan; a wrong prologue parts them by far
    more. And the fused output must be no further from the unquantized stock model than the routed one."""
    with torch.no_grad():
        stock = model(**inputs)[0]
    quant_err = rel_l1(routed, stock)
    assert 0 < quant_err < 0.05
    assert rel_l1(fused, routed) < quant_err, (rel_l1(fused, routed), quant_err)
    assert rel_l1(fused, stock) < 1.15 * quant_err, (rel_l1(fused, stock), quant_err)


def test_fused_prologue_matches_the_routed_stock_processor(seed):
    model = build_tiny_transformer("cogvideox", dtype=torch.bfloat16).to(DEVICE)
    inputs = example_inputs(model, batch=2, height=32, width=32, frames=9, text_tokens=13, dtype=torch.bfloat16,
                            device=DEVICE, seed=seed % 1000)
    assert "image_rotary_emb" in inputs
    fused, stats_fused = _run(model, inputs, True)
    routed, stats_routed = _run(model, inputs, False, blocks=True)  # the same fused blocks: the prologue alone
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


def test_fused_mochi_steps_aside_where_it_would_differ(seed):
    model = build_tiny_transformer("mochi", dtype=torch.bfloat16).to(DEVICE)
    attn = next(m for m in model.modules() if hasattr(m, "processor"))
    hs = torch.randn(2, 8, attn.to_q.in_features, dtype=torch.bfloat16, device=DEVICE)
    ehs = torch.randn(2, 4, attn.add_k_proj.in_features, dtype=torch.bfloat16, device=DEVICE)
    prefix = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], device=DEVICE)
    with sagegen.patched(model):
        proc = attn.processor
        call = lambda *args, **kw: mochi.mochi_call(proc.original, proc._sage_session, attn, args, kw)
        out = call(hs, ehs, prefix)
        assert out is not None and out[0].shape == hs.shape
        assert call(hs, ehs, torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]], device=DEVICE)) is None  # not a prefix
        assert call(hs, ehs, None) is None
        wrong = (torch.ones(8, 64, device=DEVICE), torch.zeros(8, 64, device=DEVICE))  # CogVideoX-shaped table
        assert call(hs, ehs, prefix, image_rotary_emb=wrong) is None
        attn.norm_q, saved = torch.nn.LayerNorm(attn.norm_k.dim), attn.norm_q
        try:
            assert call(hs, ehs, prefix) is None  # a norm it does not reproduce
        finally:
            attn.norm_q = saved
        # One layer: the routed stock loop (same quantized attention, per sample) agrees closely; the
        # unquantized stock processor within quantization error.
        theta = torch.rand(8, attn.heads, attn.to_q.out_features // attn.heads // 2, device=DEVICE) * 6.28
        rope = (theta.cos(), theta.sin())
        with torch.no_grad():
            stock = proc.original(attn, hs, ehs, prefix, image_rotary_emb=rope)
            proc._sage_session.fuse_qk_prologue = False
            routed = proc(attn, hs, ehs, prefix, image_rotary_emb=rope)
            out = call(hs, ehs, prefix, image_rotary_emb=rope)
        assert_one_layer_as_close_as_routed(out, routed, stock)
        assert torch.equal(out[1][0, 2:], stock[1][0, 2:])  # padded text rows: to_add_out of zeros, as stock


def test_fused_sd3_one_layer_and_fallbacks(seed):
    model = build_tiny_transformer("sd3", dtype=torch.bfloat16).to(DEVICE)
    attn = model.transformer_blocks[1].attn
    hs = torch.randn(2, 16, attn.to_q.in_features, dtype=torch.bfloat16, device=DEVICE)
    ehs = torch.randn(2, 5, attn.add_q_proj.in_features, dtype=torch.bfloat16, device=DEVICE)
    with torch.no_grad(), sagegen.patched(model):
        proc = attn.processor
        call = lambda *args, **kw: sd3.sd3_call(proc.original, proc._sage_session, attn, args, kw)
        stock = proc.original(attn, hs, ehs)
        proc._sage_session.fuse_qk_prologue = False
        routed = proc(attn, hs, ehs)
        out = call(hs, ehs)
        assert_one_layer_as_close_as_routed(out, routed, stock)
        assert call(hs, None) is not None  # image-only attention (SD3.5-medium's attn2 form)
        assert call(hs[:, None], ehs) is None  # 4-D hidden states: not this processor's joint form
        attn.norm_q, saved = torch.nn.LayerNorm(attn.norm_k.dim), attn.norm_q
        try:
            assert call(hs, ehs) is None  # a norm it does not reproduce
        finally:
            attn.norm_q = saved
    model = build_tiny_transformer("sd3", dtype=torch.float32).to(DEVICE)
    inputs = example_inputs(model, batch=1, height=64, width=64, text_tokens=11, dtype=torch.float32,
                            device=DEVICE, seed=seed % 1000)
    _, stats = _run(model, inputs, True)
    assert "fused_qk_prologue" not in stats


def test_fused_flux_one_layer_with_rotary_embeddings_and_fallbacks(seed):
    model = build_tiny_transformer("flux", dtype=torch.bfloat16).to(DEVICE)
    attn = model.transformer_blocks[0].attn
    hs = torch.randn(1, 16, attn.to_q.in_features, dtype=torch.bfloat16, device=DEVICE)
    ehs = torch.randn(1, 5, attn.add_q_proj.in_features, dtype=torch.bfloat16, device=DEVICE)
    theta = (torch.rand(21, attn.head_dim // 2, device=DEVICE) * 6.28).repeat_interleave(2, dim=1)
    rope = (theta.cos(), theta.sin())
    with torch.no_grad(), sagegen.patched(model):
        proc = attn.processor
        call = lambda *args, **kw: flux.flux_call(proc.original, proc._sage_session, attn, args, kw)
        stock = proc.original(attn, hs, ehs, image_rotary_emb=rope)
        proc._sage_session.fuse_qk_prologue = False
        routed = proc(attn, hs, ehs, image_rotary_emb=rope)
        out = call(hs, ehs, image_rotary_emb=rope)
        assert_one_layer_as_close_as_routed(out, routed, stock)
        assert call(hs, ehs, attention_mask=torch.ones(1, 21, dtype=torch.bool, device=DEVICE)) is None
        assert call(hs, ehs, image_rotary_emb=(theta[:20].cos(), theta[:20].sin())) is None  # wrong length
        assert call(hs, None) is None  # a joint block without its text: not what the stock code does
        attn.norm_q, saved = torch.nn.LayerNorm(attn.head_dim), attn.norm_q
        try:
            assert call(hs, ehs) is None
        finally:
            attn.norm_q = saved


def test_fuse_prologue_option():
    model = build_tiny_transformer("flux", dtype=torch.bfloat16)
    with sagegen.patched(model, fuse_prologue=False):
        assert _session(model).fuse_qk_prologue is False
        with sagegen.patched(model):  # a nested patch with the default turns it on, and restores it after
            assert _session(model).fuse_qk_prologue is True
        assert _session(model).fuse_qk_prologue is False
    with pytest.raises(TypeError, match="fuse_prologue"):
        sagegen.patch(model, fuse_prologue="yes")


# family: (example_inputs options, counts(model) -> (attention calls routed with the stock processors, calls
# taking the fused prologue, attention calls routed with it))
JOINT_FAMILIES = {
    # Mochi: the stock processor loops over samples (one call each); different valid text lengths per sample
    "mochi": (dict(batch=2, height=32, width=32, frames=13, text_tokens=16, valid_text=[5, 16]),
              lambda m: (2 * len(m.transformer_blocks), len(m.transformer_blocks), len(m.transformer_blocks))),
    # SD3: layer 0 has SD3.5-medium's extra image-only attention
    "sd3": (dict(batch=2, height=64, width=64, text_tokens=11), lambda m: (3, 3, 3)),
    # HunyuanVideo: dual- and single-stream blocks with the text mask; its token refiner (one layer here) has
    # another processor, routed as before
    "hunyuanvideo": (dict(batch=2, height=32, width=32, frames=9, text_tokens=12, valid_text=[4, 12]),
                     lambda m: (1 + _blocks(m), _blocks(m), 1 + _blocks(m))),
    # Flux: double- and single-stream blocks, rotary embeddings over the joint tokens
    "flux": (dict(batch=1, height=64, width=64, text_tokens=9), lambda m: (_blocks(m), _blocks(m), _blocks(m))),
}


def _blocks(model) -> int:
    return len(model.transformer_blocks) + len(model.single_transformer_blocks)


@pytest.mark.parametrize("family", sorted(JOINT_FAMILIES))
def test_fused_joint_attention_matches_the_routed_stock_processor(seed, family):
    """Norms (and rotary embeddings) written into joint Q/K/V buffers and one attention call, against the stock
    processors (concatenations, fp32 rotations, Mochi's per-sample loop) routed through sagegen."""
    options, counts = JOINT_FAMILIES[family]
    model = build_tiny_transformer(family, dtype=torch.bfloat16).to(DEVICE)
    inputs = example_inputs(model, dtype=torch.bfloat16, device=DEVICE, seed=seed % 1000, **options)
    fused, stats_fused = _run(model, inputs, True)
    routed, stats_routed = _run(model, inputs, False, blocks=True)  # the same fused blocks: the prologue alone
    stock_routed, fused_calls, fused_routed = counts(model)
    assert stats_fused["fused_qk_prologue"] == fused_calls and stats_fused["routed"] == fused_routed
    assert "fused_qk_prologue" not in stats_routed and stats_routed["routed"] == stock_routed
    _assert_as_close_as_routed(model, inputs, fused, routed)


@pytest.mark.parametrize("block", ["transformer_blocks", "single_transformer_blocks"])
def test_fused_hunyuan_one_layer_and_fallbacks(seed, block):
    """One HunyuanVideo attention of each block kind, with random rotary tables on the video tokens and a text
    padding mask, against its stock processor routed through sagegen."""
    model = build_tiny_transformer("hunyuanvideo", dtype=torch.bfloat16).to(DEVICE)
    attn = getattr(model, block)[0].attn
    dim = attn.to_q.in_features
    hs = torch.randn(2, 16, dim, dtype=torch.bfloat16, device=DEVICE)
    ehs = torch.randn(2, 6, attn.add_q_proj.in_features if attn.add_q_proj is not None else dim,
                      dtype=torch.bfloat16, device=DEVICE)
    head_dim = attn.to_q.out_features // attn.heads
    theta = (torch.rand(16, head_dim // 2, device=DEVICE) * 6.28).repeat_interleave(2, dim=1)
    rope = (theta.cos(), theta.sin())
    mask = torch.ones(2, 22, dtype=torch.bool, device=DEVICE)
    mask[0, 19:] = False  # the first sample's last three text tokens are padding
    with torch.no_grad(), sagegen.patched(model):
        proc = attn.processor
        call = lambda *args, **kw: hunyuanvideo.hunyuan_call(proc.original, proc._sage_session, attn, args, kw)
        proc._sage_session.fuse_qk_prologue = False
        routed = proc(attn, hs, ehs, mask, image_rotary_emb=rope)
        stock = proc.original(attn, hs, ehs, mask, image_rotary_emb=rope)
        out = call(hs, ehs, mask, image_rotary_emb=rope)
        assert_one_layer_as_close_as_routed(out, routed, stock)
        assert call(hs, ehs, mask, image_rotary_emb=(theta[:15].cos(), theta[:15].sin())) is None
        proc.original._attention_backend = "flash"  # another diffusers backend: the stock path (and its backend)
        try:
            assert call(hs, ehs, mask, image_rotary_emb=rope) is None
        finally:
            proc.original._attention_backend = None


@pytest.mark.parametrize("path", [
    "diffusers.models.attention_processor.CogVideoXAttnProcessor2_0",
    "diffusers.models.attention_processor.MochiAttnProcessor2_0",  # every parameter required
    "diffusers.models.attention_processor.JointAttnProcessor2_0",  # *args, **kwargs: inspect binds it
    "diffusers.models.transformers.transformer_flux.FluxAttnProcessor",
    "diffusers.models.transformers.transformer_wan.WanAttnProcessor",
])
def test_call_arguments_bind_as_inspect_does(seed, path):
    """`fused_common._arguments` binds a processor call by hand where the signature is plain: the same names
    and values as ``inspect.Signature.bind(...).arguments`` for random positional/keyword mixes, and None
    wherever bind raises (too many, duplicate, unknown or missing arguments); None for a subclass."""
    import inspect
    import random

    cls = fused_common._diffusers_class(path)
    signature = inspect.signature(cls.__call__)
    proc, rng = cls.__new__(cls), random.Random(seed)
    names = [*list(signature.parameters)[2:], "unknown"]
    refused = 0
    for _ in range(200):
        args = tuple(object() for _ in range(rng.randint(0, len(names))))
        kwargs = {name: object() for name in rng.sample(names, rng.randint(0, len(names)))}
        try:
            want = dict(signature.bind(proc, "attn", *args, **kwargs).arguments)
        except TypeError:
            want, refused = None, refused + 1
        got = fused_common._arguments(proc, path, "attn", args, kwargs)
        assert (None if got is None else dict(got)) == want, (len(args), list(kwargs))
    assert 0 < refused < 200  # both kinds of case were drawn
    sub = type("Sub", (cls,), {})
    assert fused_common._arguments(sub.__new__(sub), path, "attn", (), {}) is None
