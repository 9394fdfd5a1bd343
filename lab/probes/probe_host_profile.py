"""Probe: where an eager step's host time goes (cProfile), for stock, sagegen attention only and sagegen + FP8
linears, on the model at full size with random weights (--model, FLUX.1-dev by default).

Eager image steps are host-bound on some machines (lab/NOTES.md v5.7, v5.9): the GPU waits for Python. Each
variant runs --steps steps under cProfile after a warm-up; the report lists the functions with the most own
time and the most cumulative time, plus the wall time per step with and without the profiler, and the GPU busy
time of one step (torch profiler), so host and GPU can be compared.

python lab/probes/probe_host_profile.py --out bench/results/probe-host-profile-flux-<gpu>-<date>.json
"""

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

import sagegen  # noqa: E402
from probe_util import full_size_model  # noqa: E402
from sagegen.runs.files import atomic_write_json  # noqa: E402
from sagegen.jobs.stepbench.measure import device_info, profile_step, versions  # noqa: E402


def _top(stats: pstats.Stats, key: str, n: int) -> list[dict]:
    stats.sort_stats(key)
    rows = []
    for func in stats.fcn_list[:n]:
        cc, nc, tt, ct, _ = stats.stats[func]
        rows.append({"function": f"{os.path.basename(func[0])}:{func[1]}:{func[2]}", "calls": nc,
                     "tottime_ms": tt * 1e3, "cumtime_ms": ct * 1e3})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="flux.1-dev")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--variants", default="stock,attention,fp8")
    args = p.parse_args()
    dev = torch.device("cuda")
    model, inputs = full_size_model(args.model, dev)

    def run():
        with torch.inference_mode():
            return model(**inputs)[0]

    def wall(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            run()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n

    result = {"probe": "host_profile", "model": args.model, "environment": device_info(dev), "versions": versions(),
              "variants": {}}
    for variant in args.variants.split(","):
        sagegen.unpatch(model)
        if variant == "attention":
            sagegen.patch(model)
        elif variant == "fp8":
            sagegen.patch(model, linear="fp8")
        for _ in range(2):
            run()
        plain = wall(args.steps)
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        t = time.perf_counter()
        for _ in range(args.steps):
            run()
        host = (time.perf_counter() - t) / args.steps  # the host's own time: launches are asynchronous
        torch.cuda.synchronize()
        prof.disable()
        stats = pstats.Stats(prof, stream=io.StringIO())
        busy = profile_step(run)["total_s"]
        entry = {"wall_s": plain, "host_s_under_cprofile": host, "gpu_busy_s": busy,
                 "own_time": _top(stats, "tottime", args.top), "cumulative": _top(stats, "cumulative", args.top)}
        result["variants"][variant] = entry
        print(f"== {variant}: wall {plain * 1e3:.1f} ms/step, host under cProfile {host * 1e3:.1f} ms/step, "
              f"GPU busy {busy * 1e3:.1f} ms", flush=True)
        for r in entry["own_time"][:25]:
            print(f"  {r['tottime_ms'] / args.steps:8.2f} ms/step own {r['cumtime_ms'] / args.steps:8.2f} cum "
                  f"{r['calls'] // args.steps:6d} calls/step  {r['function']}", flush=True)
        atomic_write_json(args.out, result)


if __name__ == "__main__":
    main()
