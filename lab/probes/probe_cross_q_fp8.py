"""Wan's cross-attention Q projection fed by its norm in FP8 (`residual_norm(fp8_out=True)` + `forward_fp8`)
against what runs without it, at the presets' shapes (Wan2.1-1.3B 480p, Wan2.2-TI2V-5B 720p, Wan2.1-14B 720p);
and LTX-Video's (704x512x161, CFG 2), whose Q reads a residual sum that the add writes with its FP8 copy.

Per shape, every variant once a round (triton.testing.do_bench, median), --rounds rounds:
  norm_eager   diffusers' eager ops for ``x + y·gate`` and norm2 (what stock runs)
  norm_plain   sagegen's `residual_norm` kernel, bf16 rows;   norm_fp8   the same writing the per-token FP8 copy
               (LTX-Video's rows: the residual add alone, whose sum Q reads; fp8: the sum and its copy)
  quant        the per-token quantizer on the bf16 rows (what the Q projection ran before)
  gemm_bf16    F.linear (cuBLAS);   gemm_fp8   `FP8Linear.forward_fp8` (the `_scaled_mm` alone)
  proj_fp8     `FP8Linear` on the bf16 rows (quantizer + GEMM)
Composites (sums of medians) and the ratios the issue reads: the Q projection with its quantization counted
(bf16 GEMM over FP8 GEMM + quantizer, before; over FP8 GEMM + what norm_fp8 adds to norm_plain, now) and the
norm + projection pair. Identity: the FP8 rows against the quantizer of the bf16 rows (codes that differ) and the
two projections' outputs. JSON to --out.

    python lab/probes/probe_cross_q_fp8.py --rounds 5 --out bench/results/probe-cross-q-fp8-h200-$(date +%F).json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

from probe_util import environment, write_json  # noqa: E402

from sagegen.kernels import triton_residual_norm as _norm_module  # noqa: E402
from sagegen.kernels.fp8_quant import quantize_per_token_unchecked  # noqa: E402
from sagegen.kernels.triton_residual_norm import residual_norm, residual_norm_reference  # noqa: E402
from sagegen.linear import FP8Linear  # noqa: E402

# (model, tokens, channels, the pass producing the Q projection's input: Wan's norm2, LTX-Video's residual add)
SHAPES = [("wan2.1-t2v-1.3b", 32760, 1536, "norm"), ("wan2.2-ti2v-5b", 27280, 3072, "norm"),
          ("wan2.1-t2v-14b", 75600, 5120, "norm"), ("ltx-video", 14784, 2048, "add")]


def _rel_l1(a, b) -> float:
    return float((a.float() - b.float()).abs().sum() / b.float().abs().sum().clamp_min(1e-30))


def run_shape(model, M, C, producer, rounds, bench) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    rnd = lambda *s, scale=1.0: torch.randn(*s, generator=g, device="cuda") * scale
    x = rnd(1, M, C, scale=2.0).to(torch.bfloat16)
    y = rnd(1, M, C).to(torch.bfloat16)
    gate = rnd(1, 1, C, scale=0.3)
    w_n, b_n = (rnd(C, scale=0.1) + 1).to(torch.bfloat16), rnd(C, scale=0.1).to(torch.bfloat16)
    lin = torch.nn.Linear(C, C, device="cuda", dtype=torch.bfloat16)
    fp8 = FP8Linear(lin)
    kw = dict(weight=w_n, bias=b_n, eps=1e-6) if producer == "norm" else dict(norm=False)
    h, n = residual_norm(x, y, gate, **kw)
    n = n if producer == "norm" else h  # (LTX: Q reads the residual sum)
    _, (n8, ns) = residual_norm(x, y, gate, fp8_out=True, **kw)
    q, s = quantize_per_token_unchecked(n.view(M, C))
    differ = int((n8.view(M, C).view(torch.uint8) != q.view(torch.uint8)).sum())
    out_new = fp8.forward_fp8(n8, ns, torch.bfloat16)
    out_old = fp8(n)
    out_bf16 = F.linear(n, lin.weight, lin.bias)
    variants = {
        "norm_eager": lambda: residual_norm_reference(x, y, gate, **kw),
        "norm_plain": lambda: residual_norm(x, y, gate, **kw),
        "norm_fp8": lambda: residual_norm(x, y, gate, fp8_out=True, **kw),
        "quant": lambda: quantize_per_token_unchecked(n.view(M, C)),
        "gemm_bf16": lambda: F.linear(n, lin.weight, lin.bias),
        "gemm_fp8": lambda: fp8.forward_fp8(n8, ns, torch.bfloat16),
        "proj_fp8": lambda: fp8(n),
    }
    times = {k: [] for k in variants}
    for _ in range(rounds):
        for k, fn in variants.items():
            times[k].append(bench(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    before = med["gemm_fp8"] + med["quant"]
    added = med["norm_fp8"] - med["norm_plain"]
    row = dict(model=model, M=M, C=C, producer=producer, ms=med, ms_rounds=times,
               codes_differing=differ, codes=M * C, scales_equal=bool(torch.equal(ns, s)),
               rel_l1_new_vs_before=_rel_l1(out_new, out_old),
               max_abs_new_vs_before=float((out_new.float() - out_old.float()).abs().max()),
               rel_l1_new_vs_bf16=_rel_l1(out_new, out_bf16), rel_l1_before_vs_bf16=_rel_l1(out_old, out_bf16),
               quant_counted_before=med["gemm_bf16"] / before,
               quant_counted_now=med["gemm_bf16"] / (med["gemm_fp8"] + max(added, 0.0)),
               norm_added_ms=added,
               pair_vs_sagegen_bf16=(med["norm_plain"] + med["gemm_bf16"]) / (med["norm_fp8"] + med["gemm_fp8"]),
               pair_vs_stock=(med["norm_eager"] + med["gemm_bf16"]) / (med["norm_fp8"] + med["gemm_fp8"]),
               pair_before_vs_sagegen_bf16=(med["norm_plain"] + med["gemm_bf16"]) / (med["norm_plain"] + before),
               pair_now_vs_before=(med["norm_plain"] + before) / (med["norm_fp8"] + med["gemm_fp8"]))
    return row


def sweep_shape(model, M, C, rounds, bench) -> dict:
    """The norm kernel alone, bf16 and FP8 rows, at every (rows a program, warps) that keeps 4-128 elements a
    thread: time, and whether the output equals the default launch's (bf16) or the quantizer of its rows (FP8)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(1, M, C, generator=g, device="cuda") * 2).to(torch.bfloat16)
    y = torch.randn(1, M, C, generator=g, device="cuda").to(torch.bfloat16)
    gate = torch.randn(1, 1, C, generator=g, device="cuda") * 0.3
    kw = dict(weight=(torch.randn(C, generator=g, device="cuda") * 0.1 + 1).to(torch.bfloat16),
              bias=(torch.randn(C, generator=g, device="cuda") * 0.1).to(torch.bfloat16), eps=1e-6)
    default = _norm_module.launch
    _, n_ref = residual_norm(x, y, gate, **kw)
    q_ref, _ = quantize_per_token_unchecked(n_ref.view(M, C))
    block = triton.next_power_of_2(C)
    configs = [(r, w) for r in (1, 2, 4) for w in (1, 2, 4, 8, 16) if 4 <= r * block // (32 * w) <= 128]
    out = []
    try:
        for fp8 in (False, True):
            for rows, warps in configs:
                _norm_module.launch = lambda C, f, rows=rows, warps=warps: dict(ROWS=rows, num_warps=warps)
                fn = lambda: residual_norm(x, y, gate, fp8_out=fp8, **kw)
                _, n = fn()
                same = (int((n[0].view(M, C).view(torch.uint8) != q_ref.view(torch.uint8)).sum()) if fp8
                        else int((n != n_ref).sum()))
                ms = statistics.median(bench(fn) for _ in range(rounds))
                out.append(dict(fp8=fp8, rows=rows, warps=warps, ms=ms, differing=same))
                print(f"  {model} C={C} {'fp8 ' if fp8 else 'bf16'} rows {rows} warps {warps:2d}: {ms:.4f} ms, "
                      f"{same} differing", flush=True)
    finally:
        _norm_module.launch = default
    return dict(model=model, M=M, C=C, configs=out)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out")
    p.add_argument("--sweep", action="store_true", help="the norm kernel's launches first (see sweep_shape)")
    p.add_argument("--graphs", action="store_true",
                   help="time each variant replayed as a CUDA graph (do_bench_cudagraph): no host time, which "
                        "sets the time of the ~50-100 us launches on a slow host")
    args = p.parse_args(argv)

    bench = ((lambda fn: triton.testing.do_bench_cudagraph(fn, rep=50)) if args.graphs
             else (lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50)))
    rows, sweeps = [], []
    with torch.inference_mode():
        for model, M, C, producer in SHAPES if args.sweep else ():
            if producer == "norm":
                sweeps.append(sweep_shape(model, M, C, args.rounds, bench))
        for model, M, C, producer in SHAPES:
            row = run_shape(model, M, C, producer, args.rounds, bench)
            rows.append(row)
            m = row["ms"]
            print(f"{model:16s} M={M} C={C}: norm eager {m['norm_eager']:.3f} plain {m['norm_plain']:.3f} "
                  f"fp8 {m['norm_fp8']:.3f} | quant {m['quant']:.3f} | gemm bf16 {m['gemm_bf16']:.3f} "
                  f"fp8 {m['gemm_fp8']:.3f} proj_fp8 {m['proj_fp8']:.3f} ms | Q proj with quantization: before "
                  f"{row['quant_counted_before']:.2f}x now {row['quant_counted_now']:.2f}x | norm+Q vs bf16 "
                  f"{row['pair_vs_sagegen_bf16']:.2f}x (before {row['pair_before_vs_sagegen_bf16']:.2f}x), "
                  f"vs stock {row['pair_vs_stock']:.2f}x | codes differing {row['codes_differing']}, "
                  f"rel-L1 new/before {row['rel_l1_new_vs_before']:.2e}", flush=True)
    result = dict(environment=environment(), rounds=args.rounds, graphs=args.graphs, rows=rows, sweeps=sweeps)
    write_json(args.out, **result)
    return result


if __name__ == "__main__":
    main()
