"""An attention call and its output projection, as a model patched with ``linear="fp8"`` runs them (issue 21's
output projections at 4-9k tokens).

Per model shape (random bf16 inputs, a random nn.Linear(C, C) with bias), each variant is captured in a CUDA
graph and its replay timed (`triton.testing.do_bench`, median; no host time), every variant once a round:
  stock         PyTorch SDPA (default backends) + bf16 F.linear of the projected rows
  bf16_out      sagegen's attention as the patch runs it before this change (``auto``: SDPA below its
                crossover) + FP8Linear (per-token quantization pass + cuBLASLt row-wise GEMM)
  fp8_out       sagegen's kernel writing its output in e4m3 (kernels/fp8_out.py) + FP8Linear.forward_fp8 (the
                GEMM alone)
and the parts: attn_bf16 / attn_fp8 (sagegen's kernel alone, bf16 or FP8 output; ``backend="triton"``),
linear_bf16 (F.linear), linear_fp8 (quantization + GEMM), gemm_fp8_in (forward_fp8 on the FP8 output).
Projection speedups over bf16 cuBLAS, quantization included:
  separate   linear_bf16 / linear_fp8
  fused      linear_bf16 / (gemm_fp8_in + max(0, attn_fp8 - attn_bf16)): whatever the FP8 epilogue costs the
             attention kernel counts as quantization; a saving is not credited
Errors of the projected rows against stock (rel. L1): bf16_out and fp8_out. JSON (device, versions, date) to --out.

    python bench/bench_out_proj.py --out bench/results/out-proj-h200-$(date +%F).json [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import sagegen  # noqa: E402
from sagegen.api import sageattn_fp8_out  # noqa: E402
from sagegen.linear import FP8Linear  # noqa: E402
from sagegen.runs.files import atomic_write_json  # noqa: E402

# (model, B, H, N, D, the joint-token rows its to_out projects, or None for all): the attention call of one
# block at the preset's size (CFG batch where the pipeline batches it). Flux: text first; SD3.5: image first.
SHAPES = [
    ("flux.1-dev", 1, 24, 4608, 128, (512, 4608)),
    ("sd3.5-large", 2, 38, 4429, 64, (0, 4096)),
    ("wan2.1-t2v-1.3b", 1, 12, 32760, 128, None),
    ("cogvideox-5b", 2, 48, 17776, 64, None),
    ("wan2.1-t2v-14b", 1, 40, 75600, 128, None),
    ("hunyuanvideo-1.5", 1, 16, 113585, 128, (0, 112585)),  # video first, then 1,000 text tokens
    ("mochi-1", 2, 24, 44776, 128, (0, 44520)),              # video first, then 256 text tokens
]
QUICK = 2  # --quick: the first two (the image models' 4-9k-token projections)


def captured(fn) -> torch.cuda.CUDAGraph:
    """``fn`` captured in a CUDA graph (after warm-up calls on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def bench_shape(model, B, H, N, D, rows, rounds):
    import triton.testing

    C = H * D
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(B, N, H, D, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(3))
    lin = torch.nn.Linear(C, C, device=dev, dtype=torch.bfloat16)
    fp8 = FP8Linear(lin)
    sl = slice(*rows) if rows is not None else slice(None)
    cfg = sagegen.DIFFUSION_CONFIG

    def stock():
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return lin(o.transpose(1, 2).flatten(2, 3)[:, sl])

    def bf16_out():
        o = sagegen.sageattn(q, k, v, tensor_layout="NHD", config=cfg)
        return fp8(o.flatten(2, 3)[:, sl])

    def fp8_out():
        o8, s = sageattn_fp8_out(q, k, v, tensor_layout="NHD", config=cfg)
        return fp8.forward_fp8(o8.flatten(2, 3)[:, sl], s, torch.bfloat16)

    o_bf16 = sagegen.sageattn(q, k, v, tensor_layout="NHD", config=cfg, backend="triton").flatten(2, 3)[:, sl]
    o8, s8 = sageattn_fp8_out(q, k, v, tensor_layout="NHD", config=cfg)
    x8 = o8.flatten(2, 3)[:, sl]
    parts = {
        "attn_bf16": lambda: sagegen.sageattn(q, k, v, tensor_layout="NHD", config=cfg, backend="triton"),
        "attn_fp8": lambda: sageattn_fp8_out(q, k, v, tensor_layout="NHD", config=cfg),
        "linear_bf16": lambda: lin(o_bf16),
        "linear_fp8": lambda: fp8(o_bf16),
        "gemm_fp8_in": lambda: fp8.forward_fp8(x8, s8, torch.bfloat16),
    }
    with torch.no_grad():
        want = stock().float()
        errors = {"bf16_out": (bf16_out().float() - want).abs().mean().item() / want.abs().mean().item(),
                  "fp8_out": (fp8_out().float() - want).abs().mean().item() / want.abs().mean().item()}
        fns = {"stock": stock, "bf16_out": bf16_out, "fp8_out": fp8_out, **parts}
        graphs = {name: captured(fn) for name, fn in fns.items()}
        times = {name: [] for name in fns}
        for _ in range(rounds):
            for name, g in graphs.items():
                times[name].append(triton.testing.do_bench(g.replay, warmup=5, rep=100, return_mode="median"))
    ms = {name: statistics.median(t) for name, t in times.items()}
    epilogue = max(0.0, ms["attn_fp8"] - ms["attn_bf16"])
    m_rows = B * (N if rows is None else rows[1] - rows[0])
    return {
        "model": model, "shape": [B, H, N, D], "projected_rows": m_rows, "channels": C, "ms": ms, "rounds_ms": times,
        "speedup": {"pair_bf16_out": ms["stock"] / ms["bf16_out"], "pair_fp8_out": ms["stock"] / ms["fp8_out"],
                    "fp8_out_vs_bf16_out": ms["bf16_out"] / ms["fp8_out"],
                    "proj_separate": ms["linear_bf16"] / ms["linear_fp8"],
                    "proj_fused": ms["linear_bf16"] / (ms["gemm_fp8_in"] + epilogue)},
        "epilogue_extra_ms": ms["attn_fp8"] - ms["attn_bf16"], "rel_l1_vs_stock": errors,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the two image-model shapes only")
    ap.add_argument("--only", default=None, help="comma-separated model names of SHAPES to run instead")
    args = ap.parse_args(argv)
    shapes = SHAPES[:QUICK] if args.quick else SHAPES
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {s[0] for s in SHAPES})
        if unknown:
            ap.error(f"--only: unknown model(s) {', '.join(unknown)}; choose from {', '.join(s[0] for s in SHAPES)}")
        shapes = [s for s in SHAPES if s[0] in names]
    if not torch.cuda.is_available():
        raise SystemExit("bench_out_proj.py needs a CUDA GPU")
    import triton

    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "date": datetime.date.today().isoformat(), "argv": sys.argv[1:]}
    rows = []
    for shape in shapes:
        row = bench_shape(*shape, rounds=args.rounds)
        rows.append(row)
        s = row["speedup"]
        print(f"{row['model']:16s} rows {row['projected_rows']:6d}  projection over bf16: separate "
              f"{s['proj_separate']:.2f}x, fused {s['proj_fused']:.2f}x "
              f"(epilogue {row['epilogue_extra_ms'] * 1e3:+.1f} us)"
              f"  attention+projection over stock: {s['pair_bf16_out']:.2f}x -> {s['pair_fp8_out']:.2f}x  "
              f"rel. L1 {row['rel_l1_vs_stock']['bf16_out']:.4f} / {row['rel_l1_vs_stock']['fp8_out']:.4f}",
              flush=True)
        if args.out:
            atomic_write_json(args.out, {"environment": env, "rows": rows, "partial": True})
    report = {"environment": env, "rows": rows, "partial": False}
    if args.out:
        atomic_write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
