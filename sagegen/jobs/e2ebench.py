"""Time to video: whole-pipeline generations per variant, with text encoding, denoising, decoding and saving
timed apart (``python bench/bench_e2e.py MODEL ...``; options: `sagegen.cli.e2e_bench`).

Variants (``--variants``, in this order; the pipeline is loaded once):
- ``stock``: diffusers as loaded, eager;
- ``sagegen``: sagegen's attention + FP8 linears (+ ``--sparse``), compiled per ``--compile``;
- ``torchao``: stock attention + torchao's float8 dynamic quantization of the same layers, compiled per
  ``--compile`` (the strongest stack without sagegen; it rewrites the weights in place, so it runs last);
each also with ``--cache SPEC`` when one is given (``*_cache``: the same schedule on both stacks; on random weights
only fixed schedules, TaylorSeer's interval or PAB, skip as they would on real ones).

Per variant: one warm-up generation at ``--warmup-steps`` (compiles; its time is reported apart), then one timed
generation at the preset's steps: ``encode_s``, ``denoise_s``, ``decode_s`` (`generate.generate_one`), ``save_s``
(the MP4 or PNG written), ``total_s`` (the four), peak GPU memory, and with a cache the realised schedule. JSON
(device, versions, date) written atomically after each variant, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import contextlib
import datetime
import tempfile
import time
from pathlib import Path

VARIANTS = ("stock", "sagegen", "torchao")


def run(job, args, argv: list[str]) -> dict:
    """Measure ``job``'s first sample (a `generate.Job` with linear FP8, and the cache in its settings) for each
    of ``args.variants``; ``args``: variants, compile, warmup_steps, out (`sagegen.cli.e2e_bench` parses them)."""
    import torch

    from sagegen.jobs import ranks as distributed
    from sagegen.jobs.generate import default_loader
    from sagegen.jobs.stepbench.measure import device_info, versions
    from sagegen.runs.files import atomic_write_json

    device = distributed.device_for(job.device, distributed.info())
    t0 = time.perf_counter()
    loaded = default_loader(job, device)
    report = {"benchmark": "e2e", "model": job.preset.name, "random_weights": bool(job.settings["random_weights"]),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": device_info(device), "versions": versions(), "argv": argv,
              "settings": job.settings, "compile": args.compile, "load_s": round(time.perf_counter() - t0, 3),
              "results": {}}
    cache = job.settings.get("cache")
    runs = [(v, None) for v in args.variants] + ([(v, cache) for v in args.variants] if cache else [])
    runs.sort(key=lambda r: r[0] == "torchao")  # torchao rewrites the weights: last
    for variant, spec in runs:
        name = variant + ("_cache" if spec else "")
        setup: dict = {}
        try:
            with _variant(loaded.pipe, variant, job, args, setup):
                report["results"][name] = {**_measure(loaded, job, device, args, torch, spec), **setup}
        except _Skipped as e:
            report["results"][name] = {"skipped": str(e)}
        r = report["results"][name]
        print(f"{name:>16}: " + (f"total {r['total_s']:.2f} s (encode {r['encode_s']:.2f}, denoise "
                                 f"{r['denoise_s']:.2f}, decode {r['decode_s']:.2f}, save {r['save_s']:.2f})"
                                 if "total_s" in r else f"skipped: {r['skipped']}"), flush=True)
        atomic_write_json(args.out, report)
    base = report["results"].get("stock", {}).get("total_s")
    for r in report["results"].values():
        if base and r.get("total_s"):
            r["speedup_vs_stock"] = round(base / r["total_s"], 3)
    atomic_write_json(args.out, report)
    return report


class _Skipped(Exception):
    pass


@contextlib.contextmanager
def _variant(pipe, variant: str, job, args, setup: dict):
    import sagegen
    from sagegen.patch.targets import denoisers

    models = list(denoisers(pipe)[0].values())
    if variant == "stock":
        yield
        return
    if variant == "sagegen":
        kwargs = dict(backend=job.backend, linear="fp8", allow_generic=True)
        if job.sparse is not None:
            kwargs["sparse"] = job.sparse
        sagegen.patch(pipe, job.sage_config, **kwargs)
        setup["compile_report"] = sagegen.patch_info(pipe).get("compile")
    else:
        try:
            from sagegen.jobs.stepbench.torchao_variants import load_torchao
            config_cls, per_row, quantize_ = load_torchao()
        except Exception as e:  # noqa: BLE001 - reported as a skipped variant
            raise _Skipped(f"torchao does not import ({type(e).__name__}: {e})") from None
        from types import SimpleNamespace

        from sagegen.jobs.stepbench.torchao_variants import fp8_layer_names

        for model in models:  # the same layers as sagegen's FP8, each denoiser's own
            names = set(fp8_layer_names(model, job.sage_config, job.backend, SimpleNamespace(linear_policy=None)))
            quantize_(model, config_cls(granularity=per_row()), filter_fn=lambda m, fqn, names=names: fqn in names)
    if args.compile == "regional":
        for model in models:
            model.compile_repeated_blocks(fullgraph=True)
    try:
        yield
    finally:
        if args.compile == "regional":
            import torch

            from sagegen.jobs.stepbench.compiling import uncompile

            for model in models:
                uncompile(model)
            torch._dynamo.reset()
        if variant == "sagegen":
            sagegen.unpatch(pipe)


def _measure(loaded, job, device, args, torch, spec: dict | None) -> dict:
    from sagegen.jobs.generate import generate_one, step_cache
    from sagegen.runs.encode import encode_mp4_file

    sample = job.samples[0]
    cache_setup: dict = {}
    with step_cache(loaded.pipe, spec, cache_setup) as recorder:
        # MagCache's ratios are per step of the run: its warm-up runs every step
        warm = job.settings["steps"] if spec is not None and spec["kind"] == "magcache" else args.warmup_steps
        t = time.perf_counter()
        generate_one(loaded, job.preset, job.settings, sample, device, steps=warm)
        warmup_s = time.perf_counter() - t
        if recorder is not None:
            recorder.calls.clear()
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        frames, timings, finite = generate_one(loaded, job.preset, job.settings, sample, device)
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if job.preset.is_video:
            encode_mp4_file(frames, Path(tmp) / "v.mp4", job.preset.fps)
        else:
            from PIL import Image

            Image.fromarray(frames[0]).save(Path(tmp) / "i.png")
    save_s = time.perf_counter() - t
    out = {**timings, "save_s": round(save_s, 6), "warmup_s": round(warmup_s, 3), "peak_mem_gb": peak,
           "finite": bool(finite)}
    if "cache" in cache_setup:
        out["cache"] = cache_setup["cache"]
    out["total_s"] = round(timings["encode_s"] + timings["denoise_s"] + timings["decode_s"] + save_s, 6)
    return out
