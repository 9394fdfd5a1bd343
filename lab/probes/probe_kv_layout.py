"""Could the K/V quantization launch run faster with V read channel-major? A standalone Gluon launch made of
`probe_fused_pass`'s quantization item (each thread loads 8 consecutive stored keys of one channel, so the FP8
transpose needs no shared memory and the stores are 8 bytes; K with 16-byte loads), timed next to
`triton_quant`'s K/V launch on the same statistics, outputs compared bit for bit.

    python lab/probes/probe_kv_layout.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import sagegen  # noqa: E402
from sagegen.kernels import triton_quant  # noqa: E402
import probe_fused_pass  # noqa: E402
from probe_util import bench_ms, environment, write_json  # noqa: E402

SHAPES = [(4, 32, 8192, 128), (4, 32, 16384, 128), (2, 48, 17776, 64), (1, 24, 4608, 128), (2, 38, 4429, 64)]

KERNEL_SRC = '''

@gluon.jit
def _kv_item_kernel(K, V, KMean, VInv, K8, KSc, VQ, H, N, NK_PAD,
                    stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                    BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr):
    blk = gl.program_id(0)
    pid_bh = gl.program_id(1)
    _produce_item(K, V, KMean, VInv, K8, KSc, VQ, KSc, KSc, pid_bh, pid_bh // H, pid_bh % H, blk, N, NK_PAD,
                  stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                  BLOCK, HEAD_DIM)
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    probe_fused_pass.ITEM_SRC += KERNEL_SRC
    mod = probe_fused_pass.probe_module()
    cfg = sagegen.SageConfig()
    rows = []
    for b, h, n, d in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        k = k + 2 * torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16)
        qq = triton_quant.quantize(q, k, v, cfg, 64, 128, d, permute_v_keys=True, quantize_q=False)
        km, _, _, v_inv = triton_quant._kv_stats(k, v, d, True, False, True)
        nk_pad = qq.k8.shape[2]
        k8, ks, vq = torch.zeros_like(qq.k8), torch.zeros_like(qq.k_scale), torch.zeros_like(qq.v)

        def triton_kv():
            triton_quant._quant_kv_kernel[(nk_pad // 128, b * h)](
                k, v, ks, km, ks, v_inv, k8, ks, vq, *k.stride(), *v.stride(), h, n, d, nk_pad,
                BLOCK=128, HEAD_DIM=d, SMOOTH_K=True, SMOOTH_V=False, K_PER_TOKEN=False, FP8=True,
                EXACT_FP8_CAST=False, KEY_MASK=False, PERMUTE_KEYS=True, PAD_D=False,
                num_warps=triton_quant.QUANT_WARPS["kv"], enable_fp_fusion=True)

        def gluon_kv(warps):
            return lambda: mod._kv_item_kernel[(nk_pad // 128, b * h)](
                k, v, km, v_inv, k8, ks, vq, h, n, nk_pad, *k.stride(), *v.stride(), BLOCK=128, HEAD_DIM=d,
                num_warps=warps, enable_fp_fusion=True)

        row = {"shape": [b, h, n, d]}
        for name, fn in (("triton_us", triton_kv), ("gluon4_us", gluon_kv(4)), ("gluon8_us", gluon_kv(8)),
                         ("triton_us_again", triton_kv)):
            k8.zero_(), ks.zero_(), vq.zero_()
            fn()
            torch.cuda.synchronize()
            row[name.replace("_us", "_equal")] = bool(torch.equal(k8, qq.k8) and torch.equal(ks, qq.k_scale)
                                                     and torch.equal(vq.view(torch.uint8), qq.v.view(torch.uint8)))
            row[name] = 1000 * bench_ms(fn)
        rows.append(row)
        print(json.dumps(row), flush=True)
        q = k = v = qq = k8 = ks = vq = None  # free before the next shape
        torch.cuda.empty_cache()
    write_json(args.out, environment=environment(), rows=rows)


if __name__ == "__main__":
    main()
