"""FP8 linear layers: weights quantized once, activations per call (`sagegen.kernels.fp8_quant`), cuBLASLt
FP8 GEMMs on sm89+ GPUs and a bit-compatible PyTorch emulation elsewhere. Knows nothing of diffusers; the
patcher (`sagegen.patch.linear_swap`) decides which layers to swap. See docs/fp8-linear.md."""

from sagegen.linear.module import OUTLIER_MODES, FP8Linear, outlier_channels
from sagegen.linear.numerics import fp8_linear_reference, quantize_activations, quantize_weight
from sagegen.linear.ops import fp8_capable, fp8_linear
from sagegen.linear.linear_policy import LinearPolicy, select_linears

__all__ = ["FP8Linear", "LinearPolicy", "OUTLIER_MODES", "fp8_capable", "fp8_linear", "fp8_linear_reference",
           "outlier_channels", "quantize_activations", "quantize_weight", "select_linears"]
