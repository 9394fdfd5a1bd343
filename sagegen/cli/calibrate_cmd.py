"""``sagegen calibrate MODEL``: per-layer block-sparse thresholds from the user's own prompts and weights, or
with ``--cache magcache`` MagCache's magnitude ratios.

Sparse: one dense generation per prompt x seed (fewer steps are fine: ``--steps``); every attention call that
would run sparse is also computed sparse at each candidate threshold, and each layer gets the sparsest one whose
worst sparse-vs-dense attention error stays under ``--target`` (`sagegen.jobs.calibrate`). The result is a
small JSON that `run` / `compare` take as ``--sparse calib=FILE``.

MagCache: one uncached generation per prompt x seed, at the steps the runs will use, with sagegen's attention;
the per-step ratios of the main blocks' residual (`sagegen.patch.cache_calibration`) averaged over them, in a
JSON that `run` / `compare` take as ``--cache magcache=FILE``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from sagegen.cli import jobs
from sagegen.cli.errors import UsageProblem, cli_command
from sagegen.cli.options import finite_number

CAL = "Calibration"
Target = Annotated[float, typer.Option("--target", callback=finite_number(1e-6), rich_help_panel=CAL,
                                       help="Largest allowed relative L2 error of a layer's sparse attention "
                                            "output against its dense output (worst call), >= 1e-06.")]
Mode = Annotated[Literal["cdf", "topk"], typer.Option("--mode", case_sensitive=False, rich_help_panel=CAL,
                                                      help="Predictor mode whose threshold is searched.")]
Candidates = Annotated[Optional[str], typer.Option("--candidates", metavar="LIST", rich_help_panel=CAL,
                                                   show_default=False,
                                                   help="Thresholds to try, comma-separated (default: cdf "
                                                        "0.8,0.9,0.95,0.98,0.995; topk 0.1,0.2,0.3,0.5,0.7).")]
Options = Annotated[Optional[str], typer.Option("--sparse-options", metavar="OPTS", rich_help_panel=CAL,
                                                show_default=False,
                                                help="Other options of the searched sparse config, e.g. "
                                                     "steps=0.25,blocks=0,sim=0.2 (as in `sagegen compare "
                                                     "--sparse topk=0.5,steps=0.25`).")]
CalOut = Annotated[Optional[Path], typer.Option("--out", "-o", metavar="FILE", show_default=False,
                                                help="Calibration JSON (default: calib-<model>.json, with --cache "
                                                     "magcache: magcache-<model>.json).")]
CacheKind = Annotated[Optional[Literal["magcache"]], typer.Option(
    "--cache", case_sensitive=False, rich_help_panel=CAL, show_default=False,
    help="Calibrate a step cache instead of sparse thresholds: magcache (its magnitude ratios at --steps, for "
         "--cache magcache=FILE).")]


def _candidates(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageProblem(f"{text!r}: expected numbers in (0, 1] separated by commas", "--candidates") from None
    if not values or not all(0 < v <= 1 for v in values):
        raise UsageProblem(f"{text!r}: every threshold must be in (0, 1]", "--candidates")
    return values


def _base_config(mode: str, options: str | None):
    """The searched config: ``MODE=0.5`` plus --sparse-options (errors name --sparse-options, not --sparse)."""
    from sagegen.sparse.text import parse_sparse_arg

    try:
        return parse_sparse_arg(f"{mode}=0.5" + (f",{options}" if options else ""))
    except ValueError as e:
        raise UsageProblem(f"--sparse-options {options!r}: {e}" if options else str(e), "--sparse-options") from None


def check_out_file(path: Path) -> None:
    """--out must name a file that can be written, checked before the calibration's minutes of work: not a
    folder, and its folder exists (or can be made) and is writable."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise UsageProblem(f"{path} is a folder; give a file name, e.g. --out {path / 'calib.json'}", "--out")
    folder = path.parent
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    if not folder.is_dir():
        raise UsageProblem(f"{path} cannot be written: {folder} is a file, not a folder", "--out")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageProblem(f"{path} cannot be written: {folder} is not writable; choose another place", "--out")


@cli_command
def calibrate_command(
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
    dtype: jobs.Dtype = "auto",
    target: Target = 0.05,
    mode: Mode = "cdf",
    candidates: Candidates = None,
    sparse_options: Options = None,
    kernel: jobs.Kernel = None,
    backend: jobs.Backend = "auto",
    model_path: jobs.ModelPath = None,
    random_weights: jobs.RandomWeights = False,
    device: jobs.Device = "auto",
    cache: CacheKind = None,
    out: CalOut = None,
) -> None:
    """Search per-layer block-sparse thresholds keeping attention error under a target; write a JSON.

    Example: sagegen calibrate hunyuanvideo --prompts t2v --max-prompts 2 --steps 10 --target 0.05 -o calib.json;
    then sagegen compare hunyuanvideo --prompts t2v --sparse calib=calib.json and sagegen eval RUN_DIR.
    """
    from rich.console import Console

    from sagegen.models.presets import resolve

    cands = _candidates(candidates)
    base = _base_config(mode, sparse_options)
    path = out or Path(f"{'magcache' if cache else 'calib'}-{resolve(model).name}.json")
    check_out_file(path)
    job, warnings = jobs.build_job(
        model=model, variants=["sage"], prompt=prompt, prompts=prompts, max_prompts=max_prompts, seed=seed,
        steps=steps, frames=frames, height=height, width=width, guidance=guidance, negative_prompt=None,
        dtype=dtype, device=device, model_path=model_path, random_weights=random_weights, offload="none",
        vae_tiling=False, vae_slicing=False, compile=False, warmup=0, kernel=kernel, fp_blocks=None,
        fp_first_steps=0, fp_last_steps=0, backend=backend, out=None, writes_run_dir=False)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    jobs.print_warnings(err, warnings)

    from sagegen.jobs import ranks as distributed
    from sagegen.jobs.generate import default_loader, generate_one
    from sagegen.jobs.calibrate import calibrate
    from sagegen.sparse.text import save_calibration

    dev = distributed.device_for(job.device, distributed.info())
    loaded = default_loader(job, dev)
    if cache:
        _calibrate_magcache(job, loaded, dev, path, model, err)
        return
    err.print(f"calibrating {job.preset.name}: {len(job.samples)} sample(s), {job.settings['steps']} steps, "
              f"{base.mode} thresholds, target error {target}", markup=False)

    def generate():
        for sample in job.samples:
            generate_one(loaded, job.preset, job.settings, sample, dev)

    result = calibrate(loaded.pipe, generate, target=target, base=base, candidates=cands, backend=job.backend,
                       config=job.sage_config)
    if not result["layers"]:
        raise UsageProblem("no attention call was eligible for sparsity (all dense by policy: short sequences, "
                           "dense steps or blocks); nothing to calibrate at this size", "--sparse-options")
    details = {"model": job.preset.name, "target": target, "candidates": result["candidates"],
               "seconds": result["seconds"], "settings": job.settings, "samples": len(job.samples),
               "layers": result["layers"]}
    save_calibration(path, result["config"], details)
    console = Console(highlight=False, soft_wrap=True)
    short = sum(not v["meets_target"] for v in result["layers"].values())
    mean_density = sum(v["density"] for v in result["layers"].values()) / len(result["layers"])
    console.print(f"{len(result['layers'])} layer(s) calibrated in {result['seconds']:.0f} s; mean density "
                  f"{mean_density:.3f}" + (f"; {short} layer(s) miss the target even at the densest candidate"
                                           if short else ""), markup=False)
    console.print(f"Wrote {path}. Use it: sagegen compare {model} ... --sparse calib={path}", markup=False)


def _calibrate_magcache(job, loaded, dev, path: Path, model: str, err) -> None:
    import sagegen
    from rich.console import Console

    from sagegen.jobs.generate import generate_one
    from sagegen.patch.cache_calibration import magcache_ratios
    from sagegen.runs.files import atomic_write_json

    steps = job.settings["steps"]
    err.print(f"calibrating MagCache for {job.preset.name}: {len(job.samples)} sample(s), {steps} steps, sagegen "
              "attention, no cache", markup=False)
    samples = list(job.samples)
    sagegen.patch(loaded.pipe, job.sage_config, backend=job.backend, allow_generic=True)
    try:
        result = magcache_ratios(loaded.pipe, lambda i: generate_one(loaded, job.preset, job.settings, samples[i],
                                                                     dev), len(samples))
    finally:
        sagegen.unpatch(loaded.pipe)
    if len(result["mag_ratios"]) != steps:
        raise UsageProblem(f"measured {len(result['mag_ratios'])} ratios for {steps} steps: this pipeline's "
                           "denoiser calls do not follow its steps; MagCache cannot be calibrated for it", "--cache")
    atomic_write_json(path, {"format": "sagegen-magcache-1", "model": job.preset.name, "steps": steps,
                             "mag_ratios": result["mag_ratios"], "streams": result["streams"],
                             "runs": result["runs"], "settings": job.settings, "samples": len(samples)})
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"Wrote {path} ({steps} ratios, mean of {result['runs']} generation(s)). Use it: sagegen compare "
                  f"{model} ... --steps {steps} --cache magcache={path}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate_command)
