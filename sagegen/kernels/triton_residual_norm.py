"""A gated residual add followed by a modulated LayerNorm, in one Triton pass over each token row.

DiT blocks such as Wan's (diffusers ``WanTransformerBlock``) wrap every sub-layer in fp32 element-wise work:
``h = (x.float() + y * gate).type_as(x)`` after it and ``(LayerNorm(h.float()) * (1 + scale) + shift)
.type_as(h)`` before the next one. Eagerly that is about ten kernels and ~170 bytes of memory traffic per
element of the hidden state per block, with fp32 intermediates; at Wan2.1-14B 720p (75,600 tokens x 5120)
about 0.75 s of a 9.5 s call. Here one program per row reads x (and y), and writes h (and the normalised row)
once each, in the activations' dtype.

Roundings as the eager ops: the residual is computed in fp32 (the gate product rounded, no FMA contraction)
and rounded once to x's dtype; the norm reads that rounded h back, as ``h.float()`` does. The LayerNorm itself
is two-pass (mean, then the centred variance) in fp32, where PyTorch's kernel uses Welford's update: the fp32
results agree to a few ulps, so a normalised output can differ from eager by one step of bf16 in rare
elements (tests/kernels/test_residual_norm.py bounds it).

``fp8_out=True`` writes the normalised rows in FP8 (e4m3) with one scale per row instead of in the activations'
dtype: the row is rounded to that dtype as it would be stored, then quantized exactly as
`sagegen.kernels.fp8_quant` quantizes a stored row per token. That is, bit for bit, the copy an FP8 linear
reading ``n`` makes, for a projection that is the norm's only reader (Wan's cross-attention Q): the norm writes
one byte an element instead of two, and the quantization pass and its read of ``n`` are gone. Without the norm,
``fp8_out=True`` adds the same copy of the residual sum h to h itself (LTX-Video's cross-attention Q reads h,
and so does the next residual add).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from sagegen.kernels.fp8_quant import _quantize_tile, _scale_and_inverse
from sagegen.kernels.spec import next_power_of_2
from sagegen.kernels.triton_qk_prologue import FP_FUSION, _to_out
from sagegen.kernels.triton_quant import interpreting

_HALF = (torch.float16, torch.bfloat16)
# Rows a program under TRITON_INTERPRET=1: the interpreter's cost is per program (tens of ms each, whatever its
# size), so one row a program made a tiny CogVideoX's 238-row calls take ~17 s each.
INTERPRETER_ROWS = 256


@triton.jit
def _residual_norm_kernel(
    X, Y, Gate, W, Bias, Scale, Shift, HOut, NOut, NScale,
    M, S, C, eps,
    stride_xr, stride_yr, stride_hr, stride_nr,
    stride_gb, stride_gs, stride_scb, stride_scs, stride_shb, stride_shs,
    HAS_RES: tl.constexpr, HAS_GATE: tl.constexpr, HAS_NORM: tl.constexpr, HAS_AFFINE: tl.constexpr,
    HAS_MOD: tl.constexpr, RMS: tl.constexpr, EXACT_CAST: tl.constexpr, FP8_OUT: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    rows = rows.to(tl.int64)
    b = (rows // S)[:, None]
    s = (rows % S)[:, None]
    r = rows[:, None]
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < C
    ok = row_ok[:, None] & col_ok[None, :]
    cols = cols[None, :]
    x = tl.load(X + r * stride_xr + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        y = tl.load(Y + r * stride_yr + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_GATE:
            y = y * tl.load(Gate + b * stride_gb + s * stride_gs + cols, mask=ok, other=0.0).to(tl.float32)
        h = _to_out(x + y, HOut.dtype.element_ty, EXACT_CAST)
        tl.store(HOut + r * stride_hr + cols, h, mask=ok)
        x = h.to(tl.float32)
        if FP8_OUT and not HAS_NORM:  # the stored residual's per-token FP8 copy (LTX-Video's cross-attention Q)
            scale, inv = _scale_and_inverse(tl.max(tl.abs(x), axis=1), False)
            tl.store(NOut + r * stride_nr + cols, _quantize_tile(x, inv[:, None], EXACT_CAST), mask=ok)
            tl.store(NScale + rows, scale, mask=row_ok)
    if HAS_NORM:
        if RMS:  # diffusers' RMSNorm: no centring
            n = x * tl.math.rsqrt(tl.sum(x * x, axis=1) / C + eps)[:, None]
        else:
            mean = tl.sum(x, axis=1) / C
            centred = tl.where(ok, x - mean[:, None], 0.0)
            var = tl.sum(centred * centred, axis=1) / C
            n = centred * tl.math.rsqrt(var + eps)[:, None]
        if HAS_AFFINE:
            n = n * tl.load(W + cols, mask=col_ok[None, :], other=0.0).to(tl.float32)
            n = n + tl.load(Bias + cols, mask=col_ok[None, :], other=0.0).to(tl.float32)
        if HAS_MOD:
            scale = tl.load(Scale + b * stride_scb + s * stride_scs + cols, mask=ok, other=0.0).to(tl.float32)
            shift = tl.load(Shift + b * stride_shb + s * stride_shs + cols, mask=ok, other=0.0).to(tl.float32)
            n = n * (1.0 + scale) + shift
        if FP8_OUT:  # the row as it would be stored, quantized as the per-token quantizer reads it back
            n = tl.where(ok, _to_out(n, X.dtype.element_ty, EXACT_CAST).to(tl.float32), 0.0)
            scale, inv = _scale_and_inverse(tl.max(tl.abs(n), axis=1), False)
            tl.store(NOut + r * stride_nr + cols, _quantize_tile(n, inv[:, None], EXACT_CAST), mask=ok)
            tl.store(NScale + rows, scale, mask=row_ok)
        else:
            tl.store(NOut + r * stride_nr + cols, _to_out(n, NOut.dtype.element_ty, EXACT_CAST), mask=ok)


@functools.cache
def launch(C: int, fp8_out: bool) -> dict:
    """Rows a program and warps for rows of C channels (the caller must not change the dict).

    One row a program; fewer warps than a row's width would suggest, since the row's two or three reductions
    cross warps through shared memory and wait on it. H200, Triton 3.6, Wan's widths at 27-76k rows
    (lab/probes/probe_cross_q_fp8.py --sweep, lab/NOTES.md v8.1), against 8 / 8 / 16 warps before:
    bf16 rows 2 / 2 / 4 warps at 1536 / 3072 / 5120 channels, 8-17% faster; FP8 rows 1 / 4 / 8 warps, 21% / 6% /
    4% faster. The warps set the order of a row's sums, so outputs move by a bf16 step in ~4e-6 of the elements
    from one launch to another."""
    block_c = next_power_of_2(C)
    if block_c <= 1024:
        return dict(ROWS=1, num_warps=4)
    if fp8_out:
        return dict(ROWS=1, num_warps=1 if block_c <= 2048 else min(16, block_c // 1024))
    return dict(ROWS=1, num_warps=max(2, min(8, block_c // 2048)))


def _row_strides(t: torch.Tensor | None, B: int, S: int, name: str) -> tuple[int, int]:
    """(batch, token) strides of a per-row vector [B or 1, S or 1, C] (0 where broadcast)."""
    if t is None:
        return 0, 0
    if t.ndim != 3 or t.shape[0] not in (1, B) or t.shape[1] not in (1, S) or t.stride(2) != 1:
        raise ValueError(f"{name} must be [B or 1, S or 1, C] with unit stride over C, got shape "
                         f"{tuple(t.shape)} strides {t.stride()}")
    return (t.stride(0) if t.shape[0] > 1 else 0), (t.stride(1) if t.shape[1] > 1 else 0)


def residual_norm(x: torch.Tensor, y: torch.Tensor | None = None, gate: torch.Tensor | None = None, *,
                  norm: bool = True, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                  eps: float = 1e-6, scale: torch.Tensor | None = None, shift: torch.Tensor | None = None,
                  rms: bool = False, fp8_out: bool = False):
    """``h = (x.float() + y.float() * gate).to(x.dtype)`` (or ``h = x`` without ``y``; no gate: a plain add),
    then ``n = (layer_norm(h.float(), weight, bias, eps) * (1 + scale) + shift).to(x.dtype)``
    (``rms=True``: an RMSNorm without weights, as diffusers' ``RMSNorm(elementwise_affine=False)``, in its place).

    Shapes: x, y [B, S, C] (fp16/bf16, rows contiguous over C); gate, scale, shift [B or 1, S or 1, C]
    (any float dtype, usually fp32: Wan's per-sample or per-token modulation); weight, bias [C] or None.
    Returns (h, n): h is x itself without ``y``; n is None with ``norm=False``. With ``fp8_out=True`` n is
    ``(n_fp8 [B, S, C] float8_e4m3fn, scales [B*S, 1] fp32)``: the per-token FP8 copy of the normalised rows,
    quantized from their ``x.dtype`` rounding (see the module doc); with ``norm=False`` (and ``y``) the copy of
    h, which is written as well.
    """
    if x.dtype not in _HALF or x.ndim != 3 or x.stride(2) != 1:
        raise ValueError(f"x must be a [B, S, C] fp16/bf16 tensor with unit stride over C, got "
                         f"{x.dtype} {tuple(x.shape)}")
    B, S, C = x.shape
    if y is not None and (tuple(y.shape) != (B, S, C) or y.stride(2) != 1):
        raise ValueError(f"y must have x's shape {(B, S, C)} with unit stride over C, got {tuple(y.shape)}")
    if (scale is None) != (shift is None) or (weight is None) != (bias is None):
        raise ValueError("scale and shift (and weight and bias) come together")
    if rms and weight is not None:
        raise ValueError("rms=True takes no weight or bias (an RMSNorm without elementwise affine)")
    if fp8_out and not norm and y is None:
        raise ValueError("fp8_out=True quantizes the normalised rows, or with norm=False the residual sum: it "
                         "needs norm=True or y")
    if y is None and not norm:
        return x, None
    x2, y2 = x.reshape(B * S, C), (y.reshape(B * S, C) if y is not None else None)
    h = torch.empty_like(x) if y is not None else x
    n = (torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device) if fp8_out
         else torch.empty_like(x) if norm else None)
    n_scale = torch.empty((B * S, 1), dtype=torch.float32, device=x.device) if fp8_out else None
    h2, n2 = h.view(B * S, C), (n.view(B * S, C) if n is not None else None)
    strides = (*_row_strides(gate, B, S, "gate"), *_row_strides(scale, B, S, "scale"),
               *_row_strides(shift, B, S, "shift"))
    block_c = next_power_of_2(C)
    dummy = x2
    config = launch(C, fp8_out)
    if interpreting():
        config = {**config, "ROWS": min(INTERPRETER_ROWS, next_power_of_2(B * S))}
    _residual_norm_kernel[(triton.cdiv(B * S, config["ROWS"]),)](
        x2, y2 if y2 is not None else dummy, gate if gate is not None else dummy,
        weight if weight is not None else dummy, bias if bias is not None else dummy,
        scale if scale is not None else dummy, shift if shift is not None else dummy,
        h2, n2 if n2 is not None else h2, n_scale if fp8_out else dummy, B * S, S, C, float(eps),
        x2.stride(0), y2.stride(0) if y2 is not None else 0, h2.stride(0), n2.stride(0) if n2 is not None else 0,
        *strides,
        HAS_RES=y is not None, HAS_GATE=gate is not None, HAS_NORM=norm, HAS_AFFINE=weight is not None,
        HAS_MOD=scale is not None, RMS=rms, EXACT_CAST=interpreting(), FP8_OUT=fp8_out, BLOCK_C=block_c,
        enable_fp_fusion=FP_FUSION, **config,
    )
    return (h, (n, n_scale)) if fp8_out else (h, n)


def residual_norm_reference(x, y=None, gate=None, *, norm=True, weight=None, bias=None, eps=1e-6,
                            scale=None, shift=None, rms=False):
    """`residual_norm` as the eager PyTorch ops of diffusers' Wan block (the oracle and the CPU path)."""
    h = x
    if y is not None:
        h = (x.float() + (y * gate if gate is not None else y.float())).type_as(x)
    if not norm:
        return h, None
    if rms:
        f = h.float()
        n = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)
    else:
        n = torch.nn.functional.layer_norm(h.float(), (h.shape[-1],),
                                           weight.float() if weight is not None else None,
                                           bias.float() if bias is not None else None, eps)
    if scale is not None:
        n = n * (1 + scale) + shift
    return h, n.type_as(x)
