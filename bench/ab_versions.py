"""A/B two versions of sagegen in one process on the GPU: this checkout (B) against an older copy of the
package (A), e.g. the commit before a change. Accuracy against an fp64 reference, then full-call TFLOP/s and
the separate quantization pass alone at the benchmark shapes, alternating A, B, A so drift shows, next to
SDPA's default in the same run. JSON to --out.

    git archive <commit> sagegen | tar -x -C /tmp/base && mv /tmp/base/sagegen /tmp/base/sagegen_base
    python bench/ab_versions.py --base /tmp/base --out $OUT/ab.json

The older copy is imported as `sagegen_base` (the kernels' modules import each other relatively, so two
copies live side by side). Both register the same `torch.ops.sagegen.sageattn`, so the comparison calls each
copy's kernel launcher (`kernels.triton_attn.sage_attention`) directly, as that op does after its checks.
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
from ab_kernel_flag import ACCURACY, SHAPES  # noqa: E402


def quant_pass(pkg):
    """The separate quantization pass of package `pkg` as its full call runs it on Hopper."""
    tq = importlib.import_module(f"{pkg.__name__}.kernels.triton_quant")
    ta = importlib.import_module(f"{pkg.__name__}.kernels.triton_attn")

    def run(q, k, v):
        cfg = pkg.SageConfig()
        bq, bk = cfg.blocks(q.shape[-1])
        return tq.quantize(q, k, v, cfg, bq, bk, max(16, q.shape[-1]), permute_v_keys=ta.gluon_permutes_v(),
                           quantize_q=not ta.gluon_quantizes_q())
    return run


def attention(pkg):
    """Package `pkg`'s attention launcher with the default config: out = attn(q, k, v), [B, H, N, D]."""
    ta = importlib.import_module(f"{pkg.__name__}.kernels.triton_attn")

    def run(q, k, v, config=None):
        out = torch.empty_like(q)
        ta.sage_attention(q, k, v, out, sm_scale=q.shape[-1] ** -0.5, config=config or pkg.SageConfig())
        return out
    return run


def main():
    import triton
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="a directory holding the older package as sagegen_base/")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", type=int, nargs=4, action="append", metavar=("B", "H", "N", "D"))
    args = ap.parse_args()
    sys.path.insert(0, args.base)
    base = importlib.import_module("sagegen_base")
    pkgs = {"A": base, "B": sagegen}
    os.environ.setdefault("SAGEGEN_KERNEL", "gluon")
    bench = lambda f: triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median")
    acc_rows, rows = [], []
    torch.manual_seed(0)
    for b, h, n, d in ACCURACY:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        k = k + 3 * torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16)  # a channel bias, as in real K
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        row = {"shape": [b, h, n, d]}
        for name, pkg in pkgs.items():
            for smooth_v in (False, True):
                o = attention(pkg)(q, k, v, pkg.SageConfig(smooth_v=smooth_v)).double()
                row[f"{name}{'_smooth_v' if smooth_v else ''}"] = {
                    "rel_l1": ((o - ref).abs().sum() / ref.abs().sum()).item(),
                    "cos": F.cosine_similarity(o.flatten(), ref.flatten(), dim=0).item()}
        acc_rows.append(row)
        print("accuracy", json.dumps(row), flush=True)
    for b, h, n, d in [tuple(s) for s in args.shape] if args.shape else SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        tf = lambda ms: 4 * b * h * n * n * d / ms / 1e9
        row = {"shape": [b, h, n, d], "sdpa_default": tf(bench(lambda: F.scaled_dot_product_attention(q, k, v)))}
        for name in ("A", "B", "A2", "B2"):
            pkg = pkgs[name[0]]
            attn = attention(pkg)
            row[name] = tf(bench(lambda: attn(q, k, v)))
            quant = quant_pass(pkg)
            row[f"quant_us_{name}"] = 1000 * bench(lambda: quant(q, k, v))
        rows.append(row)
        print(" ".join(f"{k_}={v_:.0f}" if isinstance(v_, float) else f"{k_}={v_}" for k_, v_ in row.items()),
              flush=True)
        q = k = v = None  # free the inputs before the next shape
        torch.cuda.empty_cache()
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), "A": "sagegen_base (--base)", "B": "this checkout"}
    with open(args.out, "w") as f:
        json.dump({"environment": env, "unit": "TFLOP/s", "accuracy": acc_rows, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
