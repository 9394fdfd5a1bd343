"""The fused GELU + FP8 quantizer in one power-of-two tile against chunks (two passes, the scale from
GELU(max x)), at the MLP down-projection inputs of the models; a few chunk launches; interleaved rounds.

Also checks, per shape, that the chunked codes and scales equal the one-tile kernel's bit for bit (random rows
never reach the amax floor), and times the plain quantizer of the same tensor and a bf16 -> fp8 cast as the
traffic reference.

    python lab/probes/probe_gelu_chunks.py --out $OUT/probe-gelu-chunks.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from probe_util import environment, interleaved_ms, write_json  # noqa: E402

from sagegen.kernels import fp8_quant  # noqa: E402

# (label, M, K): the MLP down projections' inputs at the presets' sizes (bench_fp8_linear.SHAPES + Wan 1.3B,
# Wan2.2-5B and Qwen-Image)
SHAPES = [("flux ff down", 4096, 12288), ("sd3.5 ff down", 8192, 9728), ("qwen-image ff down", 13778, 12288),
          ("wan1.3b ffn down", 32760, 8960), ("cogvideox ff down", 35552, 12288),
          ("wan2.2-5b ffn down", 27280, 14336), ("wan14b ffn down", 75600, 13824),
          ("hunyuanvideo ff down", 119312, 12288)]
# (label, quantize_fp8_rows overrides)
VARIANTS = [("one_tile", dict(chunked=False)), ("default", {}),
            ("chunk1024_m1_w4", dict(chunked=True, chunk_k=1024, block_m=1, num_warps=4)),
            ("chunk2048_m2_w8", dict(chunked=True, chunk_k=2048, block_m=2, num_warps=8)),
            ("chunk2048_m1_w8", dict(chunked=True, chunk_k=2048, block_m=1, num_warps=8)),
            ("chunk2048_m4_w8", dict(chunked=True, chunk_k=2048, block_m=4, num_warps=8)),
            ("chunk2048_m2_w16", dict(chunked=True, chunk_k=2048, block_m=2, num_warps=16)),
            ("chunk4096_m1_w8", dict(chunked=True, chunk_k=4096, block_m=1, num_warps=8)),
            ("chunk4096_m1_w16", dict(chunked=True, chunk_k=4096, block_m=1, num_warps=16)),
            ("chunk4096_m2_w16", dict(chunked=True, chunk_k=4096, block_m=2, num_warps=16))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for label, M, K in SHAPES:
        x = (torch.randn(M, K, device="cuda") * 2).to(torch.bfloat16)
        fns = {name: (lambda kw=kw: fp8_quant.quantize_fp8_rows(x, prologue="gelu_tanh", **kw))
               for name, kw in VARIANTS}
        fns["plain_quant"] = lambda: fp8_quant.quantize_fp8_rows(x)
        fns["cast_fp8"] = lambda: x.to(torch.float8_e4m3fn)
        ms, times = interleaved_ms(fns, args.rounds, rep=40)
        ref_q, ref_s = fns["one_tile"]()
        same = {}
        for name, _ in VARIANTS[1:]:
            q, s = fns[name]()
            same[name] = bool(torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s))
        default = fp8_quant.per_token_launch(K, chunked=fp8_quant.gelu_rows_chunked(K, True, False, False))
        rows.append({"shape": label, "M": M, "K": K, "ms": ms, "rounds_ms": times, "bit_identical_to_one_tile": same,
                     "default_launch": default, "one_tile_over_default": ms["one_tile"] / ms["default"]})
        best = min((k for k, _ in VARIANTS), key=ms.get)
        print(f"{label:22s} {M}x{K}: one tile {ms['one_tile']:.4f} ms, default {ms['default']:.4f}, "
              f"best {best} {ms[best]:.4f}; plain {ms['plain_quant']:.4f}, cast {ms['cast_fp8']:.4f}; "
              f"identical {all(same.values())}", flush=True)
        write_json(args.out, environment=environment(), rows=rows, partial=True)
    write_json(args.out, environment=environment(), rows=rows, partial=False)


if __name__ == "__main__":
    main()
