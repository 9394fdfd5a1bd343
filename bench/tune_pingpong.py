"""The two-warpgroup ping-pong kernel (`gluon_pingpong`) against the one-warpgroup Gluon kernel and SDPA's
default in the same run: agreement first (same quantized inputs, so the outputs should match to rounding),
then full-call TFLOP/s per ring depth. JSON to --out.

    python bench/tune_pingpong.py --out $OUT/tune-pingpong.json
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
from sagegen.kernels import gluon_attn, gluon_pingpong  # noqa: E402

VARIANTS = {  # name: (turn barriers, gluon_attn's loop order, ring slots, turns around P·V(j) + Q·Kᵀ(j+1))
    "alt_turns": (True, False, 4, True), "alt_no_turns": (False, False, 4, True),
    "pingpong": (True, False, 4, False)}
SHAPES = [(4, 32, 8192, 128), (4, 32, 16384, 128), (1, 24, 32768, 128), (2, 48, 17776, 64)]
# Odd sizes, Nq != Nk, a last tile whose second warpgroup has no rows, grouped heads, key lengths.
CHECKS = [(1, 2, 1000, 1000, 128, 2), (2, 3, 4097, 3001, 128, 1), (1, 2, 130, 5000, 128, 1),
          (1, 4, 2050, 2050, 64, 2), (2, 2, 8192, 8192, 128, 1), (1, 2, 333, 64, 64, 1)]


def run(q, k, v, pingpong: bool, **kw):
    d_pad = max(16, 1 << (q.shape[-1] - 1).bit_length())
    (gluon_attn.PINGPONG_HEAD_DIMS.add if pingpong else gluon_attn.PINGPONG_HEAD_DIMS.discard)(d_pad)
    gluon_attn.QUANT_Q_IN_KERNEL = False  # the ping-pong kernel reads Q from the separate pass
    return sagegen.sageattn(q, k, v, backend="triton", **kw)


def use(variant):
    gluon_pingpong.TURNS, gluon_pingpong.PREFETCH, gluon_pingpong.STAGES, gluon_pingpong.ALT = VARIANTS[variant]


def check(rows, variant):
    use(variant)
    torch.manual_seed(0)
    for b, h, nq, nk, d, group in CHECKS:
        q = torch.randn(b, h, nq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, h // group, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for masked in (False, True):
            kw = {}
            if masked:
                valid = torch.arange(nk, device="cuda")[None, :] < torch.tensor([nk, nk // 3 + 1][:b], device="cuda")[:, None]
                kw["attn_mask"] = valid[:, None, None, :]
            o1, l1 = run(q, k, v, False, return_lse=True, **kw)
            o2, l2 = run(q, k, v, True, return_lse=True, **kw)
            kk, vv = (x.double().repeat_interleave(group, dim=1) for x in (k, v))
            ref = F.scaled_dot_product_attention(q.double(), kk, vv, attn_mask=kw.get("attn_mask"))
            err = lambda o: ((o.double() - ref).abs().sum() / ref.abs().sum()).item()
            row = {"variant": variant, "shape": [b, h, nq, nk, d, group], "masked": masked,
                   "max_abs_vs_gluon": (o1.float() - o2.float()).abs().max().item(),
                   "lse_max_abs_vs_gluon": (l1 - l2).abs().max().item(),
                   "rel_l1_gluon": err(o1), "rel_l1_pingpong": err(o2), "finite": bool(o2.isfinite().all())}
            rows.append(row)
            print("check", {k_: (round(v_, 5) if isinstance(v_, float) else v_) for k_, v_ in row.items()},
                  flush=True)


def main():
    import triton
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-check", action="store_true")
    args = ap.parse_args()
    os.environ["SAGEGEN_KERNEL"] = "gluon"
    checks, rows = [], []
    if not args.skip_check:
        for variant in VARIANTS:
            check(checks, variant)
    bench = lambda f: triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median")
    for b, h, n, d in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        tf = lambda ms: 4 * b * h * n * n * d / ms / 1e9
        row = {"shape": [b, h, n, d], "sdpa_default": tf(bench(lambda: F.scaled_dot_product_attention(q, k, v))),
               "gluon": tf(bench(lambda: run(q, k, v, False)))}
        for variant in VARIANTS:
            use(variant)
            try:
                row[variant] = tf(bench(lambda: run(q, k, v, True)))
            except Exception as exc:  # e.g. out of shared memory
                row[variant] = f"{type(exc).__name__}: {str(exc)[:160]}"
        row["gluon_again"] = tf(bench(lambda: run(q, k, v, False)))
        rows.append(row)
        print(" ".join(f"{k_}={v_:.0f}" if isinstance(v_, float) else f"{k_}={v_}" for k_, v_ in row.items()),
              flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat()}
    with open(args.out, "w") as f:
        json.dump({"environment": env, "unit": "TFLOP/s", "checks": checks, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
