"""Lessons 17 and 26 say what their code computes (issue #42, items 4 and 5).

Lesson 17: every number its prose states about the set-up is the code's (the rendered page
is read against the constants and against what the code did with them), the methods are
counted right, and every method's gain over greedy carries a paired 95% CI that the table
shows; at the defaults the ordering the lesson teaches (each method above greedy) is outside
that noise. Lesson 26: the score's tie-break is explained on the page with its size, and the
top designs within the stated tolerance are reported as a tie, not as one winner. And lesson 17's
search pays with a good scorer and not with a noisy one (its defaults run once, for every test here)."""

from __future__ import annotations

import re

import pytest

from posttrain.envs.arithmetic import expressions_by_split
from posttrain.teach import forces as F
from posttrain.teach.charts import points
from tests.test_lessons import LESSONS, marked_at, restore_threads, run_in_process  # noqa: F401  (a fixture)

LESSON_17 = LESSONS / "17_prm_search.py"
LESSON_26 = LESSONS / "26_three_forces.py"
NUMBER_WORDS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


@pytest.fixture(scope="module")
def lesson_17():
    import torch

    threads = torch.get_num_threads()
    yield run_in_process(LESSON_17)
    torch.set_num_threads(threads)


def test_lesson_17_states_its_code_numbers(lesson_17):
    d = lesson_17
    intro = d["intro"].text
    # what the prose says, and what the code did with the same constants
    assert f"{d['SFT_STEPS']} SFT steps" in intro and len(d["sft_losses"]) == d["SFT_STEPS"] == 400
    assert f"temperature {d['TEMPERATURE']:g}" in intro and d["sampling"].temperature == d["TEMPERATURE"] == 0.5
    assert f"{d['DEMOS']} problems of the" in intro
    splits = expressions_by_split(2)
    assert d["DEMOS"] == len(splits["train"])  # every training problem, so no problem below was trained on
    assert len(d["problems"]) == len(splits["dev"]) + len(splits["heldout"]) == 205
    assert f"{len(d['problems'])} problems" in intro
    settings, max_new = d["settings"], d["MAX_NEW"]
    for phrase in (f"N = B / {max_new} whole samples", f"grow B / {max_new * settings.expansions} partial",
                   f"each samples {settings.expansions} next steps",
                   f"each expansion samples {settings.mcts_children} next steps"):
        assert phrase in intro, phrase
    # no stale number left in the static prose: every "N problems", "N SFT steps", "temperature T"
    # the source states outright (not through a {placeholder}) is the code's; "At full scale"
    # quotes docs/guides/search.md's run, with its own sizes
    source = LESSON_17.read_text(encoding="utf-8").split("## At full scale")[0]
    for count in re.findall(r"\b(\d+) (?:held-out |dev )?problems\b", source):
        assert int(count) == len(d["problems"]), f"the lesson states {count} problems; it runs {len(d['problems'])}"
    assert not re.search(r"\b\d+ SFT steps", source)
    for temperature in re.findall(r"temperature (\d+(?:\.\d+)?)", source):  # 0 is greedy's, by definition
        assert float(temperature) in (0.0, d["TEMPERATURE"]), f"the lesson states temperature {temperature}"
    assert "~0.15" not in source  # the old, unmeasured noise level


def test_lesson_17_counts_its_methods(lesson_17):
    intro = lesson_17["intro"].text
    heading = re.search(r"<h2[^>]*>(\w+) ways to spend", intro)
    assert heading, "the methods' heading is gone"
    table = intro[intro.index(heading.group(0)):]
    table = table[table.index("<tbody>"):table.index("</tbody>")]
    methods = re.findall(r"<tr>\s*<td[^>]*>([^<]+)</td>", table)
    assert methods == ["greedy", "best-of-N (ORM)", "best-of-N (PRM)", "beam search (PRM)", "MCTS (PRM)"]
    assert NUMBER_WORDS[heading.group(1).lower()] == len(methods)
    # the results: each method, plus the ceiling (best-of-N by a perfect verifier) the prose names
    assert len(lesson_17["rows"]) == len(methods) + 1


def test_lesson_17_every_gain_carries_a_paired_ci_outside_the_noise_at_the_defaults(lesson_17):
    d = lesson_17
    assert (d["budget"], d["noise"]) == (112, 0.0)
    rows, table = d["rows"], d["results_table"]
    assert "vs greedy [paired 95% CI]" in table
    greedy = rows["greedy"]
    assert "gain" not in greedy
    for name, row in rows.items():
        if name == "greedy":
            continue
        assert row["gain"] == pytest.approx(row["accuracy"] - greedy["accuracy"]), name
        assert row["gain_low"] <= row["gain"] <= row["gain_high"], name
        shown = f"{row['gain']:+.3f} [{row['gain_low']:+.3f}, {row['gain_high']:+.3f}]"
        assert re.search(rf"\| {re.escape(name)}\s*\|.*\| {re.escape(shown)}\s*\|", table), (name, shown)
        # the ordering the lesson teaches: every method above greedy, and its verdict the prose's
        assert row["gain"] > 0 and row["gain_low"] >= 0, (name, row["gain_low"])
        assert (row["verdict"] == "real") == (row["gain_low"] > 0) == (name not in d["inside"]), name
    # Outside the noise for every method on the AMD EPYC the numbers were set on; on the Intel Xeon
    # (AMX) that also serves this project MCTS (PRM)'s lower bound is 0.000, at the CI's edge, and the
    # lesson's prose names it from its own numbers (`inside`): one method at most sits there
    assert len(d["inside"]) <= 1 and set(d["needed"]) == set(d["inside"])
    for name, row in d["by_budget"][224].items():  # "budget 112 or more", the prose says
        assert name == "greedy" or row["gain_low"] > 0, (name, row["gain_low"])
    # the chart: the same CI, one error bar per method and budget, drawn from greedy's point
    axes = d["budget_fig"].axes[0]
    assert len(axes.containers) == len(rows) - 1
    for container, name in zip(axes.containers, [n for n in rows if n != "greedy"]):
        segments = container.lines[2][0].get_segments()
        low, high = sorted(segments[2][:, 1])  # the third budget is B = 112
        assert low == pytest.approx(greedy["accuracy"] + rows[name]["gain_low"], abs=1e-9), name
        assert high == pytest.approx(greedy["accuracy"] + rows[name]["gain_high"], abs=1e-9), name


def _lesson_26(tmp_path, spec: str | None = None) -> dict:
    text = LESSON_26.read_text(encoding="utf-8")
    if spec is not None:
        text = text.replace('value="final_int/cot-v1", label="the verifier"', f'value="{spec}", label="the verifier"')
    copy = tmp_path / LESSON_26.name
    copy.write_text(text, encoding="utf-8")
    return run_in_process(copy)


def test_lesson_26_reports_a_tie_at_the_defaults_and_explains_the_tie_break(restore_threads, tmp_path):
    d = _lesson_26(tmp_path)
    # all signal, a perfect verifier, every prompt checkable: every verifier design has signal loss 0
    assert [design.recipe for design in d["tied"]] == ["R1-Zero", "R1", "PPO-RLVR", "Tülu 3", "REINFORCE"]
    assert d["winner"].recipe == "R1-Zero"  # the tie-break's first, which the page says is a preference
    top = d["ranking"][:5]
    assert {row["weighted"] for row in top} == {0.0} and d["ranking"][5]["weighted"] > F.TOLERANCE
    assert max(row["score"] for row in top) - min(row["score"] for row in top) < 3 * F.TIE  # what the issue saw
    assert d["recipe_ties"]["all estimator, nothing checkable"] == ["RLHF (InstructGPT)", "PPO-RLVR"]
    assert d["recipe_ties"]["all signal, a fifth of the prompts uncheckable"] == ["R1"]  # a clear winner
    source = LESSON_26.read_text(encoding="utf-8")
    assert "_forces.TIE:g" in source and "3 * _forces.TIE:g" in source and "_forces.TOLERANCE:g" in source
    assert "A tie: {len(tied)} designs within {TOLERANCE:g}" in source


def test_lesson_26_a_leaky_verifier_ties_the_reward_models(restore_threads, tmp_path):
    d = _lesson_26(tmp_path, spec="hackable/substring")
    assert [design.recipe for design in d["tied"]] == ["RLOO (back to basics)", "RLHF (InstructGPT)"]
    clear = F.rank((1, 0, 0), 0.8, 1.0, d["noise"])  # a fifth uncheckable: R1 ahead by more than the tolerance
    assert [row["design"].recipe for row in F.tied_at_top(clear)] == ["R1"]
    assert clear[1]["weighted"] - clear[0]["weighted"] > F.TOLERANCE


def test_the_tolerance_covers_how_far_a_difference_between_designs_moves_between_seeds():
    """TOLERANCE's reason, measured: measure the estimator noise again with other seeds, and the
    difference between any two designs' weighted losses, anywhere in the triangle and at any
    coverage, moves by less than the tolerance (by about half of it); the tie-break (at most
    3 × TIE) is below it, so it never separates two designs."""
    import itertools

    noises = [F.estimator_noise(groups=20_000, seed=seed) for seed in range(10)]
    grid = [(i / 10, j / 10, (10 - i - j) / 10) for i in range(11) for j in range(11 - i)]
    moved = 0.0
    for coverage in (0.0, 0.5, 0.8, 1.0):
        for weights in grid:
            differences = [[a - b for a, b in itertools.combinations(
                [F.weighted(F.design_losses(d, coverage, 1.0, noise), weights) for d in F.DESIGNS], 2)]
                for noise in noises]  # (seeds, pairs)
            moved = max(moved, max(max(column) - min(column) for column in zip(*differences)))
    assert F.TOLERANCE / 4 < moved < F.TOLERANCE / 1.5, moved  # 0.0105 measured
    assert 3 * F.TIE < F.TOLERANCE


def _lesson_17(tmp_path, budget: str | None = None, noise: str | None = None) -> dict:
    path = LESSON_17
    text = path.read_text(encoding="utf-8")
    if budget is not None:
        text = text.replace("8 * MAX_NEW], value=4 * MAX_NEW,", f"8 * MAX_NEW], value={budget},")
    if noise is not None:
        text = text.replace('step=0.1, value=0.0, label="reward-model noise', f'step=0.1, value={noise}, label="reward-model noise')
    copy = tmp_path / path.name
    copy.write_text(text, encoding="utf-8")
    return run_in_process(copy)


def test_lesson_17_search_pays_with_a_good_scorer_and_not_with_a_noisy_one(lesson_17, restore_threads, tmp_path):
    defs = lesson_17  # the defaults' run, shared with the tests above
    assert defs["budget"] == 112 and defs["n"] == 4 and defs["noise"] == 0.0
    rows = defs["rows"]
    greedy, oracle = rows["greedy"], rows["best-of-4, perfect verifier"]
    beam, mcts, prm = rows["beam 2×2 (PRM)"], rows["MCTS (PRM)"], rows["best-of-4 (PRM, min)"]
    assert rows["best-of-4 (ORM)"] == oracle  # a noiseless ORM is the verifier
    # +0.15 or more on the AMD EPYC, +0.107 on the Intel Xeon (AMX): the SFT policy the lesson trains
    # differs with the CPU's float path, and so does what a verifier can pick from its samples
    assert oracle["accuracy"] >= greedy["accuracy"] + 0.10
    assert beam["accuracy"] > greedy["accuracy"] and beam["tokens"] < oracle["tokens"]  # it stops wrong chains early
    assert mcts["accuracy"] > greedy["accuracy"]
    assert prm["chain_right"] > oracle["chain_right"]  # the outcome verifier pays right answers by wrong steps
    for name, row in rows.items():
        assert row["tokens"] <= defs["budget"] or name == "greedy", name  # budget.py never lets a method overspend
    # the chart: every method at every budget of the slider; a perfect verifier only gains from more samples
    by_budget = defs["by_budget"]
    assert list(by_budget) == [28, 56, 112, 224] and by_budget[112] == rows
    best = [list(r.values())[1]["accuracy"] for r in by_budget.values()]
    assert best == sorted(best) and best[-1] > best[0] + 0.25  # +0.27 on the Intel Xeon, more on the AMD EPYC
    assert points(defs["budget_fig"]) == 6 * 4 and marked_at(defs["budget_fig"]) == [112]
    # a judge that scores at random (noise 1): the ORM keeps little of the verifier's gain, and the
    # PRM-guided methods gain nothing outside their paired CIs (the page names those inside, with the
    # problems a CI would need to exclude 0)
    noisy_defs = _lesson_17(tmp_path, noise="1.0")
    noisy = noisy_defs["rows"]
    assert noisy["best-of-4 (ORM)"]["accuracy"] < oracle["accuracy"] - 0.1
    for name in ("best-of-4 (PRM, min)", "beam 2×2 (PRM)", "MCTS (PRM)"):
        assert noisy[name]["accuracy"] <= greedy["accuracy"] + 0.05, name
        # no gain outside the noise: within it on the AMD EPYC, a loss on the Intel Xeon (AMX)
        assert noisy[name]["gain_low"] <= 0, name
        assert (noisy[name]["verdict"] == "within noise") == (name in noisy_defs["inside"]), name
    assert noisy["best-of-4, perfect verifier"]["verdict"] == "real"  # the verifier is no scorer: noise spares it
    poor = _lesson_17(tmp_path, budget="MAX_NEW")
    assert poor["n"] == 1
    assert poor["rows"]["beam 1×2 (PRM)"]["accuracy"] == 0 and poor["rows"]["MCTS (PRM)"]["accuracy"] == 0


def test_test_time_compute_keeps_measured_and_speculated_apart(lesson_17):
    defs = lesson_17
    known, budgets = defs["test_time_known"], defs["BUDGETS"]
    high = defs["by_budget"][budgets[-1]]
    assert known["greedy"] == high["greedy"]["accuracy"]
    assert known["best_accuracy"] == max(r["accuracy"] for r in list(high.values())[2:])
    assert known["ceiling_high"] > known["ceiling_low"] and known["best_gain_low"] > 0  # budget bought accuracy
    text = LESSON_17.read_text(encoding="utf-8")
    for label in ("**Measured here**", "**Published, with numbers, not reproducible here.**", "**Speculated.**"):
        assert text.count(label) == 1, label
