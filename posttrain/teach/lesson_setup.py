"""The set-up every lesson notebook shares, written once: torch on one thread.

    torch_on_one_thread()   the torch module, set to one intra-op thread

A lesson's first cell is then its own imports and that one call:

    @app.cell
    def _():
        import copy

        import marimo as mo

        from posttrain.teach.lesson_setup import torch_on_one_thread

        torch = torch_on_one_thread()
        return copy, mo, torch

What stays in each lesson, and why:
- the module docstring, the lesson's title in one line (`posttrain lessons --list` reads it);
  how to open a lesson, in the browser or headless as a plain script, is said once for all of
  them, on the index's page and in its docstring (lessons/index.py);
- `import marimo`, `__generated_with` and `app = marimo.App(...)`: marimo reads a notebook
  file by those lines, so they cannot move into a function;
- `import marimo as mo`: the line every marimo notebook opens with, and the one marimo's
  editor looks for before it adds an import cell of its own;
- everything a lesson teaches: its model, environment and library calls. The policies
  several lessons share are named helpers too, so the call says what is built:
  `widgets.tiny_policy` (gpt_mini taught the answer format by real SFT steps) and
  `sampler_mismatch.make_run_policy` (make run's gpt_mini shape, untrained).
"""

from __future__ import annotations

import types

import torch

# Every lesson's tensors are small: the largest model is make run's gpt_mini (~0.8M
# parameters), most are a few numbers or the 33k-parameter tiny policy. Waking a second
# intra-op thread costs more than such work. Measured on a shared 2-core AMD EPYC (load ~4):
# widgets.tiny_policy's 100 SFT steps took 2.0-2.3 CPU seconds (4-7 s wall) on one thread,
# and 14-17 CPU seconds (33-39 s wall) on two.
LESSON_THREADS = 1


def torch_on_one_thread() -> types.ModuleType:
    """Set torch to LESSON_THREADS (one) intra-op thread and return the torch module, for
    the lesson's first cell: `torch = torch_on_one_thread()`.

    The setting belongs to the process (torch has one intra-op pool): where `posttrain
    lessons` serves several lessons from one process they share it, and all ask for one."""
    torch.set_num_threads(LESSON_THREADS)
    return torch
