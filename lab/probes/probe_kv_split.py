"""The K/V quantization launch with K and V in programs of their own (grid axis 2) against one program for both.

Times `triton_quant.quantize` (the whole pass: statistics, their finish, K/V) of an older package (``--base DIR``
holding it as ``sagegen_base/``) and of this one, at 4 and 8 warps for the K/V launch, alternating four times,
and checks that K, its scales and V come out bit-identical to the older package's. JSON to --out.

    python lab/probes/probe_kv_split.py --base DIR --out $OUT/probe-kv-split.json

The split launch it measured on 2026-11-29 was slower and was not committed (lab/NOTES.md v7.4); as it stands
the probe compares this checkout's launch with the base's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import sagegen  # noqa: E402
from bench_sparse import environment, time_ms  # noqa: E402
from sagegen.kernels import triton_attn, triton_quant  # noqa: E402

SHAPES = [(2, 48, 17776, 64), (1, 24, 32768, 128), (1, 40, 75600, 128), (2, 38, 4429, 64)]


def _bits_equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit equality, also for FP8 tensors (compared as bytes)."""
    if x.dtype.itemsize == 1:
        x, y = x.view(torch.uint8), y.view(torch.uint8)
    return torch.equal(x, y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--base", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.base)
    base = importlib.import_module("sagegen_base.kernels.triton_quant")
    cfg = sagegen.SageConfig()
    rows = []
    with torch.inference_mode():
        for b, h, n, d in SHAPES:
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            bq, bk = cfg.blocks(d, torch.cuda.get_device_capability())

            def run(mod):
                return mod.quantize(q, k, v, cfg, bq, bk, d, None, permute_v_keys=triton_attn.gluon_permutes_v(),
                                    quantize_q=False)
            ref, new = run(base), run(triton_quant)
            pairs = ((ref.k8, new.k8), (ref.k_scale, new.k_scale), (ref.v, new.v), (ref.v_scale, new.v_scale))
            row = {"shape": [b, h, n, d], "equal": all(_bits_equal(x, y) for x, y in pairs)}
            variants = {"base": lambda: run(base)}
            for warps in (4, 8):
                def fn(w=warps):
                    triton_quant.QUANT_WARPS["kv"] = w
                    return run(triton_quant)
                variants[f"split{warps}"] = fn
            times = {name: [] for name in variants}
            for _ in range(4):
                for name, fn in variants.items():
                    times[name].append(time_ms(fn))
            triton_quant.QUANT_WARPS["kv"] = 4
            row["ms"] = {name: sorted(t) for name, t in times.items()}
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(args.out, "w") as f:
        json.dump({"probe": "kv_split", "environment": environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
