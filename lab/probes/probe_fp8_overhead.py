"""Probe: host (CPU) time per call of the FP8 linear path's pieces on the GPU, at a token count where the GPU
work is negligible (the eager Flux step measured 197 ms wall for 104 ms of GPU time with FP8 linears: launch
bound). Prints microseconds per call for each piece, then the same at 4608 tokens (GPU bound)."""

import torch
import torch.nn.functional as F
from probe_util import per_call_us

from sagegen.kernels import fp8_quant
from sagegen.kernels.fp8_quant import quantize_fp8_rows
from sagegen.linear.module import FP8Linear
from sagegen.linear.ops import _gpu_forward, fp8_linear


def main():
    torch.manual_seed(0)
    for m in (64, 4608):
        lin = torch.nn.Linear(3072, 3072, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(m, 3072, device="cuda", dtype=torch.bfloat16)
        layer = FP8Linear(lin, min_rows=1)
        xq, xs = quantize_fp8_rows(x)
        launch = fp8_quant.per_token_launch(3072)
        n = -(-m // launch["BLOCK_M"])
        kargs = (x, x, x, xq, xs, m, 3072, 0, x.stride(0), 0, xq.stride(0), n)
        kw = dict(HAS_COL=False, GELU=False, HAS_PREFIX=False, INTERPRET=False, TANH_LIBDEVICE=False,
                  enable_fp_fusion=True, **launch)
        w_q, w_s, b = layer.w_q, layer.w_scale_gemm, lin.bias
        with torch.inference_mode():
            rows = {
                "bf16 F.linear": lambda: F.linear(x, lin.weight, lin.bias),
                "empty x2": lambda: (torch.empty_like(x, dtype=torch.float8_e4m3fn),
                                     torch.empty((m, 1), device="cuda")),
                "triton launch": lambda: fp8_quant._fp8_quant_per_token_kernel[(n,)](*kargs, **kw),
                "quantize_fp8_rows": lambda: quantize_fp8_rows(x),
                "_scaled_mm": lambda: torch._scaled_mm(xq, w_q.t(), scale_a=xs, scale_b=w_s.view(1, -1), bias=b,
                                                       out_dtype=torch.bfloat16, use_fast_accum=True),
                "_gpu_forward": lambda: _gpu_forward(x, w_q, w_s, b, "per_token", None, True, None),
                "fp8_linear op": lambda: fp8_linear(x, w_q, w_s, b, None, "per_token", False, True, None),
                "FP8Linear.forward": lambda: layer(x),
            }
            for name, fn in rows.items():
                print(f"M={m:5d} {name:20s} {per_call_us(fn):8.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
