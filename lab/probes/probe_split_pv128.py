"""Three CTAs per SM at head dim 128 with 128-key blocks? Times the Hopper kernel alone next to a variant file
(`--module`: commit 17d5f88's `gluon_attn`, whose SPLIT_PV path issues P·V in two head-dim halves and keeps
no Q·Kᵀ in flight during the softmax, switched on for 128-key blocks by SPLIT_128 = True): that path fits in
168 registers with no spills (Triton 3.6, bench/compile_check.py), so with two ring slots (74 KB of shared
memory) three CTAs share an SM. Outputs compared bit for bit with the kernel's. Timing only of the kernel
(the quantization pass is the same for both).

    mkdir -p abbase && git show 17d5f88:sagegen/kernels/gluon_attn.py \
      | sed 's/return head_dim >= 128 and block_n == 64/return head_dim >= 128 and (block_n == 64 or SPLIT_128)/' \
      > abbase/gluon_split.py && echo "SPLIT_128 = True" >> abbase/gluon_split.py
    python lab/probes/probe_split_pv128.py --module abbase/gluon_split.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from probe_util import bench_ms, environment, hopper_call, module_from_source, write_json  # noqa: E402
from sagegen.kernels import gluon_attn  # noqa: E402

SHAPES = [(4, 32, 4096, 128), (4, 32, 8192, 128), (4, 32, 16384, 128), (1, 24, 32768, 128), (1, 24, 4608, 128)]
VARIANTS = {"split_2slots": (2, None), "split_3slots": (3, None), "split_2slots_again": (2, None)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", required=True)
    ap.add_argument("--out")
    args = ap.parse_args()
    src = open(args.module).read().replace("from .spec import", "from sagegen.kernels.spec import")
    mod = module_from_source(src, "gluon_split")
    assert mod.splits_pv(128, 128), "the variant file must split P·V for 128-key blocks"
    rows = []
    for b, h, n, d in SHAPES:
        q, k, v, qq, kw = hopper_call(b, h, n, d)
        ref, out = torch.empty_like(q), torch.empty_like(q)
        gluon_attn.launch(qq, ref, None, None, **kw)
        tf = lambda ms: 4 * b * h * n * n * d / ms / 1e9
        row = {"shape": [b, h, n, d], "sdpa_default": tf(bench_ms(lambda: F.scaled_dot_product_attention(q, k, v))),
               "kernel": tf(bench_ms(lambda: gluon_attn.launch(qq, out, None, None, **kw)))}
        for name, setting in VARIANTS.items():
            mod.LAUNCH_OVERRIDES[(128, 128)] = setting
            out.zero_()
            mod.launch(qq, out, None, None, **kw)
            torch.cuda.synchronize()
            row[f"{name}_equal"] = bool(torch.equal(out, ref))
            row[name] = tf(bench_ms(lambda: mod.launch(qq, out, None, None, **kw)))
        row["kernel_again"] = tf(bench_ms(lambda: gluon_attn.launch(qq, out, None, None, **kw)))
        rows.append(row)
        print(json.dumps({k_: round(v_, 1) if isinstance(v_, float) else v_ for k_, v_ in row.items()}), flush=True)
        q = k = v = qq = ref = out = None  # free before the next shape
        torch.cuda.empty_cache()
    write_json(args.out, environment=environment(variant="17d5f88 gluon_attn, SPLIT_PV for 128-key blocks"),
               unit="TFLOP/s, kernel alone", rows=rows)


if __name__ == "__main__":
    main()
