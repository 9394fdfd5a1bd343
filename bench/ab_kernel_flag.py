"""A/B one module-level switch of sagegen's kernels in the same run: accuracy against an fp64 reference, then
full-call TFLOP/s at the benchmark shapes, alternating A and B (A, B, A) so drift shows. JSON to --out.

    python bench/ab_kernel_flag.py gluon_attn.ROWSUM_MMA --out $OUT/ab.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import sagegen  # noqa: E402
from bench_attention import quant_only  # noqa: E402  (the separate pass as the full call runs it)

SHAPES = [(4, 32, 4096, 128), (4, 32, 8192, 128), (4, 32, 16384, 128), (1, 24, 32768, 128),
          (4, 32, 16384, 64), (2, 48, 17776, 64), (1, 24, 4608, 128), (2, 38, 4429, 64)]
ACCURACY = [(2, 8, 4096, 64), (2, 8, 4096, 128), (1, 4, 3001, 128)]


def main():
    import triton
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("flag", help="module.ATTRIBUTE under sagegen.kernels, e.g. gluon_attn.ROWSUM_MMA")
    ap.add_argument("--a", default="False")
    ap.add_argument("--b", default="True")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quant", action="store_true", help="also time the quantization pass alone (µs)")
    args = ap.parse_args()
    mod_name, attr = args.flag.rsplit(".", 1)
    mod = importlib.import_module(f"sagegen.kernels.{mod_name}")
    values = {"A": eval(args.a), "B": eval(args.b)}  # noqa: S307 - a developer's command line
    os.environ.setdefault("SAGEGEN_KERNEL", "gluon")
    bench = lambda f: triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median")
    acc_rows, rows = [], []
    torch.manual_seed(0)
    for b, h, n, d in ACCURACY:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        k = k + 3 * torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16)  # a channel bias, as in real K
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        row = {"shape": [b, h, n, d]}
        for name, value in values.items():
            setattr(mod, attr, value)
            o = sagegen.sageattn(q, k, v, backend="triton").double()
            row[name] = {"rel_l1": ((o - ref).abs().sum() / ref.abs().sum()).item(),
                         "cos": F.cosine_similarity(o.flatten(), ref.flatten(), dim=0).item()}
        acc_rows.append(row)
        print("accuracy", row, flush=True)
    for b, h, n, d in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        tf = lambda ms: 4 * b * h * n * n * d / ms / 1e9
        row = {"shape": [b, h, n, d], "sdpa_default": tf(bench(lambda: F.scaled_dot_product_attention(q, k, v)))}
        for name in ("A", "B", "A2"):
            setattr(mod, attr, values[name[0]])
            row[name] = tf(bench(lambda: sagegen.sageattn(q, k, v, backend="triton")))
            if args.quant:
                row[f"quant_us_{name}"] = 1000 * bench(lambda: quant_only(q, k, v))
        rows.append(row)
        print(" ".join(f"{k_}={v_:.0f}" if isinstance(v_, float) else f"{k_}={v_}" for k_, v_ in row.items()),
              flush=True)
        q = k = v = None  # free the inputs before the next shape
        torch.cuda.empty_cache()
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), "flag": args.flag, "A": args.a, "B": args.b}
    with open(args.out, "w") as f:
        json.dump({"environment": env, "unit": "TFLOP/s", "accuracy": acc_rows, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
