"""Probe: the Hopper kernel with 128-row query tiles (two warpgroups, 8 warps, one CTA per SM) against the
shipped 64-row tiles (three CTAs per SM) on block-sparse calls, where each CTA's fixed cost (Q load and
quantization, the first TMA wait, the epilogue) weighs most (lab/NOTES.md v5.8). Same numerics (per-token
Q scales, 128-key K blocks): the outputs must be equal. Timed in alternating rounds on the same buffers.

    python lab/probes/probe_sparse_block_m.py --out /tmp/out/probe-sparse-block-m.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sagegen  # noqa: E402
from bench_sparse import environment, random_block_mask, time_ms  # noqa: E402
from sagegen.kernels import gluon_attn, triton_attn  # noqa: E402
from sagegen.kernels.block_sparse import BlockSparse  # noqa: E402

_stock_applies = triton_attn.gluon_applies
_stock_launch = gluon_attn.launch
_stock_kernel = gluon_attn._attn_fwd_sm90


def _applies(capability, config, d_pad, blocks, *args, **kwargs):
    blocks = (64, 128) if tuple(blocks) == (128, 128) else blocks  # the probe runs 128-row tiles on Gluon too
    return _stock_applies(capability, config, d_pad, blocks, *args, **kwargs)


class _Warps:
    """The kernel launcher with num_warps = BLOCK_M / 16 (one warpgroup per 64 rows)."""

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            kwargs["num_warps"] = kwargs["BLOCK_M"] // 16
            return _stock_kernel[grid](*args, **kwargs)
        return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    triton_attn.gluon_applies = _applies
    gluon_attn._attn_fwd_sm90 = _Warps()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for shape in ([2, 48, 17776, 64], [1, 24, 32768, 64]):
        b, h, n, d = shape
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for target in (0.1, 0.3, 1.0):
            blocks = random_block_mask(h, n, target, gen)
            bs = BlockSparse.from_block_dense(blocks, 128, 128)
            calls = {name: (lambda cfg=cfg: sagegen.sageattn(q, k, v, backend="triton", block_mask=bs, config=cfg))
                     for name, cfg in (("rows64", sagegen.DIFFUSION_CONFIG),
                                       ("rows128", sagegen.DIFFUSION_CONFIG.replace(block_q=128)))}
            equal = bool(torch.equal(calls["rows64"](), calls["rows128"]()))
            times = {name: [] for name in calls}
            for _ in range(args.rounds):
                for name, fn in calls.items():
                    times[name].append(time_ms(fn))
            row = {"shape": shape, "density": round(blocks.float().mean().item(), 4), "outputs_equal": equal,
                   **{f"{k}_ms": sorted(t)[len(t) // 2] for k, t in times.items()}, "rounds": times}
            row["rows64_over_rows128"] = row["rows64_ms"] / row["rows128_ms"]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"probe": "sparse_block_m", "environment": environment(), "rows": rows},
                                         indent=1))


if __name__ == "__main__":
    main()
