"""The concepts issue #43 asked to be taught with a number each: TRPO against PPO's clip,
macro vs micro actions (lesson 27), the RL family tree (lesson 09), the Goodhart regime
(lesson 15), known vs speculated test-time compute (lesson 17), state vs observation
(lesson 27). Each lesson runs headless, as tests/test_lessons.py runs it, and its numbers
are checked here; the TRPO helper is checked on its own against worked numbers."""

from __future__ import annotations

import pytest
import torch

from posttrain.teach.trust_region import conjugate_gradient
from tests.test_lessons import LESSONS, restore_threads, run_in_process, run_with_settings  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def lesson_27():
    threads = torch.get_num_threads()
    yield run_in_process(LESSONS / "27_missing_concepts.py")
    torch.set_num_threads(threads)


def test_conjugate_gradient_solves_a_small_system_without_the_matrix():
    a = torch.tensor([[4.0, 1.0], [1.0, 3.0]])  # symmetric positive-definite
    b = torch.tensor([1.0, 2.0])
    x = conjugate_gradient(lambda v: a @ v, b, iters=2)  # exact in n = 2 steps
    assert x.tolist() == pytest.approx([1 / 11, 7 / 11], abs=1e-6)  # worked by hand: 4x+y=1, x+3y=2


def test_trpo_stays_inside_its_kl_budget_and_ppo_is_not_bounded_by_epsilon(lesson_27):
    trpo, ppo, max_kl = lesson_27["trpo"], lesson_27["ppo"], lesson_27["max_kl"]
    assert max_kl == 0.01 and lesson_27["clip_eps"] == 0.2  # the panel's defaults
    assert trpo["accepted"] == 1.0 and trpo["predicted_kl"] == pytest.approx(max_kl, rel=1e-3)
    assert trpo["kl"] <= max_kl and trpo["gain"] > 0
    assert trpo["step_fraction"] == 0.5 and trpo["kl"] == pytest.approx(0.0025, abs=5e-4)  # the full step overshot
    assert ppo["kl"] == pytest.approx(0.0095, abs=2e-3) and ppo["gain"] > 0
    # every δ of the sweep is respected; PPO's KL grows with ε and is not ε
    for d, m in zip(lesson_27["DELTAS"], lesson_27["trpo_sweep"]):
        assert m["accepted"] == 1.0 and m["kl"] <= d
    ppo_kls = [m["kl"] for m in lesson_27["ppo_sweep"]]
    assert ppo_kls == sorted(ppo_kls) and ppo_kls[-1] > 3 * ppo_kls[0]
    # at the same KL (≤ 0.006 nats) the natural-gradient step buys more surrogate than PPO's epochs
    best = {name: max(m["gain"] for m in sweep if m["kl"] <= 0.006)
            for name, sweep in (("trpo", lesson_27["trpo_sweep"]), ("ppo", lesson_27["ppo_sweep"]))}
    assert best["trpo"] > 1.5 * best["ppo"]


def test_macro_view_has_one_ratio_per_completion_and_it_moves_less_than_the_tokens(lesson_27):
    mm = lesson_27["macro_micro"]
    assert mm["rows"] == 24 and mm["tokens"] > 5 * mm["rows"]
    token_low, token_high = mm["token_ratio"]
    seq_low, seq_high = mm["seq_ratio"]
    # a geometric mean lies within its terms, so the rows' ratios sit inside the tokens' range
    assert token_low <= seq_low and seq_high <= token_high
    assert mm["token_clipped"] > 0.0 and mm["seq_clipped"] == 0.0


def test_the_family_tree_places_every_registered_algorithm_once(restore_threads):
    from posttrain.algorithms import ALGORITHMS

    tree = run_in_process(LESSONS / "09_reinforce.py")["family_tree"]
    placed = [name for names in tree.values() for name in names]
    assert sorted(placed) == sorted(ALGORITHMS) and len(placed) == len(set(placed))
    branches = dict(zip(("value", "policy", "actor-critic", "model"), tree.values()))
    assert branches["actor-critic"] == ["ppo"]  # the one registered algorithm with a critic
    assert branches["value"] == [] and branches["model"] == []  # named, not covered
    assert branches["policy"][0] == "reinforce" and "grpo" in branches["policy"]


def test_the_goodhart_regime_starts_where_the_gold_peaks(restore_threads):
    defs = run_in_process(LESSONS / "15_rlhf.py")
    kl = [0.0] + [row["kl"] for row in defs["frontier"]]
    gold = [defs["start"]["gold"]] + [row["gold"] for row in defs["frontier"]]
    proxy = [defs["start"]["proxy"]] + [row["proxy"] for row in defs["frontier"]]
    peak = max(range(len(gold)), key=gold.__getitem__)
    assert defs["hacking_from"] == kl[peak] and 0 < peak < len(kl) - 1  # the regime is inside the sweep
    # measured on the lesson's reviews: 2.39 on the AMD EPYC, 2.26 on the Intel Xeon (AMX) that also
    # serves this project; the sweep's points move with the CPU's float path, the regime does not
    assert defs["hacking_from"] == pytest.approx(2.33, abs=0.15)
    # in the regime the proxy only rises while the gold stays below its peak
    assert all(b >= a - 1e-9 for a, b in zip(proxy[peak:], proxy[peak + 1:]))
    assert all(g < gold[peak] for g in gold[peak + 1:]) and min(gold[peak:]) < gold[peak] - 1.0
    fig = defs["overopt_fig"]
    labels = [text.get_text() for ax in fig.axes for legend in [ax.get_legend()] if legend for text in legend.get_texts()]
    assert any(label.startswith("reward-hacking regime") for label in labels)


def test_the_tool_episode_shows_the_policy_less_than_the_environment_holds(lesson_27):
    first, second = lesson_27["decisions"]
    assert (first["turn"], second["turn"]) == (1, 2) and (first["turns_left"], second["turns_left"]) == (3, 2)
    assert first["in_context"]["the expected answer"] is False  # hidden before the tool runs
    assert second["in_context"]["the expected answer"] is True  # the tool's result revealed it
    assert second["context_chars"] > first["context_chars"] == len("Q: 964*494\n")  # the context is the prefix
    for decision in (first, second):  # bookkeeping the environment never writes back
        assert not any(seen for name, seen in decision["in_context"].items() if name != "the expected answer")
    assert "each call's latency" in second["in_context"]


def test_a_wider_trust_region_takes_the_whole_step(restore_threads, tmp_path):  # noqa: F811
    wide = run_with_settings(LESSONS / "27_missing_concepts.py",
                             {"step=0.001, value=0.01,": "step=0.001, value=0.05,",
                              "step=0.05, value=0.2,": "step=0.05, value=1.0,"}, tmp_path)
    assert wide["max_kl"] == 0.05 and wide["clip_eps"] == 1.0
    trpo, ppo = wide["trpo"], wide["ppo"]
    assert trpo["step_fraction"] == 1.0 and trpo["kl"] == pytest.approx(0.047, abs=0.005) and trpo["kl"] <= 0.05
    assert ppo["kl"] == pytest.approx(0.032, abs=0.005)  # ε = 1 barely clips: the KL is the learning rate's
