"""Issue 58 design probe: how fast does NVIDIA's own CuTe-DSL Hopper FMHA (nvidia-cutlass-dsl 4.8.1's example,
run from FMHA_EXAMPLE, not copied here) run at head dim 128, in bf16 and in FP8 e4m3, next to sagegen's kernel and
cuDNN's SDPA in the same process? Its FP8 rate bounds what an SA2-numerics kernel of that design reaches (SA2 adds
the INT8 Q·Kᵀ dequantization and the two-level P·V accumulation on top).

    source /tmp/cutedsl/env.sh && python lab/probes/cute_design_probe.py --out $OUT/x.json
"""

import argparse
import datetime
import importlib.util
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))


def timed(fn, warmup=5, iters=20) -> float:
    """Median ms of iters calls after warmup (CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="1,32,32768;2,32,8192;1,32,16384")
    p.add_argument("--skip-cute", action="store_true")
    args = p.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")]
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rec = {"probe": "cute_design_probe", "date": now,
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    try:
        import triton
        rec["triton"] = triton.__version__
    except ImportError:
        pass

    def save():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rec, f, indent=1)
        os.replace(tmp, args.out)

    import sagegen
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for B, H, N in shapes:
        D = 128
        flop = 4 * B * H * N * N * D
        qkv = [torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        for name, fn in (("sagegen", lambda t: sagegen.sageattn(*t)),
                         ("sdpa_cudnn", lambda t: _sdpa(*t, SDPBackend.CUDNN_ATTENTION, sdpa_kernel)),
                         ("sdpa_flash", lambda t: _sdpa(*t, SDPBackend.FLASH_ATTENTION, sdpa_kernel))):
            try:
                ms = timed(lambda fn=fn, t=qkv: fn(t))
                rec["rows"].append({"kernel": name, "B": B, "H": H, "N": N, "D": D, "ms": round(ms, 4),
                                    "tflops": round(flop / ms / 1e9, 1)})
            except Exception as e:  # noqa: BLE001 - a probe records what failed
                rec["rows"].append({"kernel": name, "B": B, "H": H, "N": N, "error": f"{type(e).__name__}: {e}"[:300]})
            print(rec["rows"][-1], flush=True)
        qkv.clear()
        torch.cuda.empty_cache()
        save()
    if args.skip_cute:
        return
    path = os.environ["FMHA_EXAMPLE"]
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location("upstream_fmha", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import cutlass
    rec["cutlass_dsl"] = getattr(cutlass, "__version__", "4.8.1")
    dts = {"bf16": cutlass.BFloat16, "fp8": cutlass.Float8E4M3FN}
    configs = [("bf16", "bf16", (128, 128), False), ("fp8", "bf16", (128, 128), False),
               ("fp8", "fp8", (128, 128), False), ("fp8", "bf16", (128, 128), True),
               ("fp8", "bf16", (64, 128), False), ("fp8", "bf16", (128, 256), False)]
    # correctness first, at a small shape with upstream's own reference check
    for din, dout, tile, persistent in configs[:2]:
        row = {"kernel": f"cute_fmha_{din}_in_{dout}_out", "tile": tile, "persistent": persistent,
               "check": "1,1024,4,128"}
        try:
            mod.run((1, 1024, 4, 128), (1, 1024, 4, 128), dts[din], dts[dout], cutlass.Float32, cutlass.Float32, tile,
                    persistent, False, False, 1.0, 1.0, 1.0, 1.0, 0.0, (-1, -1), 0.1 if din == "fp8" else 0.02, 0, 1,
                    False)
            row["check_passed"] = True
        except Exception as e:  # noqa: BLE001
            row["check_error"] = f"{type(e).__name__}: {e}"[:400]
        rec["rows"].append(row)
        print(row, flush=True)
        save()
    for B, H, N in shapes:
        flop = 4 * B * H * N * N * 128
        for din, dout, tile, persistent in configs:
            row = {"kernel": f"cute_fmha_{din}_in_{dout}_out", "tile": tile, "persistent": persistent,
                   "B": B, "H": H, "N": N, "D": 128}
            t = time.perf_counter()
            try:
                us = mod.run((B, N, H, 128), (B, N, H, 128), dts[din], dts[dout], cutlass.Float32, cutlass.Float32,
                             tile, persistent, False, False, 1.0, 1.0, 1.0, 1.0, 0.0, (-1, -1), 0.1, 5, 20, True)
                row["ms"] = round(us / 1e3, 4)
                row["tflops"] = round(flop / (us / 1e3) / 1e9, 1)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            row["wall_s"] = round(time.perf_counter() - t, 1)
            rec["rows"].append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
            save()


def _sdpa(q, k, v, backend, sdpa_kernel):
    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


if __name__ == "__main__":
    main()
