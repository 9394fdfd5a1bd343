"""The FP8 per-token quantizer before and after a change, in the same process (A/B, rounds interleaved).

The "before" module is a copy of `sagegen/kernels/fp8_quant.py` at an earlier commit, given by path (e.g.
`git show <commit>:sagegen/kernels/fp8_quant.py > .old/fp8_quant_before.py`). Times plain and GELU-prologue
quantization at the models' activation shapes and checks that the plain outputs agree bit for bit.

    python lab/probes/probe_fp8_quant_ab.py --before .old/fp8_quant_before.py --out $OUT/probe-quant-ab.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from sagegen.kernels import fp8_quant  # noqa: E402

# (label, M, K): the inputs of the models' linears at full size (bench_fp8_linear.SHAPES)
SHAPES = [("flux ff down", 4096, 12288), ("sd3.5 ff down", 8192, 9728), ("cogvideox qkv", 35552, 3072),
          ("cogvideox ff down", 35552, 12288), ("hunyuanvideo ff down", 119312, 12288),
          ("wan14b qkvo", 75600, 5120), ("wan14b ffn down", 75600, 13824), ("flux single proj_out", 4608, 15360)]


def load_before(path: str):
    spec = importlib.util.spec_from_file_location("sagegen.kernels.fp8_quant_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main():
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    before = load_before(args.before)
    bench = lambda f: triton.testing.do_bench(f, warmup=10, rep=40, return_mode="median")  # noqa: E731
    rows = []
    for label, M, K in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) * 2
        variants = {f"{tag}_{'gelu' if g else 'plain'}": (lambda mod=mod, g=g, x=x: mod.quantize_fp8_rows(
            x, "per_token", prologue="gelu_tanh" if g else None)) for tag, mod in (("before", before),
                                                                                 ("after", fp8_quant))
            for g in (False, True)}
        times = {k: [] for k in variants}
        for _ in range(args.rounds):
            for k, fn in variants.items():
                times[k].append(bench(fn))
        ms = {k: statistics.median(v) for k, v in times.items()}
        qa, sa = fp8_quant.quantize_fp8_rows(x, "per_token")
        qb, sb = before.quantize_fp8_rows(x, "per_token")
        ga, gsa = fp8_quant.quantize_fp8_rows(x, "per_token", prologue="gelu_tanh")
        gb, gsb = before.quantize_fp8_rows(x, "per_token", prologue="gelu_tanh")
        row = {"label": label, "M": M, "K": K, "ms": ms, "ms_rounds": times,
               "gbps_after_plain": M * K * 3 / ms["after_plain"] / 1e6,
               "gbps_after_gelu": M * K * 3 / ms["after_gelu"] / 1e6,
               "plain_bit_equal": bool(torch.equal(qa.view(torch.uint8), qb.view(torch.uint8))
                                       and torch.equal(sa, sb)),
               "gelu_codes_differ": (ga.view(torch.uint8) != gb.view(torch.uint8)).float().mean().item(),
               "gelu_scales_differ": (gsa != gsb).float().mean().item(),
               "launch_after": fp8_quant.per_token_launch(K)}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "ms_rounds"}), flush=True)
        del x
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    with open(args.out, "w") as f:
        json.dump({"probe": "fp8_quant_ab", "device": props.name, "torch": torch.__version__,
                   "triton": __import__("triton").__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
