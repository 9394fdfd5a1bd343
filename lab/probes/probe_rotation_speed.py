"""Issue 58 item 3: what `SageConfig(qk_rotation="hadamard")` costs on the GPU. Full `sageattn` calls (bf16 in,
quantization included) with and without the rotation, and the quantization pass alone, at head dim 128 8k/32k
and the CogVideoX-5b shape; accuracy against fp64 on outlier channels beside it.

    python lab/probes/probe_rotation_speed.py --out $OUT/rotation-speed.json
"""

import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import sagegen  # noqa: E402
from sagegen.config import DIFFUSION_CONFIG  # noqa: E402
from sagegen.kernels.triton_quant import quantize  # noqa: E402


def timed(fn, warmup=3, iters=10) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(iters):
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return sorted(ms)[len(ms) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import triton
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rec = {"probe": "rotation_speed", "date": now,
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    for B, H, N, D in ((2, 32, 8192, 128), (1, 16, 32768, 128), (2, 48, 17776, 64)):
        t = [torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        flop = 4 * B * H * N * N * D
        row = {"B": B, "H": H, "N": N, "D": D}
        for rot in ("none", "hadamard"):
            cfg = DIFFUSION_CONFIG.replace(qk_rotation=rot)
            ms = timed(lambda cfg=cfg: sagegen.sageattn(*t, config=cfg, backend="triton"))
            qms = timed(lambda cfg=cfg: quantize(*t, cfg, 64, 128, D))
            row[rot] = {"call_ms": round(ms, 4), "tflops": round(flop / ms / 1e9, 1), "quant_pass_ms": round(qms, 4)}
        row["call_ratio"] = round(row["hadamard"]["call_ms"] / row["none"]["call_ms"], 4)
        rec["rows"].append(row)
        print(row, flush=True)
        t.clear()
        torch.cuda.empty_cache()
    with open(args.out + ".tmp", "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
