"""Probe: where does cuBLASLt's block-scaled FP8 GEMM (1x128 activations x 128x128 weights, via
`torch.nn.functional.scaled_mm`) run on this torch? `linear.ops.blockwise_supported` fails on torch 2.11 with
CUBLAS_STATUS_NOT_SUPPORTED at M = 250 (a size chosen not to be a multiple of 4). This tries M in {250, 256,
4096} with the activation scales' M padded to a multiple of 4 or not, and, where it runs, times it against the
row-wise path at two model shapes.

    python lab/probes/probe_blockwise_mm.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from probe_util import bench_ms, environment, write_json  # noqa: E402
from sagegen.kernels.fp8_quant import quantize_fp8_rows  # noqa: E402
from sagegen.linear import numerics  # noqa: E402
from sagegen.linear.ops import _gemm_rowwise, blockwise_weight_scale_for_gemm  # noqa: E402


def blockwise(xq, xs, w_q, w_s_gemm):
    import torch.nn.functional as F
    from torch.nn.functional import ScalingType

    return F.scaled_mm(xq, w_q.t(), scale_a=xs, scale_recipe_a=ScalingType.BlockWise1x128, scale_b=w_s_gemm,
                       scale_recipe_b=ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)


def act_scales(x, pad_m: bool):
    xq, xs = quantize_fp8_rows(x, "per_block", None, scales_k_major=True)  # xs [M, kb], stride (1, M)
    if pad_m and x.shape[0] % 4:
        m4 = -(-x.shape[0] // 4) * 4
        buf = torch.ones((xs.shape[1], m4), dtype=torch.float32, device=x.device)
        buf[:, : x.shape[0]] = xs.t()
        xs = buf.t()[: x.shape[0]]  # [M, kb] with stride (1, round_up(M, 4))
    return xq, xs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for m, k, n in [(250, 384, 256), (256, 384, 256), (4096, 3072, 12288), (75600, 5120, 5120)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        w_q, w_s = numerics.quantize_weight(w, "per_block")
        w_s_gemm = blockwise_weight_scale_for_gemm(w_s)
        for pad_m in (False, True):
            row = {"M": m, "K": k, "N": n, "pad_m": pad_m}
            try:
                xq, xs = act_scales(x, pad_m)
                got = blockwise(xq, xs, w_q, w_s_gemm).float()
                want = numerics.fp8_linear_reference(x[:512], w_q, w_s, None, "per_block").float()
                row["ok"] = True
                row["max_rel_err_vs_emulation"] = ((got[:512] - want).abs().max() / want.abs().max()).item()
                if m >= 4096:
                    row["blockwise_ms"] = bench_ms(lambda: blockwise(*act_scales(x, pad_m), w_q, w_s_gemm))
                    wq_c, ws_c = numerics.quantize_weight(w, "per_channel")
                    row["rowwise_ms"] = bench_ms(lambda: _gemm_rowwise(*quantize_fp8_rows(x, "per_token", None),
                                                                       wq_c, ws_c, None, torch.bfloat16))
                    row["bf16_ms"] = bench_ms(lambda: x @ w.t())
            except Exception as e:  # noqa: BLE001 - the probe reports what fails
                row["ok"] = False
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            print(row, flush=True)
            rows.append(row)
    write_json(args.out, environment=environment(cuda=torch.version.cuda,
                                                 cublaslt=getattr(torch._C, "_cuda_getCompiledVersion",
                                                                  lambda: None)()),
               rows=rows)


if __name__ == "__main__":
    main()
