"""Clean errors for every sagegen command: usage mistakes exit 2, runtime failures exit 1.

Each is one line on stderr naming the cause and the fix. A traceback is shown only with ``--debug``
(anywhere on the command line) or ``SAGEGEN_DEBUG=1``. Commands written elsewhere (eval, report, bench)
get the same behaviour by decorating their function with `cli_command`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import typer

try:  # typer >= 0.2x vendors its own click
    from typer._click import exceptions as _cx
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover - older typer on real click
    import click.exceptions as _cx
    from click import get_current_context

ClickException = _cx.ClickException
ClickUsageError = _cx.UsageError
# Exceptions that are typer's own control flow (help, exit codes, usage errors): never intercepted.
PASS_THROUGH = tuple({typer.Exit, typer.Abort, ClickException, *(
    (getattr(_cx, "Exit"),) if hasattr(_cx, "Exit") else ())})

DEBUG_ENV = "SAGEGEN_DEBUG"
_state = {"debug": False}


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``kill``, a job scheduler): unwinds like Ctrl-C, so that a run cleans up the same
    way (finished samples kept, a run directory without any removed) before exiting 143."""


class UsageProblem(Exception):
    """A usage mistake found after parsing (exit 2). `option` names the option at fault."""

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option

    def __str__(self) -> str:
        msg = super().__str__()
        return f"{self.option}: {msg}" if self.option and not msg.startswith(self.option) else msg


def set_debug(flag: bool) -> None:
    _state["debug"] = bool(flag)


def debug_enabled() -> bool:
    return _state["debug"] or os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def usage_error_types() -> tuple[type, ...]:
    """Exception types that mean "the command line asked for something impossible" (exit 2)."""
    from sagegen.jobs.generate import BadPolicy, RunDirConflict
    from sagegen.models.loading import BadModelPath
    from sagegen.models.presets import UnknownModel
    from sagegen.runs.integrity import OutsideRunDir
    from sagegen.runs.lock import RunDirBusy

    return (UsageProblem, UnknownModel, BadModelPath, RunDirConflict, BadPolicy, RunDirBusy, OutsideRunDir)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def print_error(message: str, *, hint: str | None = None) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    line = one_line(message) + (f" ({hint})" if hint else "")
    console.print(Text.assemble(("Error: ", "bold red"), line))


def describe(exc: BaseException) -> str:
    """The one-line cause of an unexpected exception."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# Where each command can write instead when its disk is full or read-only: only options it has (eval and report
# write into the run directory and have no --out). tests/cli/test_cli_hints.py checks every option named here.
WRITE_ELSEWHERE = {
    "run": "or write the run to another folder with --out DIR",
    "compare": "or write the run to another folder with --out DIR",
    "calibrate": "or write the file to another folder with --out FILE",
    "bench": "or write the JSON to another folder with --out FILE",
    "eval": "eval writes metrics.json into the run directory: to use another disk, copy the run directory there "
            "and evaluate the copy",
    "report": "report writes RUN_DIR/report/: to use another disk, copy the run directory there and report the "
              "copy",
}


# How each command can use less GPU memory: again only options it has.
MEMORY_SAVERS = {
    "run": "reduce memory with --offload model, --vae-tiling, fewer --frames or a smaller --height/--width",
    "compare": "reduce memory with --offload model, --vae-tiling, fewer --frames or a smaller --height/--width",
    "calibrate": "reduce memory with fewer --frames or a smaller --height/--width",
    "bench": "reduce memory with --batch 1, fewer --frames or a smaller --height/--width",
    "eval": "free the GPU's memory (another process may hold it), or evaluate on the CPU with CUDA_VISIBLE_DEVICES=",
    "report": "free the GPU's memory (another process may hold it), or use a smaller --max-side",
}


def _disk_problem(exc: BaseException) -> bool:
    """A full, read-only or forbidden disk (an OSError's errno, or ffmpeg's message for an MP4)."""
    from sagegen.runs.files import WRITE_ERRNOS

    return (isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS) or bool(getattr(exc, "disk_problem", False))


def _current_command() -> str | None:
    """The name of the command running now (``eval``), from click's context."""
    ctx = get_current_context(silent=True)
    return ctx.info_name if ctx is not None else None


def handle(exc: BaseException) -> int:
    """Print `exc` as a one-line error and return the exit code (2: usage, 1: runtime, 130: interrupted, 143:
    terminated)."""
    if isinstance(exc, KeyboardInterrupt):
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        print_error(f"{what}; finished samples are kept, and running the same command again resumes")
        return 143 if isinstance(exc, Terminated) else 130
    if isinstance(exc, usage_error_types()):
        from sagegen.jobs.generate import BadPolicy

        print_error(("--fp-blocks: " if isinstance(exc, BadPolicy) else "") + str(exc))
        return 2
    if type(exc).__name__ == "OutOfMemoryError":
        saver = MEMORY_SAVERS.get(_current_command() or "", "free the GPU's memory (another process may hold it)")
        print_error(f"{describe(exc)}; {saver}")
        return 1
    if _disk_problem(exc):
        where = WRITE_ELSEWHERE.get(_current_command() or "")
        text = str(exc) if type(exc).__module__.startswith("sagegen") or not getattr(exc, "filename", None) \
            else f"could not write {exc.filename}: {exc.strerror or exc}"
        print_error(text + (f" ({where})" if where else ""))
        return 1
    known = isinstance(exc, (RuntimeError, OSError, ValueError)) and type(exc).__module__.startswith("sagegen")
    print_error(str(exc) if known else describe(exc), hint=None if known else "run with --debug for the traceback")
    return 1


def cli_command(fn):
    """Decorate a typer command so that exceptions become one-line errors with the right exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with _sigterm_unwinds():
                return fn(*args, **kwargs)
        except PASS_THROUGH:
            raise
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - the CLI's last line of defence
            if debug_enabled():  # the traceback too, but the same one-line error and exit code
                import traceback

                traceback.print_exc()
            raise typer.Exit(handle(exc)) from None

    return wrapper


@contextlib.contextmanager
def _sigterm_unwinds():
    """While a command runs (main thread only), SIGTERM raises `Terminated` instead of ending the process
    at once; the previous handler comes back afterwards. Not under torchrun: there SIGTERM is how the launcher
    stops the other ranks when one fails, and a rank waiting in a collective must still end at once."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or os.environ.get("WORLD_SIZE", "1") != "1":
        yield
        return

    def on_term(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def format_click_error(exc) -> str:
    """A click usage error as one line, with where to look for the right usage."""
    msg = one_line(exc.format_message()).replace("Value error, ", "")
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, ClickUsageError) and ctx is not None:
        return f"{msg} (see `{ctx.command_path} --help`)"
    return msg


def show_click_error(exc) -> None:
    if type(exc).__name__ == "NoArgsIsHelpError":  # `sagegen` alone: the help (already printed by rich)
        text = exc.format_message().strip()
        if text:
            typer.echo(text, err=True)
        return
    print_error(format_click_error(exc))


def strip_debug(args: list[str]) -> tuple[list[str], bool]:
    """Remove ``--debug`` from anywhere before a ``--`` separator."""
    out, debug, passthrough = [], False, False
    for a in args:
        if a == "--":
            passthrough = True
        if not passthrough and a == "--debug":
            debug = True
            continue
        out.append(a)
    return out, debug


def exit_with(code: int) -> None:
    sys.exit(code)
