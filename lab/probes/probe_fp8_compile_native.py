"""A/B in one process: a compiled full-size step with FP8 linears traced as plain ops (the quantization fused by
inductor into its producer, then `torch._scaled_mm`: `linear.module.COMPILE_NATIVE = True`) against the opaque
`sagegen::fp8_linear` op (False), alternating A, B, A, B. Dynamo guards on the switch, so each value compiles
once and both graphs stay cached. Also: eager sagegen FP8 and compiled sagegen attention-only (no FP8) in the same
process, for "compile adds to sagegen". Wall time (CUDA events), host time, and GPU busy time (profiler) per
variant. JSON to --out.

    python lab/probes/probe_fp8_compile_native.py flux.1-dev --scope regional --out $OUT/probe.json
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
from probe_util import environment, write_json  # noqa: E402
from sagegen.jobs.stepbench.compiling import compiled, uncompile  # noqa: E402
from sagegen.jobs.stepbench.measure import Timer  # noqa: E402
from sagegen.linear import module as fp8_module  # noqa: E402
from sagegen.models import arch as archs  # noqa: E402


def busy_ms(fn) -> float:
    """GPU kernel time of one fn() (profiler), ms."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.device_time_total for e in prof.key_averages() if e.device_time_total) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--scope", default="regional", choices=["regional", "full"])
    ap.add_argument("--mode", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dtype = torch.bfloat16
    t0 = time.perf_counter()
    model = archs.build_transformer(args.model, dtype=dtype, device="cuda", seed=0)
    arch = archs.get_arch(args.model)
    inputs = archs.example_inputs(args.model, dtype=dtype, device="cuda", seed=1)
    print(f"built in {time.perf_counter() - t0:.1f} s", flush=True)
    timer = Timer(torch.device("cuda"))
    rows: dict[str, list] = {}

    def run(fn):
        def call():
            with torch.inference_mode():
                return fn(**inputs)[0]
        return call

    def timed(name, fn, warmup=1):
        t = time.perf_counter()
        out, times, peak = timer.measure(run(fn), warmup, args.repeats)
        entry = {"median_ms": statistics.median(times) * 1e3, "times_ms": [x * 1e3 for x in times],
                 "host_ms": statistics.median(timer.host_times) * 1e3, "busy_ms": busy_ms(run(fn)),
                 "peak_gb": peak, "first_s": time.perf_counter() - t}
        rows.setdefault(name, []).append(entry)
        print(f"{name:>28}: {entry['median_ms']:8.1f} ms  busy {entry['busy_ms']:7.1f}  host {entry['host_ms']:7.1f}"
              f"  peak {peak:.1f} GB  ({entry['first_s']:.0f} s with compile)", flush=True)
        write_json(args.out, environment=environment(model=args.model, scope=args.scope, mode=args.mode,
                                                    arch_source=arch.source), rows=rows)
        return out

    timed("stock", model)
    sagegen.patch(model, allow_generic=True)
    timed("sagegen_eager", model)
    fn, undo = compiled(model, args.scope, "inductor", args.mode)
    timed("sagegen_compiled", fn)
    undo()
    torch._dynamo.reset()
    sagegen.patch(model, linear="fp8", allow_generic=True)
    timed("sagegen_fp8_eager", model)
    fn, undo = compiled(model, args.scope, "inductor", args.mode)
    for _ in range(args.rounds):
        for native in (True, False):
            fp8_module.COMPILE_NATIVE = native
            timed("sagegen_fp8_compiled_" + ("native" if native else "opaque_op"), fn)
    fp8_module.COMPILE_NATIVE = True
    undo()
    info = sagegen.patch_info(model)
    write_json(args.out, environment=environment(model=args.model, scope=args.scope, mode=args.mode,
                                                arch_source=arch.source), rows=rows,
               linear={k: info["linear"][k] for k in ("fp8_layer_count", "bf16_bytes_moved_to_cpu", "bf16_copies")},
               compile=info["compile"])


if __name__ == "__main__":
    main()
