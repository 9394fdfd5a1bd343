"""Sibling FP8 projections of one input (an attention's Q, K and V) as one GEMM.

At narrow widths the three row-wise GEMMs of a shared quantization leave cuBLASLt's tiles short of work: Wan2.1-1.3B's
1536-wide Q/K/V at 32,760 tokens ran 1.59x bf16 that way, 1.69x as one GEMM over the concatenated weights
(`bench/bench_fp8_linear.py`, ``fp8_siblings_merged``; H200, 2026-11-29).

`stack(layers)` moves the layers' FP8 weights and row-wise scales into one buffer each, at patch time; every
layer's own buffers become views of it, so no memory is added and each layer still runs alone exactly as before.
`stacked_forward(layers, x)` runs them as one ``_scaled_mm`` and answers the column blocks (views of one output);
None where it does not apply (not stacked, or no longer: a `.to()`, a recalibration or a new weight gives a
layer buffers of its own; few rows; torch.compile), and the caller then calls the layers one by one. Per output
channel the weight scales are the same numbers either way; only cuBLASLt's choice of kernel for the wider N can
change the low bits of the fp32 accumulation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sagegen.linear.module import FP8Linear
from sagegen.linear.ops import gemm_eager, quantize_eager
from sagegen.linear.shared import shared

ENABLED = True  # False: `stacked_forward` always answers None (A/B switch for benchmarks and tests)


def _plain(layer) -> bool:
    return (isinstance(layer, FP8Linear) and layer.act_granularity == "per_token"
            and layer.weight_granularity == "per_channel" and layer.outliers == "off" and layer.prologue is None
            and layer.outlier_free() and not layer.fuse_cat_gelu)


class _Stack:
    """The shared buffers of stacked layers and their column boundaries."""

    def __init__(self, w_q: torch.Tensor, w_scale: torch.Tensor, widths: list[int]):
        self.w_q, self.w_scale, self.widths = w_q, w_scale, widths
        self._bias = None  # (the per-layer bias tensors and versions it was made from, the concatenation)

    def bias(self, layers: Sequence[FP8Linear]) -> torch.Tensor | None:
        parts = [lay.gemm_bias() for lay in layers]
        if any(b is None for b in parts):
            return None  # (none has one: `stack` refuses mixed layers, and `stacked_forward` a bias dropped since)
        # (inference tensors, e.g. a parked layer's bias copy made under inference_mode, have no version counter)
        key = tuple((b.data_ptr(), 0 if b.is_inference() else b._version, b.device, b.dtype) for b in parts)
        if self._bias is None or self._bias[0] != key:  # made once; again only if a bias changed in place
            with torch.no_grad():
                self._bias = (key, torch.cat([b.detach() for b in parts]))
        return self._bias[1]


def stack(layers: Sequence[FP8Linear]) -> bool:
    """Give the FP8 weights and weight scales of ``layers`` (plain per-token x per-channel `FP8Linear`s of one
    input width, weight dtype and device, all with a bias or none) one buffer each, in this order. Returns
    whether it did; layers that do not qualify are left as they are."""
    if len(layers) < 2 or not all(_plain(lay) for lay in layers):
        return False
    same = lambda f: len({f(lay) for lay in layers}) == 1  # noqa: E731
    if not (same(lambda m: m.in_features) and same(lambda m: m.w_q.device) and same(lambda m: m.weight.dtype)
            and same(lambda m: m.emulate) and same(lambda m: m.parked) and same(lambda m: m.fast_accum)
            and same(lambda m: m.min_rows)
            and same(lambda m: (m.bias_copy if m.parked else m.linear.bias) is None)):
        return False
    with torch.no_grad():
        w_q = torch.cat([lay.w_q for lay in layers])
        w_scale = torch.cat([lay.w_scale for lay in layers])  # [sum N, 1]
    widths = [lay.out_features for lay in layers]
    group = _Stack(w_q, w_scale, widths)
    start = 0
    for lay, n in zip(layers, widths):
        scale = w_scale[start:start + n]
        lay.w_q, lay.w_scale, lay.w_scale_gemm = w_q[start:start + n], scale, scale
        lay.stack = group
        start += n
    return True


def stacked(layers: Sequence[FP8Linear]) -> _Stack | None:
    """The stack ``layers`` still form (in this order, with the buffers `stack` gave them); None otherwise."""
    group = getattr(layers[0], "stack", None) if layers and isinstance(layers[0], FP8Linear) else None
    if group is None or len(group.widths) != len(layers):
        return None
    # by storage, not `_base`: views made under torch.inference_mode have no `_base`
    w_q, w_s = group.w_q.untyped_storage().data_ptr(), group.w_scale.untyped_storage().data_ptr()
    start = 0
    for lay, n in zip(layers, group.widths):
        if not isinstance(lay, FP8Linear) or getattr(lay, "stack", None) is not group or not _plain(lay):
            return None
        lay_w_q, lay_w_s = lay._buffers["w_q"], lay._buffers["w_scale_gemm"]
        if (lay_w_q.untyped_storage().data_ptr() != w_q or lay_w_q.storage_offset() != start * lay_w_q.shape[1]
                or lay_w_s.untyped_storage().data_ptr() != w_s or lay_w_s.storage_offset() != start):
            return None
        start += n
    return group


def stacked_forward(layers: Sequence[FP8Linear], x: torch.Tensor) -> list[torch.Tensor] | None:
    """``[layer(x) for layer in layers]`` as one quantization and one GEMM (x [..., K]; each output [..., N_i],
    a view of one [..., sum N_i] tensor); None where that does not apply (see the module doc)."""
    group = stacked(layers) if ENABLED else None
    if group is None or torch.compiler.is_compiling():
        return None
    x2 = x.reshape(-1, x.shape[-1])
    first = layers[0]
    if x2.shape[0] < first.min_rows or x.dtype != first.weight.dtype or x.shape[-1] != first.in_features:
        return None
    parts = [lay.gemm_bias() for lay in layers]
    if len({b is None for b in parts}) != 1:
        return None
    # a copy another projection of x quantized in this processor call is reused, as `FP8Linear.forward` does
    # (Flux's single blocks quantize their input for proj_mlp first)
    cache = shared()
    xq_xs = cache.get(x, "per_token", first.emulate) if cache is not None else None
    if xq_xs is None:
        xq_xs = quantize_eager(x2, "per_token", first.emulate)
        if cache is not None:
            cache.put(x, "per_token", first.emulate, xq_xs)
    y = gemm_eager(*xq_xs, group.w_q, group.w_scale, group.bias(layers), "per_token", first.emulate,
                   first.fast_accum, x2.dtype)
    for lay in layers:
        lay.count_fp8_call()
    return [t.reshape(*x.shape[:-1], t.shape[-1]) for t in y.split(group.widths, dim=-1)]
