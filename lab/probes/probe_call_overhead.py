"""Host time per call of sagegen's ops at sizes where the GPU work is small: where an eager (or compiled: the
custom ops run their Python either way) step's host time goes, call by call.

Each case runs N times back to back, then one synchronize: host time per call; every case once a round, the
median of the rounds reported (the host's speed drifts between runs and within one). Beside it the GPU time per
call, measured with the queue kept full (a sleep kernel first, so the host's launches run ahead of the GPU):
a case whose host time is below its GPU time is not host-bound. Also a cProfile of the sageattn and FP8-linear
calls (top functions by own time).

    python lab/probes/probe_call_overhead.py [--out FILE.json] [--n 100] [--rounds 7] [--base DIR]

--base: an older copy of the package imported as `sagegen_base` (as lab/probes/ab_versions.py does); its
kernel launcher (`kernels.triton_attn.sage_attention`, what the op runs after its checks) is timed beside this
checkout's, interleaved.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from probe_util import environment, write_json


@triton.jit
def _empty_kernel(X, N):
    pass


@triton.jit
def _many_args_kernel(A, B, C, D, E, s0, s1, s2, s3, s4, s5, s6, s7, n0, n1, n2, BLOCK: tl.constexpr,
                      FLAG: tl.constexpr):
    pass


def host_us(fn, n: int) -> float:
    """Host microseconds per call: n calls, then one sync (the GPU work is assumed to keep up)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def gpu_us(fn, n: int = 20) -> float:
    """GPU microseconds per call, with the queue kept full (a sleep kernel first so launches run ahead)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2e8))  # ~0.1 s of GPU time: the host enqueues everything below meanwhile
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e3


def profile_top(fn, n: int, top: int = 25) -> list[dict]:
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, name), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append({"function": f"{file.split('/')[-1]}:{line}:{name}", "calls_per_op": nc / n,
                     "own_us_per_op": tt / n * 1e6, "cum_us_per_op": ct / n * 1e6})
    rows.sort(key=lambda r: -r["own_us_per_op"])
    return rows[:top]


def _through_op(sagegen, q, k, v, cfg):
    """sageattn as before eager calls skipped the op's dispatch (sagegen.api.EAGER_DIRECT = False)."""
    sagegen.api.EAGER_DIRECT = False
    try:
        return sagegen.sageattn(q, k, v, backend="triton", config=cfg)
    finally:
        sagegen.api.EAGER_DIRECT = True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--n", type=int, default=100, help="calls per timing")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--base", default=None)
    args = ap.parse_args()
    import sagegen
    from sagegen.kernels import gluon_attn, triton_quant
    from sagegen.kernels import dispatch as backends
    from sagegen.kernels.spec import device_capability
    from sagegen.linear.module import FP8Linear

    dev = torch.device("cuda")
    torch.set_grad_enabled(False)
    q, k, v = (torch.randn(1, 24, 1024, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
    x = torch.empty(16, device=dev)
    cfg = sagegen.DIFFUSION_CONFIG
    qq = triton_quant.quantize(q, k, v, cfg, 64, 128, 128, permute_v_keys=True, quantize_q=False)
    out = torch.empty_like(q)
    lin = torch.nn.Linear(3072, 3072, device=dev, dtype=torch.bfloat16)
    fp8 = FP8Linear(lin)
    a = torch.randn(2048, 3072, device=dev, dtype=torch.bfloat16)
    big = torch.empty(1 << 20, device=dev, dtype=torch.int8)

    cases = {
        "empty_triton_launch": lambda: _empty_kernel[(1,)](x, 16),
        "triton_launch_16_args": lambda: _many_args_kernel[(1,)](x, x, x, x, x, 1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 48,
                                                                 BLOCK=64, FLAG=True),
        "torch_empty": lambda: torch.empty(1024, device=dev),
        "torch_add_small": lambda: x.add(1.0),
        "device_capability": lambda: device_capability(dev),
        "describe_cuda": lambda: backends.describe_cuda(dev),
        "tensor_descriptor": lambda: gluon_attn.TensorDescriptor.from_tensor(
            big.view(-1, 128), [64, 128], gluon_attn.shared_layouts(64, 128, 128)[0]),
        "shared_layouts_uncached": lambda: gluon_attn.shared_layouts.__wrapped__(64, 128, 128),
        "sdpa_1x24x1024x128": lambda: F.scaled_dot_product_attention(q, k, v),
        "sageattn_triton_1x24x1024x128": lambda: sagegen.sageattn(q, k, v, backend="triton", config=cfg),
        "sageattn_through_the_op": lambda: _through_op(sagegen, q, k, v, cfg),
        "sageattn_op_only": lambda: torch.ops.sagegen.sageattn(q, k, v, None, False, 0.088, "HND", False, "triton",
                                                               *sagegen.api._config_args(cfg)),
        "quantize_kv_only": lambda: triton_quant.quantize(q, k, v, cfg, 64, 128, 128, permute_v_keys=True,
                                                          quantize_q=False),
        "gluon_launch_only": lambda: gluon_attn.launch(qq, out, None, None, H=24, group=1, n_q=1024, n_k=1024,
                                                       d=128, block_m=64, block_n=128, smooth_v=True,
                                                       sm_scale_log2=0.127, q=q),
        "linear_bf16_2048x3072": lambda: lin(a),
        "fp8_linear_2048x3072": lambda: fp8(a),
    }
    if args.base:
        import importlib
        import sys

        sys.path.insert(0, args.base)
        for label, pkg in (("base", "sagegen_base"), ("now", "sagegen")):
            launcher = importlib.import_module(f"{pkg}.kernels.triton_attn").sage_attention
            cases[f"launcher_{label}"] = (lambda f: lambda: f(q, k, v, out, sm_scale=0.088, config=cfg))(launcher)
    results, rounds = {}, {}
    for name, fn in list(cases.items()):
        try:
            results[name] = {"gpu_us": round(gpu_us(fn), 2)}
            rounds[name] = []
        except Exception as exc:  # one broken case must not lose the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            del cases[name]
    # the host's speed drifts by up to 2x between (and within) runs: every case once a round, medians compared
    for _ in range(args.rounds):
        for name, fn in cases.items():
            rounds[name].append(host_us(fn, args.n))
    for name in cases:
        results[name].update(host_us=round(statistics.median(rounds[name]), 2),
                             host_us_rounds=[round(x, 1) for x in rounds[name]])
    for name, r in results.items():
        print(f"{name:36s} {r.get('host_us', '-'):>8} us host  {r.get('gpu_us', '-'):>8} us GPU  {r.get('error', '')}",
              flush=True)
    profiles = {
        "sageattn": profile_top(cases["sageattn_triton_1x24x1024x128"], 200),
        "fp8_linear": profile_top(cases["fp8_linear_2048x3072"], 200),
    }
    for name, rows in profiles.items():
        print(f"-- cProfile {name} (us per op, own / cumulative)")
        for r in rows[:18]:
            print(f"   {r['own_us_per_op']:8.2f} {r['cum_us_per_op']:8.2f} {r['calls_per_op']:5.1f}  {r['function']}")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               "?")
    write_json(args.out, probe="call_overhead", environment=environment(cpu=cpu, load=open("/proc/loadavg").read()),
               cases=results, profiles=profiles)


if __name__ == "__main__":
    main()
