"""The one console every command prints to (rich: colours, progress bars, tables), and what
prints through it on every command's behalf:

    warn(text)                            a warning, as one line: "warning <text>"
    print_warnings_once()                 posttrain's own warnings.warn (PosttrainWarning) as warn's
                                          lines, each once a process (the command line calls it)
    step_progress(stage, steps, done)     a stage's progress, advanced once per finished step

On a terminal the progress is rich's live bar. Anywhere else (a pipe, a log file, a CI job)
a live bar shows nothing until the stage ends, so the progress is a plain line instead: after
the first step, then at most one every PLAIN_EVERY_SECONDS, and after the last step run, each
with the step, the time elapsed and left, and the step's metrics.
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from posttrain.config.checks import PosttrainWarning

console = Console()

# seconds between two plain progress lines: often enough that a log shows a run alive, seldom
# enough that a 200-step run of one-second steps writes about 40 lines, not 200
PLAIN_EVERY_SECONDS = 5.0


def warn(text: str) -> None:
    """A warning for the person running the command: one line, "warning" in yellow on a terminal."""
    console.print(f"[yellow]warning[/] {escape(text)}")


def print_warnings_once() -> None:
    """Print each PosttrainWarning (config/checks.py) once a process, as warn's one line.
    Python's own format adds the line of package source that called warnings.warn, and it
    prints a message again from each place that warns it, or once anything (torch, peft)
    changes the warning filters, which forgets what was shown ("once" filters included): a
    data file loaded by the checks and again by the run printed its repeated rows twice or
    three times. Other categories print as Python prints them. For the command line, which
    owns its process; a library leaves warnings.showwarning to its caller."""
    warnings.showwarning = show_warning


PYTHON_SHOWWARNING = warnings.showwarning
SHOWN: set[str] = set()  # the PosttrainWarning messages this process has printed


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> Any:
    """warnings.showwarning, as print_warnings_once sets it."""
    if not issubclass(category, PosttrainWarning):
        return PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)
    if str(message) not in SHOWN:
        SHOWN.add(str(message))
        warn(str(message))


class PlainProgress:
    """A stage's progress as plain lines, for output that is not a terminal:

        rl step 12/200 (6%), 0:00:31 elapsed, 0:08:07 left: reward 0.41  len 38

    `advance(info)` counts one finished step and prints its line after the first step, the
    last, and otherwise once `every` seconds have passed since the line before; `finish()`
    prints the last step's line if that was not printed (a stage stopped early). The time
    left is the mean step time so far times the steps still to run."""

    def __init__(self, stage: str, steps: int, done: int, every: float = PLAIN_EVERY_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stage, self.steps, self.done, self.every, self.clock = stage, steps, done, every, clock
        self.first = done  # a resumed stage starts past 0: its speed is measured from here
        self.started = clock()
        self.printed_at: float | None = None
        self.unprinted: tuple[float, str] | None = None  # (when, info) of a finished step not yet shown

    def advance(self, info: str) -> None:
        self.done += 1
        now = self.clock()
        if self.printed_at is not None and now - self.printed_at < self.every and self.done < self.steps:
            self.unprinted = (now, info)
            return
        self.print_line(now, info)

    def finish(self) -> None:
        if self.unprinted is not None:
            self.print_line(*self.unprinted)

    def print_line(self, now: float, info: str) -> None:
        self.printed_at, self.unprinted = now, None
        elapsed = now - self.started
        left = elapsed / (self.done - self.first) * (self.steps - self.done)
        line = (f"{self.stage} step {self.done}/{self.steps} ({100 * self.done / self.steps:.0f}%), "
                f"{timedelta(seconds=round(elapsed))} elapsed, {timedelta(seconds=round(left))} left")
        console.print(line + (f": {info}" if info else ""), markup=False, highlight=False, soft_wrap=True)


@contextmanager
def step_progress(stage: str, steps: int, done: int) -> Iterator[Callable[[str], None]]:
    """The progress of `stage`'s `steps` steps, `done` of them finished before (a resume):
    yields `advance(info)`, to call once per finished step with what to show of its metrics."""
    if not (console.is_terminal or console.is_jupyter):
        plain = PlainProgress(stage, steps, done)
        try:
            yield plain.advance
        finally:
            plain.finish()
        return
    columns = [TextColumn(f"[bold]{stage}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(stage, total=steps, completed=done, info="")
        yield lambda info: progress.update(task, advance=1, info=info)
