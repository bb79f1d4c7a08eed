"""The one console every command prints to (rich: colours, progress bars, tables), and what
prints through it on every command's behalf:

    warn(text)                            a warning, as one line: "warning <text>"
    print_warnings_once()                 posttrain's own warnings.warn (PosttrainWarning) as warn's
                                          lines, each once a process (the command line calls it)
"""

from __future__ import annotations

import warnings
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape

from posttrain.config.checks import PosttrainWarning

console = Console()


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
