"""Is the Hopper Gluon kernel bound by its K/V tile traffic (L2 -> shared memory)? Times the kernel alone on
quantized buffers next to a variant that loads only the first ring's worth of K/V tiles and then computes on
those stale tiles (same instructions, same waits, no L2 traffic after the prologue). Timing only: the variant's
output is meaningless.

    python bench/probe_l2.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import sagegen  # noqa: E402,F401
from probe_util import kernel_source, module_from_source  # noqa: E402
from sagegen.kernels import gluon_attn, triton_quant  # noqa: E402

SHAPES = [(4, 32, 8192, 128), (4, 32, 16384, 128), (2, 48, 17776, 64)]


def stale_tiles_module():
    """gluon_attn with the loop's ring refills removed and every ring wait made to pass at once."""
    src = kernel_source(gluon_attn)
    loop_wait = "        mbarrier.wait(bars.index(nxt % STAGES), (nxt // STAGES) & 1)\n"
    refill = ("        if j + STAGES < n_blocks:\n"
              "            _issue_kv(k_desc, v_desc, k_smem, v_smem, bars, kv_row0, v_row0, j + STAGES, STAGES, BLOCK_N)\n")
    assert loop_wait in src and refill in src, "gluon_attn changed: update the probe"
    src = src.replace(loop_wait, "        mbarrier.wait(bars.index(nxt % STAGES), 0)\n").replace(refill, "")
    return module_from_source(src, "gluon_attn_stale")


def main():
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    stale = stale_tiles_module()
    cfg = sagegen.SageConfig()
    rows = []
    for b, h, n, d in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qq = triton_quant.quantize(q, k, v, cfg, 64, 128, d, permute_v_keys=True)
        out = torch.empty_like(q)
        row = {"shape": [b, h, n, d]}
        for name, mod in (("kernel", gluon_attn), ("kernel_stale_tiles", stale)):
            run = lambda: mod.launch(qq, out, None, None, H=h, group=1, n_q=n, n_k=n, d=d, block_m=64, block_n=128,
                                     smooth_v=False, sm_scale_log2=d**-0.5 * 1.4426950408889634)
            ms = triton.testing.do_bench(run, warmup=50, rep=300, return_mode="median")
            row[name] = 4 * b * h * n * n * d / ms / 1e9
        tile_bytes = (b * h) * (n // 64) * n * (2 * d)  # K and V tiles (8-bit) streamed per query block
        row["l2_to_smem_TBps"] = tile_bytes / (4 * b * h * n * n * d / row["kernel"] / 1e12) / 1e12
        rows.append(row)
        print(f"{b},{h},{n},{d}: kernel {row['kernel']:.0f} TFLOP/s, stale tiles {row['kernel_stale_tiles']:.0f}; "
              f"K/V tiles streamed at {row['l2_to_smem_TBps']:.2f} TB/s", flush=True)
    if args.out:
        env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "date": __import__("datetime").date.today().isoformat()}
        with open(args.out, "w") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
