"""Wan's Q/K prologue on the GPU: the stock eager ops (torch.nn.RMSNorm across heads, unflatten, Wan's rotary
over strided halves) against sagegen's one-pass kernel (`kernels.triton_heads_rms_rope`), for Q and K of one
self-attention layer at the presets' sizes, and the agreement of the two.

    python bench/bench_wan_prologue.py --out bench/results/wan-prologue-h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

SIZES = {  # name: (heads, latent frames, latent height / 2, latent width / 2)
    "wan2.1-t2v-1.3b 480p": (12, 21, 30, 52),
    "wan2.1-t2v-14b 720p": (40, 21, 45, 80),
    "wan2.2-ti2v-5b 720p": (24, 31, 22, 40),
}


def eager(x, norm, cos, sin, heads):
    q = norm(x).unflatten(2, (heads, -1))
    x1, x2 = q.unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.empty_like(q)
    out[..., 0::2] = x1 * cos[..., 0::2] - x2 * sin[..., 1::2]
    out[..., 1::2] = x1 * sin[..., 1::2] + x2 * cos[..., 0::2]
    return out.type_as(q)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--table-dtype", choices=["fp32", "bf16"], default="fp32",
                   help="rotary tables as from_pretrained keeps them (fp32) or as a whole-model bf16 cast")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_wan_prologue.py needs a CUDA GPU")
    import diffusers
    import triton
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
    from triton.testing import do_bench

    from sagegen.kernels.triton_heads_rms_rope import heads_rms_norm_rope

    table_dtype = torch.float32 if args.table_dtype == "fp32" else torch.bfloat16
    rows = {}
    for name, (heads, f, h, w) in SIZES.items():
        d = 128
        cos, sin = WanRotaryPosEmbed(d, (1, 2, 2), 1024).cuda()(torch.zeros(1, 1, f, 2 * h, 2 * w, device="cuda"))
        cos, sin = cos.to(table_dtype), sin.to(table_dtype)
        n = cos.shape[1]
        x = torch.randn(1, n, heads * d, device="cuda", dtype=torch.bfloat16)
        norm = torch.nn.RMSNorm(heads * d, eps=1e-6).cuda().to(torch.bfloat16)
        flat = (cos[0, :, 0, 0::2], sin[0, :, 0, 1::2])
        with torch.no_grad():
            ref = eager(x, norm, cos, sin, heads)
            out = heads_rms_norm_rope(x.unflatten(2, (heads, d)), (norm.weight, norm.eps), flat)
            t_eager = do_bench(lambda: eager(x, norm, cos, sin, heads), warmup=25, rep=200)
            t_fused = do_bench(lambda: heads_rms_norm_rope(x.unflatten(2, (heads, d)), (norm.weight, norm.eps),
                                                           flat), warmup=25, rep=200)
        gbytes = 2 * x.numel() * x.element_size() / 1e9  # one read + one write at the least
        rows[name] = {"tokens": n, "heads": heads, "eager_ms": t_eager, "fused_ms": t_fused,
                      "speedup": t_eager / t_fused, "fused_GBps_min_traffic": gbytes / (t_fused / 1e3),
                      "differing_fraction": float((out != ref).float().mean()),
                      "max_abs_diff": float((out.float() - ref.float()).abs().max())}
        print(f"{name}: {n} tokens, eager {t_eager:.3f} ms, fused {t_fused:.3f} ms ({t_eager / t_fused:.2f}x), "
              f"{rows[name]['differing_fraction']:.1e} of values differ", flush=True)
    result = {"benchmark": "wan_prologue", "per_tensor": "one of Q or K, one layer", "table_dtype": args.table_dtype,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(), "versions": {"torch": torch.__version__,
                                                                   "triton": triton.__version__,
                                                                   "diffusers": diffusers.__version__},
              "results": rows}
    from sagegen.runs.files import atomic_write_text  # a unique temporary name beside it, removed on failure

    atomic_write_text(args.out, json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
