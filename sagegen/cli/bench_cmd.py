"""``sagegen bench MODEL``: one denoising step of the full-size transformer with random weights, stock
attention vs sagegen (and optionally both under torch.compile); see `sagegen.jobs.stepbench.bench`."""

from __future__ import annotations

import datetime
import os

import typer

from sagegen.cli.completion import complete_model
from sagegen.cli.errors import UsageProblem, cli_command

NO_GPU = ("sagegen bench times the GPU kernels, and no CUDA GPU is visible to PyTorch here (see `sagegen env`); "
          "run it on a machine with an NVIDIA GPU, or add --tiny for the CPU smoke test of the same code path")
NO_GPU_E2E = ("sagegen bench --e2e times whole generations on the GPU, and no CUDA GPU is visible to PyTorch here (see "
              "`sagegen env`); run it on a machine with an NVIDIA GPU, or time a tiny- preset (tiny-flux) on the CPU")


def bench_architecture(model: str, tiny: bool = False) -> str:
    """The stepbench architecture for a model name, accepting every name and alias that `run` accepts; with
    ``tiny`` (the --tiny smoke test) a ``tiny-`` preset stands for its family's first full-size architecture."""
    from sagegen.models import arch
    from sagegen.models.presets import resolve

    preset = resolve(model)  # UnknownModel (exit 2) with "did you mean"
    for name in (preset.name, *preset.aliases):  # e.g. hunyuanvideo-1.5 -> its 720p architecture
        try:
            return arch.get_arch(name).name
        except ValueError:
            pass
    full = [p for p in arch.ARCHS if arch.ARCHS[p].family == preset.family]
    if tiny and full and preset.name.startswith("tiny-"):
        return full[0]
    hint = f" (the full-size {preset.family} architectures: {', '.join(full)}; --tiny shrinks them)" if full else ""
    raise UsageProblem(f"{preset.name} has no full-size architecture to benchmark{hint}; choose one of "
                       f"{', '.join(arch.ARCHS)}", "MODEL")


def bench_command(
    ctx: typer.Context,
    model: str = typer.Argument(..., metavar="MODEL", autocompletion=complete_model,
                                help="architecture: a preset name or alias as for `run`, such as cogvideox, "
                                     "cogvideox-5b, hunyuanvideo, mochi, flux.1-dev, sd3.5-large"),
) -> None:
    """Time one denoising step at the model's default resolution (random weights, nothing downloaded).

    Stock attention vs sagegen in the same run after warm-up, an attention-free run (Amdahl), peak memory and the \
output difference; JSON with device, versions and date. Needs a CUDA GPU (--tiny: a CPU smoke test).

    Options passed to the benchmark: --compile (--compiled-only: skip the eager sagegen variants; --compile-scope \
full|regional, --compile-mode MODE, --compile-backend NAME), --cuda-graphs (also each eager variant replayed as a CUDA \
graph: no host time), --repeats N, --warmup N, --batch N, --height, --width, --frames, --dtype bf16|fp16, --seed N, \
--sage-config JSON, --backend auto|triton, --linear fp8 (also attention + FP8 linears; --linear-policy JSON), \
--torchao (the same layers by torchao's float8, if installed), --sparse SPEC (also block-sparse attention, repeatable: \
topk=0.5, cdf=0.95, sta, radial), --only NAMES (time just these variants), --profile (GPU time by kernel group), \
--no-zero-attention, --random-weights (the default), --tiny, --out FILE.

    --e2e: time to video instead (the whole pipeline at the preset's steps: text encoding, denoising, decoding and \
saving timed apart; variants stock, sagegen's stack, torchao's stack; --cache SPEC also runs each with that step \
cache; options: `python bench/bench_e2e.py --help`).

    Examples: sagegen bench cogvideox-5b --compile; sagegen bench flux --tiny --out /tmp/smoke.json; \
sagegen bench flux.1-dev --e2e --cache taylorseer=3
    """
    extra = list(ctx.args)
    if "--e2e" in extra:
        return _e2e(model, [a for a in extra if a != "--e2e"])
    if any(a == "--cache" or a.startswith("--cache=") for a in extra):
        raise UsageProblem("--cache acts across denoising steps and `sagegen bench` times one step; add --e2e to time "
                           "whole generations with the cache", "--cache")
    name = bench_architecture(model, tiny="--tiny" in extra)
    args = [name, *extra]
    if "--out" not in extra and not any(a.startswith("--out=") for a in extra):
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        args += ["--out", os.path.join(os.environ.get("SAGEGEN_RUNS", "runs"), "bench", f"{name}-{stamp}.json")]
    from sagegen.jobs.stepbench.args import BenchArgError, parse_args

    try:  # a wrong option is named before anything else is said, and before torch loads
        parse_args(args, raise_errors=True)
    except BenchArgError as e:
        raise UsageProblem(f"{e} (see `sagegen bench --help`)") from None
    from sagegen.jobs.stepbench import bench as stepbench

    try:
        if "--tiny" not in extra:
            import torch

            if not torch.cuda.is_available():
                raise UsageProblem(NO_GPU)
        else:
            print(f"note: --tiny: {name}'s architecture shrunk to a few layers, timed on this machine; a smoke test "
                  "of the code path, not a speed measurement", flush=True)
        stepbench.main(args)
    except SystemExit as exc:
        if isinstance(exc.code, str):  # a message from the benchmark itself
            raise UsageProblem(exc.code) from None
        if exc.code:  # argparse's own exit (its checks ran above, so not expected here)
            raise typer.Exit(2) from None


def _e2e(model: str, extra: list[str]) -> None:
    """``sagegen bench MODEL --e2e ...``: `sagegen.cli.e2e_bench` (time to video), its usage errors exit 2."""
    from sagegen.models.presets import resolve

    name = resolve(model).name  # UnknownModel (exit 2) with "did you mean"
    if "--out" not in extra and not any(a.startswith("--out=") for a in extra):
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        extra += ["--out", os.path.join(os.environ.get("SAGEGEN_RUNS", "runs"), "bench", f"e2e-{name}-{stamp}.json")]
    from sagegen.cli import e2e_bench

    try:
        args = e2e_bench.parse([name, *extra])
    except SystemExit as exc:
        raise typer.Exit(2 if exc.code else 0) from None
    if not name.startswith("tiny-") and args.device in ("auto", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageProblem(NO_GPU_E2E)
    e2e_bench.main([name, *extra])


def register(app: typer.Typer) -> None:
    app.command("bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
        cli_command(bench_command))
