"""The lessons (marimo notebooks in lessons/): each runs headless as a plain script, has
exactly one widget (one control, or one `mo.ui.dictionary` panel of controls), names only
source files that exist, and makes claims its numbers back up — at the widgets' defaults
and, for the "find the knob that breaks it" settings, with the knob turned; the index lists
every lesson; `posttrain lessons` resolves names and refuses unknown ones without
starting a server. The browser test is tests/test_lessons_browser.py."""

from __future__ import annotations

import ast
import importlib.util
import math
import multiprocessing
import os
import re
import resource
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posttrain.teach import lessons as lessons_cli
from posttrain.teach.charts import points

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "lessons"
LESSON_FILES = sorted(p for p in LESSONS.glob("*.py") if re.match(r"\d\d[a-z]?_", p.name))
ALL_NOTEBOOKS = LESSON_FILES + [LESSONS / "index.py"]
# A repository path as the lessons write it: posttrain/roles/rollout.py, tests/test_rollout.py
SOURCE_PATH = re.compile(r"\b(?:posttrain|tests|docs|lessons|benchmarks|exercises)/[\w./-]*\w\.(?:py|md|toml|txt)\b")
TIME_LIMIT_S = 30.0


def ids(paths):
    return [p.name for p in paths]


def _is_ui_call(node: ast.AST) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        return isinstance(owner, ast.Attribute) and owner.attr == "ui" and getattr(owner.value, "id", None) == "mo"
    return False


def ui_calls(path: Path) -> list[str]:
    """Names of the top-level mo.ui constructors called in a notebook: ["slider"], ...
    Controls nested inside another mo.ui call (a `mo.ui.dictionary` panel) belong to that
    one widget and are not counted separately."""
    calls = []

    def visit(node: ast.AST) -> None:
        if _is_ui_call(node):
            calls.append(node.func.attr)
            return  # its children are parts of this widget
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
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


def marked_at(fig) -> list[float]:
    """Where a chart's mark() lines stand on the x axis: the widget's current setting."""
    from posttrain.teach.charts import SETTING

    return [float(line.get_xdata()[0]) for ax in fig.axes for line in ax.get_lines() if line.get_color() == SETTING]


# --------------------------------------------------------------------------------------
# Every notebook
# --------------------------------------------------------------------------------------


def test_there_are_lessons():
    assert [p.name[:2] for p in LESSON_FILES][:19] == [f"{n:02d}" for n in range(19)]


# A fresh `python lesson.py` spends ~5 CPU seconds importing torch, marimo and matplotlib before
# its first cell, 35 times over (measured on the 2-core Intel Xeon, 2026-12-03). The notebooks
# run instead in processes forked from one server that made those imports once: each still runs
# its file as __main__, in a process of its own that exits when the lesson does.
PRELOADED = ["torch", "marimo", "matplotlib.pyplot", "posttrain.teach.charts", "tests.test_lessons"]


@pytest.fixture(scope="module")
def fork_server():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    return context


def run_as_main(path: str, log: str, cpu_file: str) -> None:
    """In a process forked from the fork server: what `python path` does from the repository
    root, its output to `log`, and the CPU seconds its cells took to `cpu_file`."""
    with open(log, "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    os.chdir(ROOT)
    os.environ["MARIMO_SKIP_UPDATE_CHECK"] = "1"
    sys.argv, sys.path[0] = [path], str(Path(path).parent)
    runpy.run_path(path, run_name="__main__")
    used = resource.getrusage(resource.RUSAGE_SELF)  # a forked process's counters start at zero
    Path(cpu_file).write_text(str(used.ru_utime + used.ru_stime))


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=ids(ALL_NOTEBOOKS))
def test_notebook_runs_headless_as_a_script(path, fork_server, tmp_path):
    log, cpu_file = tmp_path / "output.txt", tmp_path / "cpu.txt"
    process = fork_server.Process(target=run_as_main, args=(str(path), str(log), str(cpu_file)))
    process.start()
    process.join(timeout=10 * TIME_LIMIT_S)
    if process.is_alive():
        process.kill()
        process.join()
    output = log.read_text() if log.exists() else ""
    assert process.exitcode == 0 and cpu_file.exists(), f"{path.name} failed:\n{output[-3000:]}"
    # the CPU seconds of the lesson's cells, not wall time: other jobs sharing the cores (CI, a second
    # pytest worker) stretch wall time past any budget, and never change what the lesson computes. The
    # budget is a fresh process's, imports left out: forked, lesson 17 took 16.6-17.6 CPU s (27.4 fresh),
    # but once of the 35 runs of 2026-12-03 over 25 s, unexplained, so the margin stays wide
    cpu = float(cpu_file.read_text())
    assert cpu < TIME_LIMIT_S, f"{path.name} used {cpu:.1f} CPU seconds headless after its imports; the budget is {TIME_LIMIT_S:.0f} s"


def test_a_notebook_runs_as_python_lesson_py_in_a_fresh_process():
    """The command a reader types, once, for the cheapest lesson: the fork server above skips
    only the imports of a fresh interpreter."""
    path = LESSONS / "00_orientation.py"
    env = dict(os.environ, MARIMO_SKIP_UPDATE_CHECK="1")
    result = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=10 * TIME_LIMIT_S)
    assert result.returncode == 0, f"{path.name} failed:\n{result.stderr[-3000:]}"


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
    # when the reward lies: flips shrink the gradient by 1 − 2ε and learning with it; a format reward climbs alone
    assert [round(r["grad_ratio"], 5) for r in defs["noise_rows"]] == [1.0, 0.8, 0.6, 0.4, 0.2, 0.0]
    assert defs["noisy_p_best"][0] > 0.6 and defs["noisy_p_best"][-1] < 0.3  # measured 0.68 and 0.20
    assert defs["noisy_p_best"] == sorted(defs["noisy_p_best"], reverse=True)
    assert defs["format_curves"]["reward"][-1] > defs["format_curves"]["reward"][0] + 0.1
    assert defs["format_curves"]["accuracy"][-1] < defs["format_curves"]["accuracy"][0] - 0.1


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


def run_with_setting(path: Path, default: str, setting: str, tmp_path: Path) -> dict:
    """Run a copy of the notebook with one widget default replaced (`default` -> `setting`,
    text that must occur exactly once): the "find the knob that breaks it" settings."""
    text = path.read_text(encoding="utf-8")
    assert text.count(default) == 1, f"{default!r} should occur exactly once in {path.name}"
    copy = tmp_path / path.name
    copy.write_text(text.replace(default, setting), encoding="utf-8")
    return run_in_process(copy)


def run_with_settings(path: Path, replacements: dict[str, str], tmp_path: Path) -> dict:
    """run_with_setting with several widget defaults replaced at once (a panel's knobs)."""
    text = path.read_text(encoding="utf-8")
    for default, setting in replacements.items():
        assert text.count(default) == 1, f"{default!r} should occur exactly once in {path.name}"
        text = text.replace(default, setting)
    copy = tmp_path / path.name
    copy.write_text(text, encoding="utf-8")
    return run_in_process(copy)


def test_lesson_05_a_small_lr_keeps_the_policy_and_a_large_one_breaks_it(restore_threads, tmp_path):
    path = LESSONS / "05_trainer.py"
    defs = run_in_process(path)
    assert defs["error"] is None and len(defs["steps"]) == 4
    assert defs["steps"][0]["ratio_max"] == pytest.approx(1.0, abs=1e-4)  # step 1 is on-policy
    assert defs["delta_right"] > 0 > defs["delta_wrong"]
    # four small steps on 24 samples move greedy pass@1 on 90 problems by no more than noise
    # (measured 0.700 -> 0.667 with the sampler of 2026-11-25, 0.700 -> 0.711 before)
    assert defs["pass_after"] >= defs["pass_before"] - 0.05
    broken = run_with_setting(path, "value=-4.0, label=", "value=-2.0, label=", tmp_path)
    assert broken["pass_after"] < defs["pass_before"] - 0.3  # η = 1e-2: the collapse the lesson names


def test_lesson_06_on_policy_every_step_and_stale_without_sync(restore_threads, tmp_path):
    path = LESSONS / "06_weight_sync.py"
    defs = run_in_process(path)
    assert [r["staleness"] for r in defs["log"]] == [0] * defs["STEPS"]
    assert max(abs(r["approx_kl"]) for r in defs["log"]) < 1e-5
    assert defs["sync"].version == defs["STEPS"]
    never = run_with_setting(path, "value=1, label=\"push weights", "value=0, label=\"push weights", tmp_path)
    assert [r["staleness"] for r in never["log"]] == list(range(never["STEPS"]))
    assert never["sync"].version == 0
    assert all(r["approx_kl"] > 1e-4 for r in never["log"][1:])  # stale from the first update on
    # and from two updates behind, tokens start the step outside the trust region (measured
    # 3-8% of them; one update behind moved none that far with this draw)
    assert all(r["outside"] > 0 for r in never["log"][2:])


@pytest.mark.parametrize("bug", ["none: the loop as written", "compute advantages before scoring",
                                 "collate without the sampling temperature", "skip the sync"])
def test_lesson_07_each_planted_bug_shows_where_the_lesson_says(bug, restore_threads, tmp_path):
    path = LESSONS / "07_controller.py"
    default = 'value="none: the loop as written", label'
    defs = run_with_setting(path, default, f'value="{bug}", label', tmp_path)
    m, out = defs["metrics"], defs["out"]
    if bug == "none: the loop as written":
        assert m["ratio_max"] == pytest.approx(1.0, abs=1e-4) and m["grad_norm"] > 0
        assert out["sync_gap_after"] == 0.0 and out["engine_version"] == 1
    elif bug == "compute advantages before scoring":
        assert defs["batch"].advantages.abs().max() == 0 and m["grad_norm"] == 0
    elif bug == "collate without the sampling temperature":
        assert abs(m["ratio_mean"] - 1) > 1e-3 and m["approx_kl"] > 1e-5
    else:
        assert out["sync_gap_after"] > 0 and out["engine_version"] == 0


def test_lesson_08_masked_tool_tokens_cannot_reach_the_loss(restore_threads, tmp_path):
    path = LESSONS / "08_agentic_tool_masking.py"
    defs = run_in_process(path)
    assert defs["tool_value"] == 0.0
    assert defs["loss_delta"] == defs["loss_0"] and defs["loss_nan"] == defs["loss_0"]
    assert defs["tool_push"].abs().max() == 0
    assert (defs["grad_0"] * defs["tool"]).abs().max() == 0
    bug = run_with_setting(path, 'value="0: tool output is state, not action (correct)",',
                           'value="1: tool output trained as if the model wrote it (the bug)",', tmp_path)
    assert bug["loss_delta"] != bug["loss_0"]
    assert bug["loss_nan"] != bug["loss_nan"]  # NaN reached the loss
    assert bug["tool_push"][0] > 0 > bug["tool_push"][1]  # right tool output pushed up, wrong down
    assert bug["tool_logp_change"][1] < defs["tool_logp_change"][1] - 0.3


def test_lesson_09_offset_hurts_without_a_baseline_and_cancels_with_one(restore_threads, tmp_path):
    path = LESSONS / "09_reinforce.py"
    clean = run_in_process(path)
    assert clean["grad_mean"] > 0 and clean["wrong_sign"] < 0.05
    offset = 'step=0.5, value=0.0, label="reward offset'
    shifted = run_with_setting(path, offset, 'step=0.5, value=5.0, label="reward offset', tmp_path)
    assert shifted["grad_std"] > 5 * clean["grad_std"] and shifted["wrong_sign"] > 0.2
    assert shifted["p_best_final"] < clean["p_best_final"]
    text = path.read_text(encoding="utf-8").replace(offset, 'step=0.5, value=5.0, label="reward offset')
    (tmp_path / "g.py").write_text(text.replace('value="none", label="baseline b"', 'value="group_mean", label="baseline b"'))
    group = run_in_process(tmp_path / "g.py")
    (tmp_path / "g0.py").write_text(path.read_text(encoding="utf-8").replace(
        'value="none", label="baseline b"', 'value="group_mean", label="baseline b"'))
    group_clean = run_in_process(tmp_path / "g0.py")
    assert group["grad_std"] == pytest.approx(group_clean["grad_std"], rel=1e-5)  # the offset cancels exactly


def test_lesson_10_clip_table_corners(restore_threads, tmp_path):
    path = LESSONS / "10_ppo.py"
    defs = run_in_process(path)
    assert defs["cell"]["clipped"] and defs["cell"]["grad"] == 0.0  # ρ = 1.3, A = +1, ε = 0.2
    table = defs["table"]
    assert table[(1.5, 1.0)]["clipped"] and table[(0.5, -1.0)]["clipped"]
    assert not table[(0.5, 1.0)]["clipped"] and not table[(1.5, -1.0)]["clipped"]  # the pessimistic corners
    assert table[(1.5, -1.0)]["grad"] == pytest.approx(1.5)  # −A·ρ, growing with ρ
    assert table[(0.9, 1.0)]["grad"] == pytest.approx(-0.9)
    # the chart: the clipped objective is flat past 1 + ε for A > 0 and below 1 − ε for A < 0
    ratios, objective = defs["objective_ratios"], defs["objective"]
    assert points(defs["objective_fig"]) == 4 * len(ratios) and marked_at(defs["objective_fig"]) == [1.3]
    assert {round(v, 6) for r, v in zip(ratios, objective["clipped, A = +1"]) if r >= 1.2} == {1.2}
    assert {round(v, 6) for r, v in zip(ratios, objective["clipped, A = -1"]) if r <= 0.8} == {-0.8}
    assert objective["clipped, A = +1"][ratios.index(1.0)] == pytest.approx(1.0)
    free = run_with_setting(path, "step=0.05, value=0.2, label=", "step=0.05, value=2.0, label=", tmp_path)
    assert free["epochs"][-1]["approx_kl"] > 5 * defs["epochs"][-1]["approx_kl"]
    assert free["epochs"][-1]["ratio_max"] > 3 > 1.5 > defs["epochs"][-1]["ratio_max"]


def test_lesson_11_bias_is_exactly_k_minus_1_over_k(restore_threads, tmp_path):
    path = LESSONS / "11_grpo.py"
    defs = run_in_process(path)
    K, rows, true = defs["K"], defs["bias_rows"], defs["true_grad"]
    assert rows["GRPO mean only (= Dr. GRPO)"] / true == pytest.approx((K - 1) / K, rel=1e-5)
    assert rows["RLOO (leave one out)"] / true == pytest.approx(1.0, rel=1e-5)
    # the chart: the same enumeration at every K of the slider; mean-only is (K − 1)/K at each
    for k, row in zip(defs["GROUP_SIZES"], defs["bias_by_k"]):
        assert row["GRPO mean only (= Dr. GRPO)"] / true == pytest.approx((k - 1) / k, abs=1e-5), k
    dead = defs["zero_var_by_k"]
    assert dead[0] == 1.0 and all(a > b for a, b in zip(dead, dead[1:]))  # a bigger group is live more often
    assert points(defs["bias_fig"]) == 3 * 8 and points(defs["zero_fig"]) == 8 and marked_at(defs["bias_fig"]) == [4]
    one = run_with_setting(path, "step=1, value=4, label=", "step=1, value=1, label=", tmp_path)
    assert one["zero_var"] == 1.0
    for name, (adv, push, _) in one["results"].items():
        if name == "dapo":  # dynamic sampling drops every group: nothing left to train on
            assert torch.isnan(adv).all() and torch.isnan(push).all()
        else:
            assert adv.abs().max() == 0 and push.abs().max() == 0


def test_lesson_12_rloo_is_grpo_without_std_times_k_over_k_minus_1(restore_threads):
    defs = run_in_process(LESSONS / "12_rloo.py")
    K = defs["K"]
    torch.testing.assert_close(defs["rloo_adv"], defs["centred"] * K / (K - 1))
    assert defs["loo"][0] == pytest.approx(1 / 3)  # the others of sample 0: 1, 0, 0
    # the chart: leave-one-out is unbiased at every K, the mean of all is (K − 1)/K of the truth
    for k, biased, unbiased in zip(defs["UNBIASED_KS"], *defs["unbiased"].values()):
        assert (biased, unbiased) == (pytest.approx((k - 1) / k, abs=1e-5), pytest.approx(1.0, abs=1e-5)), k
    assert points(defs["unbiased_fig"]) == 14 and marked_at(defs["unbiased_fig"]) == [4]


def test_lesson_13_each_ablation_changes_what_the_lesson_says(restore_threads, tmp_path):
    path = LESSONS / "13_dapo.py"
    defs = run_in_process(path)  # default: dynamic sampling removed
    full, ablated = defs["results"]["dapo"], defs["results"][defs["label"]]
    assert full[2]["kept_rows"] == 8 and ablated[2]["kept_rows"] == 12
    assert ablated[1][4:].abs().sum() < full[1][4:].abs().sum()  # informative rows pushed less
    assert points(defs["push_fig"]) == 3 * 12  # GRPO, DAPO and the ablation on each of 12 rows
    default = 'value="dynamic sampling (keep every group)",'
    overlong = run_with_setting(path, default, 'value="overlong shaping (no length penalty)",', tmp_path)
    adv = overlong["results"][overlong["label"]][0]
    assert adv[9] == pytest.approx(adv[8].item())  # the 44-token answer as good as the 10-token one
    assert overlong["results"]["dapo"][0][9] < overlong["results"]["dapo"][0][8]
    clip = run_with_setting(path, default, 'value="clip-higher (ε_high back to 0.2)",', tmp_path)
    assert defs["push_125"] and not clip["push_125"]


def test_lesson_13_caveat_reads_the_two_start_presets_and_quotes_the_measured_pair(restore_threads):
    """The caveat's table is the two recipes/start_from_*.toml files' difference, read by the
    lesson; its measured numbers are quoted by links into the docs section that measured them
    (test_docs_pages checks that each quoted number is one that section states)."""
    path = LESSONS / "13_dapo.py"
    differences = run_in_process(path)["start_differences"]
    assert differences == {"rl.algo_params.clip_eps_high": (0.2, 0.28), "rl.algo_params.kl_coef": (0.0, 0.05),
                           "rl.algo_params.loss_agg": ("token-mean", "seq-mean-token-mean"),
                           "rl.algo_params.overlong_filter": (False, True), "rl.reward.terms": ("r1", "accuracy"),
                           "sft.steps": (200, 600)}
    text = path.read_text(encoding="utf-8")
    assert text.count("(../docs/guides/base-vs-aligned.md#the-measured-pair-clip-higher-from-each-start)") >= 2
    # every paired difference of the page's table (start, seed, ..., clip-higher − symmetric, ...), in the lesson
    page = (ROOT / "docs" / "guides" / "base-vs-aligned.md").read_text(encoding="utf-8")
    paired = [cells[4] for cells in (line.strip("|").split("|") for line in page.splitlines())
              if len(cells) == 7 and cells[0].strip() in ("aligned", "base")]
    assert len(paired) == 6 and all(diff.strip() in text for diff in paired), paired

def test_lesson_14_length_bias_under_grpo_only(restore_threads):
    defs = run_in_process(LESSONS / "14_dr_grpo.py")
    g, d, L = defs["per_token"]["grpo"], defs["per_token"]["dr_grpo"], defs["L"]
    assert (g[1] / g[2]).item() == pytest.approx(8 / L, rel=1e-4)
    assert (d[1] / d[2]).item() == pytest.approx(1.0, rel=1e-5)


def test_lesson_15_the_proxy_only_rises_and_the_gold_peaks_then_falls(restore_threads, tmp_path):
    path = LESSONS / "15_rlhf.py"
    defs = run_in_process(path)
    history, sweep = defs["history"], defs["sweep"]
    assert history[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # a zero head: σ(0) = 1/2 for every pair
    assert sum(h["loss"] for h in history[-10:]) / 10 < 0.65 and defs["heldout_acc"] > 0.6
    assert [row["beta"] for row in sweep] == sorted((row["beta"] for row in sweep), reverse=True)
    for key in ("proxy", "kl"):  # more reward, more KL, whenever β falls: by construction
        assert all(a[key] < b[key] for a, b in zip(sweep, sweep[1:])), key
    assert all(a["distinct"] > b["distinct"] for a, b in zip(sweep, sweep[1:]))
    assert defs["start"]["distinct"] > 300 and sweep[-1]["distinct"] < 3  # job 2: the policy narrows to ~one review
    peak = max(sweep, key=lambda row: row["gold"])
    assert sweep[0]["beta"] > peak["beta"] > sweep[-1]["beta"]  # the gold peaks at a moderate β ...
    past_peak = [row["gold"] for row in sweep if row["beta"] < peak["beta"]]
    # ... and falls by more than a point past it: over-optimisation. (Below zero at β = 0.003 on
    # an Intel Xeon, −0.84; on an AMD EPYC with AVX-512 the reward model trains to other weights
    # and the fall is 1.79 -> 0.62 at β = 0.01: the lesson's text gives both.)
    assert peak["gold"] > 1 and min(past_peak) < peak["gold"] - 1
    assert defs["chosen"]["beta"] == 0.1 and defs["chosen"]["gold"] > peak["gold"] - 0.3  # the default sits near it
    # the chart: the same optimum across the slider's β; the proxy only rises with KL, the gold turns over
    frontier = defs["frontier"]
    assert len(frontier) == 26 and frontier[-1]["beta"] == pytest.approx(10 ** -2.5)
    assert all(a["kl"] < b["kl"] and a["proxy"] < b["proxy"] for a, b in zip(frontier, frontier[1:]))
    top = max(range(26), key=lambda i: frontier[i]["gold"])
    assert 0 < top < 25 and frontier[top]["gold"] > frontier[-1]["gold"] + 0.3
    assert points(defs["overopt_fig"]) == 2 * 27 and marked_at(defs["overopt_fig"]) == [pytest.approx(defs["chosen"]["kl"])]
    hard = run_with_setting(path, "step=0.25, value=-1.0, label=", "step=0.25, value=-2.5, label=", tmp_path)
    assert hard["chosen"]["beta"] == pytest.approx(0.0032, abs=1e-4)
    assert hard["chosen"]["proxy"] > defs["chosen"]["proxy"] and hard["chosen"]["gold"] < peak["gold"] - 0.3
    top = int(hard["chosen"]["logp"].argmax())  # the reward model's blind spot: a negated compliment
    assert hard["chosen"]["logp"][top].exp() > 0.5 and any(w in hard["texts"][top] for w in (" not ", " never "))
    assert hard["gold"][top] < hard["gold"].max() - 5  # the raters score it far below the best reviews (+7.5)
    few = run_with_setting(path, "value=3000, label=", "value=30, label=", tmp_path)
    assert few["train_acc"] > few["heldout_acc"] + 0.15  # 30 pairs: memorised, not learned


def _lesson_16(tmp_path, x: str | None = None) -> dict:
    path = LESSONS / "16_dpo.py"
    default = "step=0.25, value=-1.0, label="
    return run_in_process(path) if x is None else run_with_setting(path, default, f"step=0.25, value={x}, label=",
                                                                 tmp_path)


def test_lesson_16_z_cancels_and_only_orpo_keeps_the_chosen_answers(restore_threads, tmp_path):
    defs = _lesson_16(tmp_path)
    beta = defs["beta"]
    assert beta == 0.1
    for table in defs["tables"]:
        # β log π*/π_ref + β log Z(x) is the reward, for every answer
        torch.testing.assert_close(table["implicit"] + beta * table["log_z"], table["r"], atol=1e-4, rtol=0)
    assert abs(defs["tables"][0]["log_z"] - defs["tables"][1]["log_z"]) > 0.5  # different prompts, different Z
    # DPO's loss at π* is the Bradley–Terry loss of the true rewards (a margin of 1): Z is nowhere
    assert defs["dpo_at_optimum"] == pytest.approx(defs["bt_of_rewards"], abs=1e-5)
    assert defs["bt_of_rewards"] == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)
    results, before = defs["results"], defs["pass_before"]
    assert results["orpo"]["d_chosen"] > 0 and results["orpo"]["pass@1"] >= before - 0.1
    for name in ("dpo", "ipo", "kto", "simpo"):
        assert results[name]["d_chosen"] < 0 < results[name]["d_chosen"] - results[name]["d_rejected"], name
        assert results[name]["pass@1"] < before - 0.2, name
    for name in results:
        assert results[name]["accuracy"] > 0.6, name  # every loss ranks most of its training pairs
    leashed = _lesson_16(tmp_path, "0.0")  # β = 1
    for name in ("dpo", "ipo", "kto"):
        assert leashed["results"][name]["kl"] < results[name]["kl"], name
        assert leashed["results"][name]["pass@1"] > results[name]["pass@1"], name
    for name in ("orpo", "simpo"):  # no reference, no leash: β does not reach them
        assert leashed["results"][name]["pass@1"] == results[name]["pass@1"], name
    loose = _lesson_16(tmp_path, "-2.0")  # β = 0.01: IPO's target margin is 50 nats
    assert loose["results"]["ipo"]["kl"] > 1.5 * results["ipo"]["kl"]


@pytest.mark.parametrize("spec", ["hackable/substring", "hackable/multi-final", "hackable/last-number",
                                  "hackable/case-insensitive-prefix", "final_int/cot-v1"])
def test_lesson_18_the_optimiser_finds_the_holes_that_pay(spec, restore_threads, tmp_path):
    path = LESSONS / "18_verifiers.py"
    defs = run_with_setting(path, 'value="hackable/substring", label', f'value="{spec}", label', tmp_path)
    honest, numbers, lines = defs["final_pi"]
    curve, inflation = defs["curve"], defs["inflation"]
    assert inflation["gold"] == 0.49  # the frozen rollouts under final_int/cot-v1
    for kind, written_for, _, paid, gold in defs["pack_rows"]:
        assert gold == 0.0, kind  # no exploit beats the honest spec ...
        if written_for == spec:
            assert paid == 1.0, kind  # ... and every one beats the spec it was written against
    if spec in ("hackable/substring", "hackable/multi-final"):
        assert honest < 0.05 and curve[-1]["proxy"] > 0.95 and curve[-1]["gold"] < 0.1
        assert sum(c["gold"] for c in curve[:5]) / 5 > 0.2  # it started mostly honest
        if spec == "hackable/multi-final":
            assert lines > 0.9  # only the Final-lines exploit pays here
    else:
        assert honest > 0.99  # no exploit pays more than answering
    assert (inflation["proxy"] > inflation["gold"]) == (spec != "final_int/cot-v1")
    assert points(defs["hacking_fig"]) == 3 * 40  # proxy, gold and π(honest) at every step


def _close_to_formula(row: dict, groups: int) -> None:
    """The measured share of live groups is a mean of `groups` Bernoulli draws: within 4 standard errors."""
    se = math.sqrt(max(row["share_formula"] * (1 - row["share_formula"]), 1e-12) / groups)
    assert abs(row["share"] - row["share_formula"]) < 4 * se + 1e-9, row
    assert row["signal"] == pytest.approx(row["signal_formula"], rel=0.08, abs=1e-9), row


def test_lesson_18a_signal_density_the_band_the_weights_and_the_pipeline(restore_threads, tmp_path):
    path = LESSONS / "18a_data_as_signal.py"
    defs = run_in_process(path)  # levels 2,3,5 after SFT, K = 8, band 1/8..7/8
    passes, groups = defs["passes"], defs["GROUPS"]
    assert (passes.count(0), passes.count(8), len(passes)) == (750, 118, 1024)  # the measured pool
    rows = {(r["band"], r["weights"]): r for r in defs["rows"]}
    assert len(rows) == 6
    for row in rows.values():
        _close_to_formula(row, groups)
    uniform, failure, signal = (rows[(0.0, 1.0), w] for w in ("uniform", "failure", "signal"))
    # the formula, worked from the histogram by hand: uniform draws over the whole pool
    by_hand = sum(passes.count(j) / 1024 * (1 - (j / 8) ** 8 - (1 - j / 8) ** 8) for j in range(9))
    assert uniform["share_formula"] == pytest.approx(by_hand) and by_hand == pytest.approx(0.125, abs=0.002)
    assert uniform["hopeless"] == pytest.approx(750 / 1024)
    # 1 − p sends most draws to the hopeless, and fewer groups disagree than under uniform draws
    assert failure["hopeless"] > 0.85 and failure["share_formula"] < uniform["share_formula"]
    # p(1 − p) needs no band: the same 156 prompts and the same draws as band + signal
    assert signal["prompts"] == 156 and signal["hopeless"] == signal["solved"] == 0.0
    assert signal["share_formula"] == pytest.approx(rows[(0.125, 0.875), "signal"]["share_formula"])
    assert signal["signal_formula"] > 7 * uniform["signal_formula"]
    banded = rows[(0.125, 0.875), "uniform"]
    assert banded["prompts"] == 156 and banded["share"] == pytest.approx(0.83, abs=0.02)
    assert banded["online_kept"] == banded["share"]  # at K = 8, band 1/8..7/8 keeps exactly the live groups
    pipeline = defs["pipeline"]  # the four planted rows, each dropped by its stage
    assert (pipeline["source"], pipeline["verifier-check"]) == (1028, 1027)
    assert (pipeline["decontaminated"], pipeline["deduplicated"], pipeline["screened"]) == (2, 1, 1024)
    assert pipeline["waiting"] == 868 and [len(v) for v in pipeline["strata"].values()] == [342, 341, 341]
    # the chart: the pool's shares as bars, p(1 − p) and the live-group share as curves, the band's edges marked
    assert [c["prompts"] for c in defs["by_count"]] == [passes.count(j) for j in range(9)]
    assert max(defs["by_count"], key=lambda c: c["signal"])["passed"] == 4  # p(1 − p) peaks at p = ½
    assert points(defs["signal_fig"]) == 9 + 2 * 9 and marked_at(defs["signal_fig"]) == [0.5, 7.5]

    # the knobs: K = 1 is no group, and a band of the hopeless has nothing to learn from
    one = run_with_setting(path, 'value=8, label="K', 'value=1, label="K', tmp_path)
    assert all(r["share"] == r["signal"] == r["share_formula"] == r["signal_formula"] == 0 for r in one["rows"])
    assert all(r["online_kept"] == 0 for r in one["rows"] if r["band"] != (0.0, 1.0))
    hopeless = run_with_setting(path, 'value="1/8..7/8 (drop the solved and the hopeless)",',
                                'value="0..0 (only the hopeless)",', tmp_path)
    for r in hopeless["rows"]:
        if r["band"] == (0.0, 0.0):
            assert r["prompts"] == 750 and r["hopeless"] == pytest.approx(1.0) and r["share"] == r["signal"] == 0
    # on the mostly-solved level-3 pool the same failure weights help
    level3 = run_with_setting(path, 'value="levels 2,3,5, after SFT (13.6%)", label',
                              'value="level 3, after SFT (69.8%)", label', tmp_path)
    l3 = {(r["band"], r["weights"]): r for r in level3["rows"]}
    assert l3[(0.0, 1.0), "failure"]["share_formula"] > l3[(0.0, 1.0), "uniform"]["share_formula"] + 0.05
    half = run_with_setting(path, 'value="levels 2,3,5, after SFT (13.6%)", label',
                            'value="synthetic: every prompt at 4/8", label', tmp_path)
    assert all(r["signal_formula"] == pytest.approx(7 / 8 / 4) for r in half["rows"])


def _lesson_26(tmp_path, spec: str | None = None, weights: tuple | None = None) -> dict:
    path = LESSONS / "26_three_forces.py"
    text = path.read_text(encoding="utf-8")
    if spec is not None:
        text = text.replace('value="final_int/cot-v1", label="the verifier"', f'value="{spec}", label="the verifier"')
    if weights is not None:
        for name, w in zip(("signal", "estimator", "cost"), weights):
            text = re.sub(rf'("{name}": mo\.ui\.slider\(start=0\.0, stop=1\.0, step=0\.1, value=)[0-9.]+', rf"\g<1>{w}", text)
    copy = tmp_path / path.name
    copy.write_text(text, encoding="utf-8")
    return run_in_process(copy)


RECIPES_AT_THE_CORNERS = {
    "all signal, every prompt checkable": "R1-Zero",
    "all signal, a fifth of the prompts uncheckable": "R1",
    "all estimator, nothing checkable": "RLHF (InstructGPT)",
    "all cost": "DPO (Zephyr)",
    "signal and cost, half the prompts checkable": "Tülu 3",
}


def test_lesson_26_the_corners_recover_the_recipes_and_a_leaky_verifier_fools_it(restore_threads, tmp_path):
    defs = _lesson_26(tmp_path)
    assert defs["point"] == (1.0, 0.0, 0.0) and defs["coverage"] == 1.0 and defs["fidelity"] == 1.0
    assert defs["winner"].recipe == "R1-Zero" and defs["error"] is None
    # the chart: the winner at each of 231 points of the triangle, the weights' point starred at its corner
    triangle = defs["triangle_fig"]
    assert points(triangle) == 231
    star = [line for line in triangle.axes[0].get_lines() if line.get_marker() == "*"]
    assert len(star) == 1 and (star[0].get_xdata()[0], star[0].get_ydata()[0]) == (0.0, 0.0)
    assert defs["recipes"] == RECIPES_AT_THE_CORNERS
    noise = defs["noise"]  # the numbers the lesson's text quotes
    assert noise["none"] == pytest.approx(2.35, abs=0.1) and noise["critic"] == pytest.approx(0.77, abs=0.05)
    assert noise["group"] == pytest.approx(0.90, abs=0.06) and noise["grpo"] == pytest.approx(0.32, abs=0.05)
    # the knob: 18 of 24 exploits refused looks like a 0.75 verifier, and the simulator still picks GRPO on it
    leaky = _lesson_26(tmp_path, spec="hackable/multi-final")
    assert leaky["fidelity"] == 0.75 and leaky["winner"].recipe == "R1-Zero"
    assert leaky["recipes"]["signal and cost, half the prompts checkable"] == "DPO (Zephyr)"
    assert _lesson_26(tmp_path, spec="hackable/substring")["winner"].recipe == "RLOO (back to basics)"
    assert _lesson_26(tmp_path, weights=(0.0, 0.0, 1.0))["winner"].recipe == "DPO (Zephyr)"
    nothing = _lesson_26(tmp_path, weights=(0.0, 0.0, 0.0))
    assert nothing["winner"] is None and "weight 0" in nothing["error"]


def _lesson_23(tmp_path, **settings) -> dict:
    path = LESSONS / "23_recipes_and_failure_modes.py"
    defaults = {"recipe": 'value="r1", label="recipe"', "donor": 'value="r1_zero", label="take one axis from"',
                "axis": 'value="data", label="the axis to swap"',
                "symptom": 'value="reward up while dev pass@1 falls"', "loosen": "value=1.0,"}
    knobs = {"recipe": 'value="{}", label="recipe"', "donor": 'value="{}", label="take one axis from"',
             "axis": 'value="{}", label="the axis to swap"', "symptom": 'value="{}"', "loosen": "value={},"}
    return run_with_settings(path, {defaults[k]: knobs[k].format(v) for k, v in settings.items()}, tmp_path)


FAILURE_MAP_23 = {  # symptom: (the step its monitor first fires, the loosening from which it never does)
    "reward up while dev pass@1 falls": (30, 3.0), "KL to the reference explodes": (33, 2.5),
    "entropy collapses": (38, 2.5), "every group scored alike": (24, 4.5), "responses double in length": (31, 1.5),
    "chosen likelihood falls (DPO)": (30, 2.0), "sampler and trainer log-probs disagree": (20, 2.0),
}


def test_lesson_23_one_axis_swapped_and_each_symptom_caught_by_its_own_monitor(restore_threads, tmp_path):
    defs = _lesson_23(tmp_path)
    # R1 with R1-Zero's data: three settings (digits again, no worked steps, R1-Zero's 150 demonstrations); it passes the checks
    assert defs["changed"] == {"env.arithmetic.words": (0.5, 0.0), "env.cot": (True, False), "sft.num_examples": (300, 150)}
    assert defs["moved"] == {"env.cot": False}
    assert defs["refused"] is None
    assert set(defs["STATED"]) == {"instructgpt", "kimi_k15", "qwen25", "qwen3", "r1", "r1_zero",  # the seven famous
                                   "tulu3_rlvr",  # recipes
                                   "capstone_aligned_assistant", "capstone_reasoning_specialist",  # the capstones
                                   "start_from_base", "start_from_aligned"}  # and the two start presets
    assert all(len(axes) == 5 for axes in defs["STATED"].values())
    assert all(defs["axis_of"](k) is not None for f in defs["RECIPES"].values() for k in f if k not in defs["NOT_AN_AXIS"])
    # the map: each symptom fires its own monitor and no other, at the step the lesson quotes; health fires nothing
    assert defs["healthy_alerts"] == []
    assert {name: (m["step"], m["hidden_from"]) for name, m in defs["failure_map"].items()} == FAILURE_MAP_23
    assert all(m["others"] == [] for m in defs["failure_map"].values())
    assert [(a["step"], a["monitor"]) for a in defs["alerts"]] == [(30, "proxy_gold_divergence")]
    # the knob: a line three times looser hides the same sick run
    assert _lesson_23(tmp_path, loosen=3.0)["alerts"] == []
    flat = _lesson_23(tmp_path, symptom="every group scored alike", loosen=4.0)
    assert [(a["step"], a["monitor"]) for a in flat["alerts"]] == [(39, "no_learning_signal")]
    # the algorithm axis carries the stage sequence; some swaps change nothing; some hybrids cannot run
    algo = _lesson_23(tmp_path, axis="algorithm")
    assert algo["changed"]["stages"][1] == "" and algo["changed"]["stages"][0].startswith("sft,grpo,sft[sft.teacher=self,")
    assert algo["changed"]["rl.algo_params.kl_coef"] == ("(not set)", 0.001) and len(algo["changed"]) == 2
    assert _lesson_23(tmp_path, recipe="tulu3_rlvr", donor="qwen25", axis="data")["changed"] == {}  # both the default data
    # R1's data in Tülu 3: its prompts in number words do not fit Tülu 3's 96 positions (scale is another axis)
    assert "more than the model's 96 positions" in _lesson_23(tmp_path, recipe="tulu3_rlvr", donor="r1")["refused"]
    # Qwen3's stage list poses the task in /think mode, which R1's task (arithmetic) has no setting for
    qwen3 = _lesson_23(tmp_path, donor="qwen3", axis="algorithm")
    assert list(qwen3["changed"]) == ["stages"] and qwen3["changed"]["stages"][1].count("think_mode=think") == 2
    assert qwen3["refused"].startswith("env.arithmetic_think.think_mode='think' is not allowed") \
        and "only env.name arithmetic_think reads the arithmetic_think section" in qwen3["refused"]
    tulu = _lesson_23(tmp_path, recipe="tulu3_rlvr", donor="kimi_k15")
    assert "rl.curation.pool_size=1024" in tulu["refused"] and "rl.curation.order" in tulu["changed"]
    assert "rl.reward.length_reward=1" in _lesson_23(tmp_path, recipe="tulu3_rlvr", donor="kimi_k15", axis="reward")["refused"]
    assert not any(defs["axis_of"](k) == "system" for f in defs["RECIPES"].values() for k in f)  # one process, every file


def test_lesson_27_every_concept_is_mapped_and_its_code_exists():
    text = (LESSONS / "27_missing_concepts.py").read_text(encoding="utf-8")
    tree = ast.parse(text)
    concepts = next(ast.literal_eval(n.value) for n in ast.walk(tree)
                    if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "CONCEPTS")
    assert len(concepts) == 22  # the 17 of the outline's list, and five more (TRPO to test-time compute)
    listed = {"PRM training", "Reward-model internals", "RLAIF", "GAE (λ-returns)", "KL estimator choice",
              "Entropy regularisation", "Off-policy correction", "FP8", "Mixture of experts", "KV-cache offload",
              "Checkpointing and resume", "Multi-LoRA"}  # the twelve the course outline names
    assert listed <= {c["concept"] for c in concepts}
    series = {f"{n:02d}" for n in range(29)} | {"18a", "22a", "22b", "22c"}  # the full series' lesson numbers
    for c in concepts:
        assert c["after"] in series, c["concept"]
        for path, name in c["code"]:
            source = ROOT / path
            assert source.is_file(), f"{c['concept']}: {path} does not exist"
            defined = re.search(rf"^\s*(?:def |class )?{re.escape(name)}\b\s*[(:=]", source.read_text(encoding="utf-8"),
                                re.MULTILINE)
            assert defined, f"{c['concept']}: {path} does not define {name}"
    assert sum(bool(c["code"]) for c in concepts) == 18


def _lesson_27(tmp_path, drift: str) -> dict:
    return run_with_setting(LESSONS / "27_missing_concepts.py", "step=0.25, value=1.0,", f"step=0.25, value={drift},",
                            tmp_path)


def test_lesson_27_truncation_helps_near_policy_and_nothing_rescues_a_distant_one(restore_threads, tmp_path):
    defs = run_in_process(LESSONS / "27_missing_concepts.py")
    r, cap = defs["results"], defs["CAP"]
    ignore, full, tis = r["ignore it"], r["full importance sampling"], r[f"truncated, cap {cap:g}"]
    assert defs["true_value"] == pytest.approx(0.40, abs=1e-6)
    assert ignore["mean"] == pytest.approx(defs["pi_b_right"], abs=0.01)  # it estimates the sampler's value
    assert ignore["bias"] < -0.18 and abs(full["bias"]) < 0.01 and abs(tis["bias"]) < 0.01
    assert full["std"] == pytest.approx(2 * ignore["std"], rel=0.1) and tis["std"] <= full["std"]
    assert full["max_w"] == pytest.approx(2.03, abs=0.01)
    same = _lesson_27(tmp_path, "0.0")
    assert same["ess"] == pytest.approx(1.0) and len({round(v["mean"], 9) for v in same["results"].values()}) == 1
    far = _lesson_27(tmp_path, "3.0")["results"]
    assert far["ignore it"]["mean"] < 0.05 and abs(far["full importance sampling"]["bias"]) < 0.02
    assert far["full importance sampling"]["std"] > 0.35 and far["full importance sampling"]["max_w"] > 12
    assert far[f"truncated, cap {cap:g}"]["mean"] < 0.08
    assert min(v["rmse"] for v in far.values()) > 0.3


# ---- lessons 22b, 22c, 24, 25, 28 (systems, part 2) ------------------------------------


def test_lesson_22b_the_tax_the_patches_and_the_trap(restore_threads, tmp_path):
    path = LESSONS / "22b_long_tail_rollouts.py"
    defs = run_in_process(path)  # 256 rows, cv 1, cap 4 × the mean, keep 0.9
    assert defs["tax"] == pytest.approx(7.9, abs=0.1) and defs["monte_carlo"] == pytest.approx(defs["tax"], rel=0.05)
    seconds = [p.seconds for p in defs["patches"]]
    assert [p.patch.split(" ")[0] for p in defs["patches"]] == ["none", "packing", "length", "dynamic"]
    assert all(later < earlier for earlier, later in zip(seconds, seconds[1:])) and seconds[0] > 3 * seconds[1]
    assert 0.7 < defs["kept_mean"] / defs["MEAN"] < 0.8  # "~25 % shorter" even at keep = 0.9
    assert defs["float_worst"] < 1e-5  # float32 sampler = trainer to rounding
    assert 1e-3 < defs["int8_mismatch"].mean_abs_logp_diff < 2e-2  # "thousandths of a nat"
    assert defs["speedups"][1] > 1.8 > 1.3 > defs["speedups"][256]  # int8 pays while the weights' read binds
    short = run_with_setting(path, "step=0.05, value=0.9,", "step=0.05, value=0.5,", tmp_path)
    assert short["kept_mean"] / short["MEAN"] < 0.45  # keep 0.5: answers at ~40 % of the policy's length
    tight = run_with_setting(path, 'value=4.0, label="length cap', 'value=1.0, label="length cap', tmp_path)
    assert tight["truncated"] > 0.3 and tight["penalty"] < -0.3  # "a third cut off", sharply negative
    even = run_with_setting(path, 'value=1.0, label="spread', 'value=0.0, label="spread', tmp_path)
    assert even["tax"] == pytest.approx(1.0, abs=1e-3)
    assert even["patches"][1].seconds == pytest.approx(even["patches"][0].seconds)  # packing changes nothing
    assert even["patches"][-1].seconds > even["patches"][-2].seconds  # dynamic K only adds work


def test_lesson_22c_async_is_a_max_and_the_freshness_wall(restore_threads, tmp_path):
    path = LESSONS / "22c_async_pipelining.py"
    defs = run_in_process(path)  # async, k = 1, cv 0.5, updates of 3 s
    chart, lockstep, wall = defs["chart"], defs["lockstep"], defs["wall"]
    assert max(chart.staleness) == 1 and chart.makespan < lockstep.makespan / 1.4
    assert wall[0][1] == pytest.approx(lockstep.makespan / 12) and wall[1][1] < wall[0][1]
    totals = [s.total for _, s in defs["sync_steps"]]
    assert all(later < earlier for earlier, later in zip(totals, totals[1:])) and 0.1 < totals[0] < 0.2
    assert defs["across_nodes"].total > 5 * totals[0] and defs["bubbles"][1] == 0.75
    slow_trainer = run_with_settings(path, {'value=1, label="async': 'value=4, label="async',
                                            'value=3.0, label="seconds per update"': 'value=8.0, label="seconds per update"'},
                                     tmp_path)
    wall = slow_trainer["wall"]
    assert wall[2][1] == pytest.approx(wall[4][1]) and wall[1][1] - wall[2][1] < 0.03 * wall[1][1]  # no speed past k = 1
    assert wall[4][2] > 2.5 and max(slow_trainer["chart"].staleness) == 4  # only staleness
    turns = run_with_setting(path, 'value="async", label="topology"', 'value="colocated", label="topology"', tmp_path)
    assert turns["chart"].makespan == pytest.approx(turns["lockstep"].makespan)  # the sum, not the max


def test_lesson_24_copies_paths_and_what_does_not_fit(restore_threads, tmp_path):
    path = LESSONS / "24_rl_infra_engineer.py"
    defs = run_in_process(path)  # colocated, llama-3-8b, 8 × H100, GRPO
    placements = defs["placements"]
    assert all(p.fit.fits for pl in placements.values() for p in pl.pools)
    colocated = placements["colocated"]
    assert colocated.path("collectives").bytes > colocated.path("weights").bytes
    assert colocated.path("trajectories").bytes == 0
    assert placements["async"].step_seconds < colocated.step_seconds < placements["disaggregated"].step_seconds
    ppo = run_with_setting(path, 'value="grpo", label="algorithm"', 'value="ppo", label="algorithm"', tmp_path)
    pools = {a: pl.pools for a, pl in ppo["placements"].items()}
    assert pools["colocated"][0].fit.fits and not pools["disaggregated"][0].fit.fits  # the trainer pool overflows
    assert pools["disaggregated"][0].memory.total_bytes / 1e9 == pytest.approx(76.7, abs=0.1)
    big = run_with_setting(path, 'value="llama-3-8b", label="model', 'value="llama-3-70b", label="model', tmp_path)
    assert not any(p.fit.fits for pl in big["placements"].values() for p in pl.pools if p.name != "rollout")


def test_lesson_25_sampler_equals_trainer_until_its_kernels_change(restore_threads, tmp_path):
    path = LESSONS / "25_kernels_for_rl.py"
    defs = run_in_process(path)  # float32
    assert defs["worst"] < 1e-5 and abs(defs["start_ratio"] - 1).max() < 1e-5
    assert defs["cache"].contiguous_waste > 0.85 and defs["cache"].paged_waste < 0.01
    assert defs["roi"][0].lever.name == "2× faster rollout" and defs["decode_share"] < 0.25
    default = "value=\"float32: the trainer's own kernels\""
    bf16 = run_with_setting(path, default, 'value="bfloat16 matmuls (autocast)"', tmp_path)
    assert bf16["worst"] > 100 * 1e-5 and 1e-4 < bf16["stats"].mean_abs_logp_diff < 3e-3
    int8 = run_with_setting(path, default, 'value="int8 weights (models/int8.py)"', tmp_path)
    assert int8["worst"] > 1e-2 and int8["stats"].mean_abs_logp_diff > 2 * bf16["stats"].mean_abs_logp_diff
    assert 0.01 < abs(int8["start_ratio"] - 1).max() < 0.05  # "up to 2 % either side of 1"


def test_lesson_28_the_allocator_on_real_runs(restore_threads, tmp_path):
    path = LESSONS / "28_bottlenecks.py"
    defs = run_in_process(path)  # our colocated run, budget 3
    chosen = defs["chosen"]
    assert [g.lever.name for g in chosen][0] == "async, one step ahead"
    assert defs["before"] == pytest.approx(18.2, abs=0.1) and chosen[0].after_seconds == pytest.approx(10.6, abs=0.1)
    assert defs["sampling"]["async"] > 2 * defs["sampling"]["colocated"]  # 2 shared cores: sampling stretches
    assert all(abs(rmax - 1) < 1e-3 for _, rmax, *_ in defs["health"]["colocated"])
    assert all(abs(w - 1) < 5e-3 and stale == 1 for _, _, _, stale, w, _ in defs["health"]["async"])
    top = dict((key, share) for key, _, share in defs["profile_top"])
    assert "aten::mm" in top and top["aten::mm"] < 0.5  # the matmuls are not most of a tiny decode
    # the charts: one bar per lever spent (and the step as it is), every logged RL step of both runs
    assert points(defs["levers_fig"]) == len(chosen) + 1
    assert [len(steps) for steps in defs["ratio_steps"].values()] == [12, 12] and points(defs["ratio_fig"]) == 3 * 12
    default = 'value="our colocated run (measured)", label'
    stretched = run_with_setting(path, default, 'value="our async run, 2 Ray workers (measured)", label', tmp_path)
    trainer_side = [g for g in stretched["alone"] if g.lever.factors and "rollout" not in g.lever.factors]
    assert trainer_side and all(g.saved_seconds == 0 for g in trainer_side)  # the rollout binds
    planned = run_with_settings(path, {default: 'value="Llama-3-8B GRPO on 8 H100s (planned)", label',
                                       'value=3, label="optimizations': 'value=6, label="optimizations'}, tmp_path)
    names = [g.lever.name.split(" ")[0] for g in planned["chosen"]]
    assert names == ["speculative", "length", "async,", "low-precision", "skip"]  # the sixth slot stays unspent
    assert [round(g.after_seconds) for g in planned["chosen"]] == [39, 25, 14, 11, 8]


def rho_bars(defs: dict) -> list[float]:
    """The ρ-histogram's bar heights (token counts), left to right: its data, not the clip band."""
    from posttrain.teach.charts import DECORATION

    return [patch.get_height() for ax in defs["rho_fig"].axes for patch in ax.patches if patch.get_gid() != DECORATION]


def test_lesson_28_the_rho_histogram_spreads_as_the_learning_rate_grows(restore_threads, tmp_path):
    path = LESSONS / "28_bottlenecks.py"
    runs_lr = run_in_process(path)  # η = 10^-4, the learning rate the two shipped runs trained with
    ratios, bars = runs_lr["ratios"], rho_bars(runs_lr)
    # every response token of 8 prompts × 8 answers is in one of the 50 bars, and only those tokens
    assert len(bars) == 50 and sum(bars) == len(ratios) == int(runs_lr["rho_batch"].response_mask.sum()) > 300
    assert (runs_lr["clip_low"], runs_lr["clip_high"]) == pytest.approx((0.8, 1.2))
    # "about a third of its samples right" (measured 0.33): groups with both rewards, so GRPO has a gradient
    assert 0.2 < runs_lr["rho_batch"].rewards.mean().item() < 0.5
    # the update logged its own statistics at θ = θ_old, before its step: ratio 1, nothing clipped
    assert runs_lr["rho_update"]["ratio_max"] == pytest.approx(1.0, abs=1e-4) and runs_lr["rho_update"]["clipfrac"] == 0
    # the prose: at the runs' η nearly every token stays inside the clip range (measured 0.2 %, ρ in 0.69–1.14)
    assert runs_lr["outside_clip"] < 0.01 and 0.5 < ratios.min() and ratios.max() < 1.5
    assert ratios.min() < 1 < ratios.max()  # one step moved the policy both ways: not a spike of exact 1s
    big = run_with_setting(path, "value=-4.0,", "value=-2.5,", tmp_path)
    assert big["rho_lr"] == pytest.approx(10 ** -2.5) and len(big["ratios"]) == len(ratios)  # the same tokens
    assert rho_bars(big) != bars and sum(rho_bars(big)) == len(ratios)
    # "over a tenth of the tokens outside the clip range, ρ in the tens" (measured 12.8 %, largest 26)
    assert big["outside_clip"] > 0.1 and big["ratios"].max() > 10

# ---- end of lessons 22b-28 ----



# ---- lessons 19, 20, 21, 22, 22a (systems, part 1) ------------------------------------


def test_lesson_19_placement_costs_idle_time_or_memory(restore_threads, tmp_path):
    path = LESSONS / "19_system_topology.py"
    defs = run_in_process(path)  # split 4 + 4, async, NVLink
    times = defs["times"]
    assert defs["step"] == pytest.approx(times.rollout) and times.rollout > times.trainer_side  # the rollout binds
    assert defs["fits"] and 0.3 < defs["idle"] / (8 * defs["step"]) < 0.4
    colocated = run_with_setting(path, 'value="split, async"', 'value="colocated"', tmp_path)
    assert colocated["idle"] == 0 and colocated["step"] == pytest.approx(sum(colocated["times"].as_dict().values()))
    assert defs["step"] < colocated["step"] < 1.2 * defs["step"]
    lockstep = run_with_setting(path, 'value="split, async"', 'value="split, lockstep"', tmp_path)
    assert lockstep["idle"] == pytest.approx(4 * lockstep["step"])  # equal pools: exactly half the node waits
    assert lockstep["step"] > colocated["step"]
    alone = run_with_setting(path, 'value=4, label="split', 'value=1, label="split', tmp_path)
    assert not alone["fits"] and alone["per_gpu_gb"]["trainer"] > 122  # 16 bytes × 7.6 B on one GPU
    slow = run_with_setting(path, 'value="NVLink, 450 GB/s", label=', 'value="25 Gb Ethernet, 3.1 GB/s", label=',
                            tmp_path)
    assert slow["times"].sync > 10 and slow["step"] == pytest.approx(defs["step"])  # hidden behind the rollout


def test_lesson_20_paging_wastes_under_a_block_and_contiguous_the_reservation(restore_threads, tmp_path):
    path = LESSONS / "20_kv_cache.py"
    defs = run_in_process(path)  # Llama-3-8B, max_new_tokens 8192, blocks of 16
    assert defs["measured_bytes"] == defs["formula_bytes"]  # our sampler's cache is the formula, byte for byte
    assert defs["per_token"] == 2 * 32 * 8 * 128 * 2  # 128 KiB
    alloc = defs["alloc"]
    assert alloc.contiguous_waste > 0.8 and alloc.paged_waste < 16 / (256 + 1024)  # under one block a sequence
    assert defs["in_flight_paged"] > 6 * defs["in_flight_contiguous"]
    longer = run_with_setting(path, "value=8192, label", "value=16384, label", tmp_path)
    assert longer["alloc"].contiguous_waste > 0.9 and longer["in_flight_contiguous"] == defs["in_flight_contiguous"] // 2
    assert longer["in_flight_paged"] == pytest.approx(defs["in_flight_paged"], abs=2)  # paging does not care
    big = run_with_setting(path, 'value="16", label', 'value="1024", label', tmp_path)
    assert big["alloc"].paged_waste > 0.2 and big["shared"].saved_fraction < 0  # the partial block, copied per sample
    mha = run_with_setting(path, 'value="llama-3-8b (GQA 4:1)"', 'value="llama-2-7b (MHA)"', tmp_path)
    assert mha["per_token"] == 4 * defs["per_token"]


def test_lesson_21_tricks_compose_and_speculation_can_lose(restore_threads, tmp_path):
    path = LESSONS / "21_scheduling_tricks.py"
    defs = run_in_process(path)  # 64 rows, α = 0.7, γ = 4
    steps = defs["steps"]
    assert [s.trick for s in steps] == ["none", "continuous batching", "prefix caching", "chunked prefill",
                                        "speculative decoding"]
    assert all(b.time.total <= a.time.total for a, b in zip(steps, steps[1:]))
    assert steps[1].time.decode == pytest.approx(steps[0].time.decode * 1024 / defs["longest"])
    assert steps[2].time.prefill == pytest.approx(steps[1].time.prefill / 8)  # 8 samples, one prefill
    assert defs["per_pass"] == pytest.approx((1 - 0.7 ** 5) / 0.3)
    assert defs["compute_fraction"] < 0.5  # 64 rows: bandwidth-bound, where speculation pays
    losing = run_with_settings(path, {"value=0.7, label": "value=0.3, label", "value=4, label": "value=10, label"},
                               tmp_path)
    assert losing["spec_factor"] > 1 and losing["steps"][-1].time.decode > losing["steps"][-2].time.decode
    full = run_with_setting(path, 'value="64", label', 'value="512", label', tmp_path)
    assert full["compute_fraction"] > 0.9  # the formula's bandwidth-bound assumption no longer holds


def test_lesson_22_sixteen_bytes_zero_and_a_memory_bound_decode(restore_threads, tmp_path):
    path = LESSONS / "22_memory_and_throughput.py"
    defs = run_in_process(path)  # Qwen2.5-7B, ZeRO-3 over 8 GPUs, 64 rows at 1280 tokens
    P, state = defs["P"], defs["state"]
    assert state.total == pytest.approx(16 * P / 8) and defs["fits"]
    held, trained = defs["held"], defs["trained"]  # measured: float32 AdamW holds 4 + 4 + 8 bytes a parameter
    assert (held["weights"], held["grads"], held["optimizer"]) == (4 * trained, 4 * trained, 8 * trained)
    assert defs["saved"] == pytest.approx(defs["saved_formula"], rel=0.2)
    assert defs["step"].bound == "memory" and defs["crossover"] == float("inf")
    replicated = run_with_setting(path, 'value=3, label="ZeRO', 'value=0, label="ZeRO', tmp_path)
    assert replicated["state"].total == pytest.approx(16 * P) and not replicated["fits"]
    one = run_with_setting(path, 'value=64, label="decode', 'value=1, label="decode', tmp_path)
    assert defs["step"].seconds < 1.5 * one["step"].seconds  # 64 rows for a third more time
    assert defs["tokens_per_second"] > 40 * one["tokens_per_second"]
    big = run_with_setting(path, 'value="qwen2.5-7b",', 'value="llama-3-70b",', tmp_path)
    assert not big["fits"] and big["state"].total > 0.9 * 80e9  # ZeRO-3 on 8 GPUs is not enough


def test_lesson_22a_a_sum_or_a_max_and_where_it_binds(restore_threads, tmp_path):
    path = LESSONS / "22a_throughput_equation.py"
    defs = run_in_process(path)  # colocated, mean response 1024, regex verifier
    times = defs["times"]
    assert defs["step"] == pytest.approx(sum(times.as_dict().values())) and defs["binding"] == "rollout"
    assert defs["rollout_share"] > 0.8 > 0.3 > defs["decode_share"]  # most of the time, a fifth of the FLOPs
    overlapped = run_with_setting(path, 'value="colocated", label', 'value="async", label', tmp_path)
    assert overlapped["step"] == pytest.approx(overlapped["times"].rollout) and overlapped["step"] < defs["step"]
    scored = run_with_settings(path, {'value="colocated", label': 'value="async", label',
                                      'value="regex, 0 s", label': 'value="sandboxed tests, 2 s", label'}, tmp_path)
    assert scored["binding"] == "verifier" and scored["times"].verifier == pytest.approx(512 * 2.0 / 8)
    assert scored["step"] == pytest.approx(scored["times"].trainer_side)


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


def test_every_lesson_links_the_next():
    """In lesson order (22 < 22a < 22b < 23), each lesson's closing text names the next one:
    a ?file= link to it, or 'lesson NN' in its last cells."""
    def order(path: Path) -> tuple:
        match = re.match(r"(\d+)([a-z]?)_", path.name)
        return int(match.group(1)), match.group(2)

    files = sorted(LESSONS.glob("[0-9]*.py"), key=order)
    assert len(files) == 33
    for this, following in zip(files, files[1:]):
        tail = this.read_text(encoding="utf-8")[-3000:]
        number = following.name.split("_")[0]
        assert f"?file={following.name}" in tail or re.search(rf"[Ll]esson {number}\b", tail), (
            f"{this.name} does not link {following.name}")
