"""Probe: how fast this host's CPUs run a fixed pure-Python loop, each core in turn (the main thread pinned to
it), a few times over. Eager FP8 image steps are host-bound, and their time across processes tracked this
loop's time (probe_step_gc.py's `python_loop_ms`: ~10 ms in processes with 88-102 ms steps, 18-21 ms in those
with 132-163 ms steps, 2026-11-29): the CPU, not sagegen's code, set the step time.

    python lab/probes/probe_cpu_speed.py --rounds 3 --out $OUT/cpu-speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from sagegen.jobs.stepbench.measure import cpu_loop_ms  # noqa: E402  (the loop `sagegen bench` records)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    rows = {c: [] for c in cores}
    for _ in range(args.rounds):
        for c in cores:
            os.sched_setaffinity(0, {c})
            rows[c].append(cpu_loop_ms())
    os.sched_setaffinity(0, set(cores))
    best = {c: min(v) for c, v in rows.items()}
    for c in cores:
        print(f"cpu {c:3d}: " + " ".join(f"{t:5.1f}" for t in rows[c]) + " ms", flush=True)
    print(f"fastest {min(best.values()):.1f} ms, slowest {max(best.values()):.1f} ms, loadavg {os.getloadavg()}")
    mhz = []
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
    except OSError:
        pass
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": platform.node(), "cores": cores, "loop_ms": rows, "cpu_mhz": mhz,
                       "loadavg": os.getloadavg()}, f, indent=1)


if __name__ == "__main__":
    main()
