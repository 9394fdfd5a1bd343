"""Probe: which switch makes an FP8 model's CUDA-graph replays differ from its eager calls
(`tests/patch/test_gpu_graphs.py::test_replays_answer_each_call_like_eager[*-fp8]` failed on Triton 3.9, session 29).

For the smoke Flux and Wan models: eager outputs of four inputs, then the same under `cuda_graphs=True`, with the
stacked Q/K/V GEMM and the FP8 attention output each on and off; also eager after a second patch (is a re-patch
deterministic?). Prints rel-L1 per call against eager and whether the bits match.

    python lab/probes/probe_graphs_fp8.py --out $OUT/graphs-fp8.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import sagegen  # noqa: E402
from probe_util import environment  # noqa: E402
from sagegen.linear import LinearPolicy, stacked  # noqa: E402
from sagegen.models import arch as archs  # noqa: E402
from sagegen.patch import patch_info  # noqa: E402
from sagegen.patch import fp8_handoff as fp8_out


def rel_l1(a, b):
    return ((a.float() - b.float()).abs().sum() / b.float().abs().sum().clamp_min(1e-30)).item()


def build(name):
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cuda", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    dims = dict(height=256, width=256)
    if archs.get_arch(name).frames:
        dims["frames"] = 9
    inputs = [archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cuda", seed=s, **dims)
              for s in (1, 2, 3, 4)]
    return model, inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    policy = LinearPolicy(keep_blocks=(), min_rows=1)
    rows = []
    for name in ("flux.1-dev", "wan2.1-t2v-1.3b"):
        model, inputs = build(name)
        for stack_on, out_on in itertools.product((True, False), (True, False)):
            stacked.ENABLED, fp8_out.ENABLED = stack_on, out_on
            with torch.inference_mode():
                sagegen.patch(model, linear="fp8", linear_policy=policy)
                eager = [model(**x)[0].clone() for x in inputs]
                sagegen.patch(model, linear="fp8", linear_policy=policy)
                again = [model(**x)[0].clone() for x in inputs]
                sagegen.patch(model, linear="fp8", linear_policy=policy, cuda_graphs=True)
                got = [model(**x)[0].clone() for x in inputs]
                calls = patch_info(model)["cuda_graphs"]["calls"]
                sagegen.unpatch(model)
            row = {"model": name, "stacked": stack_on, "fp8_out": out_on, "graph_calls": calls,
                   "repatch_equal": [torch.equal(a, b) for a, b in zip(again, eager)],
                   "graph_equal": [torch.equal(a, b) for a, b in zip(got, eager)],
                   "graph_rel_l1": [rel_l1(a, b) for a, b in zip(got, eager)]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    stacked.ENABLED, fp8_out.ENABLED = True, True
    with open(args.out, "w") as f:
        json.dump({"environment": environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
