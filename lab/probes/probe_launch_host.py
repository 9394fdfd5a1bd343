"""Probe: host time per launch of sagegen's eager kernels, to compare Triton versions on one machine.

An eager FP8 Flux step ran 107 ms on Triton 3.6 and ~175 ms on Triton 3.9 on the same H200 host (GPU busy ~87 ms
either way; lab/NOTES.md v7.6). This times back-to-back launches where the GPU work is tiny (the host is all
that is measured), for a trivial Triton kernel, the FP8 per-token quantizer, the residual-norm pass, a short
attention call and a bf16 ``F.linear`` for scale, then profiles the quantizer's and the attention call's
launches (cProfile, top functions by own time).

    python lab/probes/probe_launch_host.py --out $OUT/launch-host-t39.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from probe_util import per_call_us  # noqa: E402
from sagegen.api import sageattn  # noqa: E402
from sagegen.kernels.fp8_quant import quantize_per_token_unchecked  # noqa: E402
from sagegen.kernels.triton_residual_norm import residual_norm  # noqa: E402


@triton.jit
def _add_one(X, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(X + offs, tl.load(X + offs) + 1)


def host_us(fn, calls=40, repeats=5):
    """Host microseconds per call: the time to enqueue ``calls`` calls, GPU idle at the start and the launch queue
    far from full, so the GPU's own time does not enter (best of ``repeats``)."""
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t)
    torch.cuda.synchronize()
    return best / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    tiny = torch.zeros(16, device=dev)
    x = torch.randn(64, 3072, device=dev, dtype=torch.bfloat16)
    y = torch.randn_like(x)
    w = torch.randn(3072, 3072, device=dev, dtype=torch.bfloat16)
    q = torch.randn(1, 512, 24, 128, device=dev, dtype=torch.bfloat16)  # host-bound: ~20 us of GPU work
    q4k = torch.randn(1, 4608, 24, 128, device=dev, dtype=torch.bfloat16)  # Flux's length: the Gluon kernel runs
    calls = {
        "triton_trivial": lambda: _add_one[(1,)](tiny, N=16),
        "fp8_quant_per_token": lambda: quantize_per_token_unchecked(x),
        "residual_norm": lambda: residual_norm(x.view(1, 64, 3072), y.view(1, 64, 3072), norm=True, eps=1e-6),
        "torch_linear_bf16": lambda: torch.nn.functional.linear(x, w),
        "torch_empty": lambda: torch.empty(64, 3072, device=dev, dtype=torch.float8_e4m3fn),
        "sageattn_512_hd128": lambda: sageattn(q, q, q, tensor_layout="NHD"),
        "sageattn_4608_hd128": lambda: sageattn(q4k, q4k, q4k, tensor_layout="NHD"),
    }
    us = {name: per_call_us(fn, iters=2000) for name, fn in calls.items() if "4608" not in name}
    host = {name: host_us(fn) for name, fn in calls.items()}
    for name in calls:
        print(f"{name:22s} {us.get(name, float('nan')):8.1f} us/call   host only {host[name]:8.1f} us", flush=True)
    profiles = {}
    for name in ("fp8_quant_per_token", "sageattn_4608_hd128"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            calls[name]()
        torch.cuda.synchronize()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
        profiles[name] = text.getvalue()
        print(name, profiles[name][-4000:], flush=True)
    result = {"triton": triton.__version__, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
              "us_per_call": us, "host_us_per_call": host, "profiles_300_calls": profiles}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
