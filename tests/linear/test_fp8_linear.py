"""FP8 linear numerics (CPU): the Triton activation quantizer in the interpreter against the emulation (bit for
bit), weight quantization, the emulated product against fp64, the custom op, and outlier handling on inputs
with injected outlier channels."""

from __future__ import annotations

import pytest
import torch

from tests.support.helpers import cosine, rel_l1
from sagegen.kernels.fp8_quant import quantize_fp8_rows
from sagegen.linear import FP8Linear, fp8_linear, fp8_linear_reference, outlier_channels, quantize_weight
from sagegen.linear.numerics import dequantize_activations, dequantize_weight, quantize_activations


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton tests: the GPU kernel, or the interpreter


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@pytest.mark.parametrize("granularity", ["per_token", "per_block"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_quantizer_matches_the_emulation_bit_for_bit(seed, granularity, dtype):
    M, K = 23, 300  # odd sizes: a short last row tile and a short last 1x128 block
    base = torch.randn(M, K + 17) * torch.logspace(-3, 2, K + 17)  # channels over five decades
    base[4] = 0.0                                   # an all-zero row gets scale 1
    base[7, 5] = -3e3                               # an outlier; tiny negatives round to -0.0
    x = base.to(DEVICE, dtype)[:, 3:K + 3]          # a view with a row stride != K
    col = torch.rand(K, device=DEVICE) * 2
    # per token: the row in one read (K <= 8192) and the two-pass loop forced for wide rows
    for col_scale, single_k in ((None, 8192), (col, 8192), (col, 128)):
        got_q, got_s = quantize_fp8_rows(x, granularity, col_scale, programs=3,  # 3 programs: grid-stride
                                         max_single_pass_k=single_k)
        want_q, want_s = quantize_activations(x, granularity, col_scale)
        assert torch.equal(got_s, want_s)
        assert torch.equal(_bits(got_q), _bits(want_q))
    if granularity == "per_block":
        q, s = quantize_fp8_rows(x, granularity, scales_k_major=True)
        assert s.stride(0) == 1 and torch.equal(s, quantize_activations(x, granularity)[1])


@pytest.mark.parametrize("K", [1000, 2432, 4112, 13824])
def test_quantizer_wide_rows_match_the_emulation(seed, K):
    # one read of the whole row, padded to a power of two (masked lanes), at the models' widths and odd ones
    x = (torch.randn(5, K) * torch.logspace(-2, 2, K)).to(DEVICE, torch.bfloat16)
    x[2, K - 1] = 500.0  # the row's amax in its last valid column
    x[1, :4] = torch.tensor([-30.0, 30.0, -10.0, 10.0])  # GELU's tails: -0 (an inf inside the kernel's form), x
    q, s = quantize_fp8_rows(x, "per_token")
    want_q, want_s = quantize_activations(x, "per_token")
    assert torch.equal(s, want_s) and torch.equal(_bits(q), _bits(want_q))
    q, s = quantize_fp8_rows(x, "per_token", prologue="gelu_tanh")
    want_q, want_s = quantize_activations(x, "per_token", prologue="gelu_tanh")
    assert s[2, 0] == want_s[2, 0] and torch.allclose(s, want_s, rtol=2 ** -7, atol=0)
    assert (_bits(q) != _bits(want_q)).float().mean() < 0.01
    assert torch.equal(_bits(q[1, :4]), _bits(want_q[1, :4]))  # the tails exactly, -0.0 included


def test_quantizer_rejects_bad_input():
    with pytest.raises(ValueError, match="granularity"):
        quantize_fp8_rows(torch.randn(4, 16), "per_tensor")
    with pytest.raises(ValueError, match="2-D"):
        quantize_fp8_rows(torch.randn(2, 4, 16))
    with pytest.raises(TypeError, match="fp16, bf16 or fp32"):
        quantize_fp8_rows(torch.randn(4, 16).double())
    with pytest.raises(ValueError, match="col_scale"):
        quantize_fp8_rows(torch.randn(4, 16), col_scale=torch.ones(8))
    q, s = quantize_fp8_rows(torch.randn(0, 16))
    assert q.shape == (0, 16) and s.shape == (0, 1)


@pytest.mark.parametrize("granularity", ["per_channel", "per_block"])
def test_weight_quantization_error_is_within_e4m3_rounding(seed, granularity):
    w = torch.randn(200, 272) * 0.05
    q, s = quantize_weight(w, granularity)
    assert s.shape == ((200, 1) if granularity == "per_channel" else (2, 3))
    deq = dequantize_weight(q, s)
    # e4m3 keeps 3 mantissa bits: relative rounding error <= 2^-4 of each value, bounded below by the
    # subnormal step (2^-9 x scale)
    step = (2.0 ** -9) * (s if granularity == "per_channel" else s.repeat_interleave(128, 0).repeat_interleave(
        128, 1)[:200, :272])
    assert ((deq - w).abs() <= w.abs() * 2 ** -4 + step).all()


@pytest.mark.parametrize("act, weight", [("per_token", "per_channel"), ("per_block", "per_block")])
def test_emulated_fp8_linear_is_close_to_fp64(seed, act, weight):
    x = torch.randn(96, 384, dtype=torch.bfloat16)
    w = torch.randn(160, 384) / 384 ** 0.5
    bias = torch.randn(160)
    w_q, w_s = quantize_weight(w, weight)
    y = fp8_linear_reference(x, w_q, w_s, bias.to(torch.bfloat16), act)
    ref = x.double() @ w.double().t() + bias.to(torch.bfloat16).double()
    assert y.dtype == torch.bfloat16 and y.shape == (96, 160)
    assert cosine(y, ref) > 0.998 and rel_l1(y, ref) < 0.06
    # the custom op on the CPU is the emulation
    assert torch.equal(fp8_linear(x, w_q, w_s, bias.to(torch.bfloat16), None, act, False), y)
    # and it is the product of the dequantized operands
    xq, xs = quantize_activations(x, act)
    manual = (dequantize_activations(xq, xs) @ dequantize_weight(w_q, w_s).t() + bias.to(torch.bfloat16).float())
    assert torch.equal(y, manual.to(torch.bfloat16))


def _outlier_problem(M=128, K=512, N=96, magnitude=3e5):
    """Activations with a few massive channels (x `magnitude`) that meet small weights, as in DiTs: every
    channel's contribution to the output is of the same order, so losing the small channels shows.
    e4m3's exponent range absorbs outliers up to ~1e4 x the typical channel (plain FP8 loses little there:
    rel. L1 0.06 at 3e4 vs 0.037 without); at 3e5 the typical channels fall below its subnormals."""
    x = torch.randn(M, K)
    w = torch.randn(N, K) / K ** 0.5
    idx = torch.tensor([5, 200, 333])
    x[:, idx] *= magnitude
    w[:, idx] /= magnitude
    return x.to(torch.bfloat16), w.to(torch.bfloat16), idx


def _layer_error(outliers: str, act: str = "per_token", weight: str = "per_channel") -> float:
    x, w, _ = _outlier_problem()
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(w)
    layer = FP8Linear(lin, outliers=outliers, act_granularity=act, weight_granularity=weight, min_rows=1)
    ref = x.double() @ w.double().t()
    return rel_l1(layer(x), ref)


def test_outlier_handling_bounds_the_error_where_plain_fp8_does_not(seed):
    plain = _layer_error("off")
    smooth = _layer_error("smooth")
    split = _layer_error("split")
    clean_x = torch.randn(128, 512, dtype=torch.bfloat16)  # the same layer without outliers, for scale
    clean_w = (torch.randn(96, 512) / 512 ** 0.5).to(torch.bfloat16)
    w_q, w_s = quantize_weight(clean_w)
    clean = rel_l1(fp8_linear_reference(clean_x, w_q, w_s, None, "per_token"), clean_x.double() @ clean_w.double().t())
    assert plain > 0.3, plain             # the outliers set every row's scale: the other channels are lost
    assert smooth < 2 * clean + 0.01, (smooth, clean)
    assert split < 2 * clean + 0.01, (split, clean)
    # 1x128 blocks confine an outlier to its block: better than per token, still worse than handling it
    blocked = _layer_error("off", "per_block", "per_block")
    assert split < blocked < plain


def test_outlier_channels_finds_the_injected_channels():
    x, _, idx = _outlier_problem()
    found = outlier_channels(x.float().abs().amax(0), ratio=8.0, limit=64)
    assert torch.equal(found, idx)
    assert outlier_channels(x.float().abs().amax(0), ratio=8.0, limit=2).numel() == 2
    assert outlier_channels(torch.ones(64), ratio=8.0, limit=64).numel() == 0


def test_fp8linear_forwards_attributes_and_small_calls_run_bf16(seed):
    lin = torch.nn.Linear(64, 32, dtype=torch.bfloat16)
    layer = FP8Linear(lin, min_rows=16)
    assert layer.weight is lin.weight and layer.bias is lin.bias
    assert (layer.in_features, layer.out_features) == (64, 32)
    small = torch.randn(2, 5, 64, dtype=torch.bfloat16)  # 10 rows < 16: the original linear
    assert torch.equal(layer(small), lin(small)) and layer.fp8_calls == 0
    big = torch.randn(2, 9, 64, dtype=torch.bfloat16)
    out = layer(big)
    assert out.shape == (2, 9, 32) and layer.fp8_calls == 1 and not torch.equal(out, lin(big))
    with pytest.raises(ValueError, match="outliers"):
        FP8Linear(lin, outliers="clip")
    with pytest.raises(TypeError, match="nn.Linear"):
        FP8Linear(torch.nn.Conv1d(4, 4, 1))


def test_unchecked_per_token_path_is_the_checked_kernel(seed):
    """The eager linears' launch (cached launch plan, no checks) quantizes as the emulation does, bit for bit,
    and with the GELU prologue as the checked entry with the same tile does."""
    from sagegen.kernels.fp8_quant import per_token_launch, quantize_per_token_unchecked

    x = (torch.randn(37, 200) * torch.logspace(-2, 2, 200)).to(DEVICE, torch.bfloat16)[:, 5:197]  # stride != K
    col = torch.rand(192, device=DEVICE) * 2
    for col_scale in (None, col):
        q, s = quantize_per_token_unchecked(x, col_scale)
        want_q, want_s = quantize_activations(x, "per_token", col_scale)
        assert torch.equal(s, want_s) and torch.equal(_bits(q), _bits(want_q))
    bm = per_token_launch(192)["BLOCK_M"]
    q, s = quantize_per_token_unchecked(x, None, gelu=True)
    want_q, want_s = quantize_fp8_rows(x, "per_token", prologue="gelu_tanh", block_m=bm)
    assert torch.equal(s, want_s) and torch.equal(_bits(q), _bits(want_q))
    q, s = quantize_per_token_unchecked(x[:0])
    assert q.shape == (0, 192) and s.shape == (0, 1)


def test_rowwise_gemm_views_follow_the_buffers():
    """`FP8Linear` keeps w_q.t() and the [1, N] scales between calls; a move or a recalibration renews them, so
    no view keeps an old copy of the weight alive."""
    layer = FP8Linear(torch.nn.Linear(64, 32, dtype=torch.bfloat16), min_rows=1)
    wt, ws = layer._rowwise_operands()
    assert torch.equal(_bits(wt), _bits(layer.w_q.t())) and ws.shape == (1, 32) and wt._base is layer.w_q
    assert layer._rowwise_operands()[0] is wt  # reused
    layer.to(torch.device("cpu"))
    assert layer._gemm_views is None
    layer.w_q = layer.w_q.clone()  # as calibrate() does
    assert layer._rowwise_operands()[0]._base is layer.w_q


def test_blockwise_row_padding_keeps_rows_and_scales():
    """M not a multiple of 4 is padded for cuBLASLt's 1x128 recipe: the real rows and their K-major scales are
    kept, the added rows are +0 with unit scales (their outputs are dropped)."""
    from sagegen.linear.ops import _pad_rows_to_4

    xq = (torch.randn(6, 256) * 10).to(torch.float8_e4m3fn)
    xs = torch.rand(2, 6).t()  # [M, K/128], stride (1, M): the quantizer's K-major layout
    q, s = _pad_rows_to_4(xq, xs)
    assert q.shape == (8, 256) and s.shape == (8, 2) and s.stride() == (1, 8)
    assert torch.equal(q[:6].view(torch.uint8), xq.view(torch.uint8)) and (q[6:].view(torch.uint8) == 0).all()
    assert torch.equal(s[:6], xs) and (s[6:] == 1).all()
    a, b = xq[:4], xs[:4]
    assert all(x is y for x, y in zip(_pad_rows_to_4(a, b), (a, b)))  # a multiple of 4: untouched
