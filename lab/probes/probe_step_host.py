"""Host time of an eager denoising step, A/B of `sagegen.api.EAGER_DIRECT` (eager sageattn calls skip the custom
op's dispatch) in one process: a full-size model with random weights, patched (optionally with FP8 linears),
steps alternating A (True) and B (False). Per step: the wall time between CUDA events, and the host time until
`step()` returns (all launched, nothing synchronised): when it is well below the wall time the step is
GPU-bound and host savings cannot show in it. (Timing the enqueue behind a long GPU sleep does not work: the
launch queue fills within a step and the host waits for the sleep.) JSON to --out.

    python lab/probes/probe_step_host.py sd3.5-large [--linear fp8] --out $OUT/step-host.json
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
from probe_util import environment, event_ms, full_size_model, write_json  # noqa: E402


def host_ms(step) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--linear", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model, inputs = full_size_model(args.model, torch.device("cuda"))
    step = lambda: model(**inputs)[0]  # noqa: E731
    res = {"wall_ms": {"A": [], "B": []}, "host_ms": {"A": [], "B": []}}
    with torch.inference_mode():
        sagegen.patch(model, linear=args.linear)
        for value in (True, False):
            sagegen.api.EAGER_DIRECT = value
            step()
        for _ in range(args.rounds):
            for label, value in (("A", True), ("B", False)):
                sagegen.api.EAGER_DIRECT = value
                res["wall_ms"][label].append(event_ms(step))
                res["host_ms"][label].append(host_ms(step))
                print(label, f"wall {res['wall_ms'][label][-1]:.1f} ms, host {res['host_ms'][label][-1]:.1f} ms",
                      flush=True)
    sagegen.api.EAGER_DIRECT = True
    res["median"] = {kind: {k: statistics.median(v) for k, v in d.items()} for kind, d in
                     (("wall_ms", res["wall_ms"]), ("host_ms", res["host_ms"]))}
    print(res["median"], flush=True)
    write_json(args.out, environment=environment(), model=args.model, linear=args.linear, **res)


if __name__ == "__main__":
    main()
