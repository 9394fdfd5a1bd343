"""Three CTAs per SM at head dim 128 with 128-key blocks? Times the Hopper kernel alone next to a variant file
(`--module`: commit 17d5f88's `gluon_attn`, whose SPLIT_PV path issues P·V in two head-dim halves and keeps
no Q·Kᵀ in flight during the softmax, switched on for 128-key blocks by SPLIT_128 = True): that path fits in
168 registers with no spills (Triton 3.6, bench/compile_check.py), so with two ring slots (74 KB of shared
memory) three CTAs share an SM. Outputs compared bit for bit with the kernel's. Timing only of the kernel
(the quantization pass is the same for both).

    git show 17d5f88:sagegen/kernels/gluon_attn.py > abbase/gluon_split.py   # then see NOTES v3.9
    python bench/probe_split_pv128.py --module abbase/gluon_split.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import sagegen  # noqa: E402
from sagegen.kernels import gluon_attn, triton_quant  # noqa: E402

SHAPES = [(4, 32, 4096, 128), (4, 32, 8192, 128), (4, 32, 16384, 128), (1, 24, 32768, 128), (1, 24, 4608, 128)]
VARIANTS = {"split_2slots": (2, None), "split_3slots": (3, None), "split_2slots_again": (2, None)}


def main():
    import triton
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--module", required=True)
    ap.add_argument("--out")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("gluon_split", args.module)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.splits_pv(128, 128), "the variant file must split P·V for 128-key blocks"
    bench = lambda f: triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median")
    cfg = sagegen.SageConfig()
    rows = []
    for b, h, n, d in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qq = triton_quant.quantize(q, k, v, cfg, 64, 128, d, permute_v_keys=True, quantize_q=False)
        kw = dict(H=h, group=1, n_q=n, n_k=n, d=d, block_m=64, block_n=128, smooth_v=False,
                  sm_scale_log2=d**-0.5 * 1.4426950408889634, q=q)
        ref, out = torch.empty_like(q), torch.empty_like(q)
        gluon_attn.launch(qq, ref, None, None, **kw)
        tf = lambda ms: 4 * b * h * n * n * d / ms / 1e9
        row = {"shape": [b, h, n, d], "sdpa_default": tf(bench(lambda: F.scaled_dot_product_attention(q, k, v))),
               "kernel": tf(bench(lambda: gluon_attn.launch(qq, out, None, None, **kw)))}
        for name, setting in VARIANTS.items():
            mod.LAUNCH_OVERRIDES[(128, 128)] = setting
            out.zero_()
            mod.launch(qq, out, None, None, **kw)
            torch.cuda.synchronize()
            row[f"{name}_equal"] = bool(torch.equal(out, ref))
            row[name] = tf(bench(lambda: mod.launch(qq, out, None, None, **kw)))
        row["kernel_again"] = tf(bench(lambda: gluon_attn.launch(qq, out, None, None, **kw)))
        rows.append(row)
        print(json.dumps({k_: round(v_, 1) if isinstance(v_, float) else v_ for k_, v_ in row.items()}), flush=True)
        del q, k, v, qq, ref, out
        torch.cuda.empty_cache()
    if args.out:
        env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "date": datetime.date.today().isoformat(), "variant": "17d5f88 gluon_attn, SPLIT_PV for 128-key blocks"}
        with open(args.out, "w") as f:
            json.dump({"environment": env, "unit": "TFLOP/s, kernel alone", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
