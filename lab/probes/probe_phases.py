"""Where a loop iteration of the Hopper Gluon kernel spends its cycles: a probe copy of `gluon_attn` reads the
SM clock (%clock) at five points of every steady-state iteration and stores them for the first CTAs of head 0
(thread 0 of each). Phases: ring wait + Q·Kᵀ(j+1) issue, softmax(j) to FP8 P, the wait for P·V(j) (and
Q·Kᵀ(j+1)), accumulator update + ring refill. The clock reads cost a little themselves; read the split, not
the totals.

    python lab/probes/probe_phases.py [--shape 4 32 8192 128] [--out probe.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import sagegen  # noqa: E402
from sagegen.kernels import gluon_attn, triton_quant  # noqa: E402

PHASES = ["ring wait + QK issue", "softmax -> P", "wait P·V and QK", "acc update + refill"]
SAMPLED_Q_BLOCKS = 8  # q-blocks 0..7 of (batch 0, head 0)
ITERS = 64


def _patched_source() -> str:
    src = open(gluon_attn.__file__).read().replace("from .spec import", "from sagegen.kernels.spec import")
    edits = [
        ("    for j in range(0, n_blocks - 1):\n        nxt = j + 1\n",
         "    for j in range(0, n_blocks - 1):\n        _stamp(CLK, start_m, pid_bh, j, 0)\n        nxt = j + 1\n"),
        ("        ks_next = gl.load(ks_base + nxt * BLOCK_N)\n",
         "        _stamp(CLK, start_m, pid_bh, j, 1)\n        ks_next = gl.load(ks_base + nxt * BLOCK_N)\n"),
        ("        slot = j % STAGES\n        pv_tok",
         "        slot = j % STAGES\n        _stamp(CLK, start_m, pid_bh, j, 2)\n        pv_tok"),
        ("        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1) + pv\n        if j + STAGES",
         "        _stamp(CLK, start_m, pid_bh, j, 3)\n"
         "        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1) + pv\n        if j + STAGES"),
        ("        ks = ks_next\n", "        ks = ks_next\n        _stamp(CLK, start_m, pid_bh, j, 4)\n"),
        ("PERMUTED_V: gl.constexpr,\n):", "PERMUTED_V: gl.constexpr, CLK=None,\n):"),
    ]
    for old, new in edits:
        assert src.count(old) >= 1, f"gluon_attn changed: update the probe ({old[:40]!r})"
        src = src.replace(old, new, 1)
    src = src.replace("@gluon.jit\ndef _attn_fwd_sm90(", '''@gluon.jit
def _stamp(CLK, start_m, pid_bh, j, point: gl.constexpr):
    if (pid_bh == 0) & (start_m < 8) & (j < 64):
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        tid = gl.arange(0, 32 * gl.num_warps(), layout=lay)
        clk = gl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r,r", [tid], dtype=gl.int32, is_pure=False,
                                        pack=1)
        gl.store(CLK + (start_m * 64 + j) * 5 + point + tid * 0, clk, mask=tid == 0)


@gluon.jit
def _attn_fwd_sm90(''', 1)
    # the launcher passes the clock buffer through
    src = src.replace("        SMOOTH_V=smooth_v, RETURN_LSE=lse is not None, PERMUTED_V=permuted_v,"
                      " num_warps=4, **extra,",
                      "        SMOOTH_V=smooth_v, RETURN_LSE=lse is not None, PERMUTED_V=permuted_v, CLK=CLOCKS[0],"
                      " num_warps=4, **extra,")
    return src + "\nCLOCKS = [None]\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", type=int, nargs=4, default=[4, 32, 8192, 128])
    ap.add_argument("--stages", type=int, help="K/V ring slots (5 at head dim 128: one CTA per SM by shared memory)")
    ap.add_argument("--out")
    args = ap.parse_args()
    path = os.path.join(tempfile.mkdtemp(), "gluon_attn_phases.py")
    with open(path, "w") as f:
        f.write(_patched_source())
    spec = importlib.util.spec_from_file_location("gluon_attn_phases", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    b, h, n, d = args.shape
    if args.stages:
        mod.LAUNCH_OVERRIDES[d] = (args.stages, None)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qq = triton_quant.quantize(q, k, v, sagegen.SageConfig(), 64, 128, d, permute_v_keys=True)
    out = torch.empty_like(q)
    clocks = torch.zeros(SAMPLED_Q_BLOCKS * ITERS * 5, dtype=torch.int32, device="cuda")
    mod.CLOCKS[0] = clocks
    for _ in range(3):  # the last run's stamps are kept
        mod.launch(qq, out, None, None, H=h, group=1, n_q=n, n_k=n, d=d, block_m=64, block_n=128, smooth_v=False,
                   sm_scale_log2=d**-0.5 * 1.4426950408889634)
    torch.cuda.synchronize()
    t = clocks.view(SAMPLED_Q_BLOCKS, ITERS, 5).long().cpu()
    rows = []
    for p in range(4):
        dt = ((t[:, 4:, p + 1] - t[:, 4:, p]) % 2**32).flatten().tolist()  # skip the first iterations
        rows.append({"phase": PHASES[p], "median_clk": statistics.median(dt), "mean_clk": statistics.mean(dt)})
    per_iter = ((t[:, 5:, 0] - t[:, 4:-1, 0]) % 2**32).flatten().tolist()
    total = statistics.median(per_iter)
    for r in rows:
        print(f"{r['phase']:>22}: median {r['median_clk']:7.0f} clk ({100 * r['median_clk'] / total:4.1f}%)")
    print(f"{'iteration':>22}: median {total:7.0f} clk (shape {args.shape}, stages {args.stages or 'default'})")
    if args.out:
        env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "date": __import__("datetime").date.today().isoformat()}
        with open(args.out, "w") as f:
            json.dump({"environment": env, "shape": args.shape, "stages": args.stages, "phases": rows,
                       "iteration_median_clk": total}, f, indent=1)


if __name__ == "__main__":
    main()
