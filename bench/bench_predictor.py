"""Block-sparse predictor overhead and end-to-end sparse attention on the GPU (issue 20, sections 2 and 5).

For each shape: the dense sagegen call, the predictor alone (`sagegen::sparse_blocks`: pooled Q/K launch,
block scores, top-k / cdf, always-keep rules), and the full `sageattn(sparse=...)` call, on synthetic
video-like inputs (`sagegen.testing.attention_inputs`: attention decays with grid distance) at top-k 0.5 / 0.3 and
cdf 0.95; plus the realized density, the attention mass the mask keeps (sampled query rows, fp64) and the
error vs dense. Target: predictor <= 5% of the dense call at >= 32k tokens.

    python bench/bench_predictor.py --out bench/results/sparse-predictor-<gpu>-<date>.json [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import sagegen  # noqa: E402
from sagegen import SparseConfig  # noqa: E402
from sagegen.testing import attention_inputs as synthetic  # noqa: E402
from sagegen.sparse.op import sparse_block_mask  # noqa: E402

# B, H, (frames, height, width) latent grid in tokens, D
SHAPES = [
    (1, 24, (8, 64, 64), 128),    # 32,768 tokens
    (1, 24, (21, 45, 80), 128),   # 75,600: Wan2.1 / HunyuanVideo-like 720p x 81 frames
    (2, 48, (13, 30, 45), 64),    # 17,550: CogVideoX-5b-like
]
QUICK = [SHAPES[0]]
MODES = [("topk", 0.5), ("topk", 0.3), ("cdf", 0.95)]


def bench_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100))


def inputs(b, h, grid, d):
    """Video-like q/k/v built on the CPU per head (cheap at 1 head) and tiled over heads/batch on the GPU."""
    g = torch.Generator().manual_seed(0)
    q, k, v = synthetic.video_qkv(*grid, heads=1, head_dim=d, generator=g)
    rep = lambda t: t.to("cuda").expand(b, h, -1, -1).contiguous()
    return rep(q), rep(k), rep(v)


def kept_mass(q, k, keep_dense_rows, rows, scale):
    """Mean attention mass (fp64) inside the mask over sampled query rows of head 0."""
    s = (q[0, 0, rows].double() @ k[0, 0].double().T) * scale
    p = torch.softmax(s, dim=-1)
    return float((p * keep_dense_rows).sum(-1).mean())


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_predictor.py needs a CUDA GPU")
    cfg0 = sagegen.DIFFUSION_CONFIG
    rows_out = []
    for b, h, grid, d in (QUICK if args.quick else SHAPES):
        q, k, v = inputs(b, h, grid, d)
        n = q.shape[2]
        scale = d ** -0.5
        dense_ms = bench_ms(lambda: sagegen.sageattn(q, k, v, config=cfg0, backend="triton"))
        dense = sagegen.sageattn(q, k, v, config=cfg0, backend="triton")
        entry = {"B": b, "H": h, "grid": list(grid), "N": n, "D": d, "dense_ms": dense_ms, "modes": {}}
        rows = torch.randint(0, n, (256,), device="cuda")
        for mode, value in MODES:
            sp = SparseConfig(mode=mode, value=value)
            pred = lambda: sparse_block_mask(q, k, sp, tensor_layout="HND", attn_mask=None, sm_scale=scale,
                                             config=cfg0)
            pred_ms = bench_ms(pred)
            full_ms = bench_ms(lambda: sagegen.sageattn(q, k, v, config=cfg0, backend="triton", sparse=sp))
            bs = pred()
            out = sagegen.sageattn(q, k, v, config=cfg0, backend="triton", block_mask=bs)
            blocks = bs.to_block_dense()[0, 0]  # [NQB, NKB] of batch 0, head 0
            keep_rows = blocks[rows // bs.block_q].repeat_interleave(bs.block_kv, 1)[:, :n].double()
            err = float((out.float() - dense.float()).norm() / dense.float().norm())
            entry["modes"][f"{mode}={value}"] = {
                "predictor_ms": pred_ms, "predictor_share_of_dense": pred_ms / dense_ms,
                "sparse_call_ms": full_ms, "speedup_vs_dense": dense_ms / full_ms,
                "density": float(bs.counts.float().mean() / bs.indices.shape[-1]),
                "kept_mass_head0": kept_mass(q, k, keep_rows, rows, scale),
                "rel_l2_vs_dense": err,
            }
            m = entry["modes"][f"{mode}={value}"]
            print(f"N={n} D={d} {mode}={value}: dense {dense_ms:.2f} ms, predictor {pred_ms:.3f} ms "
                  f"({100 * m['predictor_share_of_dense']:.1f}%), sparse {full_ms:.2f} ms "
                  f"({m['speedup_vs_dense']:.2f}x) density {m['density']:.3f} mass {m['kept_mass_head0']:.4f} "
                  f"err {err:.4f}", flush=True)
        rows_out.append(entry)
        q = k = v = dense = out = None  # free before the next shape (not del: the lambdas name them)
        torch.cuda.empty_cache()
    import triton

    report = {"benchmark": "sparse_predictor", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                  timespec="seconds"),
              "device": torch.cuda.get_device_name(), "versions": {"torch": torch.__version__,
                                                                   "triton": triton.__version__},
              "results": rows_out}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    from sagegen.runs.files import atomic_write_text  # a unique temporary name beside it, removed on failure

    atomic_write_text(args.out, json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
