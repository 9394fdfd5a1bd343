"""Context parallelism on several GPUs: one transformer call of a full-size model (random bf16 weights) with
sagegen vs diffusers' own backend under the same Ulysses/Ring split, against one GPU.

    torchrun --nproc-per-node 2 bench/bench_cp.py --model hunyuanvideo --cp ulysses=2 --cp ring=2 \\
        --out bench/results/cp-hunyuanvideo-2xh200.json
    torchrun --nproc-per-node 4 bench/bench_cp.py --model wan2.1-14b --cp ulysses=4 --cp ulysses=2,ring=2 \\
        --out bench/results/cp-wan14b-4xh200.json

Every --cp must use all launched processes. Per model: rank 0 first times the call on one GPU with each
attention (the others wait), keeping sagegen's output as the reference; then every process builds the model
(same seed, same weights), enables CP and times it. Reports per CP setting and attention: median seconds,
speedup and scaling efficiency against the one-GPU call of the same attention, cosine and rel-L1 of the
gathered output against one-GPU sagegen (and against one-GPU stock for the stock backend), peak memory per GPU.
HunyuanVideo 720p x 129 frames: 118,800 video + 256 text tokens; Wan2.1-T2V-14B 720p x 81 frames: 75,600 tokens;
HunyuanVideo-1.5 720p x 121 frames: 111,600 video + 1,985 text tokens (1,000 Qwen, 256 ByT5, 729 image; padded
by sagegen's CP hook to a multiple of the ranks). Its one-GPU call runs diffusers' own processor, which builds a
[B, 1, S, S] bool mask (~13 GB at this size).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from sagegen.cli.cp_option import parse_cp  # noqa: E402
from sagegen.jobs.stepbench.measure import compare, device_info, versions  # noqa: E402

ARCH = {"hunyuanvideo": "hunyuanvideo", "wan2.1-14b": "wan2.1-t2v-14b",     # sagegen.models.arch names
        "hunyuanvideo-1.5": "hunyuanvideo-1.5-720p"}
SIZE = {"hunyuanvideo": dict(height=720, width=1280, frames=129), "wan2.1-14b": dict(height=720, width=1280, frames=81),
        "hunyuanvideo-1.5": dict(height=720, width=1280, frames=121)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", choices=sorted(ARCH), required=True)
    p.add_argument("--cp", action="append", required=True, help="ulysses=U,ring=R (repeatable), U*R = processes")
    p.add_argument("--stock", default=None,
                   help="diffusers backend to compare with (CP-capable; native does Ulysses only); default "
                        "_native_cudnn, native with --cpu-smoke")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--single", choices=["all", "sagegen", "none"], default="all",
                   help="one-GPU baselines to measure: every attention, sagegen's alone (and its --patched variants: "
                        "scaling and accuracy for sagegen only), or none (no scaling or accuracy numbers)")
    p.add_argument("--baseline-dir", default=None,
                   help="keep each model's one-GPU timings and outputs here, and reuse them when a later launch "
                        "(say, 4 processes after 2) finds them for the same device and repeats")
    p.add_argument("--patched", action="append", choices=["attention", "fp8", "sparse"], default=[],
                   help="also time sagegen.patch on the model (repeatable): 'attention' (fused Q/K prologues and "
                        "block norms around sagegen's attention), 'fp8' (and FP8 linears), 'sparse' (and "
                        "block-sparse attention, top-k 0.5); one GPU and under CP")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="check the script on CPUs (gloo): 1-layer 2-head models at a tiny size, no timings meaning")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def sagegen_backend(backend: str = "auto") -> str:
    from sagegen.jobs.cp_pipeline import sagegen_backend_name

    return sagegen_backend_name(backend=backend)


def build(name: str, device, smoke: bool = False):
    """The full-size transformer with random weights (1 layer of each kind and 2 heads with ``smoke``) and one
    call's inputs at 720p, batch 1 (Wan runs CFG as two calls)."""
    from sagegen.models import arch

    # parameters drawn at construction (Wan's scale_shift_table) must be the same on every build and every rank
    torch.manual_seed(0)
    key = ARCH[name]
    over = arch.smoke_overrides(key) if smoke else None
    size = dict(height=64, width=64, frames=5, text_tokens=16) if smoke else SIZE[name]
    model = arch.build_transformer(key, device=device, seed=0, config_overrides=over)
    if smoke:
        model = model.float()      # sagegen's backend runs fp32 on a bf16 copy; CPU SDPA wants fp32
    inputs = arch.example_inputs(key, **size, batch=1, device=device, seed=0, dtype=next(model.parameters()).dtype)
    return model, inputs


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def free(device):
    """Release the last model: diffusers' hooks hold reference cycles, so ``del`` alone leaves its weights
    on the GPU until the cycle collector runs (a 13B model per measurement: out of memory on 80 GB cards)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timed(model, inputs, warmup, repeats, device, barrier=True):
    with torch.no_grad():
        for _ in range(warmup):
            model(**{**inputs, "return_dict": False})
        times = []
        for _ in range(repeats):
            sync(device)
            if barrier:          # CP: start every rank's call together
                dist.barrier()
            t0 = time.perf_counter()
            out = model(**{**inputs, "return_dict": False})[0]
            sync(device)
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], out


# --patched choice -> (label, sagegen.patch keyword arguments); sparse: one call is one step, so no dense first
# steps (the first block and cross-attention stay dense, as by default)
PATCHED = {"attention": ("sagegen_patched", {}), "fp8": ("sagegen_patched_fp8", {"linear": "fp8"}),
           "sparse": ("sagegen_patched_sparse", {"sparse": "topk=0.5,steps=0"})}
PATCH_KWARGS = dict(PATCHED.values())


def variants(args, backends: dict) -> dict:
    """label -> diffusers backend, with the --patched variants (sagegen's backend under sagegen.patch)."""
    return {**backends, **{PATCHED[p][0]: backends["sagegen"] for p in args.patched}}


@contextlib.contextmanager
def patched(model, label, args):
    """sagegen.patch for a --patched variant (every block's linears in FP8 at full size: the default policy;
    at --cpu-smoke size none reaches min_rows), else nothing."""
    info: dict = {}
    if label not in PATCH_KWARGS:
        yield info
        return
    import sagegen

    sagegen.patch(model, backend="reference" if args.cpu_smoke else "auto", **PATCH_KWARGS[label])
    try:
        yield info
    finally:
        if "sparse" in PATCH_KWARGS[label]:  # the realized block density (this rank's heads under CP)
            from sagegen.patch import sparse_density

            info["sparse_density"] = sparse_density(model).get("overall")
        sagegen.unpatch(model)


def baseline_path(args, name, device) -> str | None:
    """Where one model's one-GPU baseline is kept: named by model, device name and repeats, so a launch on other
    cards or with other settings never reuses it."""
    if not args.baseline_dir:
        return None
    card = device_info(device)["name"].replace(" ", "_").replace("/", "_")
    tag = f"{name}-{card}-w{args.warmup}r{args.repeats}{'-smoke' if args.cpu_smoke else ''}"
    return os.path.join(args.baseline_dir, tag + ".pt")


def single_gpu(name, args, device, backends):
    """Rank 0's one-GPU call with each attention: ({label: timings}, {label: fp32 CPU output})."""
    path = baseline_path(args, name, device)
    if path and os.path.exists(path):
        saved = torch.load(path)
        kept = {label: entry["backend"] for label, entry in saved["single"].items()}
        if all(kept.get(label) == backend for label, backend in backends.items()):   # a later launch may ask fewer
            print(f"[{name}] 1 GPU baselines from {path}", flush=True)
            return ({k: dict(saved["single"][k], reused_from=path) for k in backends},
                    {k: saved["ref"][k] for k in backends})
    single, ref = {}, {}
    model, inputs = build(name, device, args.cpu_smoke)
    for label, backend in backends.items():
        model.set_attention_backend(backend)
        reset_peak(device)
        with patched(model, label, args) as info:
            t, out = timed(model, inputs, args.warmup, args.repeats, device, barrier=False)
        ref[label] = out.float().cpu()
        single[label] = {"backend": backend, "median_s": t, "peak_gb": peak_gb(device), **info}
        print(f"[{name}] 1 GPU {label}: {t:.3f} s", flush=True)
    del model, inputs
    free(device)
    if path:
        from sagegen.runs.files import atomic_write_file  # a unique temporary name beside it, removed on failure

        atomic_write_file(path, lambda tmp: torch.save({"single": single, "ref": ref}, tmp))
    return single, ref


def run_model(name, args, rank, device, backends, save):
    from sagegen.patch.cp import enable_context_parallel

    res = {"single": {}, "cp": {}}
    ref = {}
    if args.single != "none" and rank == 0:
        singles = backends if args.single == "all" else {k: v for k, v in backends.items() if k != "stock"}
        res["single"], ref = single_gpu(name, args, device, singles)
        save(name, res)
    dist.barrier()
    for text in args.cp:
        spec = parse_cp(text)
        for label, backend in backends.items():
            model, inputs = build(name, device, args.cpu_smoke)
            reset_peak(device)
            enable_context_parallel(model, ulysses=spec.ulysses, ring=spec.ring, backend=backend)
            entry = {"backend": backend}
            try:
                with patched(model, label, args) as info:
                    t, out = timed(model, inputs, args.warmup, args.repeats, device)
                entry.update(info)
            except Exception as e:  # noqa: BLE001 - e.g. a stock backend without Ring support
                entry["error"] = f"{type(e).__name__}: {e}"[:500]
                print(f"[{name}] {text} {label}: {entry['error']}", flush=True)
            else:
                peak = torch.tensor([peak_gb(device)], device=device)
                peaks = [torch.zeros_like(peak) for _ in range(dist.get_world_size())]
                dist.all_gather(peaks, peak)
                entry.update(median_s=t, peak_gb_per_gpu=[round(float(x), 2) for x in peaks])
                if rank == 0 and ref:
                    if label in res["single"]:
                        single = res["single"][label]["median_s"]
                        entry.update(speedup_vs_1gpu=single / t, scaling_efficiency=single / t / spec.world)
                    entry["vs_1gpu_sagegen"] = compare(out.float().cpu(), ref["sagegen"])
                    if label != "sagegen" and label in ref:
                        entry["vs_1gpu_same_backend"] = compare(out.float().cpu(), ref[label])
                print(f"[{name}] {text} {label}: {t:.3f} s", flush=True)
            res["cp"].setdefault(text, {})[label] = entry
            save(name, res)
            del model, inputs
            free(device)
            dist.barrier()
    return res


def main(argv=None):
    args = parse_args(argv)
    specs = [parse_cp(t) for t in args.cp]
    if "WORLD_SIZE" not in os.environ:
        sys.exit("launch with torchrun --nproc-per-node N bench/bench_cp.py ...")
    world, rank, local = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    bad = [t for t, s in zip(args.cp, specs) if s.world != world]
    if bad:
        sys.exit(f"--cp {bad}: ulysses*ring must equal the {world} launched processes")
    if args.cpu_smoke:
        device = torch.device("cpu")
        torch.accelerator.device_count = lambda: 1     # diffusers: rank % device_count() on a CPU-only host
        dist.init_process_group("cpu:gloo", timeout=datetime.timedelta(hours=1))
    else:
        if not torch.cuda.is_available():
            sys.exit("bench_cp.py needs CUDA GPUs (or --cpu-smoke)")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("cpu:gloo,cuda:nccl", timeout=datetime.timedelta(hours=1))
    stock = args.stock or ("native" if args.cpu_smoke else "_native_cudnn")   # cuDNN has no CPU kernel
    backends = variants(args, {"sagegen": sagegen_backend("reference" if args.cpu_smoke else "auto"), "stock": stock})
    report = {"benchmark": "context_parallel", "gpus": world, "cpu_smoke": args.cpu_smoke,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": device_info(device), "versions": versions(), "argv": sys.argv[1:] if argv is None else argv,
              "backends": backends, "warmup": args.warmup, "repeats": args.repeats, "models": {}}

    def save(name, res):
        """The report so far, written atomically after every measurement: a launch killed at a time limit
        keeps what it measured."""
        report["models"][name] = res
        if rank == 0:
            from sagegen.runs.files import atomic_write_json  # a unique temporary name beside it

            atomic_write_json(args.out, report)

    try:
        for name in args.model:
            run_model(name, args, rank, device, backends, save)
    finally:
        dist.destroy_process_group()
    return report


if __name__ == "__main__":
    main()
