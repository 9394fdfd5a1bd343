"""Same-run comparison of Hopper Gluon kernel variants (full call, bf16) next to SDPA's default, alternating
the variants twice so drift shows; accuracy against fp64 for each variant. JSON to --out.

Variants: "q-pass" (Q quantized by the separate pass), "q-in-kernel" (Q quantized per CTA, the default). The
results file of 2026-11-21 also has "keys64" (64-key blocks at head dim 128 with P·V in head-dim halves, 168
registers, three CTAs per SM; commit 17d5f88, removed afterwards: bench/NOTES.md v3.1).

    python bench/ab_gluon_variants.py --out $OUT/ab-variants.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import sagegen  # noqa: E402
from sagegen.kernels import gluon_attn  # noqa: E402

SHAPES = [(4, 32, 4096, 128), (4, 32, 8192, 128), (4, 32, 16384, 128), (1, 24, 32768, 128), (1, 24, 4608, 128),
          (4, 32, 8192, 64), (2, 48, 17776, 64), (2, 38, 4429, 64)]
ACCURACY = [(1, 8, 4096, 128), (1, 8, 4096, 64)]
VARIANTS = {"q-pass": False, "q-in-kernel": True}  # name: Q quantized in the kernel


def run_variant(name, q, k, v):
    gluon_attn.QUANT_Q_IN_KERNEL = VARIANTS[name]
    return sagegen.sageattn(q, k, v, backend="triton")


def main():
    import triton
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    names = args.variants.split(",")
    os.environ["SAGEGEN_KERNEL"] = "gluon"
    bench = lambda f: triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median")
    acc_rows, rows = [], []
    torch.manual_seed(0)
    for b, h, n, d in ACCURACY:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        row = {"shape": [b, h, n, d]}
        for name in names:
            o = run_variant(name, q, k, v).double()
            row[name] = {"rel_l1": ((o - ref).abs().sum() / ref.abs().sum()).item(),
                         "cos": F.cosine_similarity(o.flatten(), ref.flatten(), dim=0).item()}
        acc_rows.append(row)
        print("accuracy", json.dumps(row), flush=True)
    for b, h, n, d in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        tf = lambda ms: 4 * b * h * n * n * d / ms / 1e9
        row = {"shape": [b, h, n, d], "sdpa_default": tf(bench(lambda: F.scaled_dot_product_attention(q, k, v)))}
        for rep in (1, 2):
            for name in names:
                row[f"{name}#{rep}"] = tf(bench(lambda: run_variant(name, q, k, v)))
        rows.append(row)
        print(" ".join(f"{k_}={v_:.0f}" if isinstance(v_, float) else f"{k_}={v_}" for k_, v_ in row.items()),
              flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), "variants": {n: VARIANTS[n] for n in names}}
    with open(args.out, "w") as f:
        json.dump({"environment": env, "unit": "TFLOP/s", "accuracy": acc_rows, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
