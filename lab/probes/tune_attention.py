"""Sweep tile sizes and launch settings of the attention kernel on the GPU (full call, bf16), next to SDPA's
default in the same run. Prints a table; writes JSON to --out.

    python lab/probes/tune_attention.py --out $OUT/tune.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import sagegen  # noqa: E402
from sagegen.kernels import triton_attn  # noqa: E402

CANDIDATES = [  # block_q, block_k, num_warps, num_stages[, maxnreg]
    (64, 128, 4, 3), (64, 128, 4, 2, 168), (64, 128, 4, 3, 168), (64, 64, 4, 2, 168), (64, 64, 4, 3),
]
SHAPES = [(4, 32, 16384, 128), (2, 48, 17776, 64), (4, 32, 4096, 128), (4, 32, 4096, 64)]


def main():
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    for b, h, n, d in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * n * n * d
        sdpa_ms = triton.testing.do_bench(lambda: F.scaled_dot_product_attention(q, k, v), warmup=50, rep=200,
                                          return_mode="median")
        print(f"{b},{h},{n},{d} sdpa {flops / sdpa_ms / 1e9:.0f} TFLOP/s", flush=True)
        for bq, bk, w, st, *reg in CANDIDATES:
            triton_attn.LAUNCH_OVERRIDES[(bq, bk, d)] = (w, st, *reg)
            cfg = sagegen.SageConfig(block_q=bq, block_k=bk)
            try:
                ms = triton.testing.do_bench(lambda: sagegen.sageattn(q, k, v, config=cfg), warmup=50, rep=200,
                                             return_mode="median")
            except Exception as exc:
                print(f"  {bq},{bk},w{w},s{st}: {type(exc).__name__} {str(exc)[:120]}", flush=True)
                continue
            row = {"shape": [b, h, n, d], "block_q": bq, "block_k": bk, "num_warps": w, "num_stages": st,
                   "maxnreg": reg[0] if reg else None,
                   "tflops": flops / ms / 1e9, "sdpa_tflops": flops / sdpa_ms / 1e9, "ratio": sdpa_ms / ms}
            rows.append(row)
            print(f"  {bq},{bk},w{w},s{st},r{reg}: {row['tflops']:.0f} TFLOP/s = {row['ratio']:.2f}x sdpa", flush=True)
        q = k = v = None  # free the inputs (not `del`: the lambdas above name them)
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__, "rows": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
