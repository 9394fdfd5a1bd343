"""``sagegen bench MODEL``: one denoising step of the full-size transformer with random weights, stock
attention vs sagegen (and optionally both under torch.compile); see `sagegen.stepbench`."""

from __future__ import annotations

import datetime
import os

import typer

from .errors import UsageProblem, cli_command


def bench_command(
    ctx: typer.Context,
    model: str = typer.Argument(..., metavar="MODEL", help="architecture: a preset name such as cogvideox-5b, "
                                                           "hunyuanvideo, mochi-1, flux.1-dev, sd3.5-large"),
) -> None:
    """Time one denoising step at the model's default resolution (random weights, nothing downloaded).

    Stock attention vs sagegen in the same run after warm-up, an attention-free run (Amdahl), peak memory and the output difference; JSON with device, versions and date.

    Options passed to the benchmark: --compile, --repeats N, --warmup N, --batch N, --height, --width, --frames, --dtype bf16|fp16, --sage-config JSON, --backend auto|triton, --linear fp8 (also attention + FP8 linears; --linear-policy JSON), --profile (GPU time by kernel group), --no-zero-attention, --tiny, --out FILE.

    Example: sagegen bench cogvideox-5b --random-weights --compile
    """
    from ..models import arch
    from .. import stepbench

    if model not in arch.ARCHS:
        raise UsageProblem(f"unknown MODEL {model!r}; choose one of {', '.join(arch.ARCHS)}")
    args = [model, *ctx.args]
    if "--out" not in ctx.args:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        args += ["--out", os.path.join(os.environ.get("SAGEGEN_RUNS", "runs"), "bench", f"{model}-{stamp}.json")]
    try:
        stepbench.main(args)
    except SystemExit as exc:  # argparse's usage errors
        if exc.code:
            raise UsageProblem(f"bad benchmark option in {' '.join(ctx.args)!r} (see `sagegen bench --help`)")


def register(app: typer.Typer) -> None:
    app.command("bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
        cli_command(bench_command))
