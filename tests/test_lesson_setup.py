"""The lessons share one setup helper (posttrain/teach/lesson_setup.py): it sets torch to
one thread and hands torch back; every lesson's header is what marimo needs plus what is the
lesson's own, and none repeats the block the helper replaced (`import torch` and its thread
setting in the first cell, the docstring's "Run it / Headless" lines). Read from the
source, so these run in well under a second; tests/test_lessons.py runs the lessons."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from posttrain.teach.lesson_setup import LESSON_THREADS, torch_on_one_thread

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "lessons"
LESSON_FILES = sorted(p for p in LESSONS.glob("*.py") if re.match(r"\d\d[a-z]?_", p.name))
HELPER_CALL = "torch = torch_on_one_thread()"


def ids(paths):
    return [p.name for p in paths]


def first_cell(tree: ast.Module) -> ast.FunctionDef:
    return next(node for node in tree.body if isinstance(node, ast.FunctionDef))


def test_the_helper_sets_one_thread_and_returns_torch():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # whatever the process had before the lesson
        assert torch_on_one_thread() is torch
        assert LESSON_THREADS == 1
        assert torch.get_num_threads() == 1
        assert torch_on_one_thread() is torch and torch.get_num_threads() == 1  # a second lesson: the same
    finally:
        torch.set_num_threads(before)


def test_every_lesson_is_found():
    assert len(LESSON_FILES) == 33


@pytest.mark.parametrize("path", LESSON_FILES, ids=ids(LESSON_FILES))
def test_the_header_is_marimo_s_lines_and_a_one_line_title(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree)
    number = path.name.split("_")[0]
    assert re.fullmatch(rf"Lesson {number} · \S.*", doc), f"{path.name}: the docstring should be its title alone"
    header = [ast.unparse(node) for node in tree.body[1:4]]
    assert header == ["import marimo", "__generated_with = '0.25.2'", "app = marimo.App(width='medium')"], (
        f"{path.name}: marimo's three header lines, as marimo writes them")


@pytest.mark.parametrize("path", LESSON_FILES, ids=ids(LESSON_FILES))
def test_the_first_cell_holds_imports_and_torch_from_the_helper(path):
    text = path.read_text(encoding="utf-8")
    cell = first_cell(ast.parse(text))
    *body, returned = cell.body
    statements = [ast.unparse(node) for node in body if not isinstance(node, (ast.Import, ast.ImportFrom))]
    returned_names = {ast.unparse(node) for node in getattr(returned.value, "elts", [returned.value])}
    assert "import marimo as mo" in [ast.unparse(node) for node in body]
    if "torch" in returned_names:
        assert statements == [HELPER_CALL], f"{path.name}: the first cell should only import, then {HELPER_CALL}"
        assert "from posttrain.teach.lesson_setup import torch_on_one_thread" in [ast.unparse(n) for n in body]
    else:
        assert statements == [], f"{path.name}: a first cell without torch holds imports only, found {statements}"
    # the block the helper replaced, anywhere in the lesson
    assert "import torch\n" not in text and "set_num_threads" not in text, (
        f"{path.name}: torch comes from torch_on_one_thread(), which sets its threads")
    assert "Run it:" not in text and "Headless:" not in text, (
        f"{path.name}: how to open a lesson is said once, in lessons/index.py")


def test_the_lessons_that_use_torch_get_it_from_the_helper():
    """Every lesson that names torch in a later cell receives it from the first cell."""
    users = [p.name for p in LESSON_FILES if re.search(r"^def _\([^)]*\btorch\b", p.read_text(encoding="utf-8"), re.M)]
    helped = [p.name for p in LESSON_FILES if HELPER_CALL in p.read_text(encoding="utf-8")]
    assert len(users) >= 20
    assert set(users) <= set(helped)


def test_the_index_says_how_to_open_any_lesson():
    doc = ast.get_docstring(ast.parse((LESSONS / "index.py").read_text(encoding="utf-8")))
    assert "posttrain lessons 02" in doc and "python lessons/02_rollout_and_pi_old.py" in doc
