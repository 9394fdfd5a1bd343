"""How K's per-block scale reaches the Hopper kernel's loop (`kscale_kernel.py`, KS_MODE 0 / 1 / 2): the kernel
alone on the same quantized buffers, modes timed in turn for several rounds, dense and block-sparse (d = 0.1,
random 128 x 128 blocks as bench_sparse.py), head dims 64 and 128. Mode 2 must equal mode 0 bit for bit (the
same scale, read from shared memory instead of global memory); mode 1 is wrong on purpose (timing bound).

    python bench/probes/probe_kscale.py --out $OUT/probe-kscale.json [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import kscale_kernel  # noqa: E402
import sagegen  # noqa: E402
from bench_sparse import environment, random_block_mask, time_ms  # noqa: E402
from sagegen import BlockSparse  # noqa: E402
from sagegen.kernels import gluon_attn, triton_attn, triton_quant  # noqa: E402
from sagegen.kernels.block_sparse import kernel_tiles  # noqa: E402

SHAPES = [(2, 48, 17776, 64), (1, 24, 32768, 128), (1, 40, 75600, 128)]


def shape_rows(b, h, n, d, gen, rounds: int, smooth_v: bool) -> dict:
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k = k + torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16) * 4  # a channel bias, as real K has
    cfg = sagegen.SageConfig(smooth_v=smooth_v)
    block_q, block_k = cfg.blocks(d, torch.cuda.get_device_capability())
    qq = triton_quant.quantize(q, k, v, cfg, block_q, block_k, d, None, permute_v_keys=triton_attn.gluon_permutes_v(),
                               quantize_q=False)
    blocks = random_block_mask(h, n, 0.1, gen)
    tiles = kernel_tiles(BlockSparse.from_block_dense(blocks, 128, 128), block_q, block_k, n, n)
    c = d ** -0.5 * 1.4426950408889634
    outs = {}

    def kernel(mode, t):
        out = outs.setdefault((mode, t is None), torch.empty_like(q))
        args = dict(H=h, group=1, n_q=n, n_k=n, d=d, block_m=block_q, block_n=block_k, smooth_v=smooth_v,
                    sm_scale_log2=c, permuted_v=triton_attn.gluon_permutes_v(), q=q, tiles=t)
        if mode == "shipped":
            return lambda: gluon_attn.launch(qq, out, None, None, **args)
        return lambda: kscale_kernel.launch(qq, out, None, None, ks_mode=mode, **args)

    row = {"shape": [b, h, n, d], "smooth_v": smooth_v, "density": blocks.float().mean().item()}
    flops = 4 * b * h * n * n * d
    for label, t in (("dense", None), ("sparse_d0.1", tiles)):
        modes = ["shipped", 0, 1, 2]
        for m in modes:
            kernel(m, t)()
        torch.cuda.synchronize()
        ref = outs[("shipped", t is None)]
        same = {str(m): bool(torch.equal(outs[(m, t is None)], ref)) for m in (0, 2)}
        times = {str(m): [] for m in modes}
        for _ in range(rounds):
            for m in modes:
                times[str(m)].append(time_ms(kernel(m, t)))
        med = {m: statistics.median(x) for m, x in times.items()}
        row[label] = {"bit_identical_to_shipped": same, "ms": times, "median_ms": med,
                      "mode2_over_mode0": med["2"] / med["0"], "mode1_over_mode0": med["1"] / med["0"],
                      "mode0_over_shipped": med["0"] / med["shipped"]}
        if t is None:
            row[label]["tflops_mode0"] = flops / med["0"] * 1e-9
            row[label]["tflops_mode2"] = flops / med["2"] * 1e-9
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="all", help="'all' or indices into SHAPES, e.g. 0,1")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    rows = []
    with torch.inference_mode():
        for shape in shapes:
            rows.append(shape_rows(*shape, gen, args.rounds, smooth_v=shape[3] == 128))
            torch.cuda.empty_cache()
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"probe": "kscale", "environment": environment(), "rows": rows}, f, indent=1)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
