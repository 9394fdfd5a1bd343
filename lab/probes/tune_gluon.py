"""Sweep the Hopper Gluon kernel's launch settings (ring slots, register cap) on the GPU, next to SDPA's
default and the portable Triton kernel in the same run (full call, bf16). Prints a table; JSON to --out.

    python lab/probes/tune_gluon.py --out $OUT/tune-gluon.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import sagegen  # noqa: E402
from sagegen.kernels import gluon_attn, triton_quant  # noqa: E402

CANDIDATES = {  # ring slots, register cap (168: three CTAs per SM)
    128: [(3, None), (2, None), (2, 232)],
    64: [(4, 168), (3, 168), (4, None)],
}
SHAPES = [(4, 32, 8192, 128), (4, 32, 16384, 128), (1, 24, 32768, 128), (4, 32, 16384, 64), (2, 48, 17776, 64)]


def main():
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    bench = lambda f: triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median")
    rows = []
    for b, h, n, d in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        tf = lambda ms: 4 * b * h * n * n * d / ms / 1e9
        row = {"shape": [b, h, n, d], "sdpa_default": tf(bench(lambda: F.scaled_dot_product_attention(q, k, v)))}
        os.environ["SAGEGEN_KERNEL"] = "triton"
        row["triton_kernel"] = tf(bench(lambda: sagegen.sageattn(q, k, v, backend="triton")))
        cfg = sagegen.SageConfig()
        row["quant_ms"] = bench(lambda: triton_quant.quantize(q, k, v, cfg, 64, 128, d))
        os.environ["SAGEGEN_KERNEL"] = "gluon"
        row["gluon"] = {}
        for stages, maxnreg in CANDIDATES[d]:
            gluon_attn.LAUNCH_OVERRIDES[d] = (stages, maxnreg)
            try:
                t = tf(bench(lambda: sagegen.sageattn(q, k, v, backend="triton")))
            except Exception as exc:  # e.g. out of shared memory
                t = f"{type(exc).__name__}: {str(exc)[:120]}"
            row["gluon"][f"stages={stages},maxnreg={maxnreg}"] = t
        gluon_attn.LAUNCH_OVERRIDES.clear()
        os.environ.pop("SAGEGEN_KERNEL")
        rows.append(row)
        cells = " ".join(f"{k_}={v_:.0f}" if isinstance(v_, float) else f"{k_}=ERR" for k_, v_ in row["gluon"].items())
        print(f"{b},{h},{n},{d}: sdpa={row['sdpa_default']:.0f} triton={row['triton_kernel']:.0f} "
              f"quant={row['quant_ms']:.3f}ms | {cells}",
              flush=True)
        q = k = v = None  # free the inputs (not `del`: the lambdas above name them)
        torch.cuda.empty_cache()
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton_version(),
           "date": datetime.date.today().isoformat()}
    with open(args.out, "w") as f:
        json.dump({"environment": env, "unit": "TFLOP/s", "rows": rows}, f, indent=1)


def triton_version():
    import triton

    return triton.__version__


if __name__ == "__main__":
    main()
