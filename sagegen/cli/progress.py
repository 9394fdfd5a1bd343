"""Progress of `run`/`compare` (a `sagegen.jobs.generate.Reporter`): rich bars on a terminal, plain lines otherwise.

When stderr is not a terminal (CI, ``nohup``, a pipe) or with ``--quiet``, progress is one line per event,
each complete and flushed: a line when a sample starts, a line every `STEP_LINE_S` seconds during a long
sample (steps done so far), and a line when it finishes with its timings. Other ranks than 0 always write
lines (prefixed ``[rank N]``), so several processes never fight over one terminal.
"""

from __future__ import annotations

import time

from rich.console import Console

from sagegen.jobs.generate import Reporter

STEP_LINE_S = 30.0


def make_reporter(console: Console, *, quiet: bool, rank: int) -> "LineReporter":
    """Bars on rank 0 of an interactive terminal, unless --quiet; lines everywhere else."""
    if rank == 0 and not quiet and console.is_terminal:
        return RichReporter(console, rank=rank)
    return LineReporter(console, rank=rank, step_lines=not quiet)


class LineReporter(Reporter):
    """One plain line per event (logs that are read later, or by another program)."""

    def __init__(self, console: Console, *, rank: int = 0, step_lines: bool = True):
        self.console, self.rank, self.step_lines = console, rank, step_lines
        self.variant, self.total, self.index = "", 0, 0
        self.sample_id, self.t0, self.last_line = "", 0.0, 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def _prefix(self) -> str:
        return f"[rank {self.rank}] " if self.rank else ""

    def line(self, text: str, style: str | None = None) -> None:
        self.console.print(f"{self._prefix()}{text}", style=style, markup=False, highlight=False)
        file = getattr(self.console, "file", None)
        if file is not None and hasattr(file, "flush"):
            file.flush()

    def log(self, message: str) -> None:
        self.line(message, style="dim")

    def variant_start(self, variant: str, todo: int, total: int) -> None:
        self.variant, self.total, self.index = variant, total, total - todo
        done = total - todo
        if todo == 0:
            self.log(f"{variant}: all {total} sample(s) of this process already finished; skipped")
        elif done:
            self.log(f"{variant}: resuming, {done} of {total} sample(s) already finished")

    def _where(self) -> str:
        return f"{self.variant} {self.index + 1}/{self.total} {self.sample_id}"

    def sample_start(self, variant: str, sample, steps: int) -> None:
        self.sample_id, self.t0 = sample.id, time.monotonic()
        self.last_line = self.t0
        if self.step_lines:
            self.line(f"{self._where()}: started ({steps} steps)")

    def step(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.step_lines and now - self.last_line >= STEP_LINE_S and done < total:
            self.last_line = now
            self.line(f"{self._where()}: step {done}/{total}, {now - self.t0:.0f} s")

    def sample_done(self, variant: str, sample, timings: dict, path) -> None:
        self.line(f"{self._where()}: {timings['total_s']:.2f} s (denoise {timings['denoise_s']:.2f} s) -> {path}")
        self.index += 1


class RichReporter(LineReporter):
    """Two bars (samples of the current variant, steps of the current sample) on an interactive terminal."""

    def __init__(self, console: Console, *, rank: int = 0):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        super().__init__(console, rank=rank, step_lines=False)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=console, transient=False)
        self.samples_task = self.steps_task = None

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()

    def variant_start(self, variant: str, todo: int, total: int) -> None:
        super().variant_start(variant, todo, total)
        if todo == 0:
            return
        for task in (self.samples_task, self.steps_task):
            if task is not None:
                self.progress.update(task, visible=False)
        self.samples_task = self.progress.add_task(f"{variant} samples", total=total, completed=total - todo)
        self.steps_task = self.progress.add_task(f"{variant} steps", total=1, completed=0)

    def sample_start(self, variant: str, sample, steps: int) -> None:
        super().sample_start(variant, sample, steps)
        if self.steps_task is not None:
            self.progress.reset(self.steps_task, total=steps, completed=0, description=f"{variant} {sample.id} steps")

    def step(self, done: int, total: int) -> None:
        if self.steps_task is not None:
            self.progress.update(self.steps_task, completed=done, total=max(total, done))

    def sample_done(self, variant: str, sample, timings: dict, path) -> None:
        self.index += 1
        if self.samples_task is not None:
            self.progress.advance(self.samples_task)
