"""Probe: does one `torch.profiler` session slow every eager step after it?

`sagegen bench` profiles one step of each variant (`stepbench_measure.host_check`) to read its GPU busy time,
and the variants after that profile are timed in the same process. On 2026-11-30 (H200, Triton 3.9) the eager
FP8 Flux step took 140 ms in `sagegen bench` (host 139 ms, GPU busy 80 ms) and ~92 ms in `sagegen compare`,
which profiles nothing, on the same machine. Kineto leaves CUPTI's activity tracing set up after a session
unless it is torn down (pytorch/pytorch#144455), which would tax every later launch.

Timed here in one process: eager steps (wall and host enqueue time, medians of ROUNDS), then one profiled step,
then eager steps again, then (second profile) again. With ``--probe-launch``: a trivial kernel's host time per
launch before and after, too.

    python lab/probes/probe_profiler_after.py flux.1-dev --linear fp8 --out $OUT/profiler-after.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import sagegen  # noqa: E402
from probe_util import environment, event_ms, full_size_model, per_call_us, write_json  # noqa: E402
from sagegen.jobs.stepbench.measure import profile_step  # noqa: E402


def _steps(step, rounds: int) -> dict:
    walls, hosts = [], []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        hosts.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        walls.append(event_ms(step))
    return {"wall_ms": statistics.median(walls), "host_ms": statistics.median(hosts), "walls": walls,
            "hosts": hosts}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--linear", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profiles", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model, inputs = full_size_model(args.model, torch.device("cuda"))
    step = lambda: model(**inputs)[0]  # noqa: E731
    x = torch.zeros(16, device="cuda")
    tiny = lambda: x.add_(1)  # noqa: E731
    phases = []
    with torch.inference_mode():
        sagegen.patch(model, linear=args.linear)
        for _ in range(3):
            step()
        for i in range(args.profiles + 1):
            if i:
                busy = profile_step(step)["total_s"] * 1e3
                print(f"profiled one step: GPU busy {busy:.1f} ms", flush=True)
            row = _steps(step, args.rounds)
            row["tiny_launch_us"] = per_call_us(tiny)
            row["after_profiles"] = i
            phases.append(row)
            print(f"after {i} profile(s): wall {row['wall_ms']:6.1f} ms  host {row['host_ms']:6.1f} ms  "
                  f"tiny launch {row['tiny_launch_us']:5.1f} us", flush=True)
    write_json(args.out, environment=environment(model=args.model, linear=args.linear,
                                                 teardown_cupti=os.environ.get("TEARDOWN_CUPTI")), phases=phases)


if __name__ == "__main__":
    main()
