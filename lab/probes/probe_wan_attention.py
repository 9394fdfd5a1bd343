"""Probe: why Wan2.1-14B's self-attention call (B=1, H=40, 75,600 tokens, hd128) ran at ~795 TFLOP/s inside a
step's profile when `bench_sparse.py` measured 864 at 24 heads. Same kernel; the step differs in heads (40),
layout (NHD: q, k and v are [B, N, H, D]), config (DIFFUSION_CONFIG: smooth_v) and duty (40 calls back to back
between GEMMs, against `do_bench`'s repeats of one call).

Each variant: `do_bench` median and the mean of 40 calls in a row (CUDA events around all 40).

    python lab/probes/probe_wan_attention.py [--out FILE.json] [--tokens N]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import sagegen  # noqa: E402
from probe_util import bench_ms, environment, write_json  # noqa: E402


def sustained_ms(fn, calls: int = 40) -> float:
    fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--tokens", type=int, default=75600)
    args = ap.parse_args()
    n, d = args.tokens, 128
    rows = []
    for heads, layout, cfg_name in [(24, "HND", "default"), (40, "HND", "default"), (40, "NHD", "default"),
                                    (40, "HND", "diffusion"), (40, "NHD", "diffusion")]:
        cfg = sagegen.SageConfig() if cfg_name == "default" else sagegen.DIFFUSION_CONFIG
        shape = (1, heads, n, d) if layout == "HND" else (1, n, heads, d)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        fn = lambda: sagegen.sageattn(q, k, v, tensor_layout=layout, config=cfg)  # noqa: E731
        flops = 4 * heads * n * n * d
        row = {"heads": heads, "layout": layout, "config": cfg_name, "do_bench_ms": bench_ms(fn),
               "sustained_ms": sustained_ms(fn)}
        row["do_bench_tflops"] = flops / row["do_bench_ms"] * 1e-9
        row["sustained_tflops"] = flops / row["sustained_ms"] * 1e-9
        print(row, flush=True)
        rows.append(row)
        q = k = v = None  # free before the next shape
        torch.cuda.empty_cache()
    write_json(args.out, environment=environment(tokens=n), rows=rows)


if __name__ == "__main__":
    main()
