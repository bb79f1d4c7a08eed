"""The concepts issue #43 asked to be taught with a number each: TRPO against PPO's clip,
macro vs micro actions (lesson 27), the RL family tree (lesson 09), the Goodhart regime
(lesson 15), known vs speculated test-time compute (lesson 17), state vs observation
(lesson 27). Each lesson runs headless, as tests/test_lessons.py runs it, and its numbers
are checked here; the TRPO helper is checked on its own against worked numbers."""

from __future__ import annotations

import pytest
import torch

from posttrain.teach.trust_region import conjugate_gradient
from tests.test_lessons import LESSONS, restore_threads, run_in_process  # noqa: F401  (a fixture)


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
