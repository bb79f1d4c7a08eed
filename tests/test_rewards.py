"""Reward terms (formulas checked by hand), the stack (components logged, weights applied,
spec named), the R1 preset, and the KL controllers (one update worked by hand)."""

import math

import pytest

from posttrain.verifiers.final_int import get_spec
from posttrain.rewards.length import LinearLength, QuadraticLength, RatioLength
from posttrain.rewards.stack import Accuracy, Format, RewardStack, regex_format, think_answer_format
from posttrain.rewards.kl_control import AdaptiveKLController, FixedKLController
from posttrain.types import Example

E = Example(prompt="Q: 2+3\n", expected_answer="5")
COT = get_spec("final_int/cot-v1")


def scored(reward: float, format_ok: bool) -> dict:
    return {"reward": reward, "details": {"reason": "ok" if reward else "wrong_answer", "format_ok": format_ok}}


def test_length_penalties_by_hand():
    text = "x" * 130  # L = 130
    assert LinearLength(L0=100, c=0.01)(E, text, scored(1, True)) == pytest.approx(-0.3)  # −0.01·30
    assert LinearLength(L0=200, c=0.01)(E, text, scored(1, True)) == 0.0  # under L0: free
    assert QuadraticLength(L0=100, c=0.001)(E, text, scored(1, True)) == pytest.approx(-0.9)  # −0.001·30²
    assert RatioLength(L_ref=100)(E, text, scored(1, True)) == pytest.approx(-0.3)  # −(130/100 − 1)
    assert RatioLength(L_ref=100)(E, "x" * 50, scored(1, True)) == 0.0  # shorter: no bonus
    assert RatioLength(L_ref=100, max_penalty=0.5)(E, "x" * 400, scored(1, True)) == -0.5  # clipped


def test_length_can_count_tokens():
    words = LinearLength(L0=2, c=1.0, length=lambda s: len(s.split()))
    assert words(E, "one two three four", scored(1, True)) == -2.0


def test_format_reads_the_scorers_format_ok_or_a_check():
    assert Format()(E, "whatever", scored(0, True)) == 1.0
    assert Format()(E, "whatever", scored(0, False)) == 0.0
    assert Format(check=think_answer_format)(E, "<think>a</think> <answer>5</answer>", scored(0, False)) == 1.0
    assert Format(check=regex_format(r"Final: -?\d+"))(E, "Final: 12", scored(0, False)) == 1.0
    assert Format(check=regex_format(r"Final: -?\d+"))(E, "Final: 12 apples", scored(0, False)) == 0.0


@pytest.mark.parametrize(
    "text,ok",
    [
        ("<think>2+3=5</think>\n<answer>5</answer>", True),
        ("  <think></think><answer>5</answer>\n", True),
        ("<answer>5</answer><think>x</think>", False),  # wrong order
        ("<think>a</think>b<answer>5</answer>", False),  # text between the blocks
        ("<think>a</think><answer>5</answer> done", False),  # text after
        ("<think>a</think><answer>4</answer><answer>5</answer>", False),  # two answers
        ("no tags", False),
    ],
)
def test_think_answer_format(text, ok):
    assert think_answer_format(text) is ok


def test_stack_logs_every_component_and_sums_weighted_values():
    stack = RewardStack([(1.0, Accuracy()), (0.2, Format()), (0.5, LinearLength(L0=5, c=0.1))])
    completion = "2+3=5\nFinal: 5"  # 14 characters: 9 over L0
    out = stack(E, completion, COT(E, completion))
    d = out["details"]
    assert d["components"] == pytest.approx({"accuracy": 1.0, "format": 1.0, "length_linear": -0.9})
    assert d["weighted"] == pytest.approx({"accuracy": 1.0, "format": 0.2, "length_linear": -0.45})
    assert out["reward"] == pytest.approx(1.0 + 0.2 - 0.45)
    assert d["reason"] == "ok" and d["spec_version"] == "final_int/cot-v1"  # the scorer's details stay
    assert d["reward_spec"] == "1*accuracy + 0.2*format(details.format_ok) + 0.5*length_linear(L0=5,c=0.1)"


def test_stack_wrap_has_the_scorer_contract():
    score = RewardStack.deepseek_r1().wrap(COT)
    assert score(E, "Final: 5")["reward"] == pytest.approx(1.2)
    assert score(E, "Final: 4")["reward"] == pytest.approx(0.2)  # formatted but wrong: format pays
    assert score(E, "five")["reward"] == 0.0
    assert score(E, "Final: 4")["details"]["components"] == {"accuracy": 0.0, "format": 1.0}
    assert score.version == "1*accuracy + 0.2*format(details.format_ok)"


def test_r1_preset_with_think_tags():
    stack = RewardStack.deepseek_r1(format_check=think_answer_format)
    out = stack(E, "<think>2+3</think><answer>5</answer>", scored(1.0, False))
    assert out["reward"] == pytest.approx(1.2)


def test_stack_rejects_empty_and_duplicate_names():
    with pytest.raises(ValueError, match="at least one"):
        RewardStack([])
    with pytest.raises(ValueError, match="unique"):
        RewardStack([(1.0, LinearLength(1, 1.0)), (1.0, LinearLength(2, 1.0))])
    RewardStack([(1.0, LinearLength(1, 1.0)), (1.0, LinearLength(2, 1.0, name="length_far"))])


def test_terms_are_pure():
    stack = RewardStack([(1.0, Accuracy()), (1.0, RatioLength(L_ref=4))])
    first = stack(E, "Final: 5", COT(E, "Final: 5"))
    assert all(stack(E, "Final: 5", COT(E, "Final: 5")) == first for _ in range(3))


# --- KL controllers ----------------------------------------------------------------------


def test_adaptive_kl_one_update_by_hand():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10_000)
    # KL 7.5: error = clip(7.5/6 − 1, ±0.2) = clip(0.25) = 0.2; K = 256/10000 = 0.0256
    # β = 0.1 · (1 + 0.2 · 0.0256) = 0.1 · 1.00512 = 0.100512
    assert ctl.update(current_kl=7.5, n_steps=256) == pytest.approx(0.100512)
    # KL 5.4: error = 5.4/6 − 1 = −0.1 (inside the clip); β = 0.100512 · (1 − 0.1 · 0.0256)
    assert ctl.update(current_kl=5.4, n_steps=256) == pytest.approx(0.100512 * 0.99744)
    # on target: no change
    before = ctl.value
    assert ctl.update(current_kl=6.0, n_steps=256) == pytest.approx(before)


def test_adaptive_kl_moves_toward_target_and_stays_positive():
    ctl = AdaptiveKLController(0.1, target_kl=1.0, horizon=10)
    for _ in range(50):
        ctl.update(current_kl=100.0, n_steps=5)  # KL far above: β grows by 10% a step
    assert ctl.value == pytest.approx(0.1 * 1.1**50)
    for _ in range(200):
        ctl.update(current_kl=0.0, n_steps=5)  # KL far below: β shrinks by 10% a step
    assert 0 < ctl.value < 0.1 * 1.1**50 * 0.9**199


def test_adaptive_kl_rejects_steps_that_would_flip_the_sign():
    with pytest.raises(ValueError, match="n_steps"):
        AdaptiveKLController(0.1, 1.0, horizon=10).update(0.0, n_steps=50)


def test_kl_controller_state_round_trip():
    ctl = AdaptiveKLController(0.2, target_kl=6.0, horizon=1000)
    ctl.update(9.0, n_steps=64)
    restored = AdaptiveKLController(1.0, target_kl=1.0, horizon=1.0)
    restored.load_state_dict(ctl.state_dict())
    assert restored.state_dict() == ctl.state_dict()
    assert restored.update(3.0, 64) == ctl.update(3.0, 64)

    fixed = FixedKLController(0.04)
    assert fixed.update(100.0, 64) == 0.04
    other = FixedKLController(0.0)
    other.load_state_dict(fixed.state_dict())
    assert other.value == 0.04 and not math.isnan(other.value)
