"""Probe: the bf16 work around Wan2.1-14B's attention at 720p (75,600 tokens, dim 5120, FFN 13824), per block.

Times on the GPU (CUDA events, median): (1) the FFN's first layer + tanh GELU as diffusers runs it (linear,
then `F.gelu`) against cuBLASLt's GELU epilogue (`torch._addmm_activation(..., use_gelu=True)`), and their
difference from an fp64 reference; (2) Q, K and V as three GEMMs against one GEMM on the concatenated weights.
The question: does either save enough of the ~3.1 s spent outside attention in a step to matter (issue 18's
1.45x needs ~0.32 s)?

    python lab/probes/probe_wan_linears.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from probe_util import environment, write_json  # noqa: E402


def median_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def rel_l1(x, ref) -> float:
    return ((x.double() - ref).abs().sum() / ref.abs().sum()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--tokens", type=int, default=75600)
    args = ap.parse_args()
    torch.manual_seed(0)
    n, dim, ff = args.tokens, 5120, 13824
    x = torch.randn(n, dim, device="cuda", dtype=torch.bfloat16)
    w1 = torch.randn(ff, dim, device="cuda", dtype=torch.bfloat16) * dim ** -0.5
    b1 = torch.randn(ff, device="cuda", dtype=torch.bfloat16) * 0.1
    res = {}
    res["ffn1_linear_ms"] = median_ms(lambda: F.linear(x, w1, b1))
    res["ffn1_linear_gelu_ms"] = median_ms(lambda: F.gelu(F.linear(x, w1, b1), approximate="tanh"))
    res["ffn1_epilogue_gelu_ms"] = median_ms(lambda: torch._addmm_activation(b1, x, w1.t(), use_gelu=True))
    rows = slice(0, 2048)  # the fp64 reference on a slice
    ref = F.gelu(x[rows].double() @ w1.double().t() + b1.double(), approximate="tanh")
    res["gelu_stock_rel_l1_vs_fp64"] = rel_l1(F.gelu(F.linear(x, w1, b1), approximate="tanh")[rows], ref)
    res["gelu_epilogue_rel_l1_vs_fp64"] = rel_l1(torch._addmm_activation(b1, x, w1.t(), use_gelu=True)[rows], ref)
    w1 = b1 = None  # free before the QKV weights
    wq, wk, wv = (torch.randn(dim, dim, device="cuda", dtype=torch.bfloat16) * dim ** -0.5 for _ in range(3))
    bq, bk, bv = (torch.randn(dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    wqkv, bqkv = torch.cat([wq, wk, wv]), torch.cat([bq, bk, bv])
    res["qkv_three_gemms_ms"] = median_ms(lambda: (F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)))
    res["qkv_one_gemm_ms"] = median_ms(lambda: F.linear(x, wqkv, bqkv).split(dim, dim=-1))
    flops = 2 * n * dim * dim * 3
    res["qkv_three_tflops"] = flops / res["qkv_three_gemms_ms"] * 1e-9
    res["qkv_one_tflops"] = flops / res["qkv_one_gemm_ms"] * 1e-9
    for k, v in res.items():
        print(f"{k}: {v:.4g}", flush=True)
    write_json(args.out, environment=environment(tokens=n), results=res)


if __name__ == "__main__":
    main()
