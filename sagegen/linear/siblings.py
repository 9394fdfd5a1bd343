"""Projections of one input merged into one FP8 GEMM (Q, K and V; Flux's single blocks also ``proj_mlp``).

`sagegen.linear.shared` already quantizes such an input once for all its projections; each still ran its own
``_scaled_mm``. At the image models' ~4-9k tokens one GEMM over the concatenated weights is faster than three
or four (H200, 1 quantization + the GEMMs, over stock's bf16 projections: Flux Q/K/V 1.68x shared vs 1.77x
merged, SD3.5 1.62x vs 1.77x; `bench/results/fp8-linear-siblings-h200-2026-11-26.json`) and it saves two or three
launches a block, which is what eager image steps are bound by. At video sizes the two agree within the noise,
so merging stops above `LinearPolicy.merge_max_rows`.

The groups are learned, not declared: when several `FP8Linear` layers take the same quantized input inside one
`sharing()` scope (the cache records who did), they become a `SiblingGroup`. Their FP8 weights, scales and
biases are concatenated once and each layer's own buffers become views of the concatenation, so no memory is
added. From then on the first member called with an input runs the one GEMM and the others take their column
slices (views, row stride = the total width) from the scope's cache. Per-channel weight scales make every
column the same number it was. A group whose merged output is not taken by all its members (the layers were
called on different inputs after all) is disbanded, and so is every group when the model is moved or cast.
Eager only: under ``torch.compile`` and outside a scope every layer runs alone.
"""

from __future__ import annotations

import weakref

import torch

from .ops import gemm_eager, gemm_rowwise_prepared


class SiblingGroup:
    """FP8 layers that project the same input, with their weights concatenated (members' buffers are views)."""

    def __init__(self, members: list, max_rows: int):
        self.members = tuple(members)
        self.max_rows = max_rows
        widths = [m.w_q.shape[0] for m in members]
        self.slices = {id(m): (sum(widths[:i]), sum(widths[: i + 1])) for i, m in enumerate(members)}
        self.width = sum(widths)
        with torch.no_grad():
            self.w_q = torch.cat([m.w_q for m in members])
            self.w_scale = torch.cat([m.w_scale for m in members])
            biases = [m.bias_copy if m.parked else m.linear.bias for m in members]
            self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        for m in members:  # the members' buffers become views: the separate copies are freed
            lo, hi = self.slices[id(m)]
            m.w_q, m.w_scale, m.w_scale_gemm = self.w_q[lo:hi], self.w_scale[lo:hi], self.w_scale[lo:hi]
            m._gemm_views = None
            m.__dict__["_siblings"] = self
        self._gemm_views = (self.w_q.t(), self.w_scale.view(1, -1))
        self.merged_calls = 0

    def gemm(self, xq_xs: tuple[torch.Tensor, torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
        """All members' outputs side by side, [M, width], from the shared FP8 input."""
        first = self.members[0]
        self.merged_calls += 1
        if xq_xs[0].is_cuda and not first.emulate:
            return gemm_rowwise_prepared(*xq_xs, *self._gemm_views, self.bias, out_dtype, first.fast_accum)
        return gemm_eager(*xq_xs, self.w_q, self.w_scale, self.bias, "per_token", True, first.fast_accum, out_dtype)

    def columns(self, member, y: torch.Tensor) -> torch.Tensor:
        lo, hi = self.slices[id(member)]
        return y[:, lo:hi]

    def disband(self) -> None:
        for m in self.members:
            if m.__dict__.get("_siblings") is self:
                del m.__dict__["_siblings"]


def eligible(layer) -> bool:
    """A layer whose plain quantized input a sibling may share: no outlier handling, no prologue, row-wise."""
    return (layer.col_scale is None and layer.w_outlier is None and layer.prologue is None and layer.calibrated
            and layer.act_granularity == "per_token" and layer.weight_granularity == "per_channel"
            and "_siblings" not in layer.__dict__)


def propose(consumers: list) -> SiblingGroup | None:
    """Form a group from the layers that took one quantized input in one scope, if they can share a GEMM."""
    members = list(dict.fromkeys(c for c in consumers if c is not None))  # first call first, each once
    if len(members) < 2 or torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return None  # never allocate the merged weights inside a CUDA graph capture (its private pool)
    first = members[0]
    same = lambda f: all(f(m) == f(first) for m in members)  # noqa: E731
    if not (all(eligible(m) for m in members) and first.merge_max_rows > 0 and same(lambda m: m.w_q.shape[1])
            and same(lambda m: (m.w_q.device, m.w_q.dtype, m.w_scale.dtype, m.fast_accum, m.emulate, m.parked,
                                m.merge_max_rows, m.min_rows))
            and same(lambda m: (m.bias_copy if m.parked else m.linear.bias) is None)):
        return None
    bias = first.bias_copy if first.parked else first.linear.bias
    if bias is not None and not same(lambda m: (m.bias_copy if m.parked else m.linear.bias).dtype):
        return None
    return SiblingGroup(members, first.merge_max_rows)


class MergedOutputs:
    """The scope's last merged GEMM: its input (weakly), the group, the output and who has taken a slice."""

    def __init__(self, root: torch.Tensor, key: tuple, group: SiblingGroup, y: torch.Tensor, on_drop):
        self.root, self.key, self.group, self.y = weakref.ref(root, on_drop), key, group, y
        self.taken: set[int] = set()

    def finish(self) -> None:
        """The entry is being replaced or dropped: a group not wholly served by its GEMM is not a group."""
        if len(self.taken) < len(self.group.members):
            self.group.disband()
