"""Correctness + speed bench for the CuTe-DSL SageAttention2 forward prototype (sa2_fwd.py).

GPU:      python bench.py [--out results.json] [--variants serial,overlap_pp] [--quick] [--isolate SECONDS]
CPU only: python bench.py --compile-only      (compiles every variant at head dims 64 and 128, CPU self-tests)

The JSON is rewritten after every measurement (accuracy rows included), so a killed or hung run keeps what it
measured. --isolate runs each variant (and the baselines) in its own child process with a time limit and merges
the children's JSON: a hang or an illegal address in one variant then costs only that variant.

Needs PYTHONPATH with the CuTe DSL 4.8.1 packages (nvidia_cutlass_dsl/python_packages or dsl_packages) and
CUTE_DSL_ARCH=sm_90a when compiling without a GPU. The baselines (sagegen's quantization pass, sagegen.sageattn)
import sagegen from the repository root (two levels up), which needs Triton.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
if REPO_ROOT not in sys.path:
    sys.path.append(REPO_ROOT)  # sagegen (the baselines); after HERE so sa2_fwd / bench resolve here first
import sa2_fwd  # noqa: E402
from sa2_fwd import BM_WG, BN, SUPPORTED_HEAD_DIMS, VARIANTS, key_perm32  # noqa: E402

LOG2E = 1.4426950408889634
FP8_MAX = 448.0


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------- quantization helper (torch)
def _round_half_away(x):
    return torch.trunc(x + 0.5 * torch.sign(x))


def _int8_blocks(x, block):
    """x fp32 [B, H, N, D] -> int8 [B, H, N, D], scale fp32 [B, H, ceil(N/block)] (amax / 127 per block).
    block=1: one scale per row (per token), [B, H, N]."""
    B, H, N, D = x.shape
    nb = -(-N // block)
    xp = torch.nn.functional.pad(x, (0, 0, 0, nb * block - N))
    amax = xp.abs().reshape(B, H, nb, block * D).amax(-1).clamp(min=1e-8)
    scale = amax / 127.0
    inv = (127.0 / amax).repeat_interleave(block, dim=-1)[..., :N, None]
    q = _round_half_away(x * inv).clamp(-127, 127).to(torch.int8)
    return q, scale.contiguous()


def quantize_inputs(q, k, v, q_granularity="per_token"):
    """bf16 q, k, v [B, H, N, D] -> the kernel's inputs (dict). K is smoothed by its per-head token mean.
    q_granularity "per_token" (sagegen's default; q_scale [B, H, N]) or "per_block" (q_scale [B, H, ceil(N/64)])."""
    B, H, N, D = q.shape
    qf, kf, vf = q.float(), k.float(), v.float()
    q8, q_scale = _int8_blocks(qf, 1 if q_granularity == "per_token" else BM_WG)
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
                v_scale=v_scale, v8=v8, q_granularity=q_granularity)


# ---------------------------------------------------------------------------- references
def emulate(qz, sm_scale, N):
    """Torch emulation of exactly the kernel's numerics (fp32), from the quantized inputs."""
    q8, k8, v8 = qz["q_i8"].float(), qz["k_i8"].float(), qz["v8"].float()
    B, H, _, D = q8.shape
    q_block = 1 if qz["q_granularity"] == "per_token" else BM_WG
    qs = qz["q_scale"].repeat_interleave(q_block, dim=-1)[..., :N] * (sm_scale * LOG2E)  # [B, H, N]
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


def make_inputs(B, H, N, seed, kind, device, D=128):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, N, D, generator=g)
    k = torch.randn(B, H, N, D, generator=g)
    v = torch.randn(B, H, N, D, generator=g)
    if kind == "bias_outliers":
        k = k + 4.0 * torch.randn(1, H, 1, D, generator=g)  # channel bias on K (smoothing removes it)
        ch = torch.randperm(D, generator=g)[:4]
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


# ---------------------------------------------------------------------------- cases
# accuracy: (B, H, N, D); odd N and N not a multiple of 64/128 exercise the tails
ACC_SHAPES = [(1, 2, 1024, 128), (1, 2, 1000, 128), (2, 3, 2047, 128), (1, 2, 1001, 64), (2, 3, 1999, 64)]
# speed: CogVideoX-5b's attention first (the target: 700 TFLOP/s full call at head dim 64)
PERF_SHAPES = [(2, 48, 17776, 64), (2, 32, 8192, 128), (1, 32, 16384, 128), (1, 16, 32768, 128)]


def shape_key(B, H, N, D):
    return f"{B}x{H}x{N}_d{D}"


def save(res, path):
    """Atomic rewrite of the JSON (called after every measurement)."""
    finalize(res)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, path)


def finalize(res):
    """Derived numbers of each perf row: full_call_estimate_tflops[v] = flops / (loop_ms[v] + quant_ms)."""
    for row in res.get("perf", {}).values():
        qms = row.get("quant_ms")
        if qms is None:
            continue
        row["full_call_estimate_tflops"] = {v: row["flops"] / (ms + qms) / 1e9 for v, ms in row["loop_ms"].items()}


def perf_row(res, B, H, N, D):
    key = shape_key(B, H, N, D)
    if key not in res["perf"]:
        res["perf"][key] = dict(shape=[B, H, N], head_dim=D, flops=4.0 * B * H * N * N * D, loop_ms={}, tflops={},
                                ms_with_host_api={}, slice_vs_fp64={}, error={})
    return res["perf"][key]


def bench_variants(args, res, variants, dev):
    """Accuracy rows and kernel timings of the CuTe variants."""
    if not variants:
        return
    # ---------------- accuracy (per variant, against the emulation of its own numerics and fp64)
    for (B, H, N, D) in ([] if args.skip_accuracy else ACC_SHAPES):
        sm_scale = D ** -0.5
        for kind in ["randn", "bias_outliers"]:
            q, k, v = make_inputs(B, H, N, 1234 + N, kind, dev, D)
            ref = attention_fp64(q, k, v, sm_scale)
            quant = {}
            for name in variants:
                gran = VARIANTS[name].q_granularity
                if gran not in quant:
                    qz = quantize_inputs(q, k, v, gran)
                    emu = emulate(qz, sm_scale, N)
                    quant[gran] = (qz, emu, errors(emu, ref))
                    log(f"[acc] {B}x{H}x{N} d{D} {kind} q {gran}: emulation vs fp64 {quant[gran][2]}")
                qz, emu, e_emu = quant[gran]
                base = dict(variant=name, shape=[B, H, N], head_dim=D, kind=kind, q_granularity=gran)
                try:
                    o = run_kernel(qz, sm_scale, VARIANTS[name])
                    torch.cuda.synchronize()
                    row = dict(base, vs_fp64=errors(o, ref), vs_emulation=errors(o, emu), emulation_vs_fp64=e_emu)
                except Exception as ex:  # keep going: report
                    row = dict(base, error=repr(ex)[:500])
                log(f"[acc] {name} {B}x{H}x{N} d{D} {kind}: {row.get('vs_fp64', row.get('error'))} | vs emu "
                    f"{row.get('vs_emulation')}")
                res["accuracy"].append(row)
                save(res, args.out)

    # ---------------- speed
    for (B, H, N, D) in perf_shapes(args):
        sm_scale = D ** -0.5
        q, k, v = make_inputs(B, H, N, 7, "randn", dev, D)
        row = perf_row(res, B, H, N, D)
        quant = {}
        for name in variants:
            cfg = VARIANTS[name]
            try:
                if cfg.q_granularity not in quant:
                    quant[cfg.q_granularity] = quantize_inputs(q, k, v, cfg.q_granularity)
                qz = quant[cfg.q_granularity]
                out = torch.empty(B, H, N, D, dtype=torch.bfloat16, device=dev)
                launch = sa2_fwd.make_launcher(qz["q_i8"], qz["k_i8"], qz["v_fp8_t"], qz["q_scale"], qz["k_scale"],
                                               qz["v_scale"], sm_scale, out, cfg=cfg)
                ms = bench_ms(launch, reps=args.reps)
                row["loop_ms"][name], row["tflops"][name] = ms, row["flops"] / ms / 1e9
                save(res, args.out)
                row["ms_with_host_api"][name] = bench_ms(lambda: run_kernel(qz, sm_scale, cfg, out), warmup=2, reps=5)
                # sanity at perf shape: compare a slice with fp64
                o = run_kernel(qz, sm_scale, cfg)
                sl = slice(0, 256)
                refs = attention_fp64(q[:1, :2, sl], k[:1, :2], v[:1, :2], sm_scale)
                row["slice_vs_fp64"][name] = errors(o[:1, :2, sl], refs)
            except Exception as ex:
                row["error"][name] = repr(ex)[:500]
            save(res, args.out)
            log(f"[perf] {name} {B}x{H}x{N} d{D}: {row['tflops'][name]:.1f} TFLOP/s ({row['loop_ms'][name]:.3f} ms)"
                if name in row["tflops"] else f"[perf] {name} {B}x{H}x{N} d{D}: ERROR {row['error'].get(name)}")
        del quant


def bench_baselines(args, res, dev):
    """Per perf shape, on the same bf16 q, k, v: sagegen's own quantization pass (for the full-call estimate),
    sagegen.sageattn (the current product's full call) and PyTorch SDPA (bf16)."""
    for (B, H, N, D) in perf_shapes(args):
        q, k, v = make_inputs(B, H, N, 7, "randn", dev, D)
        row = perf_row(res, B, H, N, D)
        flops = row["flops"]
        # sagegen's quantization pass (Q per token, K smoothed per 128-key block, V fp8 per channel, as
        # sage_attention calls it, with Q quantized outside the attention kernel as this kernel needs)
        try:
            from sagegen.config import DIFFUSION_CONFIG
            from sagegen.kernels.triton_quant import quantize

            blocks = DIFFUSION_CONFIG.blocks(D, torch.cuda.get_device_capability())
            row["quant_config"] = dict(q_granularity=DIFFUSION_CONFIG.q_granularity,
                                       k_granularity=DIFFUSION_CONFIG.k_granularity,
                                       smooth_k=DIFFUSION_CONFIG.smooth_k, smooth_v=DIFFUSION_CONFIG.smooth_v,
                                       sagegen_blocks=list(blocks), blocks_used=[BM_WG, BN], d_pad=D)
            row["quant_ms"] = bench_ms(lambda: quantize(q, k, v, DIFFUSION_CONFIG, BM_WG, BN, D), reps=args.reps)
            log(f"[perf] sagegen quantize {B}x{H}x{N} d{D}: {row['quant_ms']:.3f} ms")
        except Exception as ex:
            row["quant_error"] = repr(ex)[:500]
            log(f"[perf] sagegen quantize {B}x{H}x{N} d{D}: ERROR {row['quant_error']}")
        save(res, args.out)
        try:
            import sagegen
            from sagegen.kernels import launch as sg_launch

            ms = bench_ms(lambda: sagegen.sageattn(q, k, v), reps=args.reps)
            row["sageattn_ms"], row["sageattn_tflops"] = ms, flops / ms / 1e9
            row["sageattn_gluon_broken"] = list(sg_launch._gluon_broken)
            log(f"[perf] sagegen.sageattn {B}x{H}x{N} d{D}: {flops / ms / 1e9:.1f} TFLOP/s ({ms:.3f} ms)")
        except Exception as ex:
            row["sageattn_error"] = repr(ex)[:500]
            log(f"[perf] sagegen.sageattn {B}x{H}x{N} d{D}: ERROR {row['sageattn_error']}")
        save(res, args.out)
        try:
            ms = bench_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), reps=args.reps)
            row["sdpa_ms"], row["sdpa_tflops"] = ms, flops / ms / 1e9
            log(f"[perf] sdpa_bf16 {B}x{H}x{N} d{D}: {flops / ms / 1e9:.1f} TFLOP/s")
        except Exception as ex:
            row["sdpa_error"] = repr(ex)[:500]
        save(res, args.out)
        del q, k, v


def perf_shapes(args):
    shapes = PERF_SHAPES[:1] if args.quick else PERF_SHAPES
    if args.head_dims:
        shapes = [s for s in shapes if s[3] in args.head_dims]
    return shapes


# ---------------------------------------------------------------------------- isolation (child processes)
def merge(res, part):
    res["accuracy"].extend(part.get("accuracy", []))
    for key, prow in part.get("perf", {}).items():
        row = res["perf"].setdefault(key, {k: v for k, v in prow.items() if not isinstance(v, dict)})
        for k, v in prow.items():
            if isinstance(v, dict):
                row.setdefault(k, {}).update(v)
            else:
                row[k] = v
    for k in ("device", "torch", "cutlass_dsl"):
        if k in part and k not in res:
            res[k] = part[k]


def run_isolated(args, variants):
    """Each variant, then the baselines, in a child process with a wall-clock limit; merge their JSON."""
    res = dict(date=datetime.datetime.now().isoformat(), variants={n: [VARIANTS[n].with_head_dim(d).tag() for d in SUPPORTED_HEAD_DIMS] for n in variants},
               accuracy=[], perf={}, children=[])
    jobs = [(n, ["--variants", n, "--no-baselines"]) for n in variants]
    if not args.no_baselines:
        jobs.append(("baselines", ["--variants", "", "--baselines-only"]))
    common = ["--reps", str(args.reps)] + (["--quick"] if args.quick else []) + (
        ["--skip-accuracy"] if args.skip_accuracy else []) + (
        ["--head-dims", ",".join(map(str, args.head_dims))] if args.head_dims else [])
    for name, extra in jobs:
        part_path = f"{args.out}.{name}.part.json"
        if os.path.exists(part_path):
            os.remove(part_path)
        cmd = [sys.executable, os.path.abspath(__file__), "--out", part_path] + extra + common
        log(f"[isolate] {name}: {' '.join(cmd)}")
        t0 = time.time()
        status = "ok"
        try:
            rc = subprocess.run(cmd, timeout=args.isolate).returncode
            if rc != 0:
                status = f"exit {rc}"
        except subprocess.TimeoutExpired:  # subprocess.run kills the child
            status = f"killed after {args.isolate} s (hang?)"
        res["children"].append(dict(name=name, status=status, seconds=round(time.time() - t0, 1)))
        log(f"[isolate] {name}: {status} in {time.time() - t0:.0f} s")
        if os.path.exists(part_path):
            with open(part_path) as f:
                merge(res, json.load(f))
        save(res, args.out)
    log("wrote", args.out)


# ---------------------------------------------------------------------------- main
def compile_only(variants, head_dims):
    log("selftest P->A register reuse:", selftest_perm())
    # CPU check of helper + emulation vs fp64 (no kernel), both Q granularities, both head dims
    for D, N in [(128, 1000), (64, 1001)]:
        q, k, v = make_inputs(1, 2, N, 0, "randn", "cpu", D)
        ref = attention_fp64(q, k, v, D ** -0.5)
        for gran in ("per_token", "per_block"):
            qz = quantize_inputs(q, k, v, gran)
            e = errors(emulate(qz, D ** -0.5, N), ref)
            log(f"CPU emulation vs fp64 (1,2,{N}) d{D} q {gran}:", e)
    from cutlass.cute.runtime import make_fake_stream
    import cutlass
    import cutlass.cute as cute

    for D in head_dims:
        for name in variants:
            cfg = VARIANTS[name].with_head_dim(D)
            t0 = time.time()
            sa2_fwd.compile_only(cfg)
            log(f"compiled variant {name} ({cfg.tag()}) in {time.time() - t0:.1f}s")
        # the GPU path's argument preparation (from_dlpack, dynamic layouts, fp8 as a uint8 view) on CPU tensors
        q, k, v = make_inputs(1, 2, 1000, 0, "randn", "cpu", D)
        quant = {g: quantize_inputs(q, k, v, g) for g in ("per_token", "per_block")}
        o = torch.empty(1, 2, 1000, D, dtype=torch.bfloat16)
        for name in variants:
            cfg = VARIANTS[name].with_head_dim(D)
            qz = quant[cfg.q_granularity]
            sa2_fwd._check_inputs(cfg, qz["q_i8"], qz["v_fp8_t"], qz["q_scale"], qz["k_scale"])
            dl_args = sa2_fwd._prepare_args(qz["q_i8"], qz["k_i8"], qz["v_fp8_t"], qz["q_scale"], qz["k_scale"],
                                            qz["v_scale"], o)
            t0 = time.time()
            cute.compile(sa2_fwd.Sa2Fwd(cfg), *dl_args, cutlass.Float32(1.0), make_fake_stream())
            log(f"compiled variant {name} ({cfg.tag()}) through the from_dlpack (GPU) argument path in "
                f"{time.time() - t0:.1f}s")
    # the bench's own bookkeeping (JSON merge, estimate) on a fake result
    res = dict(accuracy=[], perf={})
    r = perf_row(res, 2, 48, 17776, 64)
    r["loop_ms"]["x"], r["quant_ms"] = 10.0, 2.0
    finalize(res)
    assert abs(r["full_call_estimate_tflops"]["x"] - r["flops"] / 12.0 / 1e9) < 1e-6
    res2 = dict(accuracy=[], perf={})
    merge(res2, json.loads(json.dumps(res)))
    assert res2["perf"]["2x48x17776_d64"]["loop_ms"]["x"] == 10.0
    log("compile-only OK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--out", default="cute_sa2_bench.json")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--quick", action="store_true", help="only the first perf shape (CogVideoX-5b, head dim 64)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--head-dims", default="", help="comma list: only these head dims (perf shapes)")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--no-baselines", action="store_true", help="skip sagegen quantize / sageattn / SDPA timing")
    ap.add_argument("--baselines-only", action="store_true")
    ap.add_argument("--isolate", type=float, default=0.0,
                    help="run each variant and the baselines in a child process killed after this many seconds")
    args = ap.parse_args()
    args.head_dims = [int(x) for x in args.head_dims.split(",") if x]
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; known: {list(VARIANTS)}")

    if args.compile_only:
        compile_only(variants, args.head_dims or list(SUPPORTED_HEAD_DIMS))
        return
    if args.isolate > 0:
        run_isolated(args, variants)
        return

    import cutlass

    dev = torch.device("cuda")
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               cutlass_dsl=getattr(cutlass, "__version__", "?"), date=datetime.datetime.now().isoformat(),
               variants={n: [VARIANTS[n].with_head_dim(d).tag() for d in SUPPORTED_HEAD_DIMS] for n in variants}, accuracy=[], perf={})
    log("device:", res["device"], "torch", res["torch"], "cutlass-dsl", res["cutlass_dsl"])
    save(res, args.out)
    if not args.baselines_only:
        bench_variants(args, res, variants, dev)
    if not args.no_baselines:
        bench_baselines(args, res, dev)
    save(res, args.out)
    log("wrote", args.out)


if __name__ == "__main__":
    main()
