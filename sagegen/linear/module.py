"""`FP8Linear`: an ``nn.Linear`` whose product runs in FP8 (quantized weight, activations quantized per call).

The original ``nn.Linear`` stays attached (``.linear``) so that unpatching puts the very same object back; its
``weight``/``bias``/``in_features``/``out_features`` are forwarded, since diffusers' processors read them (dtype
checks, fused-QKV shapes). ``park=True`` keeps it outside the module tree, so that its bf16 weight can live on the
CPU (or nowhere: the meta device) while the GPU holds only the FP8 copy; the patcher decides
(`LinearPolicy.bf16_copies`).

Outliers (``outliers=``):
- ``"off"``: plain FP8 (the activation's largest value sets the scale of its row or 1x128 block).
- ``"smooth"``: SmoothQuant-style migration. On the first eager call the per-channel amax of the input
  (``a_j``) and of the weight's columns (``w_j``) give ``s_j = sqrt(a_j / w_j)``; the activation is multiplied by
  ``1/s`` inside the quantization kernel and the weight is re-quantized as ``W * s``. Exact in real arithmetic.
- ``"split"``: on the first eager call, channels whose amax exceeds ``outlier_ratio`` x the median channel
  amax (at most ``max_outliers``) are taken out of the FP8 product (a 0 in the kernel's channel multiplier)
  and multiplied in the activation's own precision by the matching weight columns (a second, thin GEMM).
Both calibrate once, from the first call that is not being traced by ``torch.compile`` (run one eager step
before compiling; a layer compiled before calibrating stays plain FP8 in that graph).

``prologue="gelu_tanh"`` (set by the patcher on an MLP's second layer whose GELU it took over): the input is the
pre-GELU tensor and the GELU runs inside the quantization kernel (every path, bf16 fallback included, computes
the layer of GELU(x)).

``cat_gelu(prefix, x)``: the layer of ``cat([prefix, GELU(x)], -1)`` with the concatenation and the GELU inside
the quantization kernel (the ``proj_out`` of Flux's and HunyuanVideo's single blocks, whose patched forwards call
it).

Eager calls inside an attention processor whose input another FP8 projection there has quantized (Q, K and V
of one hidden state) reuse that FP8 copy (`shared`): one quantization per activation.

`forward_fp8(x8, row_scale)`: the layer of an input already in e4m3 with one scale (an attention output written in
FP8 by sagegen's kernel, for the output projections): the GEMM only.

Calls with fewer than ``min_rows`` tokens (modulation of one timestep vector, the image models' text streams) run
the original bf16 linear: FP8 does not pay there.

Host cost: eager image steps with FP8 linears wait on the host CPU (lab/NOTES.md v7.7), and a Flux step makes
~180 FP8 GEMMs. So the call paths read buffers, the wrapped linear and its parameters from their dicts rather
than through ``nn.Module.__getattr__`` (~0.5-2 us a read), and count calls in a list rather than through
``nn.Module.__setattr__`` (~2-6 us a write); `lab/probes/probe_host_attr_traffic.py` counts both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sagegen.linear import numerics
from sagegen.linear.ops import (blockwise_weight_scale_for_gemm, fp8_linear, fp8_linear_traced, gemm_eager,
                                gemm_rowwise_prepared, quantize_eager)
from sagegen.linear.shared import shared

OUTLIER_MODES = ("off", "smooth", "split")
# Under torch.compile, per-token layers trace as plain ops (`ops.fp8_linear_traced`) that inductor fuses with
# their neighbours; False: the opaque `sagegen::fp8_linear` op (an A/B switch for benchmarks and tests).
COMPILE_NATIVE = True


def _param(module: torch.nn.Module, name: str):
    """``getattr(module, name)`` for a parameter, from the module's dict (a parametrized one the usual way)."""
    params = module._parameters
    return params[name] if name in params else getattr(module, name)


class FP8Linear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear, *, act_granularity: str = "per_token",
                 weight_granularity: str = "per_channel", outliers: str = "off", emulate: bool = False,
                 min_rows: int = 1024, outlier_ratio: float = 8.0, max_outliers: int = 64, park: bool = False,
                 fast_accum: bool = True):
        super().__init__()
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"FP8Linear wraps an nn.Linear, got {type(linear).__name__}")
        if outliers not in OUTLIER_MODES:
            raise ValueError(f"outliers={outliers!r} is not supported; use one of {OUTLIER_MODES}")
        if act_granularity not in numerics.ACT_GRANULARITIES:
            raise ValueError(f"act_granularity={act_granularity!r}; use one of {numerics.ACT_GRANULARITIES}")
        if weight_granularity not in numerics.WEIGHT_GRANULARITIES:
            raise ValueError(f"weight_granularity={weight_granularity!r}; use one of "
                             f"{numerics.WEIGHT_GRANULARITIES}")
        if park:  # kept outside the module tree, so that moving the model does not bring it back
            self.__dict__["linear"] = linear
        else:
            self.linear = linear
        self.parked = park
        self.act_granularity, self.weight_granularity = act_granularity, weight_granularity
        self.outliers, self.emulate, self.min_rows = outliers, emulate, min_rows
        self.outlier_ratio, self.max_outliers = outlier_ratio, max_outliers
        self.fast_accum = bool(fast_accum)
        self.prologue: str | None = None  # "gelu_tanh" while the patcher fuses the preceding GELU
        self.fuse_cat_gelu = False  # set by the patcher on a single block's proj_out: its block calls cat_gelu
        self.calibrated = outliers == "off"
        self._fp8_calls = [0]  # see `fp8_calls` (a list: counting writes no module attribute)
        with torch.no_grad():
            w_q, w_s = numerics.quantize_weight(linear.weight.detach(), weight_granularity)
        self.register_buffer("w_q", w_q, persistent=False)
        self.register_buffer("w_scale", w_s, persistent=False)
        self.register_buffer("w_scale_gemm", _gemm_layout(w_s, weight_granularity), persistent=False)
        self.register_buffer("col_scale", None, persistent=False)
        self.register_buffer("outlier_idx", None, persistent=False)
        self.register_buffer("w_outlier", None, persistent=False)
        # parked: the bias is needed where the GEMM runs, so it gets its own copy (the weight's FP8 copy is here)
        self.register_buffer("bias_copy", linear.bias.detach().clone() if park and linear.bias is not None
                             else None, persistent=False)
        self._gemm_views = None  # (w_q, w_scale_gemm, w_q.t(), scales [1, N]): see `_rowwise_operands`
        self.stack = None  # the Q/K/V group whose buffers this layer's are views of (`sagegen.linear.stacked`)
        self.requantized = 0  # times `requantize` ran (a LoRA merged into or out of the wrapped weight)

    @property
    def fp8_calls(self) -> int:
        """Calls that ran the FP8 product, eager or replayed in a CUDA graph (not counted under
        torch.compile); a stacked call counts for each of its layers."""
        return self._fp8_calls[0]

    def count_fp8_call(self) -> None:
        self._fp8_calls[0] += 1

    def _wrapped(self) -> torch.nn.Linear:
        """``self.linear`` (registered, or kept in ``__dict__`` when parked), without ``__getattr__``."""
        linear = self._modules.get("linear")
        return linear if linear is not None else self.__dict__["linear"]

    def outlier_free(self) -> bool:
        """No outlier handling in place (no column scale, no split channels): the plain FP8 product."""
        buffers = self._buffers
        return buffers["col_scale"] is None and buffers["w_outlier"] is None

    @torch.no_grad()
    def dequantized_weight(self) -> torch.Tensor:
        """The weight this layer's products use, fp32 [N, K]: the FP8 weight times its scales, a smoothing
        column scale undone, split outlier columns as kept. What `unpatch` restores when the bf16 copy was
        dropped (`LinearPolicy(bf16_copies="drop")`)."""
        buffers = self._buffers
        w = numerics.dequantize_weight(buffers["w_q"], buffers["w_scale"])
        col_scale, idx = buffers["col_scale"], buffers["outlier_idx"]
        if idx is not None:
            w[:, idx] = buffers["w_outlier"].float()
        elif col_scale is not None:  # smoothing quantized W * s, and col_scale = 1 / s
            w = w * col_scale.float()
        return w

    def gemm_bias(self) -> torch.Tensor | None:
        """The bias the GEMM adds: the parked copy, or the wrapped linear's."""
        return self._buffers["bias_copy"] if self.parked else _param(self._wrapped(), "bias")

    # diffusers' processors read these from the projection modules
    @property
    def weight(self) -> torch.nn.Parameter:
        return _param(self._wrapped(), "weight")

    @property
    def bias(self) -> torch.nn.Parameter | None:
        return _param(self._wrapped(), "bias")

    @property
    def in_features(self) -> int:
        return self._wrapped().in_features

    @property
    def out_features(self) -> int:
        return self._wrapped().out_features

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, act={self.act_granularity}, "
                f"weight={self.weight_granularity}, outliers={self.outliers}"
                + (f", prologue={self.prologue}" if self.prologue else "")
                + (f" ({len(self.outlier_idx)} split)" if self.outlier_idx is not None else ""))

    def _apply(self, fn, recurse=True):
        # views of the old buffers would keep them alive (and on the old device): a `.to()` (CPU offload moves
        # the model back and forth) gives this layer buffers of its own and takes it out of its Q/K/V stack
        self._gemm_views = None
        self.stack = None
        return super()._apply(fn, recurse)

    def _rowwise_operands(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``w_q.t()`` and the [1, N] weight scales, made once (two view ops less per call)."""
        views, buffers = self._gemm_views, self._buffers
        w_q, w_scale_gemm = buffers["w_q"], buffers["w_scale_gemm"]
        if views is None or views[0] is not w_q or views[1] is not w_scale_gemm:
            views = self._gemm_views = (w_q, w_scale_gemm, w_q.t(), w_scale_gemm.view(1, -1))
        return views[2], views[3]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        buffers, weight, bias = self._buffers, self.weight, self.gemm_bias()
        if x2.shape[0] < self.min_rows or x.dtype != weight.dtype:
            if self.prologue:
                x = numerics.gelu_tanh(x)
            if self.parked:  # the bf16 weight is on the CPU: the dequantized FP8 weight, in x's dtype
                w = numerics.dequantize_weight(buffers["w_q"], buffers["w_scale"]).to(x.dtype)
                return F.linear(x, w, None if bias is None else bias.to(x.dtype))
            return F.linear(x, weight, bias)
        compiling = torch.compiler.is_compiling()
        if not self.calibrated and not compiling:
            self.calibrate(numerics.gelu_tanh(x2) if self.prologue else x2)
        col_scale = buffers["col_scale"]
        if compiling and self.act_granularity == "per_token" and COMPILE_NATIVE:
            # plain ops: inductor fuses the quantization into the producer of x (`ops.fp8_linear_traced`)
            y = fp8_linear_traced(x2, buffers["w_q"], buffers["w_scale"], bias, col_scale, self.emulate,
                                  self.fast_accum, self.prologue)
        elif compiling:  # the custom op, which dynamo keeps whole
            on_gpu = x2.is_cuda and not self.emulate
            y = fp8_linear(x2, buffers["w_q"], buffers["w_scale_gemm" if on_gpu else "w_scale"], bias, col_scale,
                           self.act_granularity, self.emulate, self.fast_accum, self.prologue)
        else:  # no dispatch; a plain input already quantized for another projection is reused (`shared`)
            cache = shared() if col_scale is None and self.prologue is None else None
            # keyed on the input as passed (its reshape is a new object per call, with no _base in inference mode)
            xq_xs = cache.get(x, self.act_granularity, self.emulate) if cache is not None else None
            if xq_xs is None:
                xq_xs = quantize_eager(x2, self.act_granularity, self.emulate, col_scale, self.prologue)
                if cache is not None:
                    cache.put(x, self.act_granularity, self.emulate, xq_xs)
            y = self._gemm(xq_xs, bias, x2.dtype)
        w_outlier = buffers["w_outlier"]
        if w_outlier is not None:
            xo = x2.index_select(1, buffers["outlier_idx"])
            y = y + (numerics.gelu_tanh(xo) if self.prologue else xo) @ w_outlier.t()
        if not compiling:
            self.count_fp8_call()
        return y.reshape(*lead, y.shape[-1])

    def _gemm(self, xq_xs: tuple[torch.Tensor, torch.Tensor], bias: torch.Tensor | None,
              out_dtype: torch.dtype) -> torch.Tensor:
        """The eager product of an activation quantized by `quantize_eager` and the FP8 weight."""
        on_gpu = xq_xs[0].is_cuda and not self.emulate
        if on_gpu and self.act_granularity == "per_token":
            return gemm_rowwise_prepared(*xq_xs, *self._rowwise_operands(), bias, out_dtype, self.fast_accum)
        buffers = self._buffers
        return gemm_eager(*xq_xs, buffers["w_q"], buffers["w_scale_gemm" if on_gpu else "w_scale"], bias,
                          self.act_granularity, self.emulate, self.fast_accum, out_dtype)

    def takes_fp8_input(self, rows: int) -> bool:
        """Whether `forward_fp8` may run an eager call of ``rows`` tokens: plain per-token FP8 (no outlier
        handling, no fused GELU) at a row count that runs FP8 at all."""
        return (self.act_granularity == "per_token" and self.outliers == "off" and self.prologue is None
                and self.outlier_free() and rows >= self.min_rows and not torch.compiler.is_compiling())

    def forward_fp8(self, x8: torch.Tensor, row_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """This layer of an input that is already e4m3, ``x8.float() * row_scale`` row by row (x8 [..., K]
        float8_e4m3fn; row_scale fp32 [>= M, 1], contiguous, M = x8's rows): an attention output from
        `sagegen.api.sageattn_fp8_out` (one scale, repeated), or a norm's per-token copy
        (`residual_norm(fp8_out=True)`). The GEMM only, no quantization pass. The caller checks
        `takes_fp8_input`. Returns [..., N] in ``out_dtype``."""
        x2 = x8.reshape(-1, x8.shape[-1])  # (a copy only where the rows are not one strided block)
        xs = row_scale[:x2.shape[0]]
        y = self._gemm((x2, xs), self.gemm_bias(), out_dtype)
        self.count_fp8_call()
        return y.reshape(*x8.shape[:-1], y.shape[-1])

    def cat_gelu(self, prefix: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """This layer of ``cat([prefix, gelu_tanh(x)], -1)`` (prefix [..., K0], x [..., K - K0]): a single
        block's ``proj_out`` (Flux, HunyuanVideo) of the attention output and the MLP's pre-GELU tensor. \
In eager FP8 calls the
        quantization kernel reads both and computes the GELU (no GELU output, no concatenated copy); every
        other case (few rows, a split outlier layer, calibration, compile) runs the layer on the
        concatenation itself, with the same values."""
        rows = x.numel() // max(x.shape[-1], 1)
        buffers = self._buffers
        if (rows < self.min_rows or x.dtype != self.weight.dtype or prefix.dtype != x.dtype or self.prologue
                or buffers["w_outlier"] is not None or not self.calibrated or torch.compiler.is_compiling()
                or prefix.shape[:-1] != x.shape[:-1]):
            return self(torch.cat([prefix, numerics.gelu_tanh(x)], dim=-1))
        x2, p2 = x.reshape(-1, x.shape[-1]), prefix.reshape(-1, prefix.shape[-1])
        xq_xs = quantize_eager(x2, self.act_granularity, self.emulate, buffers["col_scale"], "gelu_tanh", p2)
        y = self._gemm(xq_xs, self.gemm_bias(), x2.dtype)
        self.count_fp8_call()
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @torch.no_grad()
    def requantize(self) -> None:
        """Quantize the wrapped linear's weight (and the parked bias copy) again, after it changed in place:
        peft merging a LoRA into it (``fuse_lora``) or out of it. The new values are written into the same
        buffers, so captured CUDA graphs and the Q/K/V stack's views read them too. Outlier handling is
        calibrated again on the next eager call. The weight must be on this layer's device (or will be copied
        there)."""
        linear = self._wrapped()
        weight = _param(linear, "weight")
        if weight.is_meta:
            raise RuntimeError("FP8Linear.requantize: the bf16 weight was dropped (LinearPolicy(bf16_copies='drop'));"
                               " nothing to quantize from")
        buffers = self._buffers
        if self.outliers != "off":  # plain FP8 until the next eager call calibrates from the new weight
            self.col_scale = self.outlier_idx = self.w_outlier = None
            self.calibrated = False
        w_q, w_s = numerics.quantize_weight(weight.detach().to(buffers["w_q"].device), self.weight_granularity)
        if buffers["w_q"].shape != w_q.shape or buffers["w_scale"].shape != w_s.shape:  # smoothing replaced them
            self.w_q, self.w_scale = w_q, w_s
            self.w_scale_gemm = _gemm_layout(w_s, self.weight_granularity)
        else:
            buffers["w_q"].copy_(w_q)
            buffers["w_scale"].copy_(w_s)
            if buffers["w_scale_gemm"] is not buffers["w_scale"]:
                buffers["w_scale_gemm"].copy_(_gemm_layout(w_s, self.weight_granularity))
        bias, copy = _param(linear, "bias"), buffers["bias_copy"]
        if copy is not None and bias is not None:
            copy.copy_(bias.detach())
        self.requantized += 1

    @torch.no_grad()
    def calibrate(self, x2: torch.Tensor) -> None:
        """Set up outlier handling from one input (see the module doc). Idempotent once done."""
        if self.calibrated:
            return
        weight = self.linear.weight.detach().to(x2.device)  # (from the CPU when parked)
        a = x2.detach().float().abs().amax(dim=0)                             # [K] activation channel amax
        if self.outliers == "smooth":
            w = weight.float().abs().amax(dim=0)                                # [K] weight column amax
            s = torch.sqrt(a.clamp_min(1e-5) / w.clamp_min(1e-5)).clamp(1e-2, 1e2)
            w_q, w_s = numerics.quantize_weight(weight.float() * s, self.weight_granularity)
            self.w_q, self.w_scale, self.col_scale = w_q, w_s, (1.0 / s).contiguous()
            self.w_scale_gemm = _gemm_layout(w_s, self.weight_granularity)
        else:  # split
            idx = outlier_channels(a, self.outlier_ratio, self.max_outliers)
            if idx.numel():
                mask = torch.ones_like(a)
                mask[idx] = 0.0
                self.col_scale, self.outlier_idx = mask, idx
                self.w_outlier = weight.index_select(1, idx).contiguous()
        self.calibrated = True


def _gemm_layout(w_s: torch.Tensor, granularity: str) -> torch.Tensor:
    """The weight scales as the GPU GEMM reads them (the 128x128 recipe wants a padded column-major layout)."""
    return w_s if granularity == "per_channel" else blockwise_weight_scale_for_gemm(w_s)


def outlier_channels(channel_amax: torch.Tensor, ratio: float, limit: int) -> torch.Tensor:
    """Indices (sorted) of the channels whose amax is above ``ratio`` x the median, the largest ``limit`` of them."""
    threshold = ratio * channel_amax.median().clamp_min(1e-12)
    candidates = (channel_amax > threshold).nonzero().flatten()
    if candidates.numel() > limit:
        candidates = candidates[channel_amax[candidates].topk(limit).indices]
    return candidates.sort().values
