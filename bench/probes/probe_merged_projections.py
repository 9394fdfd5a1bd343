"""Probe: what merging the FP8 projections of one input into one GEMM (`sagegen.linear.siblings`: Q/K/V, and
Flux's single blocks' proj_mlp with them) saves in a whole eager FP8 step.

One process, the model (--model, FLUX.1-dev by default) at full size with random weights and its preset size,
patched with FP8 linears (default policy). A first step learns the groups; then the same patched model runs
with the merged GEMMs on and off (each group's row limit set to 0, in place), alternating for --rounds rounds:
wall time (CUDA events) and GPU busy time (kernel time of one profiled step) each round, and the outputs
compared. Then the attention-only patch (bf16 linears) and stock in the same process, for reference.

python bench/probes/probe_merged_projections.py --out bench/results/probe-merged-projections-flux-<gpu>-<date>.json
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import sagegen  # noqa: E402
from sagegen.linear.module import FP8Linear  # noqa: E402
from sagegen.models import arch as archs  # noqa: E402
from sagegen.runfiles import atomic_write_json  # noqa: E402
from sagegen.stepbench_measure import Timer, compare, device_info, profile_step, versions  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="flux.1-dev")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    dev = torch.device("cuda")
    model = archs.build_transformer(args.model, dtype=torch.bfloat16, device=dev, seed=0)
    arch = archs.get_arch(args.model)
    inputs = archs.example_inputs(args.model, batch=arch.batch, dtype=torch.bfloat16, device=dev, seed=1,
                                  height=arch.height, width=arch.width, frames=arch.frames or None)
    timer = Timer(dev)

    def run():
        with torch.inference_mode():
            return model(**inputs)[0]

    def timed(label):
        y, times, _ = timer.measure(run, 1, args.repeats)
        busy = profile_step(run)["total_s"]
        print(f"{label:>16}: {statistics.median(times) * 1e3:8.1f} ms wall, {busy * 1e3:8.1f} ms GPU busy", flush=True)
        return y.float().cpu(), {"median_s": statistics.median(times), "gpu_busy_s": busy}

    stock_out, stock = timed("stock")
    sagegen.patch(model)
    attn_out, attn_only = timed("attention only")
    sagegen.patch(model, linear="fp8")
    run()  # learns the groups
    groups = {id(g): g for m in model.modules() if isinstance(m, FP8Linear)
              for g in [m.__dict__.get("_siblings")] if g is not None}
    limit = next(iter(groups.values())).max_rows if groups else 0
    print(f"{len(groups)} merged groups, {sum(len(g.members) for g in groups.values())} layers, "
          f"row limit {limit}", flush=True)
    rows: dict = {"on": [], "off": []}
    outs = {}
    for r in range(args.rounds):
        for label in ("off", "on") if r % 2 else ("on", "off"):
            for g in groups.values():
                g.max_rows = limit if label == "on" else 0
            outs[label], row = timed(f"round {r} merge {label}")
            rows[label].append(row)
    summary = {k: {"median_s": statistics.median(x["median_s"] for x in v),
                   "gpu_busy_s": statistics.median(x["gpu_busy_s"] for x in v)} for k, v in rows.items()}
    result = {"probe": "merged_projections", "model": args.model, "environment": device_info(dev),
              "versions": versions(), "groups": len(groups),
              "group_sizes": sorted({len(g.members) for g in groups.values()}), "row_limit": limit,
              "stock": stock, "attention_only": attn_only, "rounds": rows, "summary": summary,
              "merged_vs_separate": compare(outs["on"], outs["off"]),
              "fp8_merged_vs_stock": compare(outs["on"], stock_out),
              "attention_only_vs_stock": compare(attn_out, stock_out),
              "wall_ratio_off_over_on": summary["off"]["median_s"] / summary["on"]["median_s"],
              "busy_ratio_off_over_on": summary["off"]["gpu_busy_s"] / summary["on"]["gpu_busy_s"],
              "speedup_vs_stock": {"attention_only": stock["median_s"] / attn_only["median_s"],
                                   "fp8_separate": stock["median_s"] / summary["off"]["median_s"],
                                   "fp8_merged": stock["median_s"] / summary["on"]["median_s"]}}
    atomic_write_json(args.out, result)
    print({k: v for k, v in result.items() if k not in ("rounds", "environment", "versions")}, flush=True)


if __name__ == "__main__":
    main()
