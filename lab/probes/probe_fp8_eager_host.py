"""Probe: is an eager FP8 image-model step host-bound, and which layers make it so?

1. Per layer, back to back (what an eager step sees when the GPU keeps up): microseconds per call of bf16
   ``F.linear`` and of `FP8Linear` at the image models' widths for M = 64 .. 8192 tokens. Below the crossover
   the FP8 layer costs more than it saves: that sets `LinearPolicy.min_rows`.
2. Whole steps (random full-size weights, one process): stock, sagegen, sagegen + FP8 at several ``min_rows``,
   each with its wall time (CUDA events) and its GPU busy time (sum of kernel times, one profiled step): a wall
   time well above the busy time is host-bound.

python lab/probes/probe_fp8_eager_host.py --out bench/results/probe-fp8-eager-host-<gpu>-<date>.json
"""

import argparse
import gc
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import sagegen  # noqa: E402
from sagegen.linear import LinearPolicy  # noqa: E402
from sagegen.linear.module import FP8Linear  # noqa: E402
from sagegen.models import arch as archs  # noqa: E402
from sagegen.runs.files import atomic_write_json  # noqa: E402
from sagegen.jobs.stepbench.measure import Timer, compare, device_info, profile_step, versions  # noqa: E402

from probe_util import per_call_us  # noqa: E402  (lab/probes, the script's own folder)

SHAPES = {"3072->3072": (3072, 3072), "3072->12288": (3072, 12288), "12288->3072": (12288, 3072)}
ROWS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)


def layer_sweep() -> list[dict]:
    rows = []
    with torch.inference_mode():
        for name, (k, n) in SHAPES.items():
            lin = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
            fp8 = FP8Linear(lin, min_rows=1)
            for m in ROWS:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                bf16_us = per_call_us(lambda x=x, lin=lin: F.linear(x, lin.weight, lin.bias), iters=100, warmup=10)
                fp8_us = per_call_us(lambda x=x, fp8=fp8: fp8(x), iters=100, warmup=10)
                rows.append({"shape": name, "M": m, "bf16_us": bf16_us, "fp8_us": fp8_us,
                             "fp8_over_bf16": bf16_us / fp8_us})
                print(f"{name:12s} M={m:5d} bf16 {bf16_us:8.1f} us  fp8 {fp8_us:8.1f} us  "
                      f"ratio {bf16_us / fp8_us:5.2f}", flush=True)
    return rows


def step_variants(model_name: str, min_rows_list: list[int], repeats: int) -> dict:
    model = archs.build_transformer(model_name, dtype=torch.bfloat16, device=torch.device("cuda"), seed=0)
    arch = archs.get_arch(model_name)
    inputs = archs.example_inputs(model_name, batch=arch.batch, dtype=torch.bfloat16, device=torch.device("cuda"),
                                  seed=1, height=arch.height, width=arch.width,
                                  frames=arch.frames if arch.frames else None)
    timer = Timer(torch.device("cuda"))

    def run():
        with torch.inference_mode():
            return model(**inputs)[0]

    out, ref = {}, None

    def measure(label):
        nonlocal ref
        y, times, _ = timer.measure(run, 1, repeats)
        busy = profile_step(run)["total_s"]
        row = {"median_s": statistics.median(times), "times_s": times, "gpu_busy_s": busy}
        if ref is None:
            ref = y.float().cpu()
        else:
            row["vs_stock"] = compare(y.float().cpu(), ref)
        out[label] = row
        print(f"{model_name} {label:>20s}: {row['median_s'] * 1e3:8.1f} ms wall, {busy * 1e3:8.1f} ms GPU busy "
              f"(runs {', '.join(f'{t * 1e3:.1f}' for t in times)})", flush=True)
        gc.collect()

    measure("stock")
    sagegen.patch(model, allow_generic=True)
    measure("sagegen")
    sagegen.unpatch(model)
    for mr in min_rows_list:
        sagegen.patch(model, allow_generic=True, linear="fp8", linear_policy=LinearPolicy(min_rows=mr))
        measure(f"fp8_min_rows_{mr}")
        info = sagegen.patch_info(model)["linear"]
        out[f"fp8_min_rows_{mr}"]["fp8_calls"] = info["fp8_calls"]
        sagegen.unpatch(model)
    return out  # (the model goes with this frame; the caller empties the cache)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="flux.1-dev,sd3.5-large,qwen-image")
    p.add_argument("--min-rows", default="64,1024,4096")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-sweep", action="store_true")
    args = p.parse_args()
    report = {"probe": "fp8_eager_host", "device": device_info(torch.device("cuda")), "versions": versions(),
              "date": time.strftime("%Y-%m-%d"), "layers": [], "steps": {}}
    if not args.no_sweep:
        report["layers"] = layer_sweep()
        atomic_write_json(args.out, {**report, "partial": True})
    for name in filter(None, args.models.split(",")):
        report["steps"][name] = step_variants(name, [int(v) for v in args.min_rows.split(",")], args.repeats)
        gc.collect()
        torch.cuda.empty_cache()
        atomic_write_json(args.out, {**report, "partial": True})
    atomic_write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
