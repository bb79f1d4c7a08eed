"""Every lesson cell that trains or samples says so while it runs (issue #42, item 3).

A marimo cell that takes seconds shows nothing until it finishes: on a loaded machine a
learner sees the widget and an empty space where the result should be, and cannot tell a
slow cell from a broken one. So the work of such a cell sits inside
`with mo.status.spinner(title=...)`, and the title says what is being computed and how
much ("Training the reward model on 3000 pairs (100 steps)…").

The check is static, over the lessons' source: a cell that calls one of the library's
training or sampling entry points (TRAINS_OR_SAMPLES, and `.update`/`.step`/`.fit` on a
trainer, an optimizer or a controller) must make that call inside such a `with` block.
Calling the entry point is what makes a cell slow; a cell that only formats numbers is not.
A function a cell defines around such calls (lesson 17's `search_rows`) becomes an entry point
itself: the cell that calls it is the one that runs it, and the one that needs the spinner.

Measured cell times, the record the spinners were placed from (2026-12-02, the shared
2-core AMD EPYC of this project, torch 2.13 on one thread, other jobs loading the cores to a
1-minute load of 3-5; each lesson in a fresh process, widgets at their defaults). CPU seconds
of the cell, which load does not stretch; the wall seconds a learner waited were 1.5-8× more
under that load. Every cell at 0.75 CPU s or more:

    lesson  what the cell does                                  CPU s   spinner
    02      100 SFT steps of the tiny policy                     2.39   added
    05      100 SFT steps, sample 4 prompts × 6                  2.76   added
    06      8 GRPO steps with and without weight sync            2.71   added (and its 100 SFT steps)
    07      100 SFT steps                                        2.93   added (and the controller step)
    08      import the algorithms; one GRPO update               1.47   added (the update)
    09      300 REINFORCE batches, 8 learners × 60 steps         0.82   added
    15      reward model, 100 steps                              4.95   had one
    16      100 SFT steps, sample 90 prompts × 8 for pairs       2.48   added
    16      5 preference losses × 30 steps, pass@1 each          2.67   added
    17      250 SFT steps                                        5.39   had one
    17      every search method at 4 budgets                     7.13   had one
    20      sample 4 prompts × 8 to measure the KV cache         0.90   added
    22      one AdamW step on make run's gpt_mini                1.65   added
    22b     sample and score 4 prompts × 8, twice                1.28   added
    23      import the config checker, read the recipes          1.97   added (around the imports)
    25      sample and score 4 prompts × 8 in one precision      0.88   added
    27      100 SFT steps, sample 4 prompts × 6                  2.84   added
    27      TRPO and PPO steps, 1 + 5 settings each              2.00   added
    28      profile one sampler call                             1.56   had one
    28      100 SFT steps, sample 8 × 8 (the ρ-histogram)        2.72   new, with one
    00      imports for the three loops (no sampling)            0.80   none: imports only

Not given one: each lesson's first cell, 1.2-1.8 CPU s in every lesson, which imports torch
and posttrain before `mo` exists to show anything (in `posttrain lessons` one process serves
every lesson, and pays it once), and cells under 0.75 CPU s (the slowest: 18a's pool table
0.63 s, 23's check of a recipe change 0.56 s, 03's setup 0.50 s).

Remeasure: time each cell with a wrapper around marimo's script runner
(`marimo._runtime.app.script_runner.Evaluator.evaluate_sync`), `PYTHONPATH=$PWD`, one lesson
a process.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parent.parent / "lessons"
LESSON_FILES = sorted(p for p in LESSONS.glob("*.py") if re.match(r"\d\d[a-z]?_", p.name))

# The library's calls that train a model or sample from one, by the name a lesson calls them:
# each takes from a second to many on one CPU thread
TRAINS_OR_SAMPLES = {
    "tiny_policy",  # teach/widgets.py: SFT steps of a tiny gpt_mini
    "generate",  # an engine's sampler
    "sample_and_score", "sample_completions",  # teach/sampler_mismatch.py, search/
    "beam_search", "mcts",  # test-time search: many samples each
    "evaluate_pass_at_1", "evaluate_preference",  # eval/: greedy decoding of a whole problem set
    "ppo_step", "trpo_step",  # teach/trust_region.py: optimisation steps on a batch
    "sampler_cache_bytes",  # teach/measure.py: samples a batch to measure the KV cache it holds
}
TRAINING_PREFIXES = ("train_", "run_")  # train_reward_model, train_preference, run_* pipelines
# `.update(...)`, `.step(...)` and `.fit(...)` train only on these receivers (a dict has an update too)
STEPPING_METHODS = {"update", "step", "fit"}
STEPPERS = re.compile(r"trainer|optimizer|controller", re.IGNORECASE)
MIN_TITLE_CHARS = 20  # "Computing…" says nothing; the house titles name the work and its size


def callee(node: ast.Call) -> str:
    """The name a call is made by: `f` of `f(...)` and of `x.f(...)`."""
    if isinstance(node.func, ast.Name):
        return node.func.id
    return node.func.attr if isinstance(node.func, ast.Attribute) else ""


def aliases(tree: ast.AST) -> dict[str, str]:
    """`from m import f as _f` in a notebook: {"_f": "f"}, so a renamed entry point is still seen."""
    return {a.asname: a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            for a in node.names if a.asname}


def trains_or_samples(node: ast.Call, defined: frozenset[str] = frozenset(),
                      defined_aliases: dict[str, str] | None = None) -> bool:
    """Whether a call trains or samples: a library entry point (also under an alias the
    notebook imported it as, `defined_aliases`), or one of the notebook's own functions
    (`defined`) that makes such calls."""
    defined_aliases = defined_aliases or {}
    name = callee(node)
    name = defined_aliases.get(name, name)
    if name in TRAINS_OR_SAMPLES or name in defined or name.startswith(TRAINING_PREFIXES):
        return True
    if name in STEPPING_METHODS and isinstance(node.func, ast.Attribute):
        return bool(STEPPERS.search(ast.unparse(node.func.value)))
    return False


def spinner_title(item: ast.withitem) -> ast.expr | None:
    """The title of `mo.status.spinner(title=...)` if this `with` item is one, else None."""
    call = item.context_expr
    if isinstance(call, ast.Call) and ast.unparse(call.func) == "mo.status.spinner":
        return next((k.value for k in call.keywords if k.arg == "title"), call.args[0] if call.args else None)
    return None


def cells(path: Path) -> list[ast.FunctionDef]:
    """The notebook's cells: the functions decorated with `@app.cell`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node for node in tree.body if isinstance(node, ast.FunctionDef)
            and any(ast.unparse(d).startswith("app.cell") for d in node.decorator_list)]


def slow_helpers(cell_list: list[ast.FunctionDef], renamed: dict[str, str] | None = None) -> frozenset[str]:
    """Names of the functions the cells define whose bodies train or sample (directly, or by
    calling another such function): calling one is as slow as the calls inside it."""
    helpers = [node for cell in cell_list for node in ast.walk(cell)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node not in cell_list]
    slow: frozenset[str] = frozenset()
    while True:
        grown = slow | {h.name for h in helpers if any(isinstance(n, ast.Call) and trains_or_samples(n, slow, renamed)
                                                        for n in ast.walk(h))}
        if grown == slow:
            return slow
        slow = frozenset(grown)


def unspun_calls(cell: ast.FunctionDef, defined: frozenset[str] = frozenset(),
                 renamed: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """(line, call) for each training or sampling call the cell makes outside a spinner. A
    nested function's body runs where the function is called, so it is skipped here and its
    name is in `defined` instead (slow_helpers)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, spinning: bool) -> None:
        if node is not cell and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.With) and any(spinner_title(item) is not None for item in node.items):
            spinning = True
        if isinstance(node, ast.Call) and trains_or_samples(node, defined, renamed) and not spinning:
            found.append((node.lineno, ast.unparse(node.func)))
        for child in ast.iter_child_nodes(node):
            visit(child, spinning)

    visit(cell, False)
    return found


def titles(path: Path) -> list[tuple[int, str]]:
    """(line, source of the title) of every spinner in the notebook."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.lineno, ast.unparse(title)) for node in ast.walk(tree) if isinstance(node, ast.With)
            for item in node.items if (title := spinner_title(item)) is not None]


@pytest.mark.parametrize("path", LESSON_FILES, ids=[p.name for p in LESSON_FILES])
def test_training_and_sampling_cells_show_a_spinner(path):
    notebook = cells(path)
    renamed = aliases(ast.parse(path.read_text(encoding="utf-8")))
    helpers = slow_helpers(notebook, renamed)
    missing = [f"line {line}: {call}(...)" for cell in notebook for line, call in unspun_calls(cell, helpers, renamed)]
    assert not missing, (f"{path.name} trains or samples outside `with mo.status.spinner(title=...)`: "
                         f"{'; '.join(missing)}. Wrap the cell's slow work in a spinner whose title says what it "
                         "computes and how much, as lessons/15_rlhf.py does")


@pytest.mark.parametrize("path", LESSON_FILES, ids=[p.name for p in LESSON_FILES])
def test_every_spinner_says_what_it_computes(path):
    for line, title in titles(path):
        text = re.sub(r"\{[^}]*\}", "N", title)  # an f-string's fields count as a number's width
        assert len(text) - 3 >= MIN_TITLE_CHARS and text.rstrip("'\")").endswith("…"), (
            f"{path.name} line {line}: spinner title {title} should name the work and its size in at least "
            f"{MIN_TITLE_CHARS} characters and end with '…' (it is a state, not a result)")


def test_the_check_sees_a_bare_training_call_and_accepts_a_spun_one():
    bare = ast.parse("@app.cell\ndef _(mo):\n    model, tok, env, _ = tiny_policy(sft_steps=100)\n"
                     "    trainer.update(batch, grpo)\n    row.update(x=1)\n").body[0]
    spun = ast.parse("@app.cell\ndef _(mo):\n    with mo.status.spinner(title='Training a tiny policy (100 steps)…'):\n"
                     "        model = tiny_policy(sft_steps=100)\n        Trainer(m, lr=1).update(b, g)\n").body[0]
    assert isinstance(bare, ast.FunctionDef) and isinstance(spun, ast.FunctionDef)
    assert unspun_calls(bare) == [(3, "tiny_policy"), (4, "trainer.update")]  # the dict's update is no training
    assert unspun_calls(spun) == []
    # a cell's own helper around a sampler: its definition is free, the cell that calls it is not
    notebook = [node for node in ast.parse(
        "@app.cell\ndef _(engine):\n    def draw(n):\n        return engine.generate(prompts, n)\n    return (draw,)\n"
        "@app.cell\ndef _(draw):\n    rows = draw(8)\n").body if isinstance(node, ast.FunctionDef)]
    assert slow_helpers(notebook) == {"draw"}
    assert [unspun_calls(cell, slow_helpers(notebook)) for cell in notebook] == [[], [(8, "draw")]]
    # an entry point imported under another name is still one
    renamed = ast.parse("from posttrain.eval.evaluate import evaluate_pass_at_1 as _evaluate\n"
                        "@app.cell\ndef _(engine):\n    score = _evaluate(engine, env, problems)\n")
    cell = renamed.body[1]
    assert isinstance(cell, ast.FunctionDef)
    assert unspun_calls(cell, frozenset(), aliases(renamed)) == [(4, "_evaluate")]
