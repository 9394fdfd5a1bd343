"""Correctness + speed bench for the CuTe-DSL SageAttention2 forward prototype (sa2_fwd.py).

GPU:      python bench.py [--out results.json] [--variants serial,overlap_pp] [--quick]
CPU only: python bench.py --compile-only      (compiles every variant for sm_90a, runs CPU self-tests)

Needs PYTHONPATH with the CuTe DSL 4.8.1 packages (nvidia_cutlass_dsl/python_packages or dsl_packages) and
CUTE_DSL_ARCH=sm_90a when compiling without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sa2_fwd  # noqa: E402
from sa2_fwd import BM_WG, BN, HEAD_DIM, VARIANTS, key_perm32  # noqa: E402

LOG2E = 1.4426950408889634
FP8_MAX = 448.0


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------- quantization helper (torch)
def _round_half_away(x):
    return torch.trunc(x + 0.5 * torch.sign(x))


def _int8_blocks(x, block):
    """x fp32 [B, H, N, D] -> int8 [B, H, N, D], scale fp32 [B, H, ceil(N/block)] (amax / 127 per block)."""
    B, H, N, D = x.shape
    nb = -(-N // block)
    xp = torch.nn.functional.pad(x, (0, 0, 0, nb * block - N))
    amax = xp.abs().reshape(B, H, nb, block * D).amax(-1).clamp(min=1e-8)
    scale = amax / 127.0
    inv = (127.0 / amax).repeat_interleave(block, dim=-1)[..., :N, None]
    q = _round_half_away(x * inv).clamp(-127, 127).to(torch.int8)
    return q, scale.contiguous()


def quantize_inputs(q, k, v):
    """bf16 q, k, v [B, H, N, D] -> the kernel's inputs (dict). K is smoothed by its per-head token mean."""
    B, H, N, D = q.shape
    qf, kf, vf = q.float(), k.float(), v.float()
    q8, q_scale = _int8_blocks(qf, BM_WG)
    k_mean = kf.mean(dim=2, keepdim=True)
    k8, k_scale = _int8_blocks(kf - k_mean, BN)
    v_amax = vf.abs().amax(dim=2).clamp(min=1e-8)  # [B, H, D]
    v_scale = (v_amax / FP8_MAX).contiguous()
    v8 = (vf * (FP8_MAX / v_amax)[:, :, None, :]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    Np = -(-N // BN) * BN
    vt = torch.zeros(B, H, D, Np, dtype=torch.uint8, device=q.device)
    vt[..., :N] = v8.view(torch.uint8).transpose(-1, -2)
    perm = torch.tensor(key_perm32(), device=q.device)
    idx = (torch.arange(Np // 32, device=q.device)[:, None] * 32 + perm[None, :]).reshape(-1)
    vt_perm = vt[..., idx].contiguous()  # vt_perm[..., 32c + p] = vt[..., 32c + perm[p]]
    return dict(q_i8=q8.contiguous(), k_i8=k8.contiguous(), v_fp8_t=vt_perm, q_scale=q_scale, k_scale=k_scale,
                v_scale=v_scale, v8=v8)


# ---------------------------------------------------------------------------- references
def emulate(qz, sm_scale, N):
    """Torch emulation of exactly the kernel's numerics (fp32), from the quantized inputs."""
    q8, k8, v8 = qz["q_i8"].float(), qz["k_i8"].float(), qz["v8"].float()
    B, H, _, D = q8.shape
    qs = qz["q_scale"].repeat_interleave(BM_WG, dim=-1)[..., :N] * (sm_scale * LOG2E)  # [B, H, N]
    ks = qz["k_scale"]
    nkb = -(-N // BN)
    m = torch.full((B, H, N), -math.inf, device=q8.device)
    l = torch.zeros(B, H, N, device=q8.device)
    acc = torch.zeros(B, H, N, D, device=q8.device)
    for j in range(nkb):
        kk = k8[:, :, j * BN:(j + 1) * BN]
        s = (q8 @ kk.transpose(-1, -2)) * (qs[..., None] * ks[:, :, j, None, None])  # base-2 logits
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(s - (m_new - math.log2(FP8_MAX))[..., None])
        l = l * alpha + p.sum(-1)
        pq = p.to(torch.float8_e4m3fn).float()
        acc = acc * alpha[..., None] + pq @ v8[:, :, j * BN:(j + 1) * BN]
        m = m_new
    return acc / l[..., None] * qz["v_scale"][:, :, None, :]


def attention_fp64(q, k, v, sm_scale):
    B, H, N, D = q.shape
    out = torch.empty(B, H, N, D, dtype=torch.float64, device=q.device)
    kd, vd = k.double(), v.double()
    step = max(1, (1 << 26) // max(1, B * H * N))
    for i in range(0, N, step):
        s = (q[:, :, i:i + step].double() @ kd.transpose(-1, -2)) * sm_scale
        out[:, :, i:i + step] = torch.softmax(s, dim=-1) @ vd
    return out


def errors(o, ref):
    o, ref = o.double().flatten(), ref.double().flatten()
    cos = torch.nn.functional.cosine_similarity(o, ref, dim=0).item()
    rel_l1 = ((o - ref).abs().sum() / ref.abs().sum()).item()
    return dict(cos=cos, rel_l1=rel_l1, max_abs=(o - ref).abs().max().item(), nan=bool(torch.isnan(o).any()))


def make_inputs(B, H, N, seed, kind, device):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, N, HEAD_DIM, generator=g)
    k = torch.randn(B, H, N, HEAD_DIM, generator=g)
    v = torch.randn(B, H, N, HEAD_DIM, generator=g)
    if kind == "bias_outliers":
        k = k + 4.0 * torch.randn(1, H, 1, HEAD_DIM, generator=g)  # channel bias on K (smoothing removes it)
        ch = torch.randperm(HEAD_DIM, generator=g)[:4]
        q[..., ch] *= 6.0  # a few outlier channels
        k[..., ch] *= 3.0
        v[..., ch[:2]] *= 8.0
    return tuple(t.to(device=device, dtype=torch.bfloat16) for t in (q, k, v))


# ---------------------------------------------------------------------------- CPU self-test of the P->A trick
def selftest_perm():
    """Simulate one warpgroup's C-fragment -> A-fragment register reuse (pack_p's index map, the wgmma
    fragment layouts printed from the DSL's tv layouts) against V permuted by key_perm32: must equal P·V."""
    torch.manual_seed(0)
    P = torch.randn(64, 128, dtype=torch.float64)
    V = torch.randn(128, 128, dtype=torch.float64)  # [keys, d]
    perm = key_perm32()
    Vp = torch.empty_like(V)  # Vp[32c + p] = V[32c + perm[p]]
    for c in range(4):
        for p in range(32):
            Vp[32 * c + p] = V[32 * c + perm[p]]
    A = torch.zeros(64, 128, dtype=torch.float64)  # what the wgmma sees as its A matrix (rows, k)
    for t in range(128):
        lane, warp = t % 32, t // 32
        q, r = lane % 4, lane // 4
        # C fragment of thread t: value e + 2h + 4g at (row 16w + r + 8h, col 8g + 2q + e)
        cval = {}
        for g in range(16):
            for h in range(2):
                for e in range(2):
                    cval[e + 2 * h + 4 * g] = P[16 * warp + r + 8 * h, 8 * g + 2 * q + e]
        # A fragment of thread t, k-block s: value i + 4a + 8b at (row 16w + r + 8a, k 32s + 16b + 4q + i)
        for s in range(4):
            for b in range(2):
                for a in range(2):
                    for i in range(4):
                        src = (i & 1) + 2 * a + 4 * (4 * s + 2 * b + (i >> 1))  # pack_p's map
                        A[16 * warp + r + 8 * a, 32 * s + 16 * b + 4 * q + i] = cval[src]
    err = (A @ Vp - P @ V).abs().max().item()
    assert err < 1e-9, err
    return err


# ---------------------------------------------------------------------------- timing
def bench_ms(fn, warmup=5, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def run_kernel(qz, sm_scale, cfg, out=None):
    return sa2_fwd.sa2_attention(qz["q_i8"], qz["k_i8"], qz["v_fp8_t"], qz["q_scale"], qz["k_scale"], qz["v_scale"],
                                 sm_scale, cfg=cfg, out=out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--out", default="cute_sa2_bench.json")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--quick", action="store_true", help="only the first perf shape")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    sm_scale = HEAD_DIM ** -0.5

    if args.compile_only:
        log("selftest P->A register reuse:", selftest_perm())
        # CPU check of helper + emulation vs fp64 (no kernel)
        q, k, v = make_inputs(1, 2, 1000, 0, "randn", "cpu")
        qz = quantize_inputs(q, k, v)
        e = errors(emulate(qz, sm_scale, 1000), attention_fp64(q, k, v, sm_scale))
        log("CPU emulation vs fp64 (1,2,1000):", e)
        for name in variants:
            t0 = time.time()
            sa2_fwd.compile_only(VARIANTS[name])
            log(f"compiled variant {name} ({VARIANTS[name].tag()}) in {time.time() - t0:.1f}s")
        # the GPU path's argument preparation (from_dlpack, dynamic layouts, fp8 as a uint8 view) on CPU tensors
        from cutlass.cute.runtime import make_fake_stream
        import cutlass
        import cutlass.cute as cute
        o = torch.empty(1, 2, 1000, HEAD_DIM, dtype=torch.bfloat16)
        dl_args = sa2_fwd._prepare_args(qz["q_i8"], qz["k_i8"], qz["v_fp8_t"], qz["q_scale"], qz["k_scale"],
                                        qz["v_scale"], o)
        for name in variants:
            t0 = time.time()
            cute.compile(sa2_fwd.Sa2Fwd(VARIANTS[name]), *dl_args, cutlass.Float32(1.0), make_fake_stream())
            log(f"compiled variant {name} through the from_dlpack (GPU) argument path in {time.time() - t0:.1f}s")
        log("compile-only OK")
        return

    import cutlass

    dev = torch.device("cuda")
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               cutlass_dsl=getattr(cutlass, "__version__", "?"), date=datetime.datetime.now().isoformat(),
               variants={n: VARIANTS[n].tag() for n in variants}, accuracy=[], perf=[])
    log("device:", res["device"], "torch", res["torch"], "cutlass-dsl", res["cutlass_dsl"])

    # ---------------- accuracy
    for (B, H, N) in [(1, 2, 1024), (1, 2, 1000), (2, 3, 2047)]:
        for kind in ["randn", "bias_outliers"]:
            q, k, v = make_inputs(B, H, N, 1234 + N, kind, dev)
            qz = quantize_inputs(q, k, v)
            ref = attention_fp64(q, k, v, sm_scale)
            emu = emulate(qz, sm_scale, N)
            e_emu = errors(emu, ref)
            log(f"[acc] {B}x{H}x{N} {kind}: emulation vs fp64 {e_emu}")
            for name in variants:
                try:
                    o = run_kernel(qz, sm_scale, VARIANTS[name])
                    torch.cuda.synchronize()
                    row = dict(variant=name, shape=[B, H, N], kind=kind, vs_fp64=errors(o, ref),
                               vs_emulation=errors(o, emu), emulation_vs_fp64=e_emu)
                except Exception as ex:  # keep going: report
                    row = dict(variant=name, shape=[B, H, N], kind=kind, error=repr(ex)[:500])
                log(f"[acc] {name} {B}x{H}x{N} {kind}: {row.get('vs_fp64', row.get('error'))} | vs emu "
                    f"{row.get('vs_emulation')}")
                res["accuracy"].append(row)

    # ---------------- speed
    shapes = [(2, 32, 8192), (1, 32, 16384), (1, 16, 32768)]
    if args.quick:
        shapes = shapes[:1]
    for (B, H, N) in shapes:
        flops = 4.0 * B * H * N * N * HEAD_DIM
        q, k, v = make_inputs(B, H, N, 7, "randn", dev)
        qz = quantize_inputs(q, k, v)
        row = dict(shape=[B, H, N], tflops={}, ms={})
        for name in variants:
            try:
                out = torch.empty(B, H, N, HEAD_DIM, dtype=torch.bfloat16, device=dev)
                launch = sa2_fwd.make_launcher(qz["q_i8"], qz["k_i8"], qz["v_fp8_t"], qz["q_scale"], qz["k_scale"],
                                               qz["v_scale"], sm_scale, out, cfg=VARIANTS[name])
                ms = bench_ms(launch, reps=args.reps)
                ms_api = bench_ms(lambda: run_kernel(qz, sm_scale, VARIANTS[name], out), warmup=2, reps=5)
                row.setdefault("ms_with_host_api", {})[name] = ms_api
                row["ms"][name], row["tflops"][name] = ms, flops / ms / 1e9
                # sanity at perf shape: compare a slice with fp64
                o = run_kernel(qz, sm_scale, VARIANTS[name])
                sl = slice(0, 256)
                refs = attention_fp64(q[:1, :2, sl], k[:1, :2], v[:1, :2], sm_scale)
                row.setdefault("slice_vs_fp64", {})[name] = errors(o[:1, :2, sl], refs)
            except Exception as ex:
                row.setdefault("error", {})[name] = repr(ex)[:500]
            log(f"[perf] {name} {B}x{H}x{N}: {row['tflops'].get(name, 'ERR'):.6} TFLOP/s"
                if name in row["tflops"] else f"[perf] {name} {B}x{H}x{N}: ERROR {row['error'][name]}")
        ms = bench_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), reps=args.reps)
        row["ms"]["sdpa_bf16"], row["tflops"]["sdpa_bf16"] = ms, flops / ms / 1e9
        log(f"[perf] sdpa_bf16 {B}x{H}x{N}: {flops / ms / 1e9:.1f} TFLOP/s")
        res["perf"].append(row)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    log("wrote", args.out)


if __name__ == "__main__":
    main()
