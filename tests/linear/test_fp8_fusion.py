"""FP8 linears (CPU): the GELU fused into the MLP's second layer (kernel in the interpreter against eager GELU
+ the emulation; the patcher's FeedForward detection, exact equality with the unfused emulation, exact
unfuse), the concatenation + GELU of Flux's single-block proj_out read from two tensors (kernel, layer, patch),
the emulation's device-independent scale rule, and Wan's transformer under linear="fp8"."""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.support.helpers import cosine, rel_l1
from sagegen.kernels.fp8_quant import quantize_fp8_rows
from sagegen.kernels.spec import GELU_AMAX_FLOOR
from sagegen.linear import FP8Linear, LinearPolicy
from sagegen.linear.numerics import quantize_activations
from sagegen.models import arch as archs
from sagegen.patch import patch_info
from sagegen.patch.gelu_fp8 import GeluInputOnly

EVERYWHERE = LinearPolicy(keep_blocks=(), min_rows=1, fuse_gelu=True)


@pytest.mark.parametrize("granularity", ["per_token", "per_block"])
def test_gelu_prologue_matches_eager_gelu_then_quantization(seed, granularity):
    M, K = 19, 272
    x = (torch.randn(M, K) * 3).to(torch.bfloat16)
    x[3] = 0.0
    q, s = quantize_fp8_rows(x, granularity, prologue="gelu_tanh")
    q_ref, s_ref = quantize_activations(x, granularity, prologue="gelu_tanh")
    # The interpreter's tanh (an exp formula in numpy) and torch's may differ in the last fp32 bit, which can
    # move a GELU output by one bf16 step: a few values and scales, by at most that step.
    assert torch.allclose(s, s_ref, rtol=2 ** -7, atol=0) and (s != s_ref).float().mean() < 0.1
    codes, codes_ref = q.view(torch.uint8).int(), q_ref.view(torch.uint8).int()
    assert (codes != codes_ref).float().mean() < 0.01
    assert (q.float() - q_ref.float()).abs().max() <= 32  # one e4m3 step at the top of the range


@pytest.mark.parametrize("granularity", ["per_token", "per_block"])
@pytest.mark.parametrize("k0, k1, single_pass", [(40, 232, True), (37, 91, True), (128, 300, False)])
def test_prefix_quantizer_reads_the_concatenation(seed, granularity, k0, k1, single_pass):
    """cat([prefix, x]) quantized from the two tensors: bit for bit without GELU (a strided prefix, odd widths,
    a boundary inside a 1x128 block, the two-pass rows, a channel multiplier), and with the GELU on x only."""
    M = 21
    wide = (torch.randn(M, k0 + 9) * torch.logspace(-2, 1, k0 + 9)).to(torch.bfloat16)
    prefix = wide[:, 3:3 + k0]  # row stride k0 + 9: not the concatenation's
    x = (torch.randn(M, k1) * 3).to(torch.bfloat16)
    x[5], prefix[7] = 0.0, 0.0
    col = torch.rand(k0 + k1) * 2
    opts = dict(max_single_pass_k=16384 if single_pass else 64) if granularity == "per_token" else {}
    for col_scale in (None, col):
        q, s = quantize_fp8_rows(x, granularity, col_scale, prefix=prefix, **opts)
        q_ref, s_ref = quantize_activations(torch.cat([prefix, x], 1), granularity, col_scale)
        assert q.shape == (M, k0 + k1) and torch.equal(s, s_ref)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    q, s = quantize_fp8_rows(x, granularity, prologue="gelu_tanh", prefix=prefix, **opts)
    q_ref, s_ref = quantize_activations(x, granularity, prologue="gelu_tanh", prefix=prefix)
    assert torch.equal(q_ref.view(torch.uint8)[:, :k0],
                       quantize_activations(torch.cat([prefix, torch.nn.functional.gelu(x, approximate="tanh")], 1),
                                            granularity)[0].view(torch.uint8)[:, :k0])
    # as the GELU prologue test: the interpreter's tanh may move a GELU output by one bf16 step
    assert torch.allclose(s, s_ref, rtol=2 ** -7, atol=0)
    codes, codes_ref = q.view(torch.uint8).int(), q_ref.view(torch.uint8).int()
    assert (codes != codes_ref).float().mean() < 0.01 and (q.float() - q_ref.float()).abs().max() <= 32
    if granularity == "per_token":  # the prefix's codes move only through the row scale
        same_scale = (s == s_ref).flatten()
        assert torch.equal(codes[same_scale, :k0], codes_ref[same_scale, :k0]) and same_scale.any()


def test_prefix_is_checked():
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    for bad in (torch.randn(5, 8, dtype=torch.bfloat16), torch.randn(4, 8), torch.randn(4, 2, 4, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match="prefix must be 2-D"):
            quantize_fp8_rows(x, prefix=bad)
    with pytest.raises(ValueError, match=r"col_scale must be fp32 \[40\]"):
        quantize_fp8_rows(x, col_scale=torch.ones(32), prefix=torch.randn(4, 8, dtype=torch.bfloat16))


@pytest.mark.parametrize("outliers, granularity", [("off", "per_token"), ("smooth", "per_token"),
                                                    ("split", "per_token"), ("off", "per_block")])
def test_cat_gelu_layer_equals_the_layer_of_the_concatenation(seed, outliers, granularity):
    lin = torch.nn.Linear(40 + 88, 24).to(torch.bfloat16)
    layer = FP8Linear(lin, min_rows=8, outliers=outliers, act_granularity=granularity,
                      weight_granularity="per_block" if granularity == "per_block" else "per_channel")
    attn = torch.randn(2, 9, 40, dtype=torch.bfloat16)
    mlp = (torch.randn(2, 9, 88) * 3).to(torch.bfloat16)
    attn[..., 5] *= 300  # an outlier channel for the calibrating modes
    gelu = torch.nn.functional.gelu(mlp, approximate="tanh")
    first = layer.cat_gelu(attn, mlp)  # calibrates (outlier modes) on the concatenation itself
    want = layer(torch.cat([attn, gelu], -1))
    assert torch.equal(first, want) and torch.equal(layer.cat_gelu(attn, mlp), want)
    assert layer.fp8_calls == 3
    small = FP8Linear(lin, min_rows=64)  # fewer rows than min_rows: the bf16 layer of the concatenation
    assert torch.equal(small.cat_gelu(attn, mlp), lin(torch.cat([attn, gelu], -1)))


def test_scales_use_only_exactly_rounded_operations():
    # amax / 448 and amax * fp32(1/448) differ for some amax; the rule is the multiplication (what torch on the
    # GPU computes for a division by a Python scalar), followed by one IEEE reciprocal.
    x = torch.linspace(0.5, 3.0, 4096).view(4096, 1).expand(4096, 16).contiguous()
    _, s = quantize_activations(x, "per_token")
    inv = torch.tensor(1 / 448, dtype=torch.float32)
    assert torch.equal(s[:, 0], x[:, 0] * inv)
    assert not torch.equal(s[:, 0], x[:, 0] / 448.0)  # the two rules really differ on these inputs
    q, s_k = quantize_fp8_rows(x[:300], "per_token")
    assert torch.equal(s_k, s[:300])


@pytest.mark.parametrize("name", ["flux.1-dev", "cogvideox-5b", "hunyuanvideo"])
def test_patcher_fuses_feedforward_gelu_exactly_and_unfuses(name):
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    arch = archs.get_arch(name)
    size = dict(height=64, width=64, **({"frames": 9} if arch.frames else {}))
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cpu", seed=1, **size,
                                  text_tokens=archs.smoke_text_tokens(name))
    gelus = {n: m for n, m in model.named_modules() if type(m).__name__ == "GELU"}
    with torch.inference_mode():
        sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1,
                                                                      fuse_gelu=False))
        unfused = model(**inputs)[0]
        keys = list(model.state_dict())
        sagegen.patch(model, linear="fp8", linear_policy=EVERYWHERE)
        info = patch_info(model)["linear"]
        fused = model(**inputs)[0]
        assert list(model.state_dict()) == keys  # the GELU wrapper renames nothing
    singles = [n for n in info["gelu_fused_layers"] if n.startswith("single_transformer_blocks.")]
    assert singles == ([f"single_transformer_blocks.{i}.proj_out" for i in range(len(model.single_transformer_blocks))]
                       if name != "cogvideox-5b" else [])
    classes = {type(b) for b in getattr(model, "single_transformer_blocks", [])}
    # HunyuanVideo's single blocks run diffusers' forward: a subclass calls cat_gelu (Flux's fused block does)
    assert all(getattr(c, "_sage_cat_gelu_block", False) == (name == "hunyuanvideo") for c in classes)
    for n in singles:  # the block calls proj_out.cat_gelu (GELU and concatenation in the quantization)
        assert model.get_submodule(n).fuse_cat_gelu and model.get_submodule(n).prologue is None
    feedforward = [n for n in info["gelu_fused_layers"] if n not in singles]
    assert feedforward and all(n.endswith(("ff.net.2", "ff_context.net.2")) for n in feedforward)
    for n in feedforward:
        layer = model.get_submodule(n)
        assert isinstance(layer, FP8Linear) and layer.prologue == "gelu_tanh" and layer.fp8_calls > 0
        assert isinstance(model.get_submodule(n[: -len("2")] + "0"), GeluInputOnly)
    # the emulation of GELU(x) quantized is exactly what the eager GELU then the FP8 layer computed
    assert torch.equal(fused, unfused)
    sagegen.unpatch(model)
    assert all(model.get_submodule(n) is m for n, m in gelus.items())
    assert not any(isinstance(m, (FP8Linear, GeluInputOnly)) for m in model.modules())
    assert not any(getattr(type(m), "_sage_cat_gelu_block", False) for m in model.modules())


def test_fused_layer_falls_back_with_the_gelu_for_small_calls(seed):
    lin = torch.nn.Linear(64, 32).to(torch.bfloat16)
    layer = FP8Linear(lin, min_rows=64)
    layer.prologue = "gelu_tanh"
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    assert torch.equal(layer(x), lin(torch.nn.functional.gelu(x, approximate="tanh")))


def _tiny_wan():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                  in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64,
                                  num_layers=3, rope_max_seq_len=32).to(torch.bfloat16).eval()
    g = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(1, 4, 3, 16, 16, generator=g).to(torch.bfloat16),
                  timestep=torch.tensor([500]),
                  encoder_hidden_states=torch.randn(1, 12, 32, generator=g).to(torch.bfloat16),
                  return_dict=False)
    return model, inputs


def test_wan_transformer_runs_fp8_linears_with_the_fused_gelu():
    # The FP8 linear patch knows no family: on this branch Wan goes through allow_generic (its attention route
    # lives on the models branch); the linears it selects are the same either way.
    model, inputs = _tiny_wan()
    with torch.inference_mode():
        stock = model(**inputs)[0]
        sagegen.patch(model, linear="fp8", linear_policy=EVERYWHERE, allow_generic=True)
        out = model(**inputs)[0]
    info = patch_info(model)["linear"]
    names = info["fp8_layers"]
    # every block's attention projections and both FFN layers; the FFN's GELU fused into its second layer
    for part in ("attn1.to_q", "attn1.to_out.0", "attn2.to_k", "ffn.net.0.proj", "ffn.net.2"):
        assert sum(part in n for n in names) == 3, (part, names)
    assert info["gelu_fused_layers"] == [f"blocks.{i}.ffn.net.2" for i in range(3)]
    assert info["fp8_calls"] > 0
    assert cosine(out, stock) > 0.99 and rel_l1(out, stock) < 0.15
    default = LinearPolicy()  # the first and last blocks stay bf16 by default; the GELU is fused by default
    sagegen.patch(model, linear="fp8", linear_policy=default, allow_generic=True)
    assert all(n.startswith("blocks.1.") for n in patch_info(model)["linear"]["fp8_layers"])
    assert patch_info(model)["linear"]["gelu_fused_layers"] == ["blocks.1.ffn.net.2"]
    sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(fuse_gelu=False), allow_generic=True)
    assert patch_info(model)["linear"]["gelu_fused_layers"] == []
    assert not any(isinstance(m, GeluInputOnly) for m in model.modules())
    sagegen.unpatch(model)
    assert not any(isinstance(m, (FP8Linear, GeluInputOnly)) for m in model.modules())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gelu_amax_floor_bounds_every_negative_output(dtype):
    """The floor is what lets the chunked kernel take a GELU row's scale from GELU(max x): it must exceed
    |GELU(x)| for every negative x of the dtype, with torch's formula and the kernel's sigmoid form, after the
    rounding to the dtype that the kernel applies; and stay close to GELU's true minimum (0.1700)."""
    from sagegen.kernels import fp8_quant as fq

    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype)
    x = x[torch.isfinite(x) & (x < 0)].float()
    torch_form = torch.nn.functional.gelu(x.double(), approximate="tanh")
    sigmoid_form = x / (1.0 + torch.exp2(x * (fq._GELU_A.value + fq._GELU_B.value * x * x)))
    for g in (torch_form, sigmoid_form):
        worst = g.to(dtype).float().abs().max().item()
        assert 0.169 < worst < GELU_AMAX_FLOOR, worst
    assert float(torch.tensor(GELU_AMAX_FLOOR, dtype=dtype)) == GELU_AMAX_FLOOR


def test_chunked_gelu_rows_equal_one_tile_and_the_emulation(seed):
    """The chunked GELU path (pass 1: max x only; amax = GELU(max x) with the floor) gives the one-tile path's
    codes and scales bit for bit, on rows where the floor binds and where it does not: all negative, a largest
    input below 0.27 (GELU 0.11 < floor; negatives near -0.75 give 0.17), zeros, a lone large value in the
    last chunk, mixed; odd widths and a strided input."""
    from sagegen.kernels import fp8_quant as fq

    M, K = 13, 300
    wide = (torch.randn(M, K + 5) * 2).to(torch.bfloat16)
    x = wide[:, 2:2 + K]
    x[0] = -(torch.rand(K) * 5 + 0.1).to(torch.bfloat16)          # all negative
    x[1] = (torch.rand(K) * 0.27 - 1.0).to(torch.bfloat16)        # max < 0.27, values near -0.75
    x[2] = 0.0
    x[3, :] = -0.5
    x[3, K - 3] = 40.0                                             # the row's max in the last chunk
    x[4] = torch.linspace(-3, 1.5, K).to(torch.bfloat16)
    chunked = fq.quantize_fp8_rows(x, prologue="gelu_tanh", chunked=True)
    one = fq.quantize_fp8_rows(x, prologue="gelu_tanh", chunked=False)
    assert fq.per_token_launch(K, chunked=True)["SINGLE_PASS"] is False
    assert torch.equal(chunked[1], one[1]) and torch.equal(chunked[0].view(torch.uint8), one[0].view(torch.uint8))
    floor_scale = torch.tensor(GELU_AMAX_FLOOR) * torch.tensor(1 / 448, dtype=torch.float32)
    assert torch.equal(chunked[1][:3, 0], floor_scale.expand(3))  # the floor binds on rows 0-2 only
    assert (chunked[1][3:, 0] > floor_scale).all()
    q_ref, s_ref = quantize_activations(x, "per_token", prologue="gelu_tanh")
    assert torch.allclose(chunked[1], s_ref, rtol=2 ** -7, atol=0)
    assert (chunked[0].view(torch.uint8) != q_ref.view(torch.uint8)).float().mean() < 0.01
    # without the floor, row 1's scale would be its own amax (~0.17), not the floor: the test can see the rule
    assert torch.nn.functional.gelu(x[1].float(), approximate="tanh").abs().max() < GELU_AMAX_FLOOR


def test_which_gelu_rows_run_in_chunks():
    from sagegen.kernels import fp8_quant as fq

    assert fq.gelu_rows_chunked(9728, True, False, False) and fq.gelu_rows_chunked(12288, True, False, False)
    assert fq.gelu_rows_chunked(8960, True, False, False)             # Wan2.1-1.3B's ffn down
    assert not fq.gelu_rows_chunked(13824, True, False, False)        # Wan 14B: 84% of the tile
    assert not fq.gelu_rows_chunked(8192, True, False, False)         # a full tile
    assert not fq.gelu_rows_chunked(300, True, False, False)          # a 2048 chunk would pad more than the tile
    assert not fq.gelu_rows_chunked(9728, False, False, False)        # plain rows are bound by memory
    assert not fq.gelu_rows_chunked(9728, True, True, False)          # a channel multiplier breaks the max rule
    assert not fq.gelu_rows_chunked(9728, True, False, True)          # a prefix: one tile (Flux's 15360)
