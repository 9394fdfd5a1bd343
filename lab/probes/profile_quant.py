"""Where the quantization pass's time goes on the GPU: per-kernel times from torch.profiler for
`triton_quant.quantize` at one shape (default B=4, H=32, N=8192, D=128, bf16).

    python lab/probes/profile_quant.py [--shape 4 32 8192 128] [--permute]
    python lab/probes/profile_quant.py --variant "{'STATS_ROWS': 16}" \
        --variant "{'QUANT_WARPS': {'stats': 4, 'q': 4, 'kv': 4}}"
"""

from __future__ import annotations

import argparse
import ast
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from sagegen import SageConfig  # noqa: E402
from sagegen.kernels import triton_quant  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", type=int, nargs=4, default=[4, 32, 8192, 128])
    ap.add_argument("--permute", action="store_true", help="V keys in the Gluon kernel's order")
    ap.add_argument("--smooth-v", action="store_true")
    ap.add_argument("--warps", nargs=3, type=int, metavar=("STATS", "Q", "KV"), action="append",
                    help="warps per CTA of the three launches (repeatable: one profile each)")
    ap.add_argument("--variant", action="append",
                    help="a dict of triton_quant module settings, e.g. \"{'STATS_ROWS': 16}\" (repeatable: one "
                         "profile each, every one from the defaults)")
    args = ap.parse_args()
    defaults = {name: getattr(triton_quant, name) for name in ("QUANT_WARPS", "STATS_ROWS", "STATS_STAGES")}
    for warps in args.warps or [None]:
        if warps:
            triton_quant.QUANT_WARPS = dict(zip(("stats", "q", "kv"), warps))
            print(f"warps stats/q/kv = {warps}")
        profile_once(args)
    for variant in args.variant or []:
        for name, value in {**defaults, **ast.literal_eval(variant)}.items():
            setattr(triton_quant, name, value)
        print(f"variant {variant}")
        profile_once(args)


def profile_once(args):
    b, h, n, d = args.shape
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = SageConfig(smooth_v=args.smooth_v)
    run = lambda: triton_quant.quantize(q, k, v, cfg, 64, 128, d, permute_v_keys=args.permute)
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    reps = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / reps, e.count // reps) for e in prof.key_averages()
            if e.device_time_total > 0]
    total = sum(t for _, t, _ in rows)
    bytes_moved = 3 * q.numel() * 2 + 2 * k.numel() * 2 + 3 * q.numel()  # bf16 reads (K, V twice), 8-bit writes
    print(f"shape {args.shape}: GPU time per quantize {total:.1f} us; {bytes_moved / total / 1e6:.2f} TB/s "
          f"if Q read once and K, V twice")
    for name, t, c in sorted(rows, key=lambda r: -r[1]):
        print(f"  {t:8.1f} us  x{c}  {name[:90]}")


if __name__ == "__main__":
    main()
