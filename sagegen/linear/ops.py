"""The FP8 linear as a torch.library custom op (``sagegen::fp8_linear``), so ``torch.compile`` keeps it whole.

On a CUDA GPU with FP8 tensor cores (sm89+): the activation is quantized by the Triton kernel
(`sagegen.kernels.fp8_quant`) and multiplied by cuBLASLt:
- per-token activations x per-channel weights: ``torch._scaled_mm`` with row-wise scales
  (``scale_a`` [M, 1], ``scale_b`` [1, N], fp32), bias fused; ``fast_accum=True`` (the default) lets Hopper
  accumulate in the tensor core's own reduced-precision accumulator without the periodic promotion to fp32
  (what torchao's inference float8 uses; faster, error measured by bench/bench_fp8_linear.py);
- 1x128-block activations x 128x128-block weights: ``torch.nn.functional.scaled_mm`` with block-wise scaling
  recipes, where this torch/cuBLAS supports it (`blockwise_supported` probes it once per device; M is padded
  to a multiple of 4, which cuBLASLt needs). Slower than row-wise at the models' shapes on an H200 (Flux ff up
  0.29 vs 0.24 ms, Wan q/k/v/o 3.86 vs 3.28 ms with quantization), so per-token x per-channel stays the default.
Elsewhere (CPU, or ``emulate=True``): `numerics.fp8_linear_reference`, the same quantized values in fp32.
``prologue="gelu_tanh"``: the activation is GELU(x), computed inside the quantization kernel (the MLP's second
layer fed with the pre-GELU tensor).
"""

from __future__ import annotations

import functools

import torch

from sagegen.linear import numerics

FP8_MIN_CAPABILITY = (8, 9)
_FUSE_BIAS = True


def fp8_capable(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` can run FP8 GEMMs, and why not."""
    if device.type != "cuda":
        return False, f"device {device} is not a CUDA GPU"
    cap = torch.cuda.get_device_capability(device)
    if cap < FP8_MIN_CAPABILITY:
        return False, (f"{torch.cuda.get_device_name(device)} (sm{cap[0]}{cap[1]}) has no FP8 tensor cores; "
                       "FP8 GEMMs need sm89+ (Ada, Hopper, Blackwell)")
    return True, ""


def _gemm_rowwise(xq, xs, w_q, w_s, bias, out_dtype, fast_accum=True):
    return gemm_rowwise_prepared(xq, xs, w_q.t(), w_s.view(1, -1), bias, out_dtype, fast_accum)


def gemm_rowwise_prepared(xq, xs, w_q_t, w_s_row, bias, out_dtype, fast_accum=True):
    """The row-wise FP8 GEMM with the weight already as cuBLASLt reads it: ``w_q_t`` = ``w_q.t()`` ([K, N],
    column-major), ``w_s_row`` = the [1, N] scales (`FP8Linear` keeps both views: two ops less a call)."""
    # A bias is fused only for bf16 outputs with row-wise scales; otherwise it is added after.
    # Row-wise scaling produces bf16 (the only output type cuBLASLt/CUTLASS offer for it); other activation
    # dtypes get the bf16 result cast back.
    global _FUSE_BIAS
    fused = _FUSE_BIAS and bias is not None and bias.dtype == torch.bfloat16
    try:
        y = torch._scaled_mm(xq, w_q_t, scale_a=xs, scale_b=w_s_row, bias=bias if fused else None,
                             out_dtype=torch.bfloat16, use_fast_accum=fast_accum)
    except RuntimeError:
        if not fused:
            raise
        _FUSE_BIAS, fused = False, False  # this torch/cuBLAS does not fuse a bias with row-wise scales
        y = torch._scaled_mm(xq, w_q_t, scale_a=xs, scale_b=w_s_row, out_dtype=torch.bfloat16,
                             use_fast_accum=fast_accum)
    if bias is not None and not fused:
        y = y + bias.to(y.dtype)
    return y if out_dtype == torch.bfloat16 else y.to(out_dtype)


def blockwise_weight_scale_for_gemm(w_s: torch.Tensor) -> torch.Tensor:
    """The [ceil(N/128), ceil(K/128)] weight scales in the layout cuBLASLt's 128x128 recipe reads:
    [round_up(K/128, 4), N/128], column-major (the K blocks padded to a multiple of 4)."""
    nb, kb = w_s.shape
    padded = torch.ones((nb, -(-kb // 4) * 4), dtype=torch.float32, device=w_s.device)
    padded[:, :kb] = w_s
    return padded.t()


def _pad_rows_to_4(xq: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cuBLASLt's 1x128 recipe found no algorithm at M = 250 (CUBLAS_STATUS_NOT_SUPPORTED; M = 256, 4096 and
    75600 ran: torch 2.11 / CUDA 13, H200, lab/data/probe-blockwise-mm-h200-2026-11-26.json): zero rows
    (unit scales) up to the next multiple of 4; the caller drops their outputs. xs: [M, K/128], stride (1, M)."""
    m = xq.shape[0]
    m4 = -(-m // 4) * 4
    if m4 == m:
        return xq, xs
    q = torch.empty((m4, xq.shape[1]), dtype=xq.dtype, device=xq.device)
    q[:m].copy_(xq)
    q[m:].view(torch.uint8).zero_()  # 0x00 is +0 in e4m3
    s = torch.ones((xs.shape[1], m4), dtype=xs.dtype, device=xs.device)
    s[:, :m].copy_(xs.t())
    return q, s.t()


def _gemm_blockwise(xq, xs, w_q, w_s, bias, out_dtype):
    import torch.nn.functional as F
    from torch.nn.functional import ScalingType

    if w_s.is_contiguous() and w_s.shape[0] == -(-w_q.shape[0] // 128):  # the natural layout: convert
        w_s = blockwise_weight_scale_for_gemm(w_s)
    m = xq.shape[0]
    xq, xs = _pad_rows_to_4(xq, xs)
    y = F.scaled_mm(xq, w_q.t(), scale_a=xs, scale_recipe_a=ScalingType.BlockWise1x128, scale_b=w_s,
                    scale_recipe_b=ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)[:m]
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(out_dtype)


def _gpu_forward(x, w_q, w_s, bias, act_granularity, col_scale, fast_accum=True, prologue=None):
    from sagegen.kernels.fp8_quant import quantize_fp8_rows

    out_dtype = x.dtype
    if act_granularity == "per_token":
        xq, xs = quantize_fp8_rows(x, "per_token", col_scale, prologue=prologue)
        return _gemm_rowwise(xq, xs, w_q, w_s, bias, out_dtype, fast_accum)
    xq, xs = quantize_fp8_rows(x, "per_block", col_scale, prologue=prologue, scales_k_major=True)
    return _gemm_blockwise(xq, xs, w_q, w_s, bias, out_dtype)


@functools.cache
def blockwise_supported(device_index: int) -> tuple[bool, str]:
    """Whether 1x128 x 128x128 block-scaled FP8 GEMMs run on this GPU with this torch, checked against the
    emulation on a small product (once per device)."""
    device = torch.device("cuda", device_index)
    ok, why = fp8_capable(device)
    if not ok:
        return False, why
    try:
        import torch.nn.functional as F

        if not hasattr(F, "scaled_mm"):
            return False, f"torch {torch.__version__} has no torch.nn.functional.scaled_mm"
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(250, 384, generator=g).to(device, torch.bfloat16)  # M not a multiple of 4
        w = torch.randn(256, 384, generator=g).to(device, torch.bfloat16)
        w_q, w_s = numerics.quantize_weight(w, "per_block")
        got = _gpu_forward(x, w_q, w_s, None, "per_block", None).float()
        want = numerics.fp8_linear_reference(x, w_q, w_s, None, "per_block").float()
        err = ((got - want).abs().max() / want.abs().max()).item()
        if not err < 1e-2:
            return False, f"block-scaled scaled_mm disagrees with the emulation (max rel. error {err:.3g})"
        return True, ""
    except Exception as e:  # noqa: BLE001 - any failure means: not available here
        return False, f"block-scaled scaled_mm failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"


def quantize_eager(x: torch.Tensor, act_granularity: str, emulate: bool, col_scale: torch.Tensor | None = None,
                   prologue: str | None = None, prefix: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] -> (e4m3 [M, K], fp32 scales) as `gemm_eager` reads them: the Triton kernel on a GPU (block
    scales K-major, as cuBLASLt wants them), the emulation elsewhere. ``prefix`` [M, K0] (x's dtype): the
    activation is ``cat([prefix, prologue(x)], 1)``, never materialised on the GPU."""
    if emulate or x.device.type != "cuda":
        return numerics.quantize_activations(x, act_granularity, col_scale, prologue, prefix)
    if act_granularity == "per_token":  # the hot path of eager steps: no re-validation of what the layer made
        from sagegen.kernels.fp8_quant import quantize_per_token_unchecked

        unit = lambda t: t if t is None or t.stride(1) == 1 else t.contiguous()  # noqa: E731
        return quantize_per_token_unchecked(unit(x), col_scale, prologue == "gelu_tanh", unit(prefix))
    from sagegen.kernels.fp8_quant import quantize_fp8_rows

    return quantize_fp8_rows(x, act_granularity, col_scale, prologue=prologue, prefix=prefix, scales_k_major=True)


def gemm_eager(xq: torch.Tensor, xs: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
               bias: torch.Tensor | None, act_granularity: str, emulate: bool, fast_accum: bool,
               out_dtype: torch.dtype) -> torch.Tensor:
    """The product of a `quantize_eager` activation and the FP8 weight -> [M, N] in ``out_dtype``."""
    if emulate or xq.device.type != "cuda":
        y = numerics.dequantize_activations(xq, xs) @ numerics.dequantize_weight(w_q, w_scale).t()
        if bias is not None:
            y = y + bias.float()
        return y.to(out_dtype)
    if act_granularity == "per_token":
        return _gemm_rowwise(xq, xs, w_q, w_scale, bias, out_dtype, fast_accum)
    return _gemm_blockwise(xq, xs, w_q, w_scale, bias, out_dtype)


def fp8_linear_eager(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                     col_scale: torch.Tensor | None, act_granularity: str, emulate: bool, fast_accum: bool = True,
                     prologue: str | None = None, prefix: torch.Tensor | None = None) -> torch.Tensor:
    """`fp8_linear` without the custom-op dispatch, for eager calls: on an H100 the dispatch alone cost ~60 us
    of host time a call (lab/probes/probe_fp8_overhead.py), which made a Flux step launch-bound.
    ``prefix`` [M, K0]: the product of ``cat([prefix, prologue(x)], 1)`` (eager only)."""
    xq, xs = quantize_eager(x, act_granularity, emulate, col_scale, prologue, prefix)
    return gemm_eager(xq, xs, w_q, w_scale, bias, act_granularity, emulate, fast_accum, x.dtype)


def fp8_linear_traced(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                      col_scale: torch.Tensor | None, emulate: bool, fast_accum: bool = True,
                      prologue: str | None = None) -> torch.Tensor:
    """The per-token FP8 linear as plain torch ops, for code that ``torch.compile`` traces: the quantization is
    `numerics.quantize_activations` itself (amax, scale, cast), which inductor fuses into whatever produced
    ``x`` (a norm, a GELU, a residual add), and the GEMM is ``torch._scaled_mm`` (GPU) or the emulated product.
    The opaque `fp8_linear` op would read ``x`` back from memory in a quantization kernel of its own. The same
    numerics as the eager path: the Triton quantizer matches `quantize_activations` bit for bit, though
    inductor's code may round the scale's reciprocal differently (one e4m3 step, rarely).
    x [M, K]; w_q [N, K] e4m3; w_scale the [N, 1] per-channel scales -> [M, N] in x's dtype."""
    xq, xs = numerics.quantize_activations(x, "per_token", col_scale, prologue)
    if emulate or x.device.type != "cuda":
        y = numerics.dequantize_activations(xq, xs) @ numerics.dequantize_weight(w_q, w_scale).t()
        return (y if bias is None else y + bias.float()).to(x.dtype)
    fused = _FUSE_BIAS and bias is not None and bias.dtype == torch.bfloat16
    y = torch._scaled_mm(xq, w_q.t(), scale_a=xs, scale_b=w_scale.view(1, -1), bias=bias if fused else None,
                         out_dtype=torch.bfloat16, use_fast_accum=fast_accum)
    if bias is not None and not fused:
        y = y + bias.to(y.dtype)
    return y.to(x.dtype)


@torch.library.custom_op("sagegen::fp8_linear", mutates_args=())
def fp8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
               col_scale: torch.Tensor | None, act_granularity: str, emulate: bool, fast_accum: bool = True,
               prologue: str | None = None) -> torch.Tensor:
    """``x`` [M, K] (fp16/bf16/fp32) times the FP8 weight ``w_q`` [N, K] (scales ``w_scale``) -> [M, N] in x's
    dtype. ``prologue="gelu_tanh"``: GELU(x) times the weight. ``fast_accum``: cuBLASLt's fast FP8 accumulation
    (GPU, row-wise only; the emulation accumulates in fp32 either way)."""
    return fp8_linear_eager(x, w_q, w_scale, bias, col_scale, act_granularity, emulate, fast_accum, prologue)


@fp8_linear.register_fake
def _(x, w_q, w_scale, bias, col_scale, act_granularity, emulate, fast_accum=True, prologue=None):
    return x.new_empty((x.shape[0], w_q.shape[0]))
