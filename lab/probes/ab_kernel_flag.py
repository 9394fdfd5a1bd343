"""A/B one module-level switch of sagegen's kernels in the same run: accuracy against an fp64 reference, then
full-call TFLOP/s at the benchmark shapes, alternating A and B (A, B, A) so drift shows. JSON to --out.

    python lab/probes/ab_kernel_flag.py gluon_attn.ROWSUM_MMA --out $OUT/ab.json
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

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import sagegen  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # bench/, for bench_attention
from bench_attention import quant_only  # noqa: E402  (the separate pass as the full call runs it)

SHAPES = [(4, 32, 4096, 128), (4, 32, 8192, 128), (4, 32, 16384, 128), (1, 24, 32768, 128),
          (4, 32, 16384, 64), (2, 48, 17776, 64), (1, 24, 4608, 128), (2, 38, 4429, 64)]
ACCURACY = [(2, 8, 4096, 64), (2, 8, 4096, 128), (1, 4, 3001, 128)]


def _do_bench(f):
    import triton.testing

    return triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median")


def accuracy_rows(variants: dict) -> list:
    """variants: name -> attn(q, k, v). Relative L1 and cosine against fp64 at the ACCURACY shapes (N(0,1),
    K with a channel bias, as in real K)."""
    rows = []
    torch.manual_seed(0)
    for b, h, n, d in ACCURACY:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        k = k + 3 * torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        row = {"shape": [b, h, n, d]}
        for name, attn in variants.items():
            o = attn(q, k, v).double()
            row[name] = {"rel_l1": ((o - ref).abs().sum() / ref.abs().sum()).item(),
                         "cos": F.cosine_similarity(o.flatten(), ref.flatten(), dim=0).item()}
        rows.append(row)
        print("accuracy", json.dumps(row), flush=True)
    return rows


def speed_rows(shapes, turns, attn_of, quant_of=None) -> list:
    """Full-call TFLOP/s per shape for each name in `turns` (in that order, so A, B, A shows drift), next to
    SDPA's default; attn_of(name) / quant_of(name) return that turn's callables (and may switch a flag)."""
    rows = []
    for b, h, n, d in shapes:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        tf = lambda ms: 4 * b * h * n * n * d / ms / 1e9
        row = {"shape": [b, h, n, d], "sdpa_default": tf(_do_bench(lambda: F.scaled_dot_product_attention(q, k, v)))}
        for name in turns:
            attn = attn_of(name)
            row[name] = tf(_do_bench(lambda: attn(q, k, v)))
            if quant_of is not None:
                quant = quant_of(name)
                row[f"quant_us_{name}"] = 1000 * _do_bench(lambda: quant(q, k, v))
        rows.append(row)
        print(" ".join(f"{k_}={v_:.0f}" if isinstance(v_, float) else f"{k_}={v_}" for k_, v_ in row.items()),
              flush=True)
        q = k = v = None  # free the inputs before the next shape
        torch.cuda.empty_cache()
    return rows


def write_json(path: str, env: dict, acc_rows: list, rows: list) -> None:
    import triton

    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), **env}
    with open(path, "w") as f:
        json.dump({"environment": env, "unit": "TFLOP/s", "accuracy": acc_rows, "rows": rows}, f, indent=1)


def main():
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

    def attn_of(name):
        setattr(mod, attr, values[name[0]])
        return lambda q, k, v: sagegen.sageattn(q, k, v, backend="triton")

    acc_rows = accuracy_rows({name: lambda q, k, v, name=name: attn_of(name)(q, k, v) for name in values})
    rows = speed_rows(SHAPES, ("A", "B", "A2"), attn_of, (lambda name: quant_only) if args.quant else None)
    write_json(args.out, {"flag": args.flag, "A": args.a, "B": args.b}, acc_rows, rows)


if __name__ == "__main__":
    main()
