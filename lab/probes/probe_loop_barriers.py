"""What do the CTA barriers in the Hopper kernel's loop cost? Triton 3.6's shared-memory barrier analysis puts
a `bar.sync` before every mbarrier wait, mbarrier expect and TMA load (it treats the mbarrier as shared memory
written by one thread and read by all): four per loop iteration, where CUDA kernels such as FlashAttention-3
have none (the mbarriers already order those operations). PC sampling (`lab/probes/probe_stalls.py`) counts 4-5% of
the warps' samples stalled on them. This probe compiles a copy of `gluon_attn` through a PTX rewrite (Triton's
`knobs.runtime.add_stages_inspection_hook`) that deletes the barriers in front of those operations after the
kernel's first mbarrier wait (the ones after the mbarrier inits stay), checks the output bit for bit and times
the kernel alone against the unchanged one, alternating.

Why it is safe: the expect and both TMA loads are issued by the same thread (thread 0 of the warpgroup); a
wait that starts before the expect only waits longer; a ring slot is refilled after `warpgroup_mma_wait(0)`,
and a warpgroup's wgmma has finished reading shared memory once any of its warps has passed that wait.

    python lab/probes/probe_loop_barriers.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from probe_util import bench_ms, environment, hopper_call, kernel_source, module_from_source, write_json  # noqa: E402
from sagegen.kernels import gluon_attn  # noqa: E402

SHAPES = [(4, 32, 4096, 128), (4, 32, 8192, 128), (4, 32, 16384, 128), (1, 24, 32768, 128), (1, 24, 4608, 128),
          (4, 32, 16384, 64), (2, 48, 17776, 64), (2, 38, 4429, 64)]
# "all": the four loop barriers; "keep_refill": all but the one before the refill's expect (the barrier that
# makes every warp finish with the slot before thread 0 refills it, in case a wgmma's completion seen by one
# warp did not cover the others' reads)
VARIANTS = {"all": ("mbarrier.try_wait", "mbarrier.arrive.expect_tx", "elect.sync"),
            "keep_refill": ("mbarrier.try_wait", "elect.sync")}
STATS = {}


def strip_loop_barriers(ptx: str, sync_ops=VARIANTS["all"]) -> str:
    """Delete `bar.sync 0;` lines whose next instruction is one of `sync_ops` (an mbarrier wait / expect or a
    TMA issue, `elect.sync`), after the first mbarrier wait of the kernel."""
    lines = ptx.split("\n")
    first_wait = next(i for i, line in enumerate(lines) if "mbarrier.try_wait" in line)
    out, removed = [], 0
    for i, line in enumerate(lines):
        if i > first_wait and re.fullmatch(r"\s*bar\.sync\s+0;", line):
            j = i + 1
            while j < len(lines) and re.match(r"\s*(//|\{|\.reg|\.loc|waitLoop:|$)", lines[j]):
                j += 1
            if j < len(lines) and any(op in lines[j] for op in sync_ops):
                removed += 1
                continue
        out.append(line)
    STATS["removed"] = removed
    return "\n".join(out)


def probe_module(variant: str):
    src = kernel_source(gluon_attn)
    anchor = '    gl.static_assert(BLOCK_M == 16 * gl.num_warps(), "one warpgroup per 64 rows")\n'
    assert anchor in src, "gluon_attn changed: update the probe"
    # a comment inside the kernel's source: its own cache key, so it is compiled (through the hook), not reused
    src = src.replace(anchor, anchor + f"    # probe copy: loop barriers stripped from the PTX ({variant})\n")
    return module_from_source(src, f"gluon_attn_nobar_{variant}")


def install_hook(variant: str):
    import triton

    def hook(backend, stages, options, language, capability):
        make_ptx = stages["ptx"]

        def ptx_stage(src, metadata):
            ptx = make_ptx(src, metadata)
            return strip_loop_barriers(ptx, VARIANTS[variant]) if metadata.get("name") == "_attn_fwd_sm90" else ptx

        stages["ptx"] = ptx_stage

    triton.knobs.runtime.add_stages_inspection_hook = hook


def main():
    import triton
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    mods = {name: probe_module(name) for name in VARIANTS}
    rows = []
    for b, h, n, d in SHAPES:
        q, k, v, qq, kw = hopper_call(b, h, n, d)
        ref, out = torch.empty_like(q), torch.empty_like(q)
        gluon_attn.launch(qq, ref, None, None, **kw)  # compiled without the hook
        torch.cuda.synchronize()
        tf = lambda ms: 4 * b * h * n * n * d / ms / 1e9
        row = {"shape": [b, h, n, d], "sdpa_default": tf(bench_ms(lambda: F.scaled_dot_product_attention(q, k, v)))}
        for name, mod in mods.items():
            install_hook(name)
            triton.knobs.compilation.always_compile = True
            try:
                out.zero_()
                mod.launch(qq, out, None, None, **kw)
                torch.cuda.synchronize()
            finally:
                triton.knobs.runtime.add_stages_inspection_hook = None
                triton.knobs.compilation.always_compile = False
            row[f"{name}_removed"] = STATS.pop("removed", None)  # None: compiled before (cached)
            row[f"{name}_equal"] = bool(torch.equal(out, ref))
        for rep in (1, 2):
            for name, m in (("kernel", gluon_attn), *mods.items()):
                row[f"{name}#{rep}"] = tf(bench_ms(lambda: m.launch(qq, out, None, None, **kw)))
        rows.append(row)
        print(json.dumps({k_: round(v_, 1) if isinstance(v_, float) else v_ for k_, v_ in row.items()}), flush=True)
        q = k = v = qq = ref = out = None  # free before the next shape
        torch.cuda.empty_cache()
    write_json(args.out, environment=environment(), unit="TFLOP/s, kernel alone", rows=rows)


if __name__ == "__main__":
    main()
