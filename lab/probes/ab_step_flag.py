"""A/B one module-level switch of sagegen's kernels inside whole denoising steps: a full-size model with random
weights (the preset's size), one stock step, then patched steps with the switch on and off in alternation
(A, B, A, B, ...), all in one process. JSON to --out.

    python lab/probes/ab_step_flag.py wan2.1-t2v-14b gluon_attn_ring.ENABLED --out $OUT/ab-step.json
    python lab/probes/ab_step_flag.py sd3.5-large fp8_quant.GELU_CHUNKS --linear fp8 --out $OUT/ab-step.json
    python lab/probes/ab_step_flag.py flux.1-dev sagegen.patch.fused_blocks.NORM_FP8 --linear fp8 --out ...

Also reports whether the A and B steps' outputs are bit-identical (and their rel. L1 if not), and each one's
rel. L1 against the stock step.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import sagegen  # noqa: E402
from probe_util import environment, event_ms, full_size_model, write_json  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("flag", help="module.NAME under sagegen.kernels (or sagegen.any.module.NAME), set to True (A) "
                                 "and False (B)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--linear", default=None, choices=[None, "fp8"], help="patch with linear=... as well")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="patch with cuda_graphs=True: each round patches, captures and times A, then B, anew (a "
                         "captured graph keeps the switch it was captured with)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    module_name, _, name = args.flag.rpartition(".")
    module = importlib.import_module(module_name if module_name.startswith("sagegen.")
                                     else f"sagegen.kernels.{module_name}")
    original = getattr(module, name)
    model, inputs = full_size_model(args.model, torch.device("cuda"))
    step = lambda: model(**inputs)[0]  # noqa: E731
    ms = {"stock": [], "A": [], "B": []}
    outputs = {}
    with torch.inference_mode():
        stock = step().clone()
        ms["stock"].append(event_ms(step))
        if not args.cuda_graphs:
            sagegen.patch(model, linear=args.linear)
        for label, value in (("A", True), ("B", False)):
            setattr(module, name, value)
            if args.cuda_graphs:
                sagegen.patch(model, linear=args.linear, cuda_graphs=True)
            outputs[label] = step().clone()  # warm-up (compiles; captures)
            if args.cuda_graphs:
                sagegen.unpatch(model)
        for _ in range(args.rounds):
            for label, value in (("A", True), ("B", False)):
                setattr(module, name, value)
                if args.cuda_graphs:
                    sagegen.patch(model, linear=args.linear, cuda_graphs=True)
                    step(), step()  # capture, then one replay
                ms[label].append(event_ms(step))
                if args.cuda_graphs:
                    sagegen.unpatch(model)
                print(label, f"{ms[label][-1]:.1f} ms", flush=True)
    setattr(module, name, original)
    med = {k: statistics.median(v) for k, v in ms.items()}
    a, b = outputs["A"].float(), outputs["B"].float()
    result = {"model": args.model, "flag": args.flag, "linear": args.linear, "cuda_graphs": args.cuda_graphs,
              "ms": ms, "median_ms": med,
              "outputs_identical": bool(torch.equal(a, b)),
              "rel_l1_A_vs_B": ((a - b).abs().sum() / b.abs().sum()).item(),
              # (the scale of A vs B: each against the stock step of the same inputs)
              **{f"rel_l1_{k}_vs_stock": ((t - stock.float()).abs().sum() / stock.float().abs().sum()).item()
                 for k, t in (("A", a), ("B", b))},
              "speedup_A": med["stock"] / med["A"], "speedup_B": med["stock"] / med["B"],
              "A_over_B": med["B"] / med["A"]}
    print({k: v for k, v in result.items() if k != "ms"}, flush=True)
    write_json(args.out, environment=environment(), **result)


if __name__ == "__main__":
    main()
