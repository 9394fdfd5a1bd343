"""``sagegen run MODEL --prompt TEXT``: generate with sagegen's attention (or the stock one)."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from sagegen.cli import cache_opt, jobs, lora_opt, sparse_opt
from sagegen.cli.errors import cli_command

Attention = Annotated[Literal["sage", "sdpa"],
                      typer.Option("--attention", case_sensitive=False, rich_help_panel=jobs.KER,
                                   help="sage: sagegen's quantized attention; sdpa: the stock attention.")]


@cli_command
def run_command(
    model: jobs.Model,
    prompt: jobs.Prompt = None,
    prompts: jobs.Prompts = None,
    max_prompts: jobs.MaxPrompts = None,
    seed: jobs.Seed = None,
    steps: jobs.Steps = None,
    frames: jobs.Frames = None,
    height: jobs.Height = None,
    width: jobs.Width = None,
    guidance: jobs.Guidance = None,
    negative_prompt: jobs.Negative = None,
    dtype: jobs.Dtype = "auto",
    attention: Attention = "sage",
    kernel: jobs.Kernel = None,
    fp_blocks: jobs.FpBlocks = None,
    fp_first_steps: jobs.FpFirst = 0,
    fp_last_steps: jobs.FpLast = 0,
    sparse: sparse_opt.Sparse = None,
    cache: cache_opt.Cache = None,
    lora: lora_opt.Lora = None,
    backend: jobs.Backend = "auto",
    linear: jobs.Linear = "none",
    model_path: jobs.ModelPath = None,
    random_weights: jobs.RandomWeights = False,
    device: jobs.Device = "auto",
    offload: jobs.Offload = "none",
    cp: jobs.Cp = None,
    vae_tiling: jobs.VaeTiling = False,
    vae_slicing: jobs.VaeSlicing = False,
    compile: jobs.Compile = False,
    cuda_graphs: jobs.CudaGraphs = None,
    warmup: jobs.Warmup = 1,
    out: jobs.Out = None,
    quiet: jobs.Quiet = False,
) -> None:
    """Generate with sagegen's attention (or the stock one) into a run directory.

    Every prompt runs with every seed; re-running the same command resumes.

    Examples: sagegen run cogvideox --prompt "a red fox running through snow";
    sagegen run tiny-flux --prompts smoke --seed 0-1 --attention sdpa
    """
    params = {k: v for k, v in locals().items() if k not in ("attention", "quiet")}
    from rich.console import Console

    from sagegen.jobs import ranks as distributed

    job, warnings = jobs.build_job(**params, variants=[attention.lower()])
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    jobs.print_warnings(err, warnings)
    result = jobs.execute(job, quiet=quiet, title="run")
    if not distributed.info().is_main or result.manifest is None:
        return
    _print_outcome(result, job.variants[0])


def _print_outcome(result, variant) -> None:
    from sagegen.cli.tables import attention_warnings, result_console, run_notes, run_table, setup_lines

    console = result_console()
    m = result.manifest
    console.print(run_table(m, variant))
    for line in setup_lines(m):
        console.print(f"setup {line}", style="dim", markup=False)
    done = len(m.get("timings", {}).get(variant, {}))
    skipped = result.skipped.get(variant, 0)
    extra = f" ({skipped} already finished before this run)" if skipped else ""
    console.print(f"{done}/{len(m['samples'])} sample(s) finished{extra}.", markup=False)
    for warning in attention_warnings(m):
        console.print(warning, style="yellow", markup=False)
    for note in run_notes(m):
        console.print(note, style="yellow", markup=False)
    console.print(f"Output: {result.run_dir}", markup=False)
    _print_media(console, result.run_dir, variant, m)


def _print_media(console, run_dir, variant, manifest, limit: int = 5) -> None:
    """Where the videos/images of this variant are (the first few)."""
    from sagegen.runs.directory import RunDir

    rd = RunDir(run_dir)
    ids = rd.sample_ids(variant)
    for sid in ids[:limit]:
        media = rd.video_path(variant, sid) if manifest["model"]["kind"] == "video" else rd.image_path(variant, sid)
        console.print(f"  {sid}: {media}", markup=False)
    if len(ids) > limit:
        console.print(f"  … and {len(ids) - limit} more under {rd.variant_dir(variant)}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
