"""One-off: can an FP8 GEMM that quantizes its bf16 A operand on the fly beat quantizer + cuBLASLt at the
attention output projections (4-9k tokens, the last shapes below issue 21's 1.6x)?

Variants, per shape, interleaved rounds (triton.testing.do_bench, median):
  bf16            F.linear (cuBLAS)
  quant_cublas    sagegen's per-token quantizer + torch._scaled_mm (row-wise, fast accumulation): the product
  triton_fp8      the same quantizer + a Triton FP8 GEMM (A and B in FP8, TMA-free block pointers)
  amax_bf16a      a row-amax pass (writes only the scales) + a Triton GEMM that loads bf16 A, multiplies by
                  1/scale, casts to e4m3 in registers and feeds the tensor cores (A is read from L2 after the pass)
Each Triton GEMM runs at a few tile configs; the best is reported with all. Outputs are checked against
quant_cublas (same quantized values: the difference is accumulation order only).

    python lab/probes/probe_fp8_gemm_bf16a.py --out $OUT/probe-fp8-gemm-bf16a.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from probe_util import bench_ms, environment, interleaved_ms, write_json  # noqa: E402

from sagegen.kernels.fp8_quant import quantize_fp8_rows  # noqa: E402
from sagegen.linear import quantize_weight  # noqa: E402
from sagegen.linear.ops import _gemm_rowwise  # noqa: E402

SHAPES = [("flux out", 4096, 3072, 3072), ("flux single out/qkv", 4608, 3072, 3072),
          ("sd3.5 out", 8858, 2432, 2432), ("wan14b qkvo", 75600, 5120, 5120), ("cogvideox qkv", 35552, 3072, 3072)]
CONFIGS = [dict(BM=128, BN=256, BK=128, warps=8, stages=3), dict(BM=128, BN=128, BK=128, warps=8, stages=4),
           dict(BM=128, BN=256, BK=64, warps=8, stages=4), dict(BM=128, BN=128, BK=128, warps=4, stages=4),
           dict(BM=64, BN=256, BK=128, warps=4, stages=4)]


@triton.jit
def _row_amax_kernel(X, S, INV, M, K, stride_xm, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    ok = (rows < M)[:, None] & (cols < K)[None, :]
    x = tl.load(X + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    scale = tl.max(tl.abs(x), axis=1) * (1.0 / 448.0)
    scale = tl.where(scale > 0, scale, 1.0)
    tl.store(S + rows, scale, mask=rows < M)
    tl.store(INV + rows, tl.math.div_rn(tl.zeros_like(scale) + 1.0, scale), mask=rows < M)  # IEEE, as sagegen's


@triton.jit
def _gemm_kernel(A, INV, SA, B, SB, BIAS, C, M, N, K, stride_am, stride_bn, stride_cm,
                 A_BF16: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    # C[M, N] = (A quantized per row) @ B^T * sa[m] * sb[n] + bias[n]; B [N, K] e4m3 (the weight, K contiguous)
    pid = tl.program_id(0)
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = pid // (GROUP * n_n)
    first_m = group * GROUP
    size_m = min(n_m - first_m, GROUP)
    pid_m = first_m + (pid % (GROUP * n_n)) % size_m
    pid_n = (pid % (GROUP * n_n)) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptr = A + rm[:, None].to(tl.int64) * stride_am + rk[None, :]
    b_ptr = B + rn[None, :].to(tl.int64) * stride_bn + rk[:, None]
    m_ok = rm < M
    n_ok = rn < N
    if A_BF16:
        inv = tl.load(INV + rm, mask=m_ok, other=0.0)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr, mask=m_ok[:, None], other=0.0)
        b = tl.load(b_ptr, mask=n_ok[None, :], other=0.0)
        if A_BF16:
            a = (a.to(tl.float32) * inv[:, None]).to(tl.float8e4nv)
        acc = tl.dot(a, b, acc)
        a_ptr += BK
        b_ptr += BK
    sa = tl.load(SA + rm, mask=m_ok, other=0.0)
    sb = tl.load(SB + rn, mask=n_ok, other=0.0)
    bias = tl.load(BIAS + rn, mask=n_ok, other=0.0).to(tl.float32)
    out = acc * sa[:, None] * sb[None, :] + bias[None, :]
    tl.store(C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :], out.to(tl.bfloat16),
             mask=m_ok[:, None] & n_ok[None, :])


def row_amax(x):
    M, K = x.shape
    s = torch.empty(M, device=x.device, dtype=torch.float32)
    inv = torch.empty_like(s)
    bk = triton.next_power_of_2(K)
    bm = max(1, 4096 // bk)
    _row_amax_kernel[(triton.cdiv(M, bm),)](x, s, inv, M, K, x.stride(0), BLOCK_M=bm, BLOCK_K=bk,
                                            num_warps=min(16, max(4, bm * bk // 1024)))
    return s, inv


def gemm(a, inv, sa, w_q, w_s, bias, cfg, a_bf16):
    M, K = a.shape
    N = w_q.shape[0]
    c = torch.empty(M, N, device=a.device, dtype=torch.bfloat16)
    grid = (triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, cfg["BN"]),)
    _gemm_kernel[grid](a, inv, sa, w_q, w_s, bias, c, M, N, K, a.stride(0), w_q.stride(0), c.stride(0),
                       A_BF16=a_bf16, BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"], GROUP=8,
                       num_warps=cfg["warps"], num_stages=cfg["stages"])
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for label, M, K, N in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) * 0.1
        w_q, w_s = quantize_weight(w)
        w_s1 = w_s.view(-1).contiguous()
        fns = {"bf16": lambda: F.linear(x, w, bias),
               "quant_cublas": lambda: _gemm_rowwise(*quantize_fp8_rows(x), w_q, w_s, bias, torch.bfloat16)}
        for i, cfg in enumerate(CONFIGS):
            def tri_fp8(cfg=cfg):
                xq, xs = quantize_fp8_rows(x)
                return gemm(xq, xs, xs.view(-1), w_q, w_s1, bias, cfg, False)

            def tri_bf16a(cfg=cfg):
                s, inv = row_amax(x)
                return gemm(x, inv, s, w_q, w_s1, bias, cfg, True)
            fns[f"triton_fp8_c{i}"] = tri_fp8
            fns[f"amax_bf16a_c{i}"] = tri_bf16a
        ref = fns["quant_cublas"]().float()
        errors = {}
        for k, fn in list(fns.items()):
            try:
                y = fn().float()
                errors[k] = ((y - ref).abs().sum() / ref.abs().sum()).item()
            except Exception as e:  # noqa: BLE001 - a config that does not compile is reported, not fatal
                errors[k] = f"{type(e).__name__}: {str(e)[:200]}"
                del fns[k]
        ms, times = interleaved_ms(fns, args.rounds, rep=50)
        best_fp8 = min((k for k in ms if k.startswith("triton_fp8")), key=ms.get, default=None)
        best_a = min((k for k in ms if k.startswith("amax_bf16a")), key=ms.get, default=None)
        row = {"shape": label, "M": M, "K": K, "N": N, "ms": ms, "rel_l1_vs_quant_cublas": errors,
               "speedup_vs_bf16": {k: ms["bf16"] / v for k, v in ms.items()}, "best_triton_fp8": best_fp8,
               "best_amax_bf16a": best_a, "amax_ms": bench_ms(lambda: row_amax(x)),
               "quant_ms": bench_ms(lambda: quantize_fp8_rows(x))}
        rows.append(row)
        sp = row["speedup_vs_bf16"]
        print(f"{label:20s} {M}x{K}x{N}: bf16 {ms['bf16']:.4f} ms; quant+cuBLAS {sp['quant_cublas']:.2f}x; "
              f"Triton fp8 {sp.get(best_fp8, 0):.2f}x ({best_fp8}); bf16-A {sp.get(best_a, 0):.2f}x ({best_a}); "
              f"amax {row['amax_ms'] * 1e3:.1f} us, quant {row['quant_ms'] * 1e3:.1f} us", flush=True)
        write_json(args.out, environment=environment(), configs=CONFIGS, rows=rows, partial=True)
    write_json(args.out, environment=environment(), configs=CONFIGS, rows=rows, partial=False)


if __name__ == "__main__":
    main()
