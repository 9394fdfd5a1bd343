"""A/B in one process: a regionally compiled Flux step with FP8 linears traced into inductor (the quantizer as a
triton_op, torch._scaled_mm) against the opaque `sagegen::fp8_linear` custom op, alternating, with wall time and
GPU busy time (profiler) per variant. JSON to --out.

    python lab/probes/probe_fp8_compiled_traced.py --out $OUT/probe-fp8-compiled-traced.json

Needs the traced path (`sagegen.linear.module.traceable`, `ops.fp8_linear_traced`) of commit 495a30f, reverted
after these runs (lab/NOTES.md v6.1): check it out to rerun.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import sagegen  # noqa: E402
from probe_util import environment, event_ms, full_size_model, write_json  # noqa: E402
from sagegen.linear import module as fp8_module  # noqa: E402
from sagegen.jobs.stepbench.compiling import compiled  # noqa: E402

_TRACEABLE = getattr(fp8_module, "traceable", None)


TOP = {}


def gpu_busy_ms(fn, label: str = "") -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
    TOP[label] = [(e.key[:90], e.count, round(e.self_device_time_total / 1e3, 2)) for e in events[:14]]
    return sum(e.self_device_time_total for e in events) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="flux.1-dev")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if _TRACEABLE is None:
        sys.exit("this probe needs the traced FP8 path of commit 495a30f (reverted); check that commit out")
    model, inputs = full_size_model(args.model, torch.device("cuda"))
    res = {v: {"wall_ms": [], "gpu_busy_ms": []} for v in ("traced", "custom_op")}
    with torch.inference_mode():
        sagegen.patch(model, linear="fp8")
        model(**inputs)  # eager: calibration, warm kernels
        for _ in range(args.rounds):
            for variant in ("traced", "custom_op"):
                fp8_module.traceable = _TRACEABLE if variant == "traced" else (lambda *a: False)
                torch._dynamo.reset()
                fn, undo = compiled(model, "regional", "inductor", None)
                step = lambda: fn(**inputs)[0]  # noqa: E731
                step()
                step()
                walls = [event_ms(step) for _ in range(5)]
                res[variant]["wall_ms"].append(statistics.median(walls))
                res[variant]["gpu_busy_ms"].append(gpu_busy_ms(step, variant))
                for row in TOP[variant]:
                    print("   ", row, flush=True)
                undo()
                print(variant, {k: round(v[-1], 1) for k, v in res[variant].items()}, flush=True)
    fp8_module.traceable = _TRACEABLE
    summary = {v: {k: statistics.median(x) for k, x in r.items()} for v, r in res.items()}
    print(summary, flush=True)
    write_json(args.out, environment=environment(model=args.model), rounds=res, median=summary, top_kernels=TOP)


if __name__ == "__main__":
    main()
