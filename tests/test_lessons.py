"""The lessons (marimo notebooks in lessons/): each runs headless as a plain script, has
exactly one widget (one control, or one `mo.ui.dictionary` panel of controls), names only
source files that exist, and makes claims its numbers back up — at the widgets' defaults
and, for the "find the knob that breaks it" settings, with the knob turned; the index lists
every lesson; `posttrain lessons` resolves names and refuses unknown ones without
starting a server. The browser test is tests/test_lessons_browser.py."""

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

from posttrain.teach import lessons as lessons_cli

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


# --------------------------------------------------------------------------------------
# Every notebook
# --------------------------------------------------------------------------------------


def test_there_are_lessons():
    assert [p.name[:2] for p in LESSON_FILES][:15] == [f"{n:02d}" for n in range(15)]


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
    free = run_with_setting(path, "step=0.05, value=0.2, label=", "step=0.05, value=2.0, label=", tmp_path)
    assert free["epochs"][-1]["approx_kl"] > 5 * defs["epochs"][-1]["approx_kl"]
    assert free["epochs"][-1]["ratio_max"] > 3 > 1.5 > defs["epochs"][-1]["ratio_max"]


def test_lesson_11_bias_is_exactly_k_minus_1_over_k(restore_threads, tmp_path):
    path = LESSONS / "11_grpo.py"
    defs = run_in_process(path)
    K, rows, true = defs["K"], defs["bias_rows"], defs["true_grad"]
    assert rows["GRPO mean only (= Dr. GRPO)"] / true == pytest.approx((K - 1) / K, rel=1e-5)
    assert rows["RLOO (leave one out)"] / true == pytest.approx(1.0, rel=1e-5)
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


def test_lesson_13_each_ablation_changes_what_the_lesson_says(restore_threads, tmp_path):
    path = LESSONS / "13_dapo.py"
    defs = run_in_process(path)  # default: dynamic sampling removed
    full, ablated = defs["results"]["dapo"], defs["results"][defs["label"]]
    assert full[2]["kept_rows"] == 8 and ablated[2]["kept_rows"] == 12
    assert ablated[1][4:].abs().sum() < full[1][4:].abs().sum()  # informative rows pushed less
    default = 'value="dynamic sampling (keep every group)",'
    overlong = run_with_setting(path, default, 'value="overlong shaping (no length penalty)",', tmp_path)
    adv = overlong["results"][overlong["label"]][0]
    assert adv[9] == pytest.approx(adv[8].item())  # the 44-token answer as good as the 10-token one
    assert overlong["results"]["dapo"][0][9] < overlong["results"]["dapo"][0][8]
    clip = run_with_setting(path, default, 'value="clip-higher (ε_high back to 0.2)",', tmp_path)
    assert defs["push_125"] and not clip["push_125"]


def test_lesson_14_length_bias_under_grpo_only(restore_threads):
    defs = run_in_process(LESSONS / "14_dr_grpo.py")
    g, d, L = defs["per_token"]["grpo"], defs["per_token"]["dr_grpo"], defs["L"]
    assert (g[1] / g[2]).item() == pytest.approx(8 / L, rel=1e-4)
    assert (d[1] / d[2]).item() == pytest.approx(1.0, rel=1e-5)


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
