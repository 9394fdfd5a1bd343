"""Issue 20 at density 0.1: does a low-density block-sparse call gain from Q quantized by the separate pass
(read by TMA next to the first K/V tiles) instead of inside each CTA, or from the persistent kernel?

Full `sageattn` calls with a random 128 x 128 block mask (diagonal kept, as bench_sparse.py), alternating the
variants (gluon_attn.QUANT_Q_IN_KERNEL, gluon_attn.PERSISTENT_SPARSE) four times; FlexAttention (compiled,
same blocks) on the first shape. JSON to --out.

    python bench/probes/probe_sparse_q_source.py --out $OUT/probe-sparse-q-source.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import sagegen  # noqa: E402
from bench_sparse import environment, flex_mask, random_block_mask, time_ms  # noqa: E402
from sagegen import BlockSparse  # noqa: E402
from sagegen.kernels import gluon_attn  # noqa: E402

SHAPES = [(2, 48, 17776, 64), (1, 24, 32768, 128)]
VARIANTS = {"q_in_kernel": (True, False), "q_pass": (False, False), "persistent": (True, True)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    with torch.inference_mode():
        for i, (b, h, n, d) in enumerate(SHAPES):
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for density in (0.1, 0.3):
                blocks = random_block_mask(h, n, density, gen)
                bs = BlockSparse.from_block_dense(blocks, 128, 128)
                row = {"shape": [b, h, n, d], "density": blocks.float().mean().item(),
                       "ms": {k_: [] for k_ in VARIANTS}}
                outs = {}
                for _ in range(4):
                    for name, (q_in, persistent) in VARIANTS.items():
                        gluon_attn.QUANT_Q_IN_KERNEL, gluon_attn.PERSISTENT_SPARSE = q_in, persistent
                        fn = lambda: sagegen.sageattn(q, k, v, backend="triton", block_mask=bs)  # noqa: E731
                        row["ms"][name].append(time_ms(fn))
                        outs[name] = fn()
                gluon_attn.QUANT_Q_IN_KERNEL, gluon_attn.PERSISTENT_SPARSE = True, True
                row["median_ms"] = {k_: sorted(v_)[1:3] for k_, v_ in row["ms"].items()}
                row["equal_to_q_in_kernel"] = {k_: torch.equal(o, outs["q_in_kernel"]) for k_, o in outs.items()}
                if i == 0:
                    bm = flex_mask(blocks, n)
                    row["flex_ms"] = time_ms(lambda: flex(q, k, v, block_mask=bm))
                print(json.dumps(row), flush=True)
                rows.append(row)
    with open(args.out, "w") as f:
        json.dump({"probe": "sparse_q_source", "environment": environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
