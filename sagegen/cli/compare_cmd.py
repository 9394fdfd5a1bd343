"""``sagegen compare MODEL ...``: the same prompts and seeds with ``sdpa`` and ``sage`` into one run directory."""

from __future__ import annotations

import shlex

import typer

from sagegen.cli import cache_opt, jobs, lora_opt, sparse_opt
from sagegen.cli.errors import cli_command


@cli_command
def compare_command(
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
    """Generate with the stock attention (sdpa) and with sagegen (sage); print the speedups.

    Every prompt x seed runs with both into one run directory (resumable), for `sagegen eval` and `report`.

    Example: sagegen compare tiny-cogvideox --prompts smoke
    """
    params = {k: v for k, v in locals().items() if k != "quiet"}
    from rich.console import Console

    from sagegen.jobs import ranks as distributed
    from sagegen.cli.tables import attention_warnings, compare_table, result_console, run_notes, setup_lines

    job, warnings = jobs.build_job(**params, variants=["sdpa", "sage"])
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    jobs.print_warnings(err, warnings)
    result = jobs.execute(job, quiet=quiet, title="compare")
    if not distributed.info().is_main or result.manifest is None:
        return
    console = result_console()
    m = result.manifest
    console.print(compare_table(m))
    for line in setup_lines(m):
        console.print(f"setup {line}", style="dim", markup=False)
    missing = {v: len(m["samples"]) - len(m.get("timings", {}).get(v, {})) for v in job.variants}
    if any(missing.values()):
        console.print("unfinished: " + ", ".join(f"{v} {n}" for v, n in missing.items() if n), style="yellow",
                      markup=False)
    for warning in attention_warnings(m):
        console.print(warning, style="yellow", markup=False)
    for note in run_notes(m):
        console.print(note, style="yellow", markup=False)
    console.print(f"Output: {result.run_dir}", markup=False)
    typed = shlex.quote(str(result.run_dir))  # a path with spaces still works when pasted
    console.print(f"Next: sagegen eval {typed}  ·  sagegen report {typed}", style="dim", markup=False)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_command)
