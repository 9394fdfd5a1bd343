"""Probe: what the single-block ``proj_out`` fusion (cat(attention, GELU(mlp)) quantized from the two tensors,
`FP8Linear.cat_gelu`; Flux and HunyuanVideo) saves in a whole eager FP8 step.

One process, the model (--model, FLUX.1-dev by default) at full size with random weights and its preset size,
patched with FP8 linears (default policy). The same
patched model runs with the fusion on and off (the ``fuse_cat_gelu`` mark of every single block's proj_out,
flipped in place), alternating for --rounds rounds: wall time (CUDA events) and GPU busy time (kernel time of one
profiled step) each round, and the outputs compared (the fused GELU may move a few bf16 steps). Then one fused
step with every proj_out's input captured: the fused layer against the unfused one on those inputs (how far
the layers themselves differ, against how far the step's output moves).

python lab/probes/probe_cat_gelu.py --out bench/results/probe-flux-cat-gelu-<gpu>-<date>.json
python lab/probes/probe_cat_gelu.py --model hunyuanvideo --rounds 2 --repeats 3 --out ...
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

import sagegen  # noqa: E402
from probe_util import full_size_model  # noqa: E402
from sagegen.linear.module import FP8Linear  # noqa: E402
from sagegen.runs.files import atomic_write_json  # noqa: E402
from sagegen.jobs.stepbench.measure import Timer, compare, device_info, profile_step, versions  # noqa: E402


def _layer_diffs(marked, run) -> dict:
    """Each fused proj_out against the unfused layer on the inputs of one real step (rel. L1 of the outputs)."""
    diffs = []
    for m in marked:
        m.fuse_cat_gelu = True
        fused_call = m.cat_gelu

        def check(prefix, x, m=m, fused_call=fused_call):
            y = fused_call(prefix, x)
            y_ref = m(torch.cat([prefix, torch.nn.functional.gelu(x, approximate="tanh")], -1))
            diffs.append(((y.float() - y_ref.float()).abs().sum() / y_ref.float().abs().sum()).item())
            return y

        m.cat_gelu = check
    run()
    for m in marked:
        del m.cat_gelu  # the instance attribute: the method again
    return {"rel_l1_max": max(diffs), "rel_l1_median": statistics.median(diffs), "layers": len(diffs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="flux.1-dev")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    dev = torch.device("cuda")
    model, inputs = full_size_model(args.model, dev)
    sagegen.patch(model, linear="fp8")
    marked = [m for m in model.modules() if isinstance(m, FP8Linear) and m.fuse_cat_gelu]
    print(f"{len(marked)} proj_out layers fused", flush=True)
    timer = Timer(dev)

    def run():
        with torch.inference_mode():
            return model(**inputs)[0]

    rows: dict = {"on": [], "off": []}
    outs = {}
    for r in range(args.rounds):
        for label in ("off", "on") if r % 2 else ("on", "off"):
            for m in marked:
                m.fuse_cat_gelu = label == "on"
            y, times, _ = timer.measure(run, 1, args.repeats)
            busy = profile_step(run)["total_s"]
            rows[label].append({"median_s": statistics.median(times), "gpu_busy_s": busy})
            outs[label] = y.float().cpu()
            print(f"round {r} fusion {label:>3}: {statistics.median(times) * 1e3:7.1f} ms wall, "
                  f"{busy * 1e3:7.1f} ms GPU busy", flush=True)
    layer_diffs = _layer_diffs(marked, run)
    summary = {k: {"median_s": statistics.median(x["median_s"] for x in v),
                   "gpu_busy_s": statistics.median(x["gpu_busy_s"] for x in v)} for k, v in rows.items()}
    result = {"probe": "cat_gelu", "model": args.model, "environment": device_info(dev),
              "versions": versions(), "fused_layers": len(marked), "rounds": rows, "summary": summary,
              "on_vs_off": compare(outs["on"], outs["off"]),
              "layers_on_vs_off": layer_diffs,
              "wall_ratio_off_over_on": summary["off"]["median_s"] / summary["on"]["median_s"],
              "busy_ratio_off_over_on": summary["off"]["gpu_busy_s"] / summary["on"]["gpu_busy_s"]}
    atomic_write_json(args.out, result)
    print({k: v for k, v in result.items() if k not in ("rounds", "environment", "versions")}, flush=True)


if __name__ == "__main__":
    main()
