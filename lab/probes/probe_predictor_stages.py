"""Probe: where the block-mask predictor's time goes at 32k and 75.6k tokens (hd128, 24 heads): each stage
timed alone (triton.testing.do_bench) and a CUDA kernel table of one `sparse_blocks` call.

    python lab/probes/probe_predictor_stages.py
"""

from __future__ import annotations

import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import sagegen  # noqa: E402
from sagegen import SparseConfig  # noqa: E402
from sagegen.kernels.block_sparse import compact  # noqa: E402
from sagegen.sparse import pool, predictor  # noqa: E402
from sagegen.sparse.op import sparse_block_mask  # noqa: E402


def ms(fn):
    return float(triton.testing.do_bench(fn, warmup=10, rep=50))


def main():
    cfg0 = sagegen.DIFFUSION_CONFIG
    for n in (32_768, 75_600):
        q = torch.randn(1, 24, n, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn_like(q)
        bq, bkv = cfg0.blocks(128, torch.cuda.get_device_capability())
        sp = SparseConfig(mode="topk", value=0.5)
        scale = 128 ** -0.5
        stats = (pool.pool_blocks(q, bq), pool.pool_blocks(k, bkv))
        live = predictor.live_key_counts(n, bkv, None, 1, q.device)
        p = predictor.block_scores(stats[0][0], stats[1][0], scale, live)
        keep = predictor.select(p, "topk", 0.5)
        stages = {
            "dense attention": lambda: sagegen.sageattn(q, k, q, config=cfg0, backend="triton"),
            "whole predictor op": lambda: sparse_block_mask(q, k, sp, tensor_layout="HND", attn_mask=None,
                                                            sm_scale=scale, config=cfg0),
            "center(q)": lambda: pool.center(q),
            "pool q": lambda: pool.pool_blocks(q, bq),
            "pool k": lambda: pool.pool_blocks(k, bkv),
            "block_scores": lambda: predictor.block_scores(stats[0][0], stats[1][0], scale, live),
            "select topk": lambda: predictor.select(p, "topk", 0.5),
            "always_keep": lambda: predictor.always_keep(sp, stats[0][1], stats[1][1], 24, n, n, bq, bkv, q.device),
            "compact": lambda: compact(keep),
        }
        print(f"N={n} blocks {bq}x{bkv} keep {tuple(keep.shape)}")
        for name, fn in stages.items():
            print(f"  {name:20s} {ms(fn):8.3f} ms", flush=True)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            sparse_block_mask(q, k, sp, tensor_layout="HND", attn_mask=None, sm_scale=scale, config=cfg0)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))


if __name__ == "__main__":
    main()
