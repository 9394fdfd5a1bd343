"""Shared by the bench probes: loading a patched copy of a kernel module, the results file's environment, and a
full-size model with random weights at its preset size."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import tempfile
import time

import torch


def kernel_source(module) -> str:
    """A sagegen kernel module's source, importable from outside the package."""
    src = open(module.__file__).read()
    return src.replace("from .spec import", "from sagegen.kernels.spec import").replace(
        "from .block_sparse import", "from sagegen.kernels.block_sparse import")


def module_from_source(src: str, name: str):
    """Import `src` as a fresh module called `name` (from a temporary file, so Triton can read its source)."""
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def environment(**extra) -> dict:
    import triton

    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.date.today().isoformat(), **extra}


def write_json(path: str | None, **payload) -> None:
    """The probe's results (with `environment=...` among them) to `path`, when one was given."""
    if path:
        with open(path, "w") as f:
            json.dump(payload, f, indent=1)


def wan_block_workload(n: int = 75600):
    """(attention, gemms, flops): Wan2.1-14B's self-attention call at n tokens (NHD, DIFFUSION_CONFIG, random
    bf16 inputs) and its block's bf16 GEMMs (Q/K/V, output, FFN up and down), as two callables: the in-step
    proxy of the power-cap probes."""
    import torch.nn.functional as F

    import sagegen

    h, d, dim, ff = 40, 128, 5120, 13824
    q, k, v = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    x = torch.randn(n, dim, device="cuda", dtype=torch.bfloat16)
    w = {name: torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 0.01
         for name, shape in (("qkv", (3 * dim, dim)), ("o", (dim, dim)), ("up", (ff, dim)), ("down", (dim, ff)))}

    def attention():
        return sagegen.sageattn(q, k, v, tensor_layout="NHD", config=sagegen.DIFFUSION_CONFIG)

    def gemms():
        F.linear(x, w["qkv"])
        F.linear(x, w["o"])
        F.linear(F.linear(x, w["up"]), w["down"])

    return attention, gemms, 4 * h * n * n * d


def event_ms(fn) -> float:
    """Time of one fn() in ms, between CUDA events (a whole step, or one call in a sequence)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def bench_ms(fn) -> float:
    """Median time of fn() in ms (`triton.testing.do_bench`, the benchmark's settings)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def interleaved_ms(fns: dict, rounds: int, warmup: int = 10, rep: int = 40) -> tuple[dict, dict]:
    """Every fn of ``fns`` timed once a round (`triton.testing.do_bench`, median), ``rounds`` rounds, so that a
    drifting clock or host touches all alike: (median ms per name, the rounds' ms per name)."""
    import statistics

    import triton.testing

    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    return {k: statistics.median(v) for k, v in times.items()}, times


def hopper_call(b: int, h: int, n: int, d: int, config=None):
    """Random bf16 q, k, v [b, h, n, d], their quantization as the Hopper kernel takes it (Q left to the
    kernel, V's keys permuted) and the keyword arguments of `gluon_attn.launch` for them (no mask, no LSE)."""
    import sagegen
    from sagegen.kernels import triton_quant

    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qq = triton_quant.quantize(q, k, v, config or sagegen.SageConfig(), 64, 128, d, permute_v_keys=True,
                               quantize_q=False)
    kw = dict(H=h, group=1, n_q=n, n_k=n, d=d, block_m=64, block_n=128, smooth_v=False,
              sm_scale_log2=d**-0.5 * 1.4426950408889634, q=q)
    return q, k, v, qq, kw


def per_call_us(fn, iters=400, warmup=20):
    """Microseconds per call of ``fn`` called back to back (host and GPU overlapped, as in an eager step)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e6


def full_size_model(name: str, device: torch.device):
    """(transformer at full size with random weights, bf16; its inputs at the preset's size and CFG batch)."""
    from sagegen.models import arch as archs

    model = archs.build_transformer(name, dtype=torch.bfloat16, device=device, seed=0)
    arch = archs.get_arch(name)
    inputs = archs.example_inputs(name, batch=arch.batch, dtype=torch.bfloat16, device=device, seed=1,
                                  height=arch.height, width=arch.width, frames=arch.frames or None)
    return model, inputs
