"""``sagegen eval [RUN_DIR] --metric NAME ...``: compute metrics for a run directory into metrics.json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

METRIC_HELP = ("clipsim, clipt, clipscore, fid, kid, psnr, ssim, lpips, or all (repeatable; commas allowed). "
               "Default: all available, i.e. every metric that applies to the run and whose weights are found; "
               "the others are listed as skipped, with the reason.")
# the CLIP preprocessing modes (sagegen.eval.clip.MODES, which imports torch) and what each does
MODE_NOTES = {
    "evalcrafter": "EvalCrafter-compatible (OpenAI ViT-B/32; frames squashed to 224x224, raw 0..255 pixels, "
    "no normalisation; cosine similarity; read from the lossless PNG frames, where EvalCrafter decodes the MP4)",
    "standard": "standard open_clip preprocessing (resize shortest side, centre crop, mean/std normalise)",
}


def eval_command(
    run_dir: Annotated[Optional[Path], typer.Argument(help="Run directory (default: the most recent under "
                                                           "$SAGEGEN_RUNS or runs/).")] = None,
    metric: Annotated[list[str], typer.Option("--metric", "-m", metavar="NAME", help=METRIC_HELP,
                                              show_default="all available")] = [],  # noqa: B006
    clip_model: Annotated[Optional[str], typer.Option("--clip-model",
                                                      help="CLIP weights: NAME/TAG (open_clip name + pretrained "
                                                           "tag, from the local cache), [NAME:]PATH to a "
                                                           "checkpoint, or local-dir:FOLDER. Default "
                                                           "ViT-B-32/openai.")] = None,
    clip_mode: Annotated[str, typer.Option("--clip-mode",
                                           help="CLIPSIM/CLIP-T preprocessing: evalcrafter (reproduces "
                                                "EvalCrafter, as in the SageAttention2 paper) or "
                                                "standard.")] = "evalcrafter",
    inception_weights: Annotated[Optional[str], typer.Option("--inception-weights",
                                                             help="Inception for FID/KID: TorchScript "
                                                                  "inception-2015-12-05.pt, pytorch-fid's "
                                                                  "pt_inception-2015-12-05-*.pth, or a torchvision "
                                                                  "Inception-v3 .pth (or "
                                                                  "$SAGEGEN_INCEPTION_WEIGHTS).")] = None,
    reference: Annotated[Optional[Path], typer.Option("--reference",
                                                      help="Folder of reference images: FID/KID of each variant "
                                                           "against it as well.")] = None,
    lpips_weights: Annotated[Optional[str], typer.Option("--lpips-weights",
                                                         help="LPIPS weights: combined .pth or a folder with "
                                                              "alexnet-owt-*.pth and lpips' alex.pth (or "
                                                              "$SAGEGEN_LPIPS_WEIGHTS).")] = None,
    fid_frames: Annotated[Optional[int], typer.Option("--fid-frames", min=1,
                                                      help="Frames per video sample used for FID/KID "
                                                           "(evenly spaced; default all).")] = None,
    against: Annotated[Optional[Path], typer.Option("--against", metavar="OTHER_RUN",
                                                    help="Another run of the same model, prompts and seeds that "
                                                         "differs in one setting (e.g. no step cache): PSNR/SSIM/LPIPS "
                                                         "of every variant here against every variant there, "
                                                         "into metrics.json's 'against'.")] = None,
    bootstrap: Annotated[Optional[int], typer.Option("--bootstrap", hidden=True,
                                                     help="Ignored: the intervals are Student-t "
                                                          "now (kept so old scripts run).")] = None,
) -> None:
    """Evaluate a run: CLIP scores, FID/KID, PSNR/SSIM/LPIPS vs the baseline, into metrics.json.

    Writes RUN_DIR/metrics.json (per sample and aggregate, sage − baseline deltas with 95% Student-t
    confidence intervals over prompts) and prints a table. \
A metric whose weights are missing offline is skipped with a one-line
    reason; the others still run. Exits 1 when none of the requested metrics could be computed.

    Examples: sagegen eval runs/demo (every metric it can);
    sagegen eval RUN_DIR --metric psnr,ssim,lpips;
    sagegen eval RUN_DIR --metric fid --reference real_images/ --fid-frames 8;
    sagegen eval runs/cached --against runs/uncached (a step cache's cost, against stock and sagegen uncached)
    """
    from rich.console import Console

    # the command line's own mistakes first: torch comes in only with the metrics (sagegen.eval.clip, ...)
    from sagegen.runs.reader import RunDirError, load_run, resolve_run_dir
    from sagegen.eval.runner import EvalOptions, evaluate, not_applicable, parse_metrics
    from sagegen.eval.table import metrics_table, skip_lines
    from sagegen.eval.weights import BadOption, check_weight_options

    console = Console()
    err_console = Console(stderr=True, highlight=False, soft_wrap=True)
    if clip_mode not in MODE_NOTES:
        raise typer.BadParameter(f"must be one of {', '.join(MODE_NOTES)}; got {clip_mode!r}",
                                 param_hint="--clip-mode")
    if reference is not None and not reference.is_dir():
        raise typer.BadParameter(f"{reference} is not a folder", param_hint="--reference")
    try:
        check_weight_options(clip_model, inception_weights, lpips_weights)
    except BadOption as e:
        option, _, why = str(e).partition(": ")
        raise typer.BadParameter(why, param_hint=option) from e
    try:
        path = resolve_run_dir(run_dir)
        kind = load_run(path).kind
        names = parse_metrics(metric, kind)
    except RunDirError as e:
        err_console.print(f"[bold red]Error:[/] {escape(str(e))}")
        raise typer.Exit(2) from e
    except BadOption as e:
        raise typer.BadParameter(str(e).split(": ", 1)[-1], param_hint="--metric") from e
    if against is not None:
        _eval_against(path, against, metric, lpips_weights, console, err_console)
        return
    asked_for = [m for m in names if m in not_applicable(kind)] if not _all_metrics(metric) else []
    if asked_for:  # named explicitly, but not for this kind of run: a usage mistake
        raise typer.BadParameter("; ".join(not_applicable(kind)[m] for m in asked_for), param_hint="--metric")
    console.print(f"Evaluating [bold]{escape(str(path))}[/] ({kind} model): {', '.join(names)}")
    if set(names) & {"clipsim", "clipt"}:
        console.print(f"CLIP mode: [bold]{clip_mode}[/] — {MODE_NOTES[clip_mode]}")
    opts = EvalOptions(metrics=names, clip_model=clip_model, clip_mode=clip_mode, inception_weights=inception_weights,
                       lpips_weights=lpips_weights, reference=reference, fid_frames_per_sample=fid_frames)
    if bootstrap is not None:
        console.print("note: --bootstrap is ignored; the confidence intervals are Student-t over prompts",
                      style="yellow", highlight=False)
    try:
        doc = evaluate(path, opts, log=lambda s: console.print(s, style="dim", highlight=False, markup=False))
    except BadOption as e:
        opt = str(e).split(":", 1)[0] if str(e).startswith("--") else None
        raise typer.BadParameter(str(e).split(": ", 1)[-1] if opt else str(e), param_hint=opt) from e
    except RunDirError as e:
        err_console.print(f"[bold red]Error:[/] {escape(str(e))}")
        raise typer.Exit(2) from e
    console.print(metrics_table(doc, names))
    for line in skip_lines(doc, names):
        console.print(line, style="yellow", highlight=False, soft_wrap=True, markup=False)
    if _all_metrics(metric):
        for m, why in not_applicable(kind).items():  # what "all" left out, so the list is complete
            console.print(f"{m} not applicable: {why}", style="dim", highlight=False, soft_wrap=True, markup=False)
    for m in names:
        w = doc["metrics"].get(m, {}).get("warning")
        if w:
            console.print(f"warning ({m}): {w}", style="yellow", highlight=False, soft_wrap=True, markup=False)
    console.print(f"Wrote {path / 'metrics.json'}", highlight=False, soft_wrap=True, markup=False)
    # not a success: nothing the user asked for came out (reasons printed above)
    if not (doc.get("last_eval") or {}).get("computed"):
        err_console.print(f"[bold red]Error:[/] none of the requested metrics ({', '.join(names)}) could be computed; "
                          "see the reasons above (results of earlier calls in metrics.json are kept)", highlight=False,
                          soft_wrap=True)
        raise typer.Exit(1)


def _eval_against(path: Path, against: Path, metric, lpips_weights, console, err_console) -> None:
    """``--against OTHER_RUN``: the paired metrics of every variant pair (sagegen.eval.against)."""
    from sagegen.eval.against import evaluate_against
    from sagegen.eval.runner import PAIRED_METRICS, parse_metrics
    from sagegen.eval.table import against_table
    from sagegen.eval.weights import BadOption, WeightsMissing
    from sagegen.runs.reader import RunDirError, resolve_run_dir

    names = list(PAIRED_METRICS) if _all_metrics(metric) else parse_metrics(metric)
    others = [m for m in names if m not in PAIRED_METRICS]
    if others:
        raise typer.BadParameter(f"with --against only {', '.join(PAIRED_METRICS)} apply (pixel against pixel); "
                                 f"got {', '.join(others)}", param_hint="--metric")
    try:
        other = resolve_run_dir(against)
    except RunDirError as e:
        raise typer.BadParameter(str(e), param_hint="--against") from e
    lpips = None
    if "lpips" in names:
        from sagegen.eval import fidelity, weights

        try:
            lpips = fidelity.load_lpips(weights.resolve_lpips(lpips_weights))
        except (WeightsMissing, ModuleNotFoundError) as e:
            names.remove("lpips")
            console.print(f"lpips skipped: {e}", style="yellow", highlight=False, soft_wrap=True, markup=False)
    if not names:
        err_console.print("[bold red]Error:[/] none of the requested metrics could be computed (reasons above)")
        raise typer.Exit(1)
    console.print(f"Evaluating [bold]{escape(str(path))}[/] against [bold]{escape(str(other))}[/]: {', '.join(names)}")
    try:
        entry = evaluate_against(path, other, names, lambda: lpips,
                                 log=lambda s: console.print(s, style="dim", highlight=False, markup=False))
    except BadOption as e:
        raise typer.BadParameter(str(e).split(": ", 1)[-1], param_hint="--against") from e
    except RunDirError as e:
        err_console.print(f"[bold red]Error:[/] {escape(str(e))}")
        raise typer.Exit(2) from e
    console.print(against_table(entry, names, other.name))
    for sid, why in (entry.get("sample_errors") or {}).items():
        console.print(f"sample {sid} left out: {why}", style="yellow", highlight=False, soft_wrap=True, markup=False)
    console.print(f"Wrote {path / 'metrics.json'} (against.{other.name})", highlight=False, soft_wrap=True,
                  markup=False)


def _all_metrics(metric) -> bool:
    """No --metric, or ``all`` among them: every metric that applies (the others named, not refused)."""
    return not any(str(x).strip(" ,") for x in metric) or any(
        p.strip().lower() == "all" for x in metric for p in str(x).split(","))


def register(app: typer.Typer) -> None:
    """Add ``eval`` to the sagegen CLI."""
    try:  # one-line errors (exit 1/2) like the other commands, when the CLI's helper is there
        from sagegen.cli.errors import cli_command
    except ImportError:  # pragma: no cover
        cli_command = None
    app.command("eval")(cli_command(eval_command) if cli_command else eval_command)
