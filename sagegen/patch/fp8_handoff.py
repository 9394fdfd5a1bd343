"""Attention outputs handed to FP8 output projections in FP8 (``sagegen.patch(..., linear="fp8")``).

When a fused processor's output projection (``attn.to_out[0]``) is an `FP8Linear` that takes FP8 input, the
attention kernel writes its output in e4m3 with one scale from V's range (kernels/fp8_out.py) and the projection
runs its GEMM on that directly: no bf16 output and no quantization pass (~15-22 us a layer at 4-9k tokens, a
fifth of the FP8 projection; lab/NOTES.md v6.1). Rows that another layer reads in bf16 (the text stream of a
joint call, whose few rows stay bf16) are dequantized. Everything else (a fallback, context parallelism,
outlier handling, torch.compile) keeps the bf16 output and the projection's own quantization.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from sagegen.linear.module import FP8Linear
from sagegen.linear.shared import shared

# False runs every output projection on the bf16 output with its own quantization (only to measure the difference)
ENABLED = True
# False: cross-attention Q projections quantize their input themselves, rather than take the FP8 copy written by the
# pass that produces it (Wan's norm, LTX-Video's residual add; an A/B switch for the probes)
CROSS_Q_FP8 = True


class Fp8Rows(NamedTuple):
    """An attention output in e4m3: ``data.float() * scale[0]`` in the activations' ``dtype``."""

    data: torch.Tensor  # [B, N, C] float8_e4m3fn
    scale: torch.Tensor  # fp32 [>= B·N, 1]: one scale, repeated (`sagegen.api.sageattn_fp8_out`)
    dtype: torch.dtype

    def dense(self) -> torch.Tensor:
        return (self.data.float() * self.scale[0]).to(self.dtype)


def wanted(linear, rows: int) -> bool:
    """Whether ``linear`` (an attention's output projection) would take an FP8 input of ``rows`` tokens."""
    return ENABLED and takes_fp8_rows(linear, rows)


def takes_fp8_rows(linear, rows: int) -> bool:
    """Whether ``linear`` is an `FP8Linear` whose eager call of ``rows`` tokens may start from an input already in
    e4m3 (per-token scales, no outlier handling, no fused GELU)."""
    return isinstance(linear, FP8Linear) and linear.takes_fp8_input(rows)


def offer(linear, x: torch.Tensor, copy) -> None:
    """Hand ``copy`` = (x's per-token e4m3 rows [..., C], scales fp32 [rows, 1]), written by the pass that
    produced x (`residual_norm(fp8_out=True)`), to ``linear``'s next eager call on x itself: the `shared` cache
    of the enclosing `sharing()` scope, so the call quantizes nothing. Any other call (another tensor, a hook
    that changes x, outlier handling) misses and quantizes as usual."""
    cache = shared()
    if cache is not None and isinstance(linear, FP8Linear):
        cache.put(x, linear.act_granularity, linear.emulate, (copy[0].view(-1, x.shape[-1]), copy[1]))


def tokens(x, rows: slice):
    """Token rows ``rows`` of an attention output [B, N, C], bf16 or `Fp8Rows`."""
    return x._replace(data=x.data[:, rows]) if isinstance(x, Fp8Rows) else x[:, rows]


def dense(x) -> torch.Tensor:
    """The attention output in the activations' dtype (`Fp8Rows` dequantized)."""
    return x.dense() if isinstance(x, Fp8Rows) else x


def backend_copy_attention(session, processor, linear, q, k, v, mask, rows: int):
    """For the backend route's equivalents of processor calls (`qwenimage`, `ltx`, `hunyuanvideo15`), which hand q, k,
    v [B, N, H, D] to diffusers' dispatcher: the `Fp8Rows` [B, N, H·D] for ``linear`` (the output projection
    of ``rows`` tokens), or None (then dispatch as before). Not under context parallelism, nor with a sparse
    policy (the backend's own bookkeeping of those stays in charge)."""
    if (session is None or session.sparse is not None or getattr(processor, "_parallel_config", None) is not None
            or not wanted(linear, rows)):
        return None
    return attention(session, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)


def attention(session, q, k, v, mask=None):
    """The session's FP8-output call (`PatchSession.route_fp8`) on q, k, v [B, H, N, D] views: an `Fp8Rows`
    [B, N, H·D], or None where it does not run (then route the call as usual)."""
    result = session.route_fp8(q, k, v, mask)
    if result is None:
        return None
    return Fp8Rows(result[0].transpose(1, 2).flatten(2, 3), result[1], q.dtype)


@contextlib.contextmanager
def disabled():
    """A scope in which every output projection takes the bf16 output (`ENABLED` off; only to compare)."""
    global ENABLED
    saved, ENABLED = ENABLED, False
    try:
        yield
    finally:
        ENABLED = saved


def project(linear, x) -> torch.Tensor:
    """``linear(x)`` for a bf16 output, the GEMM alone for an `Fp8Rows` one."""
    if isinstance(x, Fp8Rows):
        return linear.forward_fp8(x.data, x.scale, x.dtype)
    return linear(x)
