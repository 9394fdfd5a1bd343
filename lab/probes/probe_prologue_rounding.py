"""How often the fused Q/K prologue differs from diffusers' eager ops (on the GPU), with and without FMA
contraction in the prologue kernel (`triton_qk_prologue.FP_FUSION`). Eager PyTorch rounds every product
separately; a contracted a*b + c*d rounds once less. Prints the fraction of differing bf16 elements per case;
JSON to --out.

    python lab/probes/probe_prologue_rounding.py --out $OUT/prologue-rounding.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from sagegen.kernels import triton_qk_prologue as pro  # noqa: E402


def cases():
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.normalization import RMSNorm

    dev = "cuda"
    torch.manual_seed(0)
    B, H, N, d = 2, 24, 4096, 128
    x = (torch.randn(B, H, N, d, device=dev) * 2).to(torch.bfloat16)
    theta = (torch.rand(N, d // 2, device=dev) * 6.28).repeat_interleave(2, dim=1)
    cos, sin = theta.cos(), theta.sin()
    rms = RMSNorm(d, eps=1e-6, elementwise_affine=True).to(dev)
    with torch.no_grad():
        rms.weight.copy_(torch.rand(d) + 0.5)
    rms = rms.to(torch.bfloat16)
    ln = torch.nn.LayerNorm(64, eps=1e-6).to(dev).to(torch.bfloat16)
    x64 = (torch.randn(B, 30, N, 64, device=dev) * 2).to(torch.bfloat16)
    t64 = torch.rand(N, 64, device=dev) * 6.28
    with torch.no_grad():
        yield ("rope per channel (Flux/HunyuanVideo tables)", apply_rotary_emb(x, (cos, sin)),
               lambda: pro.rms_norm_rope(x, None, (cos, sin), per_channel_rope=True))
        yield ("diffusers RMSNorm (SD3/Flux/HunyuanVideo qk norm)", rms(x),
               lambda: pro.rms_norm_rope(x, (rms.weight, rms.eps), None, round_before_weight=True))
        yield ("diffusers RMSNorm + rope per channel", apply_rotary_emb(rms(x), (cos, sin)),
               lambda: pro.rms_norm_rope(x, (rms.weight, rms.eps), (cos, sin), round_before_weight=True,
                                         per_channel_rope=True))
        yield ("rope on [N, D] tables (CogVideoX)", apply_rotary_emb(x64, (t64.cos(), t64.sin())),
               lambda: pro.layer_norm_rope(x64, None, (t64.cos(), t64.sin()), 0))
        yield ("LayerNorm + rope (CogVideoX)", apply_rotary_emb(ln(x64), (t64.cos(), t64.sin())),
               lambda: pro.layer_norm_rope(x64, (ln.weight, ln.bias, ln.eps), (t64.cos(), t64.sin()), 0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    for name, ref, run in cases():
        row = {"case": name}
        for fusion in (True, False):
            pro.FP_FUSION = fusion
            out = run()
            diff = (out.float() - ref.float()).abs()
            row[f"fp_fusion={fusion}"] = {"differing": (diff > 0).float().mean().item(),
                                          "max_abs": diff.max().item()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    pro.FP_FUSION = True
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": datetime.date.today().isoformat()}
    with open(args.out, "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
