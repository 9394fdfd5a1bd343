"""Probe: what an eager step's host time is made of, without a profiler's inflation: the wall time, the host time
until the step returns, the time Python's garbage collector ran inside the step (per generation, `gc.callbacks`)
and the time inside Triton's `JITFunction.run` (every Triton launch, wrapped with a clock). Rounds alternate the
collector on (A) and off during the step (B, collected between steps), so a collector cost shows as A - B.

Eager FP8 Flux steps ran ~100 ms on Triton 3.6 and ~134 ms on 3.9 on one H200 host (session 29), with cProfile
showing only ~20 ms more host work on 3.9: this tells the rest apart.

    python lab/probes/probe_step_gc.py flux.1-dev --linear fp8 --out $OUT/step-gc.json
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import torch
from triton.runtime.jit import JITFunction

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import sagegen  # noqa: E402
from probe_util import environment, event_ms, full_size_model, write_json  # noqa: E402

_clock = {"gc_s": [0.0, 0.0, 0.0], "gc_n": [0, 0, 0], "gc_t0": 0.0, "jit_s": 0.0, "jit_n": 0}


def _on_gc(phase, info):
    if phase == "start":
        _clock["gc_t0"] = time.perf_counter()
    else:
        g = info["generation"]
        _clock["gc_s"][g] += time.perf_counter() - _clock["gc_t0"]
        _clock["gc_n"][g] += 1


def _clocked_run(original):
    def run(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            _clock["jit_s"] += time.perf_counter() - t
            _clock["jit_n"] += 1
    return run


def _python_ms() -> float:
    """A fixed pure-Python loop (best of 3): how fast this process's interpreter runs, apart from torch and Triton."""
    from sagegen.jobs.stepbench.measure import cpu_loop_ms

    return cpu_loop_ms()


def _process_facts() -> dict:
    import threading
    with open("/proc/self/stat") as f:
        cpu = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39: the CPU it last ran on
    return {"python_loop_ms": _python_ms(), "threads": len(os.listdir("/proc/self/task")),
            "python_threads": [t.name for t in threading.enumerate()], "cpu": cpu,
            "affinity": len(os.sched_getaffinity(0)), "loadavg": os.getloadavg()}


def _reset():
    _clock.update(gc_s=[0.0, 0.0, 0.0], gc_n=[0, 0, 0], jit_s=0.0, jit_n=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--linear", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    before = _process_facts()
    print("process before", before, flush=True)
    model, inputs = full_size_model(args.model, torch.device("cuda"))
    step = lambda: model(**inputs)[0]  # noqa: E731
    JITFunction.run = _clocked_run(JITFunction.run)
    gc.callbacks.append(_on_gc)
    rows = {"A": [], "B": []}
    with torch.inference_mode():
        sagegen.patch(model, linear=args.linear)
        for _ in range(3):
            step()
        for _ in range(args.rounds):
            for label in ("A", "B"):
                gc.collect()
                if label == "B":
                    gc.disable()
                _reset()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step()
                host = time.perf_counter() - t0
                torch.cuda.synchronize()
                inner = {k: list(v) if isinstance(v, list) else v for k, v in _clock.items()}
                wall = event_ms(step)
                gc.enable()
                rows[label].append({"wall_ms": wall, "host_ms": host * 1e3,
                                    "gc_ms_by_generation": [s * 1e3 for s in inner["gc_s"]],
                                    "gc_runs_by_generation": list(inner["gc_n"]),
                                    "triton_run_ms": inner["jit_s"] * 1e3, "triton_launches": inner["jit_n"]})
                r = rows[label][-1]
                gc_ms = sum(r["gc_ms_by_generation"])
                print(f"{label} wall {wall:6.1f} ms  host {r['host_ms']:6.1f} ms  gc {gc_ms:5.1f} "
                      f"ms {r['gc_runs_by_generation']}  triton run {r['triton_run_ms']:5.1f} ms / "
                      f"{r['triton_launches']} launches", flush=True)
    after = _process_facts()
    print("process after", after, flush=True)
    median = {label: {k: statistics.median(r[k] for r in v) for k in ("wall_ms", "host_ms", "triton_run_ms")}
              for label, v in rows.items()}
    print("median", median, "gc thresholds", gc.get_threshold(), "tracked objects", len(gc.get_objects()))
    write_json(args.out, environment=environment(model=args.model, linear=args.linear), rows=rows, median=median,
               gc_threshold=gc.get_threshold(), tracked_objects=len(gc.get_objects()), process_before=before,
               process_after=after)


if __name__ == "__main__":
    main()
