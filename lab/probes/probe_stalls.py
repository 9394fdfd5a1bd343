"""Why does the Hopper kernel's loop run at ~1340 clocks per 64x128 tile per SM? CUPTI PC sampling through
Triton's profiler (proton, `backend="cupti", mode="pcsampling"`): the warp stall reasons of the attention kernel
alone (and of the K/V quantization launch), in total and per source line. No Nsight needed.

    python lab/probes/probe_stalls.py [--shape 4 32 8192 128] [--out stalls.json]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import sagegen  # noqa: E402
from probe_util import environment, write_json  # noqa: E402
from sagegen.kernels import gluon_attn, triton_quant  # noqa: E402


def walk(node, path=()):
    name = node.get("frame", {}).get("name", "?")
    yield path + (name,), node.get("metrics", {})
    for child in node.get("children", []):
        yield from walk(child, path + (name,))


def summarize(tree) -> dict:
    """Per kernel (the frame below the root whose subtree holds the samples): stall reasons summed over its
    lines, and its 25 lines with the most samples."""
    kernels = {}
    for path, metrics in walk(tree):
        stalls = {k: v for k, v in metrics.items() if k.startswith("stalled_") or "samples" in k}
        if not stalls or len(path) < 3:
            continue
        kern = next((p for p in path if "attn" in p or "quant" in p or "kernel" in p), path[1])
        entry = kernels.setdefault(kern, {"total": collections.Counter(), "lines": []})
        entry["total"].update(stalls)
        entry["lines"].append({"line": " / ".join(path[2:])[-160:], **stalls})
    out = {}
    for kern, entry in kernels.items():
        lines = sorted(entry["lines"], key=lambda r: -max((v for k, v in r.items() if "samples" in k), default=0))
        out[kern[-120:]] = {"total": dict(entry["total"]), "top_lines": lines[:25]}
    return out


def main():
    import triton.profiler as proton

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", type=int, nargs=4, default=[4, 32, 8192, 128])
    ap.add_argument("--interval", type=int, default=1000)
    ap.add_argument("--out")
    args = ap.parse_args()
    b, h, n, d = args.shape
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = sagegen.SageConfig()
    out = torch.empty_like(q)
    attn = lambda: gluon_attn.launch(qq, out, None, None, H=h, group=1, n_q=n, n_k=n, d=d, block_m=64, block_n=128,
                                     smooth_v=False, sm_scale_log2=d**-0.5 * 1.4426950408889634, q=q)
    quant = lambda: triton_quant.quantize(q, k, v, cfg, 64, 128, d, permute_v_keys=True, quantize_q=False)
    base = os.path.join(tempfile.mkdtemp(), "stalls")
    # started before the first launch: proton maps samples to source lines only for modules loaded while on
    proton.start(base, backend="cupti", mode=f"pcsampling:interval={args.interval}")
    qq = triton_quant.quantize(q, k, v, cfg, 64, 128, d, permute_v_keys=True, quantize_q=False)
    for _ in range(3):
        attn()
        quant()
    torch.cuda.synchronize()
    proton.finalize()
    files = glob.glob(base + "*")
    print("proton wrote", files)
    data = json.load(open(files[0]))
    tree = data[0] if isinstance(data, list) else data
    summary = summarize(tree)
    for kern, s in summary.items():
        tot = s["total"]
        samples = max((v for k_, v in tot.items() if "samples" in k_), default=0) or 1
        print(f"== {kern}: {json.dumps({k_: v for k_, v in tot.items() if 'samples' in k_})}")
        for k_, v in sorted(tot.items(), key=lambda kv: -kv[1]):
            if k_.startswith("stalled_") and v:
                print(f"   {k_:32s} {v:10.0f}  {100 * v / samples:5.1f}%")
        for r in s["top_lines"][:12]:
            top = sorted(((k_, v) for k_, v in r.items() if k_.startswith("stalled_") and v), key=lambda kv: -kv[1])[:3]
            print(f"   {r['line'][-90:]:90s} {top}")
    write_json(args.out, environment=environment(shape=args.shape, interval=args.interval), kernels=summary)
    if args.out:
        with open(os.path.splitext(args.out)[0] + "-raw.json", "w") as f:
            json.dump(data, f)


if __name__ == "__main__":
    main()
