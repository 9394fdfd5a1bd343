"""Probe: is the attention kernel slower inside a Wan2.1-14B step (147 ms a call in the step's profile) than
alone (~141 ms) because of the GEMMs around it? Times the 720p self-attention call (1 x 40 x 75,600 x 128,
NHD, DIFFUSION_CONFIG) alone, then interleaved with the block's bf16 GEMMs (QKV, O, FFN at Wan's shapes),
each call between CUDA events; run it next to `nvidia-smi -lms` to see the SM clock and power.

    python lab/probes/probe_insitu_clocks.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from probe_util import environment, event_ms, wan_block_workload, write_json  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--blocks", type=int, default=12)
    args = ap.parse_args()
    attn, gemms, _ = wan_block_workload()
    attn()
    gemms()
    alone = [event_ms(attn) for _ in range(args.blocks)]
    mixed, gemm_ms = [], []
    for _ in range(args.blocks):
        gemm_ms.append(event_ms(gemms))
        mixed.append(event_ms(attn))
    res = {"attention_alone_ms": alone, "attention_after_gemms_ms": mixed, "gemms_ms": gemm_ms}
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"attention alone {med(alone):.2f} ms, after the block's GEMMs {med(mixed):.2f} ms "
          f"(GEMMs {med(gemm_ms):.2f} ms)", flush=True)
    write_json(args.out, environment=environment(), results=res)


if __name__ == "__main__":
    main()
