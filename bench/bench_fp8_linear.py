"""FP8 linear GEMMs at the shapes of the supported models' linears, quantization included, vs bf16 cuBLAS.

For each (model, layer, M tokens, K in, N out) it times, with triton.testing.do_bench (median), every variant once a
round for --rounds rounds (the median of each; speedups are the median of the rounds' ratios):
  bf16             F.linear in bf16 (cuBLAS)
  fp8_fast         sagegen: Triton per-token quantization + torch._scaled_mm, row-wise scales, bias fused,
                   use_fast_accum=True (the default, LinearPolicy.fast_accum)
  fp8_precise      the same with use_fast_accum=False (periodic promotion to fp32)
  quant            the per-token quantization alone (default launch), and quant_best: the fastest of a small
                   sweep of launches (4096/8192/16384 elements a program, one read vs two passes for rows wider
                   than 8192), with its GB/s and the launch
  gemm_fast / gemm_precise   the _scaled_mm alone
  fp8_blockwise    1x128 activations x 128x128 weights via F.scaled_mm block-wise recipes (if supported here)
  torchao_rowwise  torchao Float8DynamicActivationFloat8WeightConfig(PerRow) (if torchao imports), eager, and
                   torchao_rowwise_compiled under torch.compile (--torchao-compile)
and, for an MLP's second layer (input = the pre-GELU tensor, GELU tanh-approximate):
  bf16_gelu        F.gelu + F.linear in bf16 (what stock runs)
  fp8_gelu_eager   F.gelu in bf16, then fp8_fast;   fp8_gelu_fused   GELU inside the quantization kernel
and, for the projections of one input (Q, K, V; + proj_mlp in the single blocks; SIBLINGS):
  bf16_siblings    one F.linear each (what stock runs);   bf16_siblings_merged   one F.linear of the
                   concatenated weights (diffusers' fuse_qkv_projections)
  fp8_siblings_shared  one quantization, one _scaled_mm each (what the patched model runs)
  fp8_siblings_merged  one quantization, one _scaled_mm of the concatenated FP8 weights
  fp8_siblings_stacked the same through `sagegen.linear.stacked` (FP8Linear layers, what Wan's patched
                   self-attention runs for Q/K/V)
and, for the single blocks' proj_out (input = cat(attention [M, 3072], GELU(mlp)), CAT_GELU):
  bf16_cat_gelu    F.gelu, torch.cat, F.linear in bf16 (what stock runs)
  fp8_cat_gelu_eager   F.gelu + torch.cat in bf16, then fp8_fast;   fp8_cat_gelu_fused   the quantization kernel
                   reads the two tensors and computes the GELU (FP8Linear.cat_gelu)
Errors (rel. L1, cosine) against bf16 on the first 8192 rows: fast and precise accumulation, and the fused GELU.
Writes JSON (device, versions, date) to --out after every shape (marked partial until the end); prints one
line per shape.

    python bench/bench_fp8_linear.py --quick --out bench/results/fp8-linear-quick.json   # < 2 min, 12 shapes
    python bench/bench_fp8_linear.py --out bench/results/fp8-linear-h100-$(date +%F).json  # all shapes
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch.nn.functional as F

from sagegen.kernels.fp8_quant import per_token_launch, quantize_fp8_rows
from sagegen.linear import FP8Linear, fp8_linear, quantize_weight
from sagegen.linear.ops import _gemm_rowwise, blockwise_supported, fp8_linear_eager
from sagegen.linear.stacked import stack, stacked_forward
from sagegen.runs.files import atomic_write_json

# (model, layer, M, K, N, gelu: the layer is an MLP's second layer after a tanh GELU). M: tokens per denoiser
# call at the model's default size (CFG batch included where the pipeline batches it). Flux 1024²: 4096 image +
# 512 text tokens (single blocks see the joint 4608); SD3.5-large: 2 x (4096 + 333); CogVideoX-5b 49 frames
# 480x720: 2 x 17,776; HunyuanVideo 720p 129 frames: 119,056 (+256 text); Wan2.1-14B 720p 81 frames:
# 21 x 45 x 80 = 75,600 (dim 5120, ffn 13824).
SHAPES = [
    ("flux.1-dev", "double.img qkv/out", 4096, 3072, 3072, False),
    ("flux.1-dev", "double.img ff up", 4096, 3072, 12288, False),
    ("flux.1-dev", "double.img ff down", 4096, 12288, 3072, True),
    ("flux.1-dev", "single qkv", 4608, 3072, 3072, False),
    ("flux.1-dev", "single proj_mlp", 4608, 3072, 12288, False),
    ("flux.1-dev", "single proj_out", 4608, 15360, 3072, False),
    ("sd3.5-large", "qkv/out", 8858, 2432, 2432, False),
    ("sd3.5-large", "ff up", 8192, 2432, 9728, False),
    ("sd3.5-large", "ff down", 8192, 9728, 2432, True),
    ("cogvideox-5b", "qkv/out", 35552, 3072, 3072, False),
    ("cogvideox-5b", "ff up", 35552, 3072, 12288, False),
    ("cogvideox-5b", "ff down", 35552, 12288, 3072, True),
    ("hunyuanvideo", "qkv/out", 119312, 3072, 3072, False),
    ("hunyuanvideo", "ff up / proj_mlp", 119312, 3072, 12288, False),
    ("hunyuanvideo", "ff down", 119312, 12288, 3072, True),
    ("hunyuanvideo", "single proj_out", 119312, 15360, 3072, False),
    ("wan2.1-14b", "q/k/v/o", 75600, 5120, 5120, False),
    ("wan2.1-14b", "ffn up", 75600, 5120, 13824, False),
    ("wan2.1-14b", "ffn down", 75600, 13824, 5120, True),
    # the models added since (issue 18's presets): Wan2.1-1.3B 480p 21 x 30 x 52; Wan2.2-TI2V-5B 720p
    # 31 x 22 x 40; LTX-Video 704x512x161, CFG 2 x 7,392; Qwen-Image 1328² 6,889 image tokens (+128 text in
    # its joint attention); HunyuanVideo-1.5 720p 121 frames 112,585 video tokens
    ("wan2.1-1.3b", "q/k/v/o", 32760, 1536, 1536, False),
    ("wan2.1-1.3b", "ffn up", 32760, 1536, 8960, False),
    ("wan2.1-1.3b", "ffn down", 32760, 8960, 1536, True),
    ("wan2.2-ti2v-5b", "q/k/v/o", 27280, 3072, 3072, False),
    ("wan2.2-ti2v-5b", "ffn up", 27280, 3072, 14336, False),
    ("wan2.2-ti2v-5b", "ffn down", 27280, 14336, 3072, True),
    ("ltx-video", "q/k/v/o", 14784, 2048, 2048, False),
    ("ltx-video", "ff up", 14784, 2048, 8192, False),
    ("ltx-video", "ff down", 14784, 8192, 2048, True),
    ("qwen-image", "img qkv/out", 6889, 3072, 3072, False),
    ("qwen-image", "img ff up", 6889, 3072, 12288, False),
    ("qwen-image", "img ff down", 6889, 12288, 3072, True),
    ("hunyuanvideo-1.5", "q/k/v/o", 112585, 2048, 2048, False),
    ("hunyuanvideo-1.5", "ff up", 112585, 2048, 8192, False),
    ("hunyuanvideo-1.5", "ff down", 112585, 8192, 2048, True),
    # Mochi-1 480x848x163, CFG 2 x 44,520 video tokens; SwiGLU MLP (inner 8,192: the up projection is 2x wide)
    ("mochi-1", "q/k/v/o", 89040, 3072, 3072, False),
    ("mochi-1", "ff up (SwiGLU)", 89040, 3072, 16384, False),
    ("mochi-1", "ff down", 89040, 8192, 3072, False),
]
QUICK = [SHAPES[i] for i in (1, 2, 5, 7, 8, 9, 11, 12, 14, 16, 17, 18)]
# (model, layer) -> width of the attention output before GELU(mlp) in the layer's input: the single blocks whose
# forward calls FP8Linear.cat_gelu under sagegen (Flux's fused block, HunyuanVideo's subclass)
CAT_GELU = {("flux.1-dev", "single proj_out"): 3072, ("hunyuanvideo", "single proj_out"): 3072}
# (model, layer) -> output widths of the projections the model runs on the same input (one FP8 quantization
# shared by all: `sagegen.linear.shared`): Q, K, V, and the single blocks' proj_mlp with them
SIBLINGS = {("flux.1-dev", "double.img qkv/out"): (3072,) * 3, ("flux.1-dev", "single qkv"): (3072,) * 3 + (12288,),
            ("sd3.5-large", "qkv/out"): (2432,) * 3, ("cogvideox-5b", "qkv/out"): (3072,) * 3,
            ("hunyuanvideo", "qkv/out"): (3072,) * 3, ("wan2.1-14b", "q/k/v/o"): (5120,) * 3,
            ("wan2.1-1.3b", "q/k/v/o"): (1536,) * 3, ("wan2.2-ti2v-5b", "q/k/v/o"): (3072,) * 3,
            ("ltx-video", "q/k/v/o"): (2048,) * 3, ("qwen-image", "img qkv/out"): (3072,) * 3,
            ("hunyuanvideo-1.5", "q/k/v/o"): (2048,) * 3, ("mochi-1", "q/k/v/o"): (3072,) * 3}
ERR_ROWS = 8192


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


def _quant_sweep(x, bench) -> dict:
    """The per-token quantization at a few launches: {label: ms}."""
    K = x.shape[1]
    out = {}
    for single_k in ((16384, 8192) if 8192 < K <= 16384 else (16384,)):  # wide rows: one read vs two passes
        default = per_token_launch(K, max_single_pass_k=single_k)
        for elements in (4096, 8192, 16384):  # 32 values a thread (the design point): warps follow the tile
            bm = max(1, elements // default["BLOCK_K"]) if default["SINGLE_PASS"] else max(1, elements // 1024)
            warps = bm * default["BLOCK_K"] // (32 * 32)
            label = f"{'one read' if default['SINGLE_PASS'] else 'two passes'},block_m={bm},warps={warps}"
            if label in out or warps not in (4, 8, 16):
                continue
            out[label] = bench(lambda bm=bm, warps=warps, single_k=single_k: quantize_fp8_rows(
                x, "per_token", block_m=bm, num_warps=warps, max_single_pass_k=single_k), rep=20)
    return out


def bench_shape(model, layer, M, K, N, gelu, bench, with_torchao, block_ok, sweep, device="cuda",
                torchao_compile=False, rounds=1, cat_gelu_k0=0, siblings=()) -> dict:
    """One shape's row. Every variant is timed once a round, the rounds one after another (so that a clock
    change under the H200's power cap hits all of them alike); ms = the median over rounds, and each speedup
    the median of the rounds' ratios. ``cat_gelu_k0``: the layer's input is cat(x[:, :k0], GELU(x[:, k0:]))."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16, generator=g)
    w = (torch.randn(N, K, device=device, generator=g) / K ** 0.5).to(torch.bfloat16)
    b = torch.randn(N, device=device, dtype=torch.bfloat16, generator=g) * 0.1
    flops = 2.0 * M * N * K
    row = {"model": model, "layer": layer, "M": M, "K": K, "N": N, "gelu": gelu, "ms": {}, "tflops": {},
           "error_vs_bf16": {}}

    plan: dict = {}  # name -> (fn, counts as a GEMM), timed in rounds at the end
    times: dict = {}

    def timed(name, fn, gemm=True):
        plan[name] = (fn, gemm)

    xe = x[:ERR_ROWS]
    ref = F.linear(xe, w, b)
    timed("bf16", lambda: F.linear(x, w, b))
    w_q, w_s = quantize_weight(w, "per_channel")
    for fast, tag in ((True, "fast"), (False, "precise")):
        timed(f"fp8_{tag}", lambda fast=fast: fp8_linear(x, w_q, w_s, b, None, "per_token", False, fast))
        row["error_vs_bf16"][f"fp8_{tag}"] = _err(fp8_linear(xe, w_q, w_s, b, None, "per_token", False, fast), ref)
    timed("quant", lambda: quantize_fp8_rows(x, "per_token"), gemm=False)
    row["quant_launch"] = {k: v for k, v in per_token_launch(K).items()}
    if sweep:
        swept = _quant_sweep(x, bench)
        best = min(swept, key=swept.get)
        row["quant_sweep_ms"] = swept
        row["quant_best"] = {"launch": best, "ms": swept[best], "gbps": M * K * 3 / swept[best] / 1e6}
    xq, xs = quantize_fp8_rows(x, "per_token")
    for fast, tag in ((True, "fast"), (False, "precise")):
        timed(f"gemm_{tag}", lambda fast=fast: _gemm_rowwise(xq, xs, w_q, w_s, b, torch.bfloat16, fast))
    if gelu:
        timed("bf16_gelu", lambda: F.linear(F.gelu(x, approximate="tanh"), w, b))
        timed("fp8_gelu_eager", lambda: fp8_linear(F.gelu(x, approximate="tanh"), w_q, w_s, b, None, "per_token",
                                                   False))
        timed("fp8_gelu_fused", lambda: fp8_linear(x, w_q, w_s, b, None, "per_token", False, True, "gelu_tanh"))
        gref = F.linear(F.gelu(xe, approximate="tanh"), w, b)
        row["error_vs_bf16"]["fp8_gelu_fused"] = _err(
            fp8_linear(xe, w_q, w_s, b, None, "per_token", False, True, "gelu_tanh"), gref)
        row["error_vs_bf16"]["fp8_gelu_eager"] = _err(
            fp8_linear(F.gelu(xe, approximate="tanh"), w_q, w_s, b, None, "per_token", False, True), gref)
    if cat_gelu_k0:
        _cat_gelu_variants(row, timed, x, xe, w, b, w_q, w_s, cat_gelu_k0)
    if siblings:
        _sibling_variants(row, timed, x, xe, siblings, g)
    if block_ok:
        wb_q, wb_s = quantize_weight(w, "per_block")
        timed("fp8_blockwise", lambda: fp8_linear(x, wb_q, wb_s, b, None, "per_block", False))
        row["error_vs_bf16"]["fp8_blockwise"] = _err(fp8_linear(xe, wb_q, wb_s, b, None, "per_block", False), ref)
    if with_torchao:
        lin = torch.nn.Linear(K, N, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        ao, why = _torchao_linear(lin)
        if ao is not None:
            with torch.inference_mode():
                timed("torchao_rowwise", lambda: ao(x))
                row["error_vs_bf16"]["torchao_rowwise"] = _err(ao(xe), ref)
            if torchao_compile:  # how torchao users run it: inductor fuses its quantization into one kernel
                torch._dynamo.reset()
                aoc = torch.compile(ao, dynamic=False)
                with torch.inference_mode():  # timed now: the compiled code goes with the reset below
                    times["torchao_rowwise_compiled"] = [bench(lambda: aoc(x))] * rounds
                torch._dynamo.reset()
        else:
            row["torchao_error"] = why
    for _ in range(rounds):
        for name, (fn, _gemm) in plan.items():
            times.setdefault(name, []).append(bench(fn))
    for name, ts in times.items():
        row["ms"][name] = statistics.median(ts)
        if plan.get(name, (None, True))[1]:
            row["tflops"][name] = flops / row["ms"][name] / 1e9
    if rounds > 1:
        row["ms_rounds"] = times
    row["quant_gbps"] = M * K * 3 / row["ms"]["quant"] / 1e6  # bf16 read + e4m3 write

    def speedup(base, k):  # the median of the rounds' ratios
        return statistics.median(b / t for b, t in zip(times[base], times[k]))

    row["speedup"] = {k: speedup("bf16", k) for k in times if k.startswith(("fp8", "torchao")) and "gelu" not in k}
    if gelu:  # against what stock runs for this layer: the bf16 GELU then the bf16 linear
        row["speedup"].update({k: speedup("bf16_gelu", k) for k in ("fp8_gelu_eager", "fp8_gelu_fused")})
    if cat_gelu_k0:  # against stock's GELU, concatenation and bf16 linear
        row["speedup"].update({k: speedup("bf16_cat_gelu", k) for k in ("fp8_cat_gelu_eager", "fp8_cat_gelu_fused")})
    if siblings:  # against stock's separate bf16 projections; the merged FP8 GEMM also against merged bf16
        row["speedup"].update({k: speedup("bf16_siblings", k) for k in ("fp8_siblings_shared", "fp8_siblings_merged",
                                                                        "fp8_siblings_stacked",
                                                                        "bf16_siblings_merged")})
        row["speedup"]["fp8_siblings_merged_vs_bf16_merged"] = speedup("bf16_siblings_merged", "fp8_siblings_merged")
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def _cat_gelu_variants(row, timed, x, xe, w, b, w_q, w_s, k0):
    """The single-block proj_out: the attention part and the pre-GELU MLP part as the block holds them (two
    tensors), stock's GELU + cat + linear against the fused quantization."""
    attn, mlp = x[:, :k0].contiguous(), x[:, k0:].contiguous()
    gelu = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731
    timed("bf16_cat_gelu", lambda: F.linear(torch.cat([attn, gelu(mlp)], 1), w, b))
    timed("fp8_cat_gelu_eager", lambda: fp8_linear(torch.cat([attn, gelu(mlp)], 1), w_q, w_s, b, None, "per_token",
                                                   False))
    timed("fp8_cat_gelu_fused", lambda: fp8_linear_eager(mlp, w_q, w_s, b, None, "per_token", False, True,
                                                         "gelu_tanh", attn))
    ae, me = attn[:ERR_ROWS], mlp[:ERR_ROWS]
    ref = F.linear(torch.cat([ae, gelu(me)], 1), w, b)
    row["cat_gelu_k0"] = k0
    row["error_vs_bf16"]["fp8_cat_gelu_fused"] = _err(
        fp8_linear_eager(me, w_q, w_s, b, None, "per_token", False, True, "gelu_tanh", ae), ref)


def _sibling_variants(row, timed, x, xe, widths, g):
    """Projections of one input x [M, K] to the given widths: separate or merged, bf16 or FP8 (one
    quantization of x for all)."""
    K = x.shape[1]
    ws = [(torch.randn(n, K, device=x.device, generator=g) / K ** 0.5).to(torch.bfloat16) for n in widths]
    bs = [torch.randn(n, device=x.device, dtype=torch.bfloat16, generator=g) * 0.1 for n in widths]
    w_cat, b_cat = torch.cat(ws), torch.cat(bs)
    quant = [quantize_weight(w, "per_channel") for w in ws]
    wq_cat, ws_cat = quantize_weight(w_cat, "per_channel")  # per channel: the same values as the parts'
    timed("bf16_siblings", lambda: [F.linear(x, w, b) for w, b in zip(ws, bs)])
    timed("bf16_siblings_merged", lambda: F.linear(x, w_cat, b_cat).split(list(widths), dim=1))

    def shared(x):
        xq, xs = quantize_fp8_rows(x, "per_token")
        return [_gemm_rowwise(xq, xs, w_q, w_s, b, torch.bfloat16) for (w_q, w_s), b in zip(quant, bs)]

    def merged(x):
        xq, xs = quantize_fp8_rows(x, "per_token")
        return _gemm_rowwise(xq, xs, wq_cat, ws_cat, b_cat, torch.bfloat16).split(list(widths), dim=1)

    layers = []
    for w, b in zip(ws, bs):
        lin = torch.nn.Linear(K, w.shape[0], device=x.device, dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        layers.append(FP8Linear(lin, min_rows=1))
    stack(layers)
    timed("fp8_siblings_shared", lambda: shared(x))
    timed("fp8_siblings_merged", lambda: merged(x))
    timed("fp8_siblings_stacked", lambda: stacked_forward(layers, x))
    row["siblings"] = list(widths)
    ref = torch.cat([F.linear(xe, w, b) for w, b in zip(ws, bs)], 1)
    row["error_vs_bf16"]["fp8_siblings_shared"] = _err(torch.cat(shared(xe), 1), ref)
    row["error_vs_bf16"]["fp8_siblings_merged"] = _err(torch.cat(merged(xe), 1), ref)
    row["error_vs_bf16"]["fp8_siblings_stacked"] = _err(torch.cat(stacked_forward(layers, xe), 1), ref)


def _report(device, argv, block_ok, block_why, rows, partial=False) -> dict:
    props = torch.cuda.get_device_properties(device)
    report = {"benchmark": "fp8_linear",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": {"name": props.name, "capability": list(torch.cuda.get_device_capability(device))},
              "versions": _versions(), "argv": sys.argv[1:] if argv is None else argv,
              "blockwise_supported": block_ok, "blockwise_note": block_why, "rows": rows}
    return {**report, "partial": True} if partial else report


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--quick", action="store_true", help="the main shapes of each model (< 2 min on an H100)")
    p.add_argument("--max-m", type=int, default=None, help="cap M (tokens) for a faster run")
    p.add_argument("--no-torchao", action="store_true")
    p.add_argument("--torchao-compile", action="store_true",
                   help="also time torch.compile(torchao's layer) per shape (a compile each)")
    p.add_argument("--no-sweep", action="store_true", help="skip the quantization launch sweep")
    p.add_argument("--rounds", type=int, default=3, help="time every variant once a round, this many rounds")
    p.add_argument("--only", default=None, help="comma-separated SHAPES indices (0-36) to run instead")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="time each variant as a replayed CUDA graph (GPU time only: no host launch cost, no L2 flush)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_fp8_linear.py needs a CUDA GPU")
    import triton.testing

    def bench(fn, rep=50):
        with torch.inference_mode():
            if args.cuda_graphs:
                return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")
            return triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")

    device = torch.device("cuda")
    block_ok, block_why = blockwise_supported(device.index or 0)
    print(f"block-wise scaled_mm: {'yes' if block_ok else 'no: ' + block_why}", flush=True)
    rows = []
    shapes = [SHAPES[int(i)] for i in args.only.split(",")] if args.only else QUICK if args.quick else SHAPES
    for model, layer, M, K, N, gelu in shapes:
        if args.max_m:
            M = min(M, args.max_m)
        row = bench_shape(model, layer, M, K, N, gelu, bench, not args.no_torchao, block_ok, not args.no_sweep,
                          torchao_compile=args.torchao_compile, rounds=args.rounds,
                          cat_gelu_k0=CAT_GELU.get((model, layer), 0), siblings=SIBLINGS.get((model, layer), ()))
        rows.append(row)
        # a cut-short run keeps rows
        atomic_write_json(args.out, _report(device, argv, block_ok, block_why, rows, partial=True))
        ms, err = row["ms"], row["error_vs_bf16"]
        best = row.get("quant_best")
        print(f"{model:>12} {layer:<19} M={M:<6} K={K:<5} N={N:<5} bf16 {ms['bf16']:7.3f} ms | "
              + " ".join(f"{k} {v:.2f}x" for k, v in row["speedup"].items())
              + f" | quant {ms['quant']:.3f} ms ({row['quant_gbps']:.0f} GB/s"
              + (f"; best {best['ms']:.3f} {best['launch']}" if best else "") + ")"
              + f" gemm fast/precise {ms['gemm_fast']:.3f}/{ms['gemm_precise']:.3f} ms"
              + f" | relL1 fast {err['fp8_fast']['rel_l1']:.4f} precise {err['fp8_precise']['rel_l1']:.4f}",
              flush=True)
    report = _report(device, argv, block_ok, block_why, rows)
    atomic_write_json(args.out, report)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
