"""Plumbing every demo shares: its command line, its run directory and log, its plots.

A demo's own file then holds only what it teaches. The pattern, in order:

    def parse_args(argv):
        p = demo_parser("bandit", __doc__)             # --out-dir and --seed, like every demo
        p.add_argument(...)                            # the demo's own options
        return p.parse_args(argv)

    @one_torch_thread()                                # a context manager, used here as a decorator
    def main(argv):
        args = parse_args(argv)
        console, run = start_run("bandit", args, seed=args.seed)
        ...                                            # print to `console`, write CSV/PNG into run.path
        finish_run(console, run, "bandit", "the baseline cut the variance ...")
        return 0
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import Iterator

import torch
from rich.console import Console

from posttrain.runs.rundir import RunDir


def demo_parser(name: str, doc: str, seed_help: str | None = None) -> argparse.ArgumentParser:
    """An argument parser named `posttrain demo NAME`, described by the first paragraph of
    the demo's docstring, with the two options every demo takes: --out-dir and --seed."""
    p = argparse.ArgumentParser(prog=f"posttrain demo {name}", description=doc.split("\n\n")[0])
    p.add_argument("--out-dir", default="runs", help="parent folder of the run directory")
    p.add_argument("--seed", type=int, default=0, help=seed_help)
    return p


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run the block with torch on one intra-op thread, then restore the caller's count.

    The demos' tensors hold a handful of numbers: waking a second thread costs far more
    than the work (15x slower on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def start_run(name: str, args: argparse.Namespace, fit_tables: bool = False, **meta) -> tuple[Console, RunDir]:
    """Create runs/<timestamp>-<name>/ under args.out_dir, write config.json (every
    argument) and meta.json ({"demo": name, **meta}), and return a console to print to.

    The console records what it prints (`finish_run` saves that text as the run's log) and
    soft-wraps, so long lines are not broken at 80 columns. With `fit_tables`, output that
    is piped (a test, a file) is 120 columns wide, so a demo's table keeps one row per line.
    """
    width = None if (not fit_tables or sys.stdout.isatty()) else 120
    console = Console(record=True, soft_wrap=True, width=width)
    run = RunDir.create(args.out_dir, name)
    run.write_json("config.json", vars(args))
    run.write_meta({"demo": name, **meta})
    return console, run


def finish_run(console: Console, run: RunDir, name: str, conclusion: str) -> None:
    """Print the demo's conclusion line and where its files are, then save everything the
    console printed as <run>/<name>_log.txt."""
    console.print(f"\n[bold green]Conclusion:[/bold green] {conclusion}")
    console.print(f"run directory: {run.path}")
    (run.path / f"{name}_log.txt").write_text(console.export_text())


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display on servers and in CI).
    Imported on first use: matplotlib takes a second to import and only the plots need it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path) -> None:
    """Lay out, write as PNG and close the figure (an open figure keeps its memory)."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
