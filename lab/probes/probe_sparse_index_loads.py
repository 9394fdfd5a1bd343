"""Is the block-sparse loop's cost per key tile the index loads' latency? (issue 20's d + 0.05 bound on Triton 3.9)

On 2026-11-30 the sparse call at density 1.0 ran 6-9% slower than the dense one at head dim 128 on Triton 3.9
(0-1% on 3.6). Offline SASS showed Triton 3.9's loop moving each loaded key-tile index into a uniform register a
few instructions after its load, so every key tile waited on a global load. This times the Hopper kernel alone,
this checkout against an older copy (``--base DIR`` holding ``sagegen_base/``, as `ab_versions.py` makes it),
alternating four times: dense (no tile list), every tile listed, and random masks at d = 0.5 / 0.1. Each
launch's output is also compared, bit for bit, between the two versions (`identical`).

Session 35 added the tile list staged in shared memory (``gluon_attn.list_in_smem``); ``--list-limit 128=1024``
turns it on at head dim 128 in this checkout, to measure it there too.

    python lab/probes/probe_sparse_index_loads.py --base /tmp/base --out $OUT/probe-sparse-index-loads.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from bench_sparse import environment, random_block_mask  # noqa: E402
from probe_sparse_fixed_cost import ab_rows, fixed_tiles, quantized_inputs  # noqa: E402
from sagegen import BlockSparse  # noqa: E402
from sagegen.kernels import gluon_attn, triton_attn  # noqa: E402
from sagegen.kernels.block_sparse import kernel_tiles  # noqa: E402

SHAPES = [(1, 24, 32768, 128), (1, 24, 75600, 128), (2, 48, 17776, 64)]


def shape_row(b, h, n, d, gen, base_gluon) -> dict:
    q, cfg, block_q, block_k, out, qq = quantized_inputs(b, h, n, d)
    c = d ** -0.5 * 1.4426950408889634

    def kernel(t, mod):
        return lambda: mod.launch(qq, out, None, None, H=h, group=1, n_q=n, n_k=n, d=d, block_m=block_q,
                                  block_n=block_k, smooth_v=cfg.smooth_v, sm_scale_log2=c,
                                  permuted_v=triton_attn.gluon_permutes_v(), q=q, tiles=t)
    n_qt, n_kt = -(-n // block_q), -(-n // block_k)
    launches = {"dense": lambda mod: kernel(None, mod),
                "all tiles": lambda mod, t=fixed_tiles(b, h, n_qt, n_kt, n_kt, "cuda"): kernel(t, mod)}
    for density in (0.5, 0.1):
        tiles = kernel_tiles(BlockSparse.from_block_dense(random_block_mask(h, n, density, gen), 128, 128),
                             block_q, block_k, n, n)
        launches[f"d={density}"] = lambda mod, t=tiles: kernel(t, mod)
    identical = {}
    for label, make in launches.items():
        make(base_gluon)()
        first = out.clone()
        make(gluon_attn)()
        identical[label] = torch.equal(first, out)
    row = {"shape": [b, h, n, d], "identical": identical, "ab": ab_rows(launches, base_gluon)}
    med = {k: {s: sorted(v[s])[len(v[s]) // 2] for s in ("base", "new")} for k, v in row["ab"].items()}
    row["median_ms"] = med
    row["over_dense"] = {k: {s: m[s] / med["dense"][s] for s in m} for k, m in med.items()}
    print(json.dumps({"shape": row["shape"], "identical": identical, "median_ms": med,
                      "over_dense": row["over_dense"]}), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="a directory holding the older package as sagegen_base/")
    ap.add_argument("--out", required=True)
    ap.add_argument("--list-limit", action="append", default=[], metavar="HD=N",
                    help="set gluon_attn.LIST_LIMIT[HD] = N in this checkout (0 removes it)")
    args = ap.parse_args()
    for item in args.list_limit:
        hd, n = (int(x) for x in item.split("="))
        if n:
            gluon_attn.LIST_LIMIT[hd] = n
        else:
            gluon_attn.LIST_LIMIT.pop(hd, None)
    sys.path.insert(0, args.base)
    base_gluon = importlib.import_module("sagegen_base.kernels.gluon_attn")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = [shape_row(*s, gen, base_gluon) for s in SHAPES]
    with open(args.out, "w") as f:
        json.dump({"environment": environment(), "list_limit": dict(gluon_attn.LIST_LIMIT), "rows": rows}, f,
                  indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
