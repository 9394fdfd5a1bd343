"""`make demo`: the main job on the embedded default, on any machine (CPU included).

1. The kernel's numerics against float64 on a small problem (the emulation on CPU, Triton on a GPU).
2. `sagegen compare` on the tiny random-weight CogVideoX with the smoke prompts, then `sagegen eval` and
   `sagegen report` on that run; prints where the report is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch


def kernel_accuracy() -> None:
    import sagegen
    from sagegen.kernels.reference import attention_fp64

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    print(f"sagegen.sageattn on {device} (backend='auto'), N(0,1) inputs, B=1, H=4, N=1024, bf16:")
    for d in (64, 128):
        q, k, v = (torch.randn(1, 4, 1024, d, device=device).bfloat16() for _ in range(3))
        out = sagegen.sageattn(q, k, v, backend="reference" if device == "cpu" else "triton")
        ref, _ = attention_fp64(q, k, v, sm_scale=d**-0.5)
        o, r = out.double().flatten(), ref.flatten()
        cos = torch.nn.functional.cosine_similarity(o, r, dim=0).item()
        rel = ((o - r).abs().sum() / r.abs().sum()).item()
        print(f"  head dim {d:3d}: cosine {cos:.6f}, relative L1 {rel:.4f}  (bar: >= 0.9992, <= 0.039)")


def sagegen_cli(*args: str) -> None:
    cmd = [sys.executable, "-m", "sagegen", *args]
    print("\n$ sagegen " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def main() -> None:
    kernel_accuracy()
    run_dir = os.path.join(os.environ.get("SAGEGEN_RUNS", "runs"), "demo-tiny-cogvideox")
    start = time.time()
    sagegen_cli("compare", "tiny-cogvideox", "--prompts", "smoke", "--out", run_dir)
    sagegen_cli("eval", run_dir, "--metric", "all")
    sagegen_cli("report", run_dir)
    print(f"\nDemo done in {time.time() - start:.0f} s. "
          f"Report: {os.path.abspath(os.path.join(run_dir, 'report', 'report.html'))}")


if __name__ == "__main__":
    main()
