"""Measurement helpers of `sagegen.jobs.stepbench.bench`: CUDA-event timing, output comparison, kernel-group profiles,
versions and device description."""

from __future__ import annotations

import os
import platform
import time

import torch

import sagegen


class Timer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        # The last `measure`'s host time per timed run: until ``fn`` returned, i.e. the time to enqueue a CUDA
        # step's work. Above the GPU time, the GPU waited for the host.
        self.host_times: list[float] = []
        self.warmup_times: list[float] = []

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def measure(self, fn, warmup: int, repeats: int):
        """(output of the last run, list of seconds per timed run, peak memory in GB or None)."""
        out = None
        self.warmup_times = []  # seconds per warm-up call, synchronized: a compiled variant's first is its compile
        for _ in range(warmup):
            t0 = time.perf_counter()
            out = fn()
            self.sync()
            self.warmup_times.append(time.perf_counter() - t0)
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        times, self.host_times = [], []
        for _ in range(repeats):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                start.record()
                out = fn()
                self.host_times.append(time.perf_counter() - t0)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1000.0)
            else:
                t0 = time.perf_counter()
                out = fn()
                times.append(time.perf_counter() - t0)
                self.host_times.append(times[-1])
        peak = torch.cuda.max_memory_allocated() / 2**30 if self.cuda else None
        return out, times, peak


def host_rss_gb() -> float | None:
    """This process's resident host memory now, in GB (Linux ``/proc``; None elsewhere): where FP8 linears'
    bf16 copies wait while patched (`LinearPolicy.bf16_copies`)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def cpu_loop_ms() -> float:
    """Milliseconds this thread takes for a fixed pure-Python loop (best of 3): the host CPU's speed right now.
    Host-bound eager steps track it, not the code: on the H200 hosts of 2026-11-29/30 the same vCPU ran it in
    ~12 or ~24 ms from one second to the next (hypervisor contention; lab/NOTES.md v8.0)."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        total = 0
        for i in range(300_000):
            total += i & 7
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    a, b = out.double().flatten(), ref.double().flatten()
    return {"cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0)),
            "rel_l1": float((a - b).abs().sum() / b.abs().sum()),
            "max_abs": float((a - b).abs().max()), "finite": bool(torch.isfinite(out).all())}


# Kernel-name fragments that identify attention and quantization kernels in a profile.
ATTENTION_KERNELS = ("_attn_fwd", "fmha", "flash_fwd", "sdpa")  # sagegen's, PyTorch's efficient/flash/cuDNN
QUANT_KERNELS = ("_quant_", "_kv_stats")
PROLOGUE_KERNELS = ("_norm_rope_kernel",)  # the patch's fused Q/K norms + rotary embeddings (CogVideoX, Mochi)


def kernel_group(name: str) -> str:
    low = name.lower()
    if any(k in low for k in QUANT_KERNELS):
        return "quantization"
    if any(k in low for k in PROLOGUE_KERNELS):
        return "qk_prologue"
    if any(k in low for k in ATTENTION_KERNELS):
        return "attention"
    return "other"


def profile_step(fn) -> dict:
    """GPU time of one call of fn by kernel group, and its ten largest kernels (CUDA only)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    groups: dict[str, float] = {"attention": 0.0, "quantization": 0.0, "qk_prologue": 0.0, "other": 0.0}
    kernels = []
    for e in prof.key_averages():
        t = e.device_time_total / 1e6  # us -> s
        if t > 0:
            groups[kernel_group(e.key)] += t
            kernels.append({"name": e.key[:120], "s": t, "count": e.count})
    kernels.sort(key=lambda k: -k["s"])
    return {"groups_s": groups, "total_s": sum(groups.values()), "top_kernels": kernels[:10]}


# A step's wall time above this multiple of its GPU busy time: the GPU waited for the host (Python, launches).
HOST_BOUND_RATIO = 1.10
# Steps longer than this are not profiled for the host check (video steps are GPU-bound; a profiled step costs a step).
HOST_CHECK_MAX_S = 2.0


def host_bound(wall_s: float, gpu_busy_s: float) -> bool | None:
    """Whether a step waited on the host: wall time > HOST_BOUND_RATIO x GPU busy time (None: no GPU time seen,
    e.g. kernels the profiler cannot attribute)."""
    if not gpu_busy_s > 0:
        return None
    return wall_s > HOST_BOUND_RATIO * gpu_busy_s


def host_check(entry: dict, fn, replayed: bool = False) -> str:
    """For a CUDA step shorter than HOST_CHECK_MAX_S: one profiled call of ``fn``; adds ``gpu_busy_s`` and
    ``host_bound`` to its result ``entry`` and returns a note for the log line ("" for longer steps), with the
    entry's ``host_median_s`` (the time to enqueue a step, `Timer.host_times`) where it has one.
    ``replayed``: the step is a CUDA graph replay, which launches nothing from the host, so its wall time beyond
    the GPU busy time is not host time (gaps between the graph's kernels, or kernels the profiler leaves out):
    ``host_bound`` is None there (a Flux FP8 replay: 101.0 ms wall, 85.1 ms busy; lab/NOTES.md v6.1)."""
    if entry["median_s"] >= HOST_CHECK_MAX_S:
        return ""
    gpu = profile_step(fn)["total_s"]
    entry.update(gpu_busy_s=gpu, host_bound=None if replayed else host_bound(entry["median_s"], gpu))
    host = f"  host {entry['host_median_s'] * 1000:.1f} ms" if entry.get("host_median_s") is not None else ""
    if entry.get("cpu_loop_ms"):
        host += f" (CPU loop {'/'.join(f'{t:.0f}' for t in entry['cpu_loop_ms'])} ms)"
    return f"  GPU busy {gpu * 1000:.1f} ms" + host + ("  HOST-BOUND" if entry["host_bound"] else "")


def versions() -> dict:
    import diffusers

    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - CPU machines may lack it
        triton_version = None
    return {"torch": torch.__version__, "triton": triton_version, "diffusers": diffusers.__version__,
            "sagegen": sagegen.__version__, "python": platform.python_version(), "cuda": torch.version.cuda}


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"name": props.name, "capability": list(torch.cuda.get_device_capability(device)),
                "memory_gb": round(props.total_memory / 2**30, 1)}
    return {"name": platform.processor() or platform.machine(), "capability": None, "memory_gb": None,
            "threads": torch.get_num_threads()}


def summary(results: dict, outputs: dict) -> dict:
    """Ratios between the variants measured so far (a partial run has some of them)."""
    t = {k: v["median_s"] for k, v in results.items()}
    out = {"diff_vs_stock": {v: compare(o, outputs["stock"]) for v, o in outputs.items() if v != "stock"}}
    pairs = {"speedup": ("stock", "sagegen"), "speedup_compiled": ("stock_compiled", "sagegen_compiled"),
             "speedup_fp8": ("stock", "sagegen_fp8"), "fp8_vs_attention_only": ("sagegen", "sagegen_fp8"),
             "speedup_fp8_compiled": ("stock_compiled", "sagegen_fp8_compiled"),
             "compiled_vs_eager_stock": ("stock", "stock_compiled"),
             "speedup_torchao_fp8": ("stock", "torchao_fp8"),
             "speedup_sagegen_torchao_fp8": ("stock", "sagegen_torchao_fp8"),
             "speedup_torchao_fp8_compiled": ("stock_compiled", "torchao_fp8_compiled"),
             "speedup_sagegen_torchao_fp8_compiled": ("stock_compiled", "sagegen_torchao_fp8_compiled"),
             "sagegen_fp8_vs_torchao_compiled": ("sagegen_torchao_fp8_compiled", "sagegen_fp8_compiled"),
             "sagegen_fp8_vs_torchao_stock_attention_compiled": ("torchao_fp8_compiled", "sagegen_fp8_compiled"),
             "stock_graphs_vs_stock": ("stock", "stock_graphs"), "speedup_graphs": ("stock", "sagegen_graphs"),
             "speedup_fp8_graphs": ("stock", "sagegen_fp8_graphs"),
             "speedup_fp8_graphs_vs_stock_graphs": ("stock_graphs", "sagegen_fp8_graphs")}
    out.update({name: t[a] / t[b] for name, (a, b) in pairs.items() if a in t and b in t})
    if "no_attention" in t:
        out["attention_share_lower_bound"] = 1.0 - t["no_attention"] / t["stock"]
        if "sagegen" in t:
            out["sagegen_attention_share_lower_bound"] = 1.0 - t["no_attention"] / t["sagegen"]
    waited = [k for k, v in results.items() if v.get("host_bound")]
    if waited:
        out["host_bound_variants"] = waited
    return out
