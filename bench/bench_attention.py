"""Attention benchmark on the GPU: TFLOP/s and accuracy of sagegen against SDPA's backends and the
`sageattention` 1.0.6 package, at the shapes of ../shared/anchors/attention-h200.md.

Every number is the full call a user makes (quantization and smoothing included), bf16 inputs (fp16 for
sageattention 1.0.6, which needs fp16), median of `triton.testing.do_bench`. TFLOP/s = 4·B·H·N²·D / time.

    python bench/bench_attention.py --out bench/results/attention-<gpu>-<date>.json [--plot PNG] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import sagegen  # noqa: E402
from sagegen.kernels import triton_quant  # noqa: E402
from sagegen.kernels.reference import attention_fp64  # noqa: E402

SHAPES = [  # B, H, N, D
    (4, 32, 1024, 128), (4, 32, 4096, 128), (4, 32, 8192, 128), (4, 32, 16384, 128),
    (1, 24, 32768, 128), (1, 24, 75600, 128),
    (4, 32, 1024, 64), (4, 32, 4096, 64), (4, 32, 8192, 64), (4, 32, 16384, 64),
    (2, 30, 17776, 64), (2, 48, 17776, 64),
    (1, 24, 4608, 128), (2, 38, 4429, 64),  # Flux 1024², SD3.5-large 1024² (CFG batch)
]
QUICK = [(4, 32, 4096, 128), (4, 32, 16384, 128), (4, 32, 16384, 64), (2, 48, 17776, 64)]


def sdpa(backend):
    def run(q, k, v):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)
    return run


def sageattention_106():
    try:
        from sageattention import sageattn as upstream
    except Exception as exc:  # not installed on this machine
        return None, f"{type(exc).__name__}: {exc}"
    return (lambda q, k, v: upstream(q.half(), k.half(), v.half(), tensor_layout="HND")), None


def forced_kernel(name, mask=None):
    """sagegen with SAGEGEN_KERNEL=name (the Gluon or the portable Triton kernel) for one call."""
    def run(q, k, v):
        old = os.environ.get("SAGEGEN_KERNEL")
        os.environ["SAGEGEN_KERNEL"] = name
        try:
            return sagegen.sageattn(q, k, v, attn_mask=mask, backend="triton")
        finally:
            os.environ.pop("SAGEGEN_KERNEL") if old is None else os.environ.__setitem__("SAGEGEN_KERNEL", old)
    return run


def implementations():
    impls = {
        "sagegen": lambda q, k, v: sagegen.sageattn(q, k, v, backend="triton"),
        "sagegen_triton_kernel": forced_kernel("triton"),
        "sdpa_default": sdpa(None),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
    }
    upstream, why = sageattention_106()
    if upstream is not None:
        impls["sageattention_1.0.6"] = upstream
    return impls, why


def time_ms(fn, *args):
    import triton.testing

    return triton.testing.do_bench(lambda: fn(*args), warmup=100, rep=400, return_mode="median")


def quant_only(q, k, v):
    """The separate quantization pass as the full call runs it (on Hopper the Gluon kernel quantizes Q itself)."""
    from sagegen.kernels import triton_attn

    cfg = sagegen.SageConfig()
    bq, bk = cfg.blocks(q.shape[-1])
    hopper = torch.cuda.get_device_capability()[0] == 9
    return triton_quant.quantize(q, k, v, cfg, bq, bk, max(16, q.shape[-1]),
                                 permute_v_keys=hopper and triton_attn.gluon_permutes_v(),
                                 quantize_q=not (hopper and triton_attn.gluon_quantizes_q()))


def speed(shapes, impls):
    rows = []
    for b, h, n, d in shapes:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * n * n * d
        row = {"shape": [b, h, n, d], "tflops": {}, "ms": {}}
        for name, fn in impls.items():
            try:
                ms = time_ms(fn, q, k, v)
            except Exception as exc:  # a backend that does not support the shape
                row["tflops"][name] = None
                row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
                continue
            row["ms"][name] = ms
            row["tflops"][name] = flops / ms / 1e9
        row["quant_ms"] = time_ms(quant_only, q, k, v)
        row["quant_share"] = row["quant_ms"] / row["ms"]["sagegen"] if row["ms"].get("sagegen") else None
        base = row["tflops"].get("sdpa_default")
        row["speedup_vs_sdpa_default"] = {k_: (t / base if t and base else None) for k_, t in row["tflops"].items()}
        rows.append(row)
        print(_fmt_row(row), flush=True)
        q = k = v = None  # free the inputs (not `del`: the lambdas above name them)
        torch.cuda.empty_cache()
    return rows


def _fmt_row(row):
    b, h, n, d = row["shape"]
    cells = " ".join(f"{k}={v:.0f}" if v else f"{k}=--" for k, v in row["tflops"].items())
    s = row["speedup_vs_sdpa_default"].get("sagegen")
    return f"{b},{h},{n},{d}: {cells} | sagegen/sdpa={s:.2f}x quant={100 * (row['quant_share'] or 0):.1f}%"


def accuracy(impls):
    """cos / rel-L1 against float64 at the anchors' accuracy shapes (N(0,1) and sharper attention)."""
    out = []
    for d in (64, 128):
        for sharp in (1.0, 6.0 ** 0.5):
            q, k, v = (torch.randn(1, 8, 4096, d, device="cuda") for _ in range(3))
            q, k = (q * sharp).bfloat16(), (k * sharp).bfloat16()
            v = v.bfloat16()
            ref, _ = attention_fp64(q, k, v, sm_scale=d ** -0.5)
            for name, fn in impls.items():
                o = fn(q, k, v).double()
                cos = F.cosine_similarity(o.flatten(), ref.flatten(), dim=0).item()
                rel = ((o - ref).abs().sum() / ref.abs().sum()).item()
                out.append({"impl": name, "d": d, "logit_std": round(sharp ** 2, 2), "cos": cos, "rel_l1": rel})
                print(f"acc d={d} logit_std={sharp**2:.0f} {name}: cos {cos:.6f} rel-L1 {rel:.4f}", flush=True)
    return out


def environment():
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "device": props.name, "capability": list(torch.cuda.get_device_capability(0)),
        "sms": props.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(), "sagegen": sagegen.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, d in zip(axes, (64, 128)):
        sel = sorted((r for r in rows if r["shape"][3] == d and r["shape"][0] == 4), key=lambda r: r["shape"][2])
        for name in rows[0]["tflops"]:
            xs = [r["shape"][2] for r in sel if r["tflops"].get(name)]
            ys = [r["tflops"][name] for r in sel if r["tflops"].get(name)]
            ax.plot(xs, ys, marker="o", label=name, linewidth=2.5 if name == "sagegen" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_title(f"head dim {d}, B=4, H=32, non-causal")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s (full call)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def crossover(impls):
    """sagegen (Triton, forced) vs SDPA default over sequence lengths: where the kernel starts to win."""
    out = []
    for d in (64, 128):
        for n in (1024, 2048, 3072, 4096, 4608, 6144, 8192, 12288):
            q, k, v = (torch.randn(2, 24, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            t_sage = time_ms(impls["sagegen"], q, k, v)
            t_sdpa = time_ms(impls["sdpa_default"], q, k, v)
            out.append({"d": d, "n": n, "b": 2, "h": 24, "sagegen_ms": t_sage, "sdpa_ms": t_sdpa,
                        "speedup": t_sdpa / t_sage})
            print(f"crossover d={d} n={n}: sagegen/sdpa = {t_sdpa / t_sage:.2f}x", flush=True)
    return out


MASKED = [(1, 24, 67576, 128, 216), (2, 24, 67576, 128, 216), (1, 24, 119056, 128, 216)]  # B, H, N, D, padded


def masked(impls):
    """HunyuanVideo's calls: video + 256 text tokens, text padding masked per key (valid keys first). SDPA
    gets the same mask (what the stock model runs) and, for reference, none."""
    rows = []
    for b, h, n, d, pad in MASKED:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        mask = torch.ones(b, 1, 1, n, dtype=torch.bool, device="cuda")
        mask[..., n - pad:] = False
        flops = 4 * b * h * n * (n - pad) * d
        fns = {"sagegen": lambda: sagegen.sageattn(q, k, v, attn_mask=mask, backend="triton"),
               "sagegen_triton_kernel": lambda: forced_kernel("triton", mask)(q, k, v),
               "sdpa_default_masked": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
               "sdpa_default_unmasked": lambda: F.scaled_dot_product_attention(q, k, v)}
        row = {"shape": [b, h, n, d], "masked_keys": pad, "ms": {}, "tflops": {}}
        for name, fn in fns.items():
            row["ms"][name] = time_ms(fn)
            row["tflops"][name] = flops / row["ms"][name] / 1e9
        base = row["ms"]["sdpa_default_masked"]
        row["speedup_vs_sdpa_default_masked"] = {k_: base / t for k_, t in row["ms"].items()}
        rows.append(row)
        print(f"masked {b},{h},{n},{d} pad={pad}: " + " ".join(f"{k_}={t:.0f}" for k_, t in row["tflops"].items())
              + f" | sagegen/sdpa(masked)={row['speedup_vs_sdpa_default_masked']['sagegen']:.2f}x", flush=True)
        q = k = v = None  # free the inputs (not `del`: the lambdas above name them)
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--crossover", action="store_true", help="also sweep lengths for backend='auto'")
    ap.add_argument("--masked", action="store_true", help="also HunyuanVideo's key-padded calls")
    ap.add_argument("--shape", type=int, nargs=4, action="append", metavar=("B", "H", "N", "D"),
                    help="measure these shapes instead (repeatable)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py times the kernels on a CUDA GPU and none is visible here "
                 "(`make demo` prints the kernel's accuracy on the CPU)")
    impls, why = implementations()
    result = {"environment": environment(), "method": __doc__.strip().splitlines()[2]}
    if why:
        result["sageattention_1.0.6"] = f"not measured: {why}"
    print(result["environment"], flush=True)
    if not args.no_accuracy:
        result["accuracy"] = accuracy(impls)
    if args.crossover:
        result["crossover"] = crossover(impls)
    result["speed"] = speed(args.shape or (QUICK if args.quick else SHAPES), impls)
    if args.masked:
        result["masked"] = masked(impls)
    from sagegen.runs.files import atomic_write_text  # a unique temporary name beside it, removed on failure

    atomic_write_text(args.out, json.dumps(result, indent=1))
    if args.plot:
        plot(result["speed"], args.plot)


if __name__ == "__main__":
    main()
