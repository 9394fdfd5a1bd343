"""Rich progress bars for samples and denoising steps (a `sagegen.generate.Reporter`)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from ..generate import Reporter


class RichReporter(Reporter):
    """Two bars on rank 0 (samples of the current variant, steps of the current sample); other ranks and
    ``--quiet`` print one line per finished sample instead."""

    def __init__(self, console: Console, *, enabled: bool = True, rank: int = 0):
        self.console = console
        self.rank = rank
        self.bars = enabled and rank == 0
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=console, transient=False) if self.bars else None
        self.samples_task = self.steps_task = None
        self.variant = ""

    def __enter__(self):
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()

    def _prefix(self) -> str:
        return f"[rank {self.rank}] " if self.rank else ""

    def log(self, message: str) -> None:
        self.console.print(f"{self._prefix()}{message}", style="dim", markup=False)

    def variant_start(self, variant: str, todo: int, total: int) -> None:
        self.variant = variant
        done = total - todo
        if todo == 0:
            self.log(f"{variant}: all {total} sample(s) of this process already finished; skipped")
            return
        if done:
            self.log(f"{variant}: resuming, {done} of {total} sample(s) already finished")
        if self.progress is not None:
            for task in (self.samples_task, self.steps_task):
                if task is not None:
                    self.progress.update(task, visible=False)
            self.samples_task = self.progress.add_task(f"{variant} samples", total=total, completed=done)
            self.steps_task = self.progress.add_task(f"{variant} steps", total=1, completed=0)

    def sample_start(self, variant: str, sample, steps: int) -> None:
        if self.progress is not None and self.steps_task is not None:
            self.progress.reset(self.steps_task, total=steps, completed=0,
                                description=f"{variant} {sample.id} steps")

    def step(self, done: int, total: int) -> None:
        if self.progress is not None and self.steps_task is not None:
            self.progress.update(self.steps_task, completed=done, total=max(total, done))

    def sample_done(self, variant: str, sample, timings: dict, path) -> None:
        if self.progress is not None and self.samples_task is not None:
            self.progress.advance(self.samples_task)
        else:
            self.console.print(f"{self._prefix()}{variant} {sample.id}: {timings['total_s']:.2f} s "
                               f"(denoise {timings['denoise_s']:.2f} s) -> {path}", markup=False)
