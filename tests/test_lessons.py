"""The lessons (marimo notebooks in lessons/): each runs headless as a plain script, has
exactly one widget, names only source files that exist, and makes claims its numbers
back up; the index lists every lesson; `posttrain lessons` resolves names and refuses
unknown ones without starting a server."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posttrain import lessons as lessons_cli

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "lessons"
LESSON_FILES = sorted(p for p in LESSONS.glob("*.py") if re.match(r"\d\d[a-z]?_", p.name))
ALL_NOTEBOOKS = LESSON_FILES + [LESSONS / "index.py"]
# A repository path as the lessons write it: posttrain/roles/rollout.py, tests/test_rollout.py
SOURCE_PATH = re.compile(r"\b(?:posttrain|tests|docs|lessons|benchmarks)/[\w./-]*\w\.(?:py|md|toml|txt)\b")
TIME_LIMIT_S = 30.0


def ids(paths):
    return [p.name for p in paths]


def ui_calls(path: Path) -> list[str]:
    """Names of the mo.ui constructors called in a notebook: ["slider"], ..."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "ui" and getattr(owner.value, "id", None) == "mo":
                calls.append(node.func.attr)
    return calls


@pytest.fixture
def restore_threads():
    """The lessons set torch to one thread; do not leak that into other tests."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def run_in_process(path: Path) -> dict:
    """Execute every cell of a notebook with its widgets at their defaults; return the
    notebook's public definitions (names without a leading underscore)."""
    spec = importlib.util.spec_from_file_location(f"lesson_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _, defs = module.app.run()
    return defs


# --------------------------------------------------------------------------------------
# Every notebook
# --------------------------------------------------------------------------------------


def test_there_are_lessons():
    assert [p.name[:2] for p in LESSON_FILES][:5] == ["00", "01", "02", "03", "04"]


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=ids(ALL_NOTEBOOKS))
def test_notebook_runs_headless_as_a_script(path):
    env = dict(os.environ, MARIMO_SKIP_UPDATE_CHECK="1")
    start = time.perf_counter()
    result = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=4 * TIME_LIMIT_S)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, f"{path.name} failed:\n{result.stderr[-3000:]}"
    assert elapsed < TIME_LIMIT_S, f"{path.name} took {elapsed:.1f} s headless; the budget is {TIME_LIMIT_S:.0f} s"


@pytest.mark.parametrize("path", LESSON_FILES, ids=ids(LESSON_FILES))
def test_lesson_has_exactly_one_widget(path):
    calls = ui_calls(path)
    assert len(calls) == 1, f"{path.name} should have exactly one mo.ui widget, found {calls}"


@pytest.mark.parametrize("path", LESSON_FILES, ids=ids(LESSON_FILES))
def test_lesson_teaches_with_the_library(path):
    """The widget's numbers come from posttrain: the lesson imports it (and has the
    sections every lesson promises)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert any(m.startswith("posttrain.") for m in modules), f"{path.name} imports nothing from posttrain"
    text = path.read_text(encoding="utf-8")
    for section in ("Find the knob that breaks it", "Source files used here", "Exercises"):
        assert section in text, f"{path.name} has no {section!r} section"


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=ids(ALL_NOTEBOOKS))
def test_every_source_link_resolves(path):
    paths = set(SOURCE_PATH.findall(path.read_text(encoding="utf-8")))
    if path in LESSON_FILES:
        assert any(p.startswith("posttrain/") for p in paths), f"{path.name} links no source file"
    missing = sorted(p for p in paths if not (ROOT / p).is_file())
    assert not missing, f"{path.name} names files that do not exist in the repository: {missing}"


def test_index_lists_every_lesson():
    index = (LESSONS / "index.py").read_text(encoding="utf-8")
    for path in LESSON_FILES:
        assert f'"{path.name}"' in index, f"lessons/index.py does not list {path.name}"
    listed = re.findall(r'"(\d\d[a-z]?_\w+\.py)"', index)
    assert sorted(listed) == [p.name for p in LESSON_FILES], "the index lists a lesson file that does not exist"


# --------------------------------------------------------------------------------------
# What the lessons claim, at the widgets' default settings
# --------------------------------------------------------------------------------------


def test_lesson_01_baseline_changes_the_noise_not_the_direction(restore_threads):
    defs = run_in_process(LESSONS / "01_what_is_post_training_rl.py")
    assert defs["baseline"].value == 0.0
    # the slow-motion draw pays, so with b = 0 the sampled arm must have gone up
    a = int(defs["sampled_arm"])
    assert defs["pi1"][0, a] > defs["pi0"][0, a]
    assert 0.0 < defs["mean_reward"] < 1.0
    assert defs["p_best_final"].shape == (300,)


def test_lesson_02_old_logp_equals_a_teacher_forced_pass(restore_threads):
    defs = run_in_process(LESSONS / "02_rollout_and_pi_old.py")
    assert defs["temperature"].value == 1.0
    assert defs["gap"] < 1e-5  # the sampler's log-probs are the trainer's, to float noise
    assert len(defs["episodes"]) == defs["K"]
    assert defs["sft_losses"][-1] < defs["sft_losses"][0]


def test_lesson_03_default_text_is_correct_under_the_strict_verifier(restore_threads):
    defs = run_in_process(LESSONS / "03_reward_and_reference.py")
    assert defs["verdict"]["reward"] == 1.0
    assert defs["verdict"]["details"]["reason"] == "ok"
    assert defs["text"] == f"Final: {defs['answer']}"


def test_lesson_04_shows_every_registered_algorithm(restore_threads):
    from posttrain.algorithms import ALGORITHMS
    from posttrain.algorithms.grpo import group_advantages

    defs = run_in_process(LESSONS / "04_algorithm_plugin.py")
    assert set(defs["adv_cols"]) == set(ALGORITHMS)
    batch = defs["batch"]
    expected = group_advantages(batch.rewards, batch.group_ids, "group", 1e-6)
    torch.testing.assert_close(defs["adv_cols"]["grpo"], expected)
    # a positive advantage is a push up: the signs agree wherever the advantage is not 0
    for name in ("grpo", "rloo", "dr_grpo"):
        adv, push = defs["adv_cols"][name], defs["push_cols"][name]
        on = adv.abs() > 1e-6
        assert torch.equal(torch.sign(adv[on]), torch.sign(push[on])), name


# --------------------------------------------------------------------------------------
# posttrain lessons (no server is started here)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["02", "2", "02_rollout_and_pi_old", "02_rollout_and_pi_old.py"])
def test_resolve_lesson_accepts_every_spelling(name):
    assert lessons_cli.resolve_lesson(name) == LESSONS / "02_rollout_and_pi_old.py"


def test_resolve_lesson_index():
    assert lessons_cli.resolve_lesson("index") == LESSONS / "index.py"


def test_unknown_lesson_is_refused_with_the_valid_ones(capsys):
    assert lessons_cli.main(["99"]) == 2
    err = capsys.readouterr().err
    assert "no lesson '99'" in err
    for path in LESSON_FILES:
        assert path.name[:2] in err


def test_list_names_every_lesson(capsys):
    assert lessons_cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    for path in LESSON_FILES:
        assert f"lessons/{path.name}" in out


def test_commands_stay_local_and_never_sandbox():
    cmd, url = lessons_cli.build_command(None, edit=False, port=4321, headless=False)
    assert cmd[2:5] == ["marimo", "run", str(LESSONS)]
    assert "--no-sandbox" in cmd and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert url == "http://127.0.0.1:4321/?file=index.py"  # the index, not marimo's gallery
    cmd, url = lessons_cli.build_command("3", edit=True, port=4321, headless=True)
    assert cmd[3:5] == ["edit", str(LESSONS / "03_reward_and_reference.py")]
    assert "--headless" in cmd and url is None
