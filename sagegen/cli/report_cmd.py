"""``sagegen report [RUN_DIR]``: report.html, side-by-side MP4s and a contact sheet for a run directory."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from sagegen.cli.options import finite_number


def report_command(
    run_dir: Annotated[Optional[Path], typer.Argument(help="Run directory (default: the most recent under "
                                                           "$SAGEGEN_RUNS or runs/).")] = None,
    max_side: Annotated[int, typer.Option("--max-side", min=32, max=4096,
                                          help="Longest side (px) of the frames embedded in "
                                               "report.html.")] = 384,
    max_frames: Annotated[int, typer.Option("--max-frames", min=2,
                                            help="Frames per player in report.html; longer clips show "
                                                 "every k-th frame.")] = 64,
    gain: Annotated[float, typer.Option("--gain", callback=finite_number(1.0, 255.0),
                                        help="Amplification of the |sagegen − baseline| "
                                             "difference view, from 1 to 255.")] = 8.0,
    mp4: Annotated[bool, typer.Option("--mp4/--no-mp4", help="Write side-by-side MP4s (PNGs for image "
                                                             "models).")] = True,
    contact_sheet: Annotated[bool, typer.Option("--contact-sheet/--no-contact-sheet",
                                                help="Write report/contact_sheet.png.")] = True,
    screenshot: Annotated[Optional[Path], typer.Option("--screenshot",
                                                       help="Also load the report in headless Chromium, check it, "
                                                            "and save a PNG screenshot here.")] = None,
) -> None:
    """Side-by-side report of a run: report.html, side-by-side MP4s and a contact sheet.

    Writes RUN_DIR/report/: a self-contained report.html (players in sync, amplified difference, metrics
    with deltas, per-frame PSNR, timings and speedup, settings), side_by_side/<id>.mp4 (PNG for image
    models) and contact_sheet.png.

    Examples: sagegen report (the most recent run); sagegen report RUN_DIR --no-mp4;
    sagegen report RUN_DIR --screenshot report.png
    """
    from rich.console import Console

    from sagegen.runs.reader import RunDirError, resolve_run_dir

    console = Console()
    err_console = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        path = resolve_run_dir(run_dir)
    except RunDirError as e:
        err_console.print(f"[bold red]Error:[/] {escape(str(e))}")
        raise typer.Exit(2) from e
    from sagegen.report.builder import ReportOptions, build_report  # torch: only once the run directory is known
    console.print(f"Reporting [bold]{escape(str(path))}[/]", highlight=False)
    opts = ReportOptions(max_side=max_side, max_frames=max_frames, gain=gain, mp4=mp4, contact=contact_sheet)
    try:
        written = build_report(path, opts, log=lambda s: console.print(s, style="dim", highlight=False, markup=False))
    except (RunDirError, ValueError) as e:
        err_console.print(f"[bold red]Error:[/] {escape(str(e))}")
        raise typer.Exit(2) from e
    if not (path / "metrics.json").is_file():
        typed = shlex.quote(str(path))  # a path with spaces still works when pasted
        console.print(f"note: no metrics.json yet; run `sagegen eval {typed}` first for CLIP/FID/LPIPS numbers "
                      "(the report computes PSNR itself)", style="yellow", highlight=False, soft_wrap=True,
                      markup=False)
    if screenshot is not None:
        from sagegen.report.check import check_report

        res = check_report(written["html"], screenshot)
        for p in res["problems"]:
            console.print(f"[yellow]browser:[/] {escape(str(p))}", highlight=False)
        console.print(f"Screenshot {screenshot} ({res['players']} player(s), console clean: {not res['problems']})",
                      highlight=False, markup=False)
    for key, p in written.items():
        if key != "html":
            console.print(f"  {p}", style="dim", highlight=False, markup=False)
    console.print(f"Report: {written['html']}", highlight=False, soft_wrap=True, markup=False)


def register(app: typer.Typer) -> None:
    """Add ``report`` to the sagegen CLI."""
    try:  # one-line errors (exit 1/2) like the other commands, when the CLI's helper is there
        from sagegen.cli.errors import cli_command
    except ImportError:  # pragma: no cover
        cli_command = None
    app.command("report")(cli_command(report_command) if cli_command else report_command)
