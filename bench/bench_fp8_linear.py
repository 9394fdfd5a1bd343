"""FP8 linear GEMMs at the shapes of the supported models' linears, quantization included, vs bf16 cuBLAS.

For each (model, layer, M tokens, K in, N out) it times, with triton.testing.do_bench (median):
  bf16            F.linear in bf16 (cuBLAS)
  fp8_rowwise     sagegen: Triton per-token quantization + torch._scaled_mm (row-wise scales, bias fused)
  quant_per_token the quantization alone;  gemm_rowwise  the _scaled_mm alone
  fp8_blockwise   1x128 activations x 128x128 weights via F.scaled_mm block-wise recipes (if supported here)
  torchao_rowwise torchao Float8DynamicActivationFloat8WeightConfig(PerRow) (if torchao imports)
plus the FP8 output's rel. L1 / cosine against the bf16 output. Writes JSON (device, versions, date) to --out.

    python bench/bench_fp8_linear.py --out bench/results/fp8-linear-h100-$(date +%F).json   # ~1-2 min
    python bench/bench_fp8_linear.py --quick --out /tmp/fp8.json                           # 3 shapes
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch.nn.functional as F  # noqa: E402

from sagegen.kernels.fp8_quant import quantize_fp8_rows  # noqa: E402
from sagegen.linear import fp8_linear, quantize_weight  # noqa: E402
from sagegen.linear.ops import _gemm_rowwise, blockwise_supported  # noqa: E402

# (model, layer, M, K, N). M: tokens per denoiser call at the model's default size (CFG batch included where
# the pipeline batches it). Flux 1024²: 4096 image + 512 text tokens (single blocks see the joint 4608);
# SD3.5-large: 2 x (4096 + 333); CogVideoX-5b 49 frames 480x720: 2 x 17,776; HunyuanVideo 720p 129 frames:
# 119,056 (+256 text); Wan2.1-14B 720p 81 frames: 21 x 45 x 80 = 75,600 (dim 5120, ffn 13824).
SHAPES = [
    ("flux.1-dev", "double.img qkv/out", 4096, 3072, 3072),
    ("flux.1-dev", "double.img ff up", 4096, 3072, 12288),
    ("flux.1-dev", "double.img ff down", 4096, 12288, 3072),
    ("flux.1-dev", "single qkv", 4608, 3072, 3072),
    ("flux.1-dev", "single proj_mlp", 4608, 3072, 12288),
    ("flux.1-dev", "single proj_out", 4608, 15360, 3072),
    ("sd3.5-large", "qkv/out", 8858, 2432, 2432),
    ("sd3.5-large", "ff up", 8192, 2432, 9728),
    ("sd3.5-large", "ff down", 8192, 9728, 2432),
    ("cogvideox-5b", "qkv/out", 35552, 3072, 3072),
    ("cogvideox-5b", "ff up", 35552, 3072, 12288),
    ("cogvideox-5b", "ff down", 35552, 12288, 3072),
    ("hunyuanvideo", "qkv/out", 119312, 3072, 3072),
    ("hunyuanvideo", "ff up / proj_mlp", 119312, 3072, 12288),
    ("hunyuanvideo", "ff down", 119312, 12288, 3072),
    ("hunyuanvideo", "single proj_out", 119312, 15360, 3072),
    ("wan2.1-14b", "qkv/out", 75600, 5120, 5120),
    ("wan2.1-14b", "ffn up", 75600, 5120, 13824),
    ("wan2.1-14b", "ffn down", 75600, 13824, 5120),
]
QUICK = [SHAPES[1], SHAPES[9], SHAPES[17]]


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("torch", "triton", "diffusers", "torchao", "sagegen"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["cuda"] = torch.version.cuda
    return out


def _torchao_linear(lin: torch.nn.Linear):
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
    except Exception as e:  # noqa: BLE001
        return None, f"torchao not importable: {type(e).__name__}: {e}"
    try:
        quantize_(lin, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))
        return lin, ""
    except Exception as e:  # noqa: BLE001
        return None, f"torchao quantize_ failed: {type(e).__name__}: {e}"


def _err(y, ref) -> dict:
    y, ref = y.float(), ref.float()
    return {"rel_l1": ((y - ref).abs().sum() / ref.abs().sum()).item(),
            "cosine": F.cosine_similarity(y.flatten(), ref.flatten(), dim=0).item()}


def bench_shape(model, layer, M, K, N, bench, with_torchao, block_ok) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16, generator=g) * 0.1
    flops = 2.0 * M * N * K
    row = {"model": model, "layer": layer, "M": M, "K": K, "N": N, "ms": {}, "tflops": {}}

    def timed(name, fn):
        ms = bench(fn)
        row["ms"][name] = ms
        row["tflops"][name] = flops / ms / 1e9

    ref = F.linear(x, w, b)
    timed("bf16", lambda: F.linear(x, w, b))
    w_q, w_s = quantize_weight(w, "per_channel")
    timed("fp8_rowwise", lambda: fp8_linear(x, w_q, w_s, b, None, "per_token", False))
    xq, xs = quantize_fp8_rows(x, "per_token")
    timed("quant_per_token", lambda: quantize_fp8_rows(x, "per_token"))
    timed("gemm_rowwise", lambda: _gemm_rowwise(xq, xs, w_q, w_s, b, torch.bfloat16))
    row["error_rowwise"] = _err(fp8_linear(x, w_q, w_s, b, None, "per_token", False), ref)
    if block_ok:
        wb_q, wb_s = quantize_weight(w, "per_block")
        timed("fp8_blockwise", lambda: fp8_linear(x, wb_q, wb_s, b, None, "per_block", False))
        timed("quant_per_block", lambda: quantize_fp8_rows(x, "per_block", scales_k_major=True))
        row["error_blockwise"] = _err(fp8_linear(x, wb_q, wb_s, b, None, "per_block", False), ref)
    if with_torchao:
        lin = torch.nn.Linear(K, N, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        ao, why = _torchao_linear(lin)
        if ao is not None:
            with torch.inference_mode():
                timed("torchao_rowwise", lambda: ao(x))
                row["error_torchao"] = _err(ao(x), ref)
        else:
            row["torchao_error"] = why
    row["speedup"] = {k: row["ms"]["bf16"] / v for k, v in row["ms"].items()
                      if k.startswith(("fp8", "torchao"))}
    del x, w, xq
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--quick", action="store_true", help="three shapes only")
    p.add_argument("--max-m", type=int, default=None, help="cap M (tokens) for a faster run")
    p.add_argument("--no-torchao", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_fp8_linear.py needs a CUDA GPU")
    import triton.testing

    def bench(fn):
        with torch.inference_mode():
            return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")

    device = torch.device("cuda")
    block_ok, block_why = blockwise_supported(device.index or 0)
    print(f"block-wise scaled_mm: {'yes' if block_ok else 'no: ' + block_why}", flush=True)
    rows = []
    for model, layer, M, K, N in (QUICK if args.quick else SHAPES):
        if args.max_m:
            M = min(M, args.max_m)
        row = bench_shape(model, layer, M, K, N, bench, not args.no_torchao, block_ok)
        rows.append(row)
        print(f"{model:>13} {layer:<20} M={M:<6} K={K:<5} N={N:<5} bf16 {row['ms']['bf16']:7.3f} ms  "
              + "  ".join(f"{k} {v:.2f}x" for k, v in row["speedup"].items())
              + f"  (quant {row['ms']['quant_per_token']:.3f} ms, gemm {row['ms']['gemm_rowwise']:.3f} ms)",
              flush=True)
    props = torch.cuda.get_device_properties(device)
    report = {"benchmark": "fp8_linear",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": {"name": props.name, "capability": list(torch.cuda.get_device_capability(device))},
              "versions": _versions(), "argv": sys.argv[1:] if argv is None else argv,
              "blockwise_supported": block_ok, "blockwise_note": block_why, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
