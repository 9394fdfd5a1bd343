"""What `sagegen run` and `sagegen compare` share: their options, turning them into a `Job`, running it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from sagegen.cli.cp_option import Cp  # noqa: F401  (the --cp option of run and compare)
from sagegen.cli.errors import UsageProblem
from sagegen.cli import checks
from sagegen.cli.completion import complete_model
from sagegen.cli.options import (command_line, count_seeds, finite_number, kernel_config, load_prompts, parse_seeds,
                                 precision_policy)

GEN = "Generation"
MEM = "Memory and speed"
KER = "sagegen attention"
OUT = "Output"

Model = Annotated[str, typer.Argument(metavar="MODEL", autocompletion=complete_model,
                                      help="Model preset or alias (see `sagegen models`), e.g. cogvideox, "
                                           "flux, tiny-cogvideox.", show_default=False)]
Prompt = Annotated[Optional[list[str]], typer.Option("--prompt", "-p", metavar="TEXT", help="Prompt text (repeatable).",
                                                     rich_help_panel=GEN, show_default=False)]
Prompts = Annotated[Optional[str], typer.Option("--prompts", "-P", metavar="FILE|SET", rich_help_panel=GEN,
                                                help="Prompt file (one per line, # comments) or a built-in "
                                                     "set: smoke, t2v, t2i.")]
MaxPrompts = Annotated[Optional[int], typer.Option("--max-prompts", metavar="N", min=1, rich_help_panel=GEN,
                                                   help="Use only the first N prompts.")]
Seed = Annotated[Optional[list[str]], typer.Option("--seed", "-s", metavar="SEEDS", rich_help_panel=GEN,
                                                   show_default=False,
                                                   help="Seed(s): 7, 0,1,2 or 0-3 (repeatable; default 0). "
                                                        "Every prompt runs with every seed.")]
Steps = Annotated[Optional[int], typer.Option("--steps", min=1, rich_help_panel=GEN,
                                              help="Denoising steps (default: the preset's).")]
Frames = Annotated[Optional[int], typer.Option("--frames", min=1, rich_help_panel=GEN,
                                               help="Frames (video) (default: the preset's).")]
Height = Annotated[Optional[int], typer.Option("--height", min=1, rich_help_panel=GEN,
                                               help="Height in pixels (default: the preset's).")]
Width = Annotated[Optional[int], typer.Option("--width", min=1, rich_help_panel=GEN,
                                              help="Width in pixels (default: the preset's).")]
Guidance = Annotated[Optional[float], typer.Option("--guidance", callback=finite_number(0.0), rich_help_panel=GEN,
                                                   help="Guidance scale, a finite number >= 0 (default: the "
                                                        "preset's).")]
Negative = Annotated[Optional[str], typer.Option("--negative-prompt", "-n", metavar="TEXT", rich_help_panel=GEN,
                                                 help="Negative prompt.")]
Dtype = Annotated[Literal["auto", "bfloat16", "float16", "float32"],
                  typer.Option("--dtype", case_sensitive=False, rich_help_panel=GEN,
                               help="Model dtype; auto = the preset's recommended one.")]
Device = Annotated[str, typer.Option("--device", metavar="DEVICE", rich_help_panel=MEM,
                                     help="auto (this process's GPU, else CPU), cpu, cuda or cuda:N.")]
ModelPath = Annotated[Optional[Path], typer.Option("--model-path", metavar="DIR", rich_help_panel=GEN,
                                                   show_default=False,
                                                   help="A local diffusers pipeline folder to load instead of "
                                                        "the hub/cache.")]
RandomWeights = Annotated[bool, typer.Option("--random-weights/--no-random-weights", rich_help_panel=GEN,
                                             help="The preset's full-size architecture with random weights "
                                                  "(speed at real shapes, no download; outputs are noise).")]
Offload = Annotated[Literal["none", "model", "sequential"],
                    typer.Option("--offload", case_sensitive=False, rich_help_panel=MEM,
                                 help="CPU offload of the pipeline.")]
VaeTiling = Annotated[bool, typer.Option("--vae-tiling/--no-vae-tiling", rich_help_panel=MEM, help="Decode in tiles.")]
VaeSlicing = Annotated[bool, typer.Option("--vae-slicing/--no-vae-slicing", rich_help_panel=MEM,
                                          help="Decode one video/image at a time.")]
Compile = Annotated[bool, typer.Option("--compile/--no-compile", rich_help_panel=MEM,
                                       help="torch.compile the transformer.")]
CudaGraphs = Annotated[Optional[bool], typer.Option("--cuda-graphs/--no-cuda-graphs", rich_help_panel=MEM,
                                                    show_default=False,
                                          help="Replay each denoiser call as a CUDA graph, for every variant (the "
                                               "first call of a shape runs eagerly, the second is captured): takes "
                                               "the host's launch cost out of eager steps, e.g. with --linear fp8 "
                                               "at ~4k tokens. One activation-sized memory pool per shape. Not "
                                               "with --compile, --offload, --cp or --sparse. Default: on for "
                                               "--linear fp8 on an image model on a GPU (those eager steps wait "
                                               "on the host), when none of those is set; off otherwise.")]
Warmup = Annotated[int, typer.Option("--warmup", min=0, rich_help_panel=MEM, help="Untimed warm-up calls per variant "
                                                                      "(JIT compilation, autotuning).")]
Kernel = Annotated[Optional[list[str]], typer.Option("--kernel", "-k", metavar="KEY=VALUE", rich_help_panel=KER,
                                                     show_default=False,
                                                     help="Override a SageConfig field of the diffusion default "
                                                          "(repeatable), e.g. pv_precision=fp16, smooth_q=true.")]
FpBlocks = Annotated[Optional[str], typer.Option("--fp-blocks", metavar="LIST", rich_help_panel=KER,
                                                 help="Blocks that keep full-precision attention: indices "
                                                      "and/or module names, comma-separated (e.g. 0,-1).")]
FpFirst = Annotated[int, typer.Option("--fp-first-steps", min=0, rich_help_panel=KER,
                                      help="Keep the first N denoising steps in full precision.")]
FpLast = Annotated[int, typer.Option("--fp-last-steps", min=0, rich_help_panel=KER,
                                     help="Keep the last N denoising steps in full precision.")]
Backend = Annotated[Literal["auto", "triton", "reference"],
                    typer.Option("--backend", case_sensitive=False, rich_help_panel=KER,
                                 help="sagegen backend: auto (Triton on a supported GPU, else the emulation), "
                                      "triton or reference (the PyTorch emulation).")]
Linear = Annotated[Literal["none", "fp8"],
                   typer.Option("--linear", case_sensitive=False, rich_help_panel=KER,
                                help="The sage variant's denoiser linears: none (as the model) or fp8 (FP8 GEMMs, "
                                     "sm89+ GPU; emulated on the CPU; docs/fp8-linear.md).")]
Out = Annotated[Optional[Path], typer.Option("--out", "-o", metavar="DIR", rich_help_panel=OUT, show_default=False,
                                             help="Run directory (default: runs/<model>-<settings hash>; "
                                                  "re-running resumes).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", rich_help_panel=OUT, help="No progress bars.")]


def build_job(*, model: str, variants: list[str], prompt, prompts, max_prompts, seed, steps, frames, height,
              width, guidance, negative_prompt, dtype, device, model_path, random_weights, offload, vae_tiling,
              vae_slicing, compile, warmup, kernel, fp_blocks, fp_first_steps, fp_last_steps, backend, out,
              linear="none", sparse=None, cp=None, cuda_graphs=None, cache=None, lora=None, writes_run_dir=True):
    """Check the options (UsageProblem on mistakes) and build the `Job`; returns (job, warnings).
    ``writes_run_dir=False`` (calibrate, which writes one JSON file): the run directory is not checked."""
    from sagegen.jobs.generate import Job, make_samples
    from sagegen.models.presets import RANDOM_WEIGHT_FAMILIES, check_shape, resolve

    preset = resolve(model)
    if model_path is not None and preset.tiny:
        raise UsageProblem(f"{preset.name} is built in; --model-path is for hub models", "--model-path")
    if random_weights and preset.tiny:
        raise UsageProblem(f"{preset.name} already has random weights; drop --random-weights or pick a "
                           "full-size preset", "--random-weights")
    if random_weights and preset.family not in RANDOM_WEIGHT_FAMILIES:
        families = ", ".join(sorted(RANDOM_WEIGHT_FAMILIES))
        raise UsageProblem(f"--random-weights is not available for {preset.name} yet (it needs the family's "
                           f"full-size VAE and text-embedding shapes; available for: {families}); "
                           f"`sagegen bench {preset.name}` times its transformer at full size", "--random-weights")
    if random_weights and model_path is not None:
        raise UsageProblem("--random-weights builds the model in code; it cannot be combined with --model-path",
                           "--random-weights")
    if model_path is not None:
        from sagegen.models.loading import check_model_path

        check_model_path(preset, model_path)  # a folder of the right pipeline, before anything loads
    if frames is not None and not preset.is_video:
        raise UsageProblem(f"{preset.name} makes images; --frames is for video models", "--frames")
    # Checks that need no torch first, so that these mistakes are reported within a second.
    prompts_list = load_prompts(prompt or [], prompts, max_prompts)
    from sagegen.cli.lora_opt import parse as parse_lora

    loras = parse_lora(lora)
    checks.check_plan_size(len(prompts_list), count_seeds(seed or []))  # before building the plan
    seeds = parse_seeds(seed or [])
    config = kernel_config(kernel or [])
    from sagegen.cli.sparse_opt import parse as parse_sparse

    sparse_cfg = parse_sparse(sparse)
    if sparse_cfg is not None and "sage" not in variants:
        raise UsageProblem("--sparse applies to sagegen's attention; drop it or use --attention sage", "--sparse")
    checks.check_steps(steps)
    h, w = height or preset.height, width or preset.width
    f, frame_note = checks.fitted_frames(preset, frames)
    errors, warnings = check_shape(preset, height=h, width=w, frames=f, steps=steps)
    if errors:
        raise UsageProblem("; ".join(errors))
    warnings += [frame_note] if frame_note else []
    warnings += checks.ignored_with_stock(variants, kernel=kernel, fp_blocks=fp_blocks, backend=backend,
                                          fp_first_steps=fp_first_steps, fp_last_steps=fp_last_steps)
    from sagegen.cli.cp_option import check_cp

    cp_spec = check_cp(cp, preset, offload=offload, guidance=guidance)
    linear = None if linear.lower() == "none" else linear.lower()
    if linear is not None and "sage" not in variants:
        raise UsageProblem("--linear fp8 applies to the sage variant; drop it or use --attention sage", "--linear")
    # the rest of what the command line alone shows, before _check_device imports torch (seconds)
    if cuda_graphs:
        _check_cuda_graphs(True, compile=compile, offload=offload, cp=cp_spec, sparse=sparse_cfg, on_gpu=True)
    if out is not None and writes_run_dir:
        checks.check_out_dir(out, "--out")
    on_gpu = _check_device(device)
    if cp_spec is not None and cp_spec.ring > 1 and "sdpa" in variants and not on_gpu:
        raise UsageProblem("the stock attention under Ring needs CUDA (diffusers' _native_cudnn); on the CPU use "
                           "--cp ulysses=N, or `run` (sagegen only)", "--cp")
    if offload != "none" and not on_gpu:
        raise UsageProblem("CPU offload needs a CUDA device; drop --offload or use --device cuda", "--offload")
    if backend == "triton" and not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise UsageProblem("the Triton kernels need a CUDA GPU (or TRITON_INTERPRET=1 to interpret them on the "
                           "CPU); use --backend auto or reference", "--backend")
    policy = precision_policy(fp_blocks, fp_first_steps, fp_last_steps) if "sage" in variants else None
    if policy is not None:
        checks.check_policy_blocks(preset, policy.blocks, model_path=model_path)
    if cuda_graphs is None:
        cuda_graphs = graphs_by_default(preset, linear=linear, compile=compile, offload=offload, cp=cp_spec,
                                        sparse=sparse_cfg, on_gpu=on_gpu, cache=cache)
        if cuda_graphs:
            warnings.append(Note("CUDA graphs are on: eager FP8 linears on an image model wait on the host CPU "
                                 "(docs/cuda-graphs.md); --no-cuda-graphs runs them eagerly"))
    _check_cuda_graphs(cuda_graphs, compile=compile, offload=offload, cp=cp_spec, sparse=sparse_cfg, on_gpu=on_gpu)
    if sparse_cfg is not None and cp_spec is not None:
        _check_sparse_cp(sparse_cfg, cp_spec, preset)
    settings = {"steps": steps or preset.steps, "frames": f, "height": h, "width": w,
                "guidance": preset.guidance if guidance is None else guidance,
                "negative_prompt": negative_prompt or None,
                "dtype": preset.dtype if dtype == "auto" else dtype,
                "max_sequence_length": preset.max_sequence_length,
                "vae_tiling": vae_tiling, "vae_slicing": vae_slicing, "random_weights": random_weights}
    from sagegen.cli.memory import check_fits

    # what the sizes need against the GPU and the host, before anything loads (also --random-weights' weights)
    check_fits(preset, settings, on_gpu=on_gpu, device=device, variants=variants, offload=offload,
               cp_world=cp_spec.world if cp_spec is not None else 1, random_weights=random_weights,
               model_path=model_path, given=tuple(opt for opt, v in (("--frames", frames), ("--height", height),
                                                                     ("--width", width)) if v is not None))
    if random_weights and not on_gpu:
        from sagegen.cli.estimate import cpu_warning

        warning = cpu_warning(preset, settings, len(prompts_list) * len(seeds), len(variants))
        if warning:
            warnings.append(warning)
    if cp_spec is not None:  # only then: runs without --cp keep their run-directory hash
        settings["cp"] = cp_spec.to_dict()
    from sagegen.cli.cache_opt import parse as parse_cache

    cache_spec = parse_cache(cache, settings["steps"], preset.family,
                             sequence_split=cp_spec is not None and cp_spec.sequence_split)
    if cache_spec is not None:  # likewise
        settings["cache"] = cache_spec.to_dict()
        if cuda_graphs:
            warnings.append(Note("--cuda-graphs with --cache: the cache decides per step what the denoiser runs, "
                                 "which a replayed graph would repeat, so its calls run eagerly (counted as "
                                 "eager:step_cache under cuda_graphs in the manifest)"))
    if loras is not None:  # likewise
        settings["lora"] = loras
    job = Job(preset=preset, settings=settings, samples=make_samples(prompts_list, seeds), variants=variants,
              out=out, sage_config=config, policy=policy, backend=backend, device=device, offload=offload,
              compile=compile, warmup=warmup, model_path=str(model_path) if model_path else None,
              command=command_line(), linear=linear, sparse=sparse_cfg, cuda_graphs=cuda_graphs)
    if writes_run_dir:
        checks.check_out_dir(job.resolve_out(),
                             "--out" if out is not None else "--out (default: under $SAGEGEN_RUNS or runs/)")
    checks.check_video_encoder(preset)
    return job, warnings


# families whose self-attention reaches a CP split with the sparse policy in one process's token order, under
# any split: Wan's and LTX-Video's video-only calls, HunyuanVideo's fused joint calls and HunyuanVideo-1.5's
# key-mask calls with their (video, text) segments (Ring gathers the keys whole in that order)
_SPARSE_CP = ("wan", "ltx", "hunyuanvideo", "hunyuanvideo15")


def _check_sparse_cp(sparse_cfg, cp_spec, preset) -> None:
    """Under CP the policy runs where the patch hands self-attention to the split in one process's token
    order."""
    if preset.family in _SPARSE_CP:
        return
    raise UsageProblem("--sparse combines with --cp for Wan, LTX-Video, HunyuanVideo and HunyuanVideo-1.5 "
                       f"models; got {preset.name} ({preset.family}) with ulysses={cp_spec.ulysses}, "
                       f"ring={cp_spec.ring}", "--sparse")


class Note(str):
    """A line of `build_job`'s warnings that tells what a default chose (printed as ``note:``)."""


def print_warnings(console, warnings: list[str]) -> None:
    for w in warnings:
        kind = "note" if isinstance(w, Note) else "warning"
        console.print(f"{kind}: {w}", style="dim" if kind == "note" else "yellow", markup=False)


def graphs_by_default(preset, *, linear, compile: bool, offload: str, cp, sparse, on_gpu: bool, cache=None) -> bool:
    """--cuda-graphs when neither it nor --no-cuda-graphs is given: on for FP8 linears on an image model on a
    GPU, whose eager steps (~4-7k tokens a call) wait on the host, so that FP8 can be slower than attention
    alone there (lab/NOTES.md v7.9: 107-175 ms eager vs 93-98 ms as graphs for the same Flux step); off
    where graphs do not combine (compile, offload, CP, sparse), gain nothing (videos are GPU-bound) or step aside
    (a step cache: `sagegen.patch.graphs.step_cache_on`)."""
    return (on_gpu and linear == "fp8" and not preset.is_video and not compile and offload == "none"
            and cp is None and sparse is None and not cache)


def _check_cuda_graphs(cuda_graphs: bool, *, compile: bool, offload: str, cp, sparse, on_gpu: bool) -> None:
    if not cuda_graphs:
        return
    clash = [name for name, on in (("--compile", compile), ("--offload", offload != "none"), ("--cp", cp is not None),
                                   ("--sparse", sparse is not None)) if on]
    if clash:
        why = {"--compile": "torch.compile traces the forward itself (use its mode='reduce-overhead' for graphs)",
               "--offload": "offloading moves the weights a graph reads", "--cp": "graphs are not captured across "
               "processes here", "--sparse": "sparse calls record their density per call"}[clash[0]]
        raise UsageProblem(f"--cuda-graphs does not combine with {clash[0]} ({why}); drop one of them", "--cuda-graphs")
    if not on_gpu:
        raise UsageProblem("--cuda-graphs needs a CUDA device; drop it or use --device cuda", "--cuda-graphs")


def _check_device(device: str) -> bool:
    """Validate --device; True when it means a CUDA GPU."""
    import torch

    if device == "auto":
        return torch.cuda.is_available()
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageProblem(f"{device!r} is not a device; use auto, cpu, cuda or cuda:N", "--device") from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageProblem(f"{device!r}: sagegen runs on cpu or cuda devices", "--device")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageProblem("no CUDA GPU is visible to PyTorch (see `sagegen env`); use --device cpu or auto",
                               "--device")
        if dev.index is not None and dev.index >= count:
            raise UsageProblem(f"{device}: only {count} GPU(s) visible (cuda:0..cuda:{count - 1})", "--device")
    return dev.type == "cuda"


def _cuda_job(job) -> bool:
    import torch

    return job.device.startswith("cuda") or (job.device == "auto" and torch.cuda.is_available())


def execute(job, *, quiet: bool, title: str):
    """Run the job with progress output; print the outcome on rank 0. Returns the RunResult.

    Rank 0 holds the run directory's lock (`sagegen.runs.lock`) while it runs. A run directory that this call
    created and that holds no finished sample when it fails is removed again, so that a failed first attempt
    leaves no manifest-only folder behind."""
    from rich.console import Console
    from rich.markup import escape

    from sagegen.jobs import ranks as distributed
    from sagegen.runs import lock as runlock
    from sagegen.jobs.generate import run_job
    from sagegen.cli.progress import make_reporter

    dist = distributed.info()
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    run_dir = job.resolve_out()
    created = _first_missing(run_dir)  # the top folder this run creates (None: run_dir exists)
    if dist.is_main:
        s = job.settings
        size = f"{s['width']}x{s['height']}" + (f", {s['frames']} frames" if s["frames"] else "")
        err.print(f"[bold]{title}[/] {job.preset.name}: {len(job.samples)} sample(s) x {'+'.join(job.variants)}, "
                  f"{size}, {s['steps']} steps, guidance {s['guidance']}, {s['dtype']} -> {escape(str(run_dir))}")
    lock = runlock.hold(run_dir, job.command) if dist.is_main else contextlib.nullcontext()
    # one init: a first gloo-only group would stay, and CP's collectives on CUDA tensors would then fail
    distributed.init(dist, gpu_collectives=bool(job.settings.get("cp")) and _cuda_job(job))
    finished = False
    try:
        with lock, make_reporter(err, quiet=quiet, rank=dist.rank) as reporter:
            try:
                result = run_job(job, reporter, dist=dist)
            except BaseException:
                if created is not None and dist.is_main:
                    remove_if_unfinished(run_dir, created)
                raise
        finished = True
    except BaseException:  # also when the lock itself could not be written (a full disk at start)
        if created is not None and dist.is_main:
            remove_if_unfinished(run_dir, created)
        raise
    finally:
        distributed.shutdown(dist, wait_for_peers=finished)
    return result


def _first_missing(path: Path) -> Path | None:
    path = Path(path).absolute()
    if path.exists():
        return None
    while not path.parent.exists() and path.parent != path:
        path = path.parent
    return path


def remove_if_unfinished(run_dir: Path, top: Path | None = None) -> None:
    """Remove `run_dir` if it holds nothing but run bookkeeping (no sample.json anywhere), and the empty
    folders above it up to `top` (the first one this run created)."""
    import shutil

    from sagegen.runs.directory import SAMPLE_JSON

    if not run_dir.is_dir() or any(run_dir.rglob(SAMPLE_JSON)):
        return
    keep = {"manifest.json", ".manifest.lock", ".sagegen-run.lock", "samples"}
    if any(p.name not in keep for p in run_dir.iterdir()):
        return  # something else lives there: leave it alone
    shutil.rmtree(run_dir, ignore_errors=True)
    here = Path(run_dir).absolute().parent
    if top is None:
        return
    top = Path(top).absolute()
    while here != here.parent and (here == top or top in here.parents):
        try:
            here.rmdir()  # only when empty
        except OSError:
            return
        here = here.parent
