"""A/B two versions of sagegen in one process on the GPU: this checkout (B) against an older copy of the
package (A), e.g. the commit before a change. Accuracy against an fp64 reference, then full-call TFLOP/s and
the separate quantization pass alone at the benchmark shapes, alternating A, B, A so drift shows, next to
SDPA's default in the same run. JSON to --out.

    git archive <commit> sagegen | tar -x -C /tmp/base && mv /tmp/base/sagegen /tmp/base/sagegen_base
    python lab/probes/ab_versions.py --base /tmp/base --out $OUT/ab.json

The older copy is imported as `sagegen_base` (the kernels' modules import each other relatively, so two
copies live side by side). Both register the same `torch.ops.sagegen.sageattn`, so the comparison calls each
copy's kernel launcher (`kernels.triton_attn.sage_attention`) directly, as that op does after its checks.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import sagegen  # noqa: E402
from ab_kernel_flag import SHAPES, accuracy_rows, speed_rows, write_json  # noqa: E402


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
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="a directory holding the older package as sagegen_base/")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", type=int, nargs=4, action="append", metavar=("B", "H", "N", "D"))
    args = ap.parse_args()
    sys.path.insert(0, args.base)
    pkgs = {"A": importlib.import_module("sagegen_base"), "B": sagegen}
    os.environ.setdefault("SAGEGEN_KERNEL", "gluon")
    variants = {}
    for name, pkg in pkgs.items():
        for smooth_v in (False, True):
            cfg = pkg.SageConfig(smooth_v=smooth_v)
            variants[f"{name}{'_smooth_v' if smooth_v else ''}"] = (
                lambda q, k, v, attn=attention(pkg), cfg=cfg: attn(q, k, v, cfg))
    acc_rows = accuracy_rows(variants)
    shapes = [tuple(s) for s in args.shape] if args.shape else SHAPES
    rows = speed_rows(shapes, ("A", "B", "A2", "B2"), lambda name: attention(pkgs[name[0]]),
                      lambda name: quant_pass(pkgs[name[0]]))
    write_json(args.out, {"A": "sagegen_base (--base)", "B": "this checkout"}, acc_rows, rows)


if __name__ == "__main__":
    main()
