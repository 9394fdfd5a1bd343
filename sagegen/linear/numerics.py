"""The numerics of sagegen's FP8 linear layers in plain PyTorch: the emulation and the oracle for the kernels.

- Activations: per token (one scale per row) or per 1x128 block, ``scale = amax * fp32(1/448)`` (1 where that
  is 0), values ``clamp(x * (1 / scale), ±448)`` rounded to nearest-even e4m3. Only exactly rounded fp32
  operations (a multiplication by a constant, one IEEE reciprocal per scale): torch on the GPU computes
  ``t / 448.0`` as ``t * (1/448)`` but ``t / 448`` on the CPU, so a plain division would make the emulation
  itself device-dependent. An optional per-channel
  multiplier ``col_scale`` is applied first (smoothing or the outlier mask). With the GELU prologue the amax is
  floored at ``GELU_AMAX_FLOOR`` (0.171875, above GELU's largest negative magnitude, 0.1700): the scale is then
  GELU(max x)'s, which the kernel can take from x without computing every GELU twice, and is unchanged wherever
  the row's (block's) largest magnitude reaches the floor. The Triton kernel (`sagegen.kernels.fp8_quant`)
  matches this bit for bit.
- Weights [N, K]: per output channel (one scale per row of W) or per 128x128 block, the same rule.
- The product: dequantize both (fp32), matmul in fp32, add the bias, cast to the activation's dtype. On the GPU
  cuBLASLt computes the same quantized values' product with an fp32 accumulator (summation order differs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sagegen.kernels.spec import FP8_MAX, GELU_AMAX_FLOOR

BLOCK = 128
ACT_GRANULARITIES = ("per_token", "per_block")
WEIGHT_GRANULARITIES = ("per_channel", "per_block")
FP8 = torch.float8_e4m3fn


INV_FP8_MAX = 1.0 / FP8_MAX  # rounded to fp32 where used, as in the kernel


def _scale_from_amax(amax: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    inv = torch.tensor(INV_FP8_MAX, dtype=torch.float32)  # fp32(1/448), on the CPU: a scalar multiplication
    scale = amax.float().clamp_min(floor) * inv
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x * torch.reciprocal(scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The eager activation that ``prologue="gelu_tanh"`` fuses (diffusers' ``GELU(approximate="tanh")``)."""
    return F.gelu(x, approximate="tanh")


def _pad_to(x: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    pad = (-x.shape[dim]) % multiple
    if not pad:
        return x
    widths = [0, 0] * (x.dim() - 1 - dim) + [0, pad]
    return F.pad(x, widths)


def quantize_activations(x: torch.Tensor, granularity: str = "per_token",
                         col_scale: torch.Tensor | None = None, prologue: str | None = None,
                         prefix: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (e4m3 [M, K], fp32 scales [M, 1] or [M, ceil(K/128)]). ``prologue="gelu_tanh"``: of GELU(x).
    ``prefix`` [M, K0]: of ``cat([prefix, prologue(x)], 1)`` (K0 + K channels)."""
    if granularity not in ACT_GRANULARITIES:
        raise ValueError(f"activation granularity {granularity!r} is not supported; use one of {ACT_GRANULARITIES}")
    if prologue == "gelu_tanh":
        x = gelu_tanh(x)
    elif prologue is not None:
        raise ValueError(f"prologue={prologue!r} is not supported; use None or 'gelu_tanh'")
    if prefix is not None:
        x = torch.cat([prefix.to(x.dtype), x], dim=1)
    x = x.float()
    if col_scale is not None:
        x = x * col_scale.float()
    M, K = x.shape
    floor = GELU_AMAX_FLOOR if prologue == "gelu_tanh" else 0.0
    if granularity == "per_token":
        scale = _scale_from_amax(x.abs().amax(dim=1, keepdim=True), floor)
        return _to_fp8(x, scale), scale
    blocks = _pad_to(x, 1, BLOCK).view(M, -1, BLOCK)
    scale = _scale_from_amax(blocks.abs().amax(dim=2), floor)                # [M, nb]
    q = _to_fp8(blocks, scale[..., None]).view(M, -1)[:, :K]
    return q, scale


def quantize_weight(w: torch.Tensor, granularity: str = "per_channel") -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (e4m3 [N, K], fp32 scales [N, 1] or [ceil(N/128), ceil(K/128)])."""
    if granularity not in WEIGHT_GRANULARITIES:
        raise ValueError(f"weight granularity {granularity!r} is not supported; use one of {WEIGHT_GRANULARITIES}")
    w = w.float()
    N, K = w.shape
    if granularity == "per_channel":
        scale = _scale_from_amax(w.abs().amax(dim=1, keepdim=True))
        return _to_fp8(w, scale), scale
    tiles = _pad_to(_pad_to(w, 0, BLOCK), 1, BLOCK)
    nb, kb = tiles.shape[0] // BLOCK, tiles.shape[1] // BLOCK
    tiles = tiles.view(nb, BLOCK, kb, BLOCK)
    scale = _scale_from_amax(tiles.abs().amax(dim=(1, 3)))                  # [nb, kb]
    q = _to_fp8(tiles, scale[:, None, :, None]).view(nb * BLOCK, kb * BLOCK)[:N, :K]
    return q, scale


def dequantize_activations(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    M, K = q.shape
    if scale.shape[1] == 1:
        return q.float() * scale
    return q.float() * scale.repeat_interleave(BLOCK, dim=1)[:, :K]


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    N, K = q.shape
    if scale.shape[1] == 1 and scale.shape[0] == N:
        return q.float() * scale
    full = scale.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:N, :K]
    return q.float() * full


def fp8_linear_reference(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                         act_granularity: str, col_scale: torch.Tensor | None = None,
                         prologue: str | None = None) -> torch.Tensor:
    """The emulated FP8 linear: ``x`` [M, K] quantized on the fly, ``w_q``/``w_scale`` from `quantize_weight`.
    ``prologue="gelu_tanh"``: the product of GELU(x) (the eager GELU, then the quantization)."""
    xq, xs = quantize_activations(x, act_granularity, col_scale, prologue)
    y = dequantize_activations(xq, xs) @ dequantize_weight(w_q, w_scale).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
