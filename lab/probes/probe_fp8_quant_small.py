"""The per-token FP8 quantizer at the image models' short activations, over launch settings the bench's sweep
does not try (1-2 warps a row, several rows a program, capped grids), timed alone and followed by its GEMM
(the layer as it runs), in interleaved rounds, with a bf16 -> fp8 cast of the same tensor as the traffic
floor. Question: can any launch bring the attention output projections of Flux (4-4.6k x 3072) and SD3.5
(8858 x 2432) and SD3.5's GELU-fused MLP down projection to 1.6x bf16 cuBLAS?

    python lab/probes/probe_fp8_quant_small.py --out $OUT/probe-fp8-quant-small.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from sagegen.kernels import fp8_quant  # noqa: E402
from sagegen.linear import numerics  # noqa: E402
from sagegen.linear.ops import gemm_rowwise_prepared  # noqa: E402

# (label, M, K, N, gelu)
SHAPES = [("flux out 4096", 4096, 3072, 3072, False), ("flux out 4608", 4608, 3072, 3072, False),
          ("sd3.5 out", 8858, 2432, 2432, False), ("sd3.5 ff down", 8192, 9728, 2432, True),
          ("flux ff down", 4096, 12288, 3072, True)]


def launches(K: int) -> list[tuple[str, dict]]:
    bk = fp8_quant.triton.next_power_of_2(K)
    out = [("default", {})]
    for bm in (1, 2, 4, 8):
        for warps in (1, 2, 4, 8, 16):
            per_thread = bm * bk // (32 * warps)
            if 8 <= per_thread <= 128:
                out.append((f"bm{bm}w{warps}", {"block_m": bm, "num_warps": warps}))
    for bm, warps, waves in ((1, 4, 8), (2, 4, 4), (1, 8, 4)):
        out.append((f"bm{bm}w{warps}p{waves}", {"block_m": bm, "num_warps": warps, "programs": 132 * waves}))
    return out


def main():
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    bench = lambda f: triton.testing.do_bench(f, warmup=5, rep=25, return_mode="median")  # noqa: E731
    rows = []
    for label, M, K, N, gelu in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) * 2
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        w_q, w_s = numerics.quantize_weight(w, "per_channel")
        w_t, w_sv = w_q.t(), w_s.view(1, -1)
        prologue = "gelu_tanh" if gelu else None
        ref_q, ref_s = fp8_quant.quantize_fp8_rows(x, "per_token", prologue=prologue)
        variants = {}
        for name, kw in launches(K):
            quant = (lambda kw=kw: fp8_quant.quantize_fp8_rows(x, "per_token", prologue=prologue, **kw))
            q, s = quant()
            if not (torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)):
                print(f"{label} {name}: output differs from the default launch", flush=True)
                continue
            variants[f"q:{name}"] = quant
            variants[f"q+gemm:{name}"] = (lambda quant=quant: gemm_rowwise_prepared(
                *quant(), w_t, w_sv, None, torch.bfloat16, True))
        gelu_x = F.gelu(x, approximate="tanh") if gelu else x
        variants["bf16"] = (lambda: F.linear(F.gelu(x, approximate="tanh"), w)) if gelu else (lambda: F.linear(x, w))
        variants["gemm"] = lambda: gemm_rowwise_prepared(ref_q, ref_s, w_t, w_sv, None, torch.bfloat16, True)
        variants["cast_floor"] = lambda: gelu_x.to(torch.float8_e4m3fn)
        times = {k: [] for k in variants}
        for _ in range(args.rounds):
            for k, fn in variants.items():
                times[k].append(bench(fn))
        ms = {k: statistics.median(v) for k, v in times.items()}
        best = min((k for k in ms if k.startswith("q+gemm:")), key=ms.get)
        row = {"label": label, "M": M, "K": K, "N": N, "gelu": gelu, "ms": ms, "ms_rounds": times,
               "best": best, "speedup_best": ms["bf16"] / ms[best],
               "speedup_default": ms["bf16"] / ms["q+gemm:default"],
               "quant_gbps_default": M * K * 3 / ms["q:default"] / 1e6,
               "cast_gbps": M * K * 3 / ms["cast_floor"] / 1e6}
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                          if k not in ("ms_rounds", "ms")}), flush=True)
        print("  " + " ".join(f"{k}={v * 1e3:.1f}" for k, v in sorted(ms.items(), key=lambda kv: kv[1])), flush=True)
        x = w = None  # free before the next shape (the lambdas above read these names)
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    with open(args.out, "w") as f:
        json.dump({"probe": "fp8_quant_small", "device": props.name, "torch": torch.__version__,
                   "triton": __import__("triton").__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
