"""What diffusers' dispatcher adds on top of sageattn: one attention call at real model shapes, timed as
PyTorch SDPA through diffusers' "native" backend, sageattn called directly ([B, S, H, D]), and sageattn
through ``dispatch_attention_fn(backend="sagegen")`` (the path `set_attention_backend("sagegen")` and the patch's
backend route take). Writes JSON with device, versions and date to --out.

    python bench/bench_backend.py --out bench/results/backend-h100.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # this checkout's sagegen

SHAPES = {  # name: (batch, tokens, heads, head dim, text tokens of the cross-attention)
    "wan2.1-1.3b-480p": (1, 32760, 12, 128, 512),
    "wan2.1-14b-720p": (1, 75600, 40, 128, 512),
    "ltx-video-768x512x121": (1, 6144, 32, 64, 128),
    "qwen-image-1328": (1, 6889 + 256, 24, 128, 0),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON results path")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_backend: no CUDA GPU visible", file=sys.stderr)
        return 2
    import diffusers
    import triton
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from triton.testing import do_bench

    import sagegen

    sagegen.set_backend_config(backend="triton")
    results = {}
    for name in args.shapes:
        row = _time_shape(*SHAPES[name], dispatch_attention_fn, do_bench, sagegen)
        results[name] = row
        print(name, json.dumps(row), flush=True)
        torch.cuda.empty_cache()  # the inputs died with _time_shape's frame
    payload = {"environment": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "triton": triton.__version__, "diffusers": diffusers.__version__,
                               "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
               "results": results}
    from sagegen.runs.files import atomic_write_text  # a unique temporary name beside it, removed on failure

    atomic_write_text(args.out, json.dumps(payload, indent=1))
    return 0


def _time_shape(b, n, h, d, text, dispatch_attention_fn, do_bench, sagegen) -> dict:
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    row = {"shape": [b, n, h, d]}
    with torch.no_grad():
        row["native_sdpa_ms"] = do_bench(lambda: dispatch_attention_fn(q, k, v, backend="native"))
        row["sageattn_direct_ms"] = do_bench(lambda: sagegen.sageattn(
            q, k, v, tensor_layout="NHD", config=sagegen.DIFFUSION_CONFIG, backend="triton"))
        row["sagegen_backend_ms"] = do_bench(lambda: dispatch_attention_fn(q, k, v, backend="sagegen"))
        if text:
            kt, vt = (torch.randn(b, text, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            row["cross_native_sdpa_ms"] = do_bench(lambda: dispatch_attention_fn(q, kt, vt, backend="native"))
            row["cross_sagegen_backend_ms"] = do_bench(lambda: dispatch_attention_fn(q, kt, vt, backend="sagegen"))
    row["speedup_vs_native"] = row["native_sdpa_ms"] / row["sagegen_backend_ms"]
    row["dispatch_overhead_ms"] = row["sagegen_backend_ms"] - row["sageattn_direct_ms"]
    return row


if __name__ == "__main__":
    sys.exit(main())
