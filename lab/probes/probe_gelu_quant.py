"""One-off: the fused GELU + FP8 quantizer's time against eager GELU + the plain quantizer, per tanh formula and
pass structure, at the MLP down-projection inputs of the models (H100). Prints ms and how many FP8 codes
differ from eager GELU + quantizer.

    python lab/probes/probe_gelu_quant.py --out /tmp/gelu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from sagegen.kernels.fp8_quant import quantize_fp8_rows  # noqa: E402
from sagegen.jobs.stepbench.measure import versions  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from probe_util import bench_ms  # noqa: E402

SHAPES = [("flux ff down", 4608, 12288), ("sd3.5-large ff down", 8858, 9728), ("cogvideox-5b ff down", 35552, 12288),
          ("wan2.1-14b ffn down", 75600, 13824)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = []
    for name, M, K in SHAPES:
        x = (torch.randn(M, K, device="cuda") * 2).to(torch.bfloat16)
        ref_q, ref_s = quantize_fp8_rows(F.gelu(x, approximate="tanh"))
        row = {"shape": name, "M": M, "K": K, "ms": {}, "codes_differing": {}}
        row["ms"]["quant_plain"] = bench_ms(lambda: quantize_fp8_rows(x))
        row["ms"]["gelu_eager"] = bench_ms(lambda: F.gelu(x, approximate="tanh"))
        row["ms"]["eager_gelu_then_quant"] = bench_ms(lambda: quantize_fp8_rows(F.gelu(x, approximate="tanh")))
        for tanh in ("exp2", "libdevice"):
            for passes, extra in (("one_pass", {}), ("two_pass", {"max_single_pass_k": 0}),
                                  ("one_pass_32w", {"num_warps": 32} if K > 8192 else None)):
                if extra is None:
                    continue
                key = f"fused_{tanh}_{passes}"
                fn = lambda: quantize_fp8_rows(x, prologue="gelu_tanh", tanh=tanh, **extra)  # noqa: E731
                row["ms"][key] = bench_ms(fn)
                q, s = fn()
                row["codes_differing"][key] = (q.view(torch.uint8) != ref_q.view(torch.uint8)).float().mean().item()
        print(name, {k: round(v, 3) for k, v in row["ms"].items()},
              {k: f"{v:.1e}" for k, v in row["codes_differing"].items()},
              flush=True)
        rows.append(row)
    with open(args.out, "w") as f:
        json.dump({"probe": "gelu_quant", "device": torch.cuda.get_device_name(), "versions": versions(),
                   "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
