"""One denoising step of a full-size transformer with random weights: stock attention vs `sagegen.patch`.

Builds the real diffusers transformer of an architecture in `sagegen.models.arch` (random bf16 weights, built on
the GPU, nothing downloaded) and times its forward at the model's default resolution, with the CFG batch where
the pipeline batches guidance (CogVideoX, Mochi, SD3.5 large/medium), in up to five variants:

  stock           the model as diffusers runs it (PyTorch SDPA, default backend choice)
  sagegen         after ``sagegen.patch`` (default DIFFUSION_CONFIG unless --sage-config)
  no_attention    patched, every routed attention call answered with zeros: a lower bound on the time of
                  everything but attention (so 1 - no_attention/stock bounds attention's share from below)
  stock_compiled / sagegen_compiled   the same under ``torch.compile`` (with --compile)
  sagegen_fp8     (with --linear fp8) patched with FP8 linears too (``linear="fp8"``, --linear-policy JSON);
                  sagegen_fp8_compiled with --compile as well
  torchao_fp8 / sagegen_torchao_fp8   (with --torchao) the same linears quantized by torchao instead
                  (Float8DynamicActivationFloat8WeightConfig, per-row: its float8 dynamic inference recipe),
                  with stock or sagegen attention; *_compiled with --compile. Applied last and in place
                  (torchao's quantize_ cannot be undone)

--only NAMES times just those variants besides stock (fewer compiles). Median of --repeats runs after --warmup
runs, timed with CUDA events; peak memory per variant; the output difference (cosine, relative L1, max abs) of
each variant against stock at the same inputs. Writes JSON with the device, torch/triton/diffusers/sagegen
versions and the date.

    sagegen bench cogvideox-5b --random-weights --out bench/results/model-step-cogvideox-5b-h100.json
    sagegen bench hunyuanvideo --compile --out bench/results/model-step-hunyuanvideo-h100.json
    sagegen bench cogvideox-5b --tiny --out /tmp/smoke.json   # CPU smoke test
    (python bench/bench_model_step.py ... takes the same arguments)

``patch_stats`` counts the routed attention calls; with ``--backend auto`` (default) sageattn itself runs
PyTorch SDPA for calls below its measured crossover (batch·heads·Nq·Nk; counted as ``routed_auto_sdpa``), e.g.
HunyuanVideo's 256-token text refiner; ``--backend triton`` forces the kernel everywhere.

--tiny: the same code path on the CPU with the architecture shrunk to one layer of each kind and two heads
(`arch.smoke_overrides`, same input interface) at 64x64 (9 or 13 frames) with the text cut to
`arch.smoke_text_tokens`; sagegen runs its PyTorch emulation (the Triton kernels under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import datetime
import gc
import statistics
import sys
import time
from collections import Counter

import torch

import sagegen
from sagegen.models import arch as archs
from sagegen.patch import patch_info, reset_stats, set_attention_override, sparse_density
from sagegen.runs.files import atomic_write_json
from sagegen.jobs.stepbench.args import enabled_variants, parse_args  # noqa: F401 (re-exported)
from sagegen.jobs.stepbench.compiling import compiled
from sagegen.jobs.stepbench.measure import (HOST_BOUND_RATIO, Timer, cpu_loop_ms, device_info, host_check,
                                            host_rss_gb, profile_step, versions)
from sagegen.jobs.stepbench.measure import summary as _summary

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _write(path: str, report: dict) -> None:
    atomic_write_json(path, report)


def main(argv=None) -> dict:
    args = parse_args(argv)
    arch = archs.get_arch(args.model)
    dtype = DTYPES[args.dtype]
    if args.tiny:
        device = torch.device("cpu")
        overrides = archs.smoke_overrides(args.model)
        size = dict(height=args.height or 64, width=args.width or 64,
                    frames=(args.frames or (13 if arch.family == "mochi" else 9)) if arch.frames else None,
                    text_tokens=archs.smoke_text_tokens(args.model))
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_model_step.py needs a CUDA GPU (or --tiny for the CPU smoke mode)")
        device = torch.device("cuda")
        overrides = None
        size = dict(height=args.height or arch.height, width=args.width or arch.width,
                    frames=(args.frames or arch.frames) if arch.frames else None)
    batch = args.batch or arch.batch
    config = sagegen.DIFFUSION_CONFIG.replace(**args.sage_config) if args.sage_config else sagegen.DIFFUSION_CONFIG

    t0 = time.perf_counter()
    model = archs.build_transformer(args.model, dtype=dtype, device=device, seed=args.seed,
                                    config_overrides=overrides)
    build_s = time.perf_counter() - t0
    inputs = archs.example_inputs(args.model, batch=batch, dtype=dtype, device=device, seed=args.seed + 1, **size)
    timer = Timer(device)
    results, outputs = {}, {}
    route, stats, linear_info, profiles = None, {}, None, {}
    backend = "auto" if args.tiny else args.backend

    def forward(m):
        def run():
            with torch.inference_mode():
                return m(**inputs)[0]
        return run

    def build_report() -> dict:
        summary = _summary(results, outputs)
        cfg = dict(model.config)
        report = {
            "benchmark": "model_step", "model": args.model, "tiny": args.tiny, "arch_source": arch.source,
            "patch_family": route,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device_info(device), "versions": versions(), "argv": sys.argv[1:] if argv is None else argv,
            "dtype": args.dtype, "compile_backend": args.compile_backend if args.compile else None,
            "compile_scope": args.compile_scope if args.compile else None,
            "compile_mode": args.compile_mode if args.compile else None,
            "sage_config": config.to_dict(), "backend": backend,
            "sparse": [{"spec": spec, "config": c.to_dict()} for spec, c in args.sparse],
            "warmup": args.warmup, "repeats": args.repeats,
            "build_s": build_s,
            "inputs": {"batch": batch, **size, "tokens_per_sample": archs.tokens_per_sample(args.model, **size),
                       "heads": cfg.get("num_attention_heads"), "head_dim": cfg.get("attention_head_dim"),
                       "layers": cfg.get("num_layers"), "single_layers": cfg.get("num_single_layers"),
                       "shapes": {k: list(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)}},
            "patch_stats": stats, "linear": linear_info, "results": results, **summary,
        }
        if profiles:
            report["profile"] = profiles
        return report

    def record(variant, fn):
        """Time ``fn``; returns the variant's result entry (None when --only skips it)."""
        if args.only is not None and variant != "stock" and variant not in args.only:
            return None
        cpu_before = cpu_loop_ms()
        out, times, peak = timer.measure(fn, args.warmup, args.repeats)
        outputs[variant] = out.float().cpu()
        results[variant] = {"median_s": statistics.median(times), "times_s": times, "peak_mem_gb": peak,
                            "host_rss_gb": host_rss_gb(),
                            # the warm-up calls, synchronized: for a compiled variant the first is the compile
                            # (cold or warm per the inductor cache: TORCHINDUCTOR_CACHE_DIR) plus one step
                            "warmup_s": timer.warmup_times,
                            "host_median_s": statistics.median(timer.host_times), "host_times_s": timer.host_times,
                            # the host CPU's speed before / after (`cpu_loop_ms`): what host-bound times follow
                            "cpu_loop_ms": [round(cpu_before, 2), round(cpu_loop_ms(), 2)]}
        replayed = variant.endswith("_graphs")  # a CUDA graph replay: profiled, not judged host-bound
        busy = host_check(results[variant], fn, replayed=replayed) if device.type == "cuda" else ""
        print(f"{variant:>17}: {statistics.median(times) * 1000:9.1f} ms  (runs: "
              f"{', '.join(f'{t * 1000:.1f}' for t in times)})" + (f"  peak {peak:.1f} GB" if peak else "") + busy,
              flush=True)
        del out
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        _write(args.out, {**build_report(), "partial": True})  # a run cut short keeps what it measured
        return results[variant]

    profiling = args.profile and device.type == "cuda"
    if args.profile and not profiling:
        print("note: --profile needs a CUDA GPU (it reads GPU kernel times); skipped on CPU", flush=True)
    record("stock", forward(model))
    if profiling:
        profiles["stock"] = profile_step(forward(model))
    # allow_generic: the newer classes (LTX-Video, Qwen-Image, HunyuanVideo-1.5) are not in SUPPORTED_MODELS
    # and take the generic route; the five families and Wan keep their fused routes either way
    sagegen.patch(model, config, backend=backend, allow_generic=True)
    route = patch_info(model)["family"]
    reset_stats(model)
    stats = {}
    if not args.compiled_only:
        record("sagegen", forward(model))
        stats = dict(patch_info(model)["stats"])
    if profiling and "sagegen" in results:
        profiles["sagegen"] = profile_step(forward(model))
        for side, prof in profiles.items():
            print(f"profile {side}: " + ", ".join(f"{g} {t:.3f} s" for g, t in prof["groups_s"].items()), flush=True)
    for spec, sparse_cfg in [] if args.compiled_only else args.sparse:  # block-sparse variants, density recorded
        sagegen.patch(model, config, backend=backend, sparse=sparse_cfg)
        reset_stats(model)
        name = f"sagegen_sparse[{spec}]"
        record(name, forward(model))
        if name not in results:  # left out by --only
            continue
        results[name]["density"] = sparse_density(model)
        if "sagegen" in results:
            results[name]["speedup_vs_sagegen"] = results["sagegen"]["median_s"] / results[name]["median_s"]
        results[name]["speedup_vs_stock"] = results["stock"]["median_s"] / results[name]["median_s"]
        results[name]["patch_stats"] = dict(patch_info(model)["stats"])
        d = results[name]["density"]
        print(f"  {name}: density {d.get('overall')} ({len(d.get('per_step_layer', []))} layer calls "
              f"recorded over all timed runs)", flush=True)
        sagegen.patch(model, config, backend=backend)  # back to dense for the variants below
    if not (args.no_zero_attention or args.compiled_only):
        set_attention_override(model, lambda q, k, v, mask, is_causal, scale: torch.zeros_like(q))
        record("no_attention", forward(model))
        set_attention_override(model, None)
    sagegen.unpatch(model)
    if args.linear and not args.compiled_only:
        sagegen.patch(model, config, backend=backend, linear=args.linear, linear_policy=args.linear_policy)
        record("sagegen_fp8", forward(model))
        if profiling and "sagegen_fp8" in results:
            profiles["sagegen_fp8"] = profile_step(forward(model))
            print("profile sagegen_fp8: " + ", ".join(f"{k['name'][:60]} {k['s'] * 1000:.1f} ms x{k['count']}"
                                                     for k in profiles["sagegen_fp8"]["top_kernels"]), flush=True)
        info = patch_info(model)["linear"]
        print(f"fp8 layers: {info['fp8_layer_count']}, emulated: {info['emulated']} {info['note']}", flush=True)
        if info["bf16_layers"]:  # why the others stay bf16 (with --tiny: all of them, first and last block)
            reasons = Counter(info["bf16_layers"].values()).most_common(3)
            print(f"bf16 layers: {len(info['bf16_layers'])} (" + "; ".join(f"{n} {r}" for r, n in reasons) + ")",
                  flush=True)
        linear_info = {k: info[k] for k in ("policy", "emulated", "note", "fp8_layer_count", "fp8_calls",
                                            "fp8_weight_bytes_added", "fp8_layers")}
        linear_info["bf16_layer_count"] = len(info["bf16_layers"])
        sagegen.unpatch(model)
    if args.cuda_graphs and not args.compiled_only:
        from sagegen.jobs.stepbench.graph_variants import graph_variants

        graph_variants(model, forward, record, args, config, backend)
    if args.compile:
        def record_compiled(variant):
            torch._dynamo.reset()
            fn, undo = compiled(model, args.compile_scope, args.compile_backend, args.compile_mode)
            record(variant, forward(fn))
            undo()
            torch._dynamo.reset()

        record_compiled("stock_compiled")
        sagegen.patch(model, config, backend=backend, allow_generic=True)
        record_compiled("sagegen_compiled")
        sagegen.unpatch(model)
        if args.linear:
            sagegen.patch(model, config, backend=backend, linear=args.linear, linear_policy=args.linear_policy)
            record_compiled("sagegen_fp8_compiled")
            sagegen.unpatch(model)

    if args.torchao:
        from sagegen.jobs.stepbench.torchao_variants import torchao_variants

        torchao_variants(model, forward, record, args, config, backend, linear_info)

    report = build_report()
    summary = {k: report[k] for k in ("speedup", "diff_vs_stock", "speedup_fp8", "fp8_vs_attention_only")
               if k in report}
    if "sagegen" in results and (stats.get("fallback") or not stats.get("routed")):
        print(f"warning: the patched step routed {stats.get('routed', 0)} attention calls and fell back on "
              f"{stats.get('fallback', 0)}: {stats}", file=sys.stderr)
    _write(args.out, report)
    if "speedup_fp8" in summary:
        d8 = summary["diff_vs_stock"]["sagegen_fp8"]
        over = (f" ({summary['fp8_vs_attention_only']:.3f}x over attention only)"
                if "fp8_vs_attention_only" in summary else "")  # --only may leave attention only out
        print(f"attention + FP8 linears: speedup {summary['speedup_fp8']:.3f}x{over}; vs stock: cosine "
              f"{d8['cosine']:.6f}, rel-L1 {d8['rel_l1']:.4f}")
    if "speedup_fp8_graphs" in report:
        print(f"CUDA graphs: attention + FP8 linears {report['speedup_fp8_graphs']:.3f}x stock eager"
              + (f", {report['speedup_fp8_graphs_vs_stock_graphs']:.3f}x stock under graphs"
                 if "speedup_fp8_graphs_vs_stock_graphs" in report else ""))
    if "speedup" in summary:
        d = summary["diff_vs_stock"]["sagegen"]
        print(f"speedup {summary['speedup']:.3f}x; sagegen vs stock: cosine {d['cosine']:.6f}, "
              f"rel-L1 {d['rel_l1']:.4f}")
    if "speedup_compiled" in report:
        print(f"compiled: speedup {report['speedup_compiled']:.3f}x over compiled stock")
    if report.get("host_bound_variants"):
        print(f"note: {', '.join(report['host_bound_variants'])} waited on the host (wall time > "
              f"{HOST_BOUND_RATIO:.2f}x GPU busy time): their times depend on this machine's CPU as much as on the "
              "GPU (its speed can change from second to second on a shared host: see 'CPU loop'); --cuda-graphs "
              "replays each step without the host")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
