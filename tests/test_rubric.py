"""Rubric rewards (posttrain/rewards/rubric.py): each rule criterion's score and reason on
hand-made completions, weights combining exactly, a failing criterion scoring 0 with its
reason, and the joint reward (verifier + rubric through the reward stack) whose details add
up to what it paid; selectable as `--rl.reward.terms "accuracy + 0.5*rubric"`."""

import json
import math
import re
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.config import RLConfig, RewardConfig
from posttrain.envs import make_env
from posttrain.pipelines.build import make_reward
from posttrain.pipelines.checks import check_rl
from posttrain.rewards.rubric import (
    Rubric,
    RubricCriterion,
    final_answer_line,
    mentions,
    no_repetition,
    rule_based_rubric,
    within_length,
)
from posttrain.rewards.stack import Accuracy, RewardStack
from posttrain.rewards.user_function import UserFunction, signature_of
from posttrain.types import Example
from posttrain.verifiers import get_verifier
from tests.test_user_reward import TINY  # the tiny model and run the reward-function CLI tests use

E = Example(prompt="Q: 2+3\n", expected_answer="5", id="x1", meta={"required": ["Paris", "France"]})
RIGHT = "2+3=5\nFinal: 5"
WRONG = "Final: 6"


def constant(score, reason="fixed"):
    return lambda example, completion: (score, reason)


# --- rule criteria --------------------------------------------------------------------------


@pytest.mark.parametrize("completion, score, reason", [
    (RIGHT, 1.0, "the last line gives an answer after 'Final:'"),
    ("Final: 6\n\n  ", 1.0, "the last line gives an answer after 'Final:'"),  # trailing blank lines are not lines
    ("Final:   ", 0.0, "nothing follows 'Final:' on the last line"),
    ("Final: 5\nso there", 0.0, "the last line does not start with 'Final:': 'so there'"),
    ("final: 5", 0.0, "the last line does not start with 'Final:'"),  # case-sensitive, like final_int
    ("  \n ", 0.0, "the completion is empty"),
])
def test_final_answer_line(completion, score, reason):
    got_score, got_reason = final_answer_line()(E, completion)
    assert got_score == score and got_reason.startswith(reason)


@pytest.mark.parametrize("completion, score, reason", [
    ("x" * 8, 1.0, "8 within the budget of 10"),
    ("x" * 10, 1.0, "10 within the budget of 10"),
    ("x" * 15, 0.5, "15 is 5 over the budget of 10"),  # half-way to twice the budget
    ("x" * 19, pytest.approx(0.1), "19 is 9 over the budget of 10"),
    ("x" * 40, 0.0, "40 is 30 over the budget of 10"),  # floored at 0, never negative
    ("", 0.0, "the completion is empty: brevity alone does not pay"),
])
def test_within_length(completion, score, reason):
    assert within_length(10)(E, completion) == (score, reason)


def test_within_length_counts_what_it_is_told_to():
    words = within_length(2, length=lambda s: len(s.split()))
    assert words(E, "one two three") == (0.5, "3 is 1 over the budget of 2")


@pytest.mark.parametrize("completion, n, score, reason", [
    ("a b a b a b", 2, 0.4, "3 of 5 word 2-grams are repeats"),  # (a b)(b a)(a b)(b a)(a b): 2 distinct of 5
    ("the sum is five so Final: 5", 4, 1.0, "0 of 4 word 4-grams are repeats"),
    ("Final: 5", 4, 1.0, "fewer than 4 words: nothing to repeat"),
    ("loop " * 100, 4, pytest.approx(1 / 97), "96 of 97 word 4-grams are repeats"),
    (" \n", 4, 0.0, "the completion is empty: nothing to score"),
])
def test_no_repetition(completion, n, score, reason):
    assert no_repetition(n)(E, completion) == (score, reason)


def test_mentions_fixed_items_and_the_examples_own():
    assert mentions(["Paris", "France", "Seine"])(E, "paris, in france") == (
        pytest.approx(2 / 3), "mentions 2 of 3; missing ['Seine']")
    assert mentions()(E, "Paris is in France.") == (1.0, "mentions 2 of 2")  # E.meta["required"]
    with pytest.raises(ValueError, match=r"no items to look for.*meta\['required'\]"):
        mentions()(Example("q", "a"), "anything")


@pytest.mark.parametrize("factory, bad", [(within_length, 0), (within_length, 2.5), (no_repetition, 0)])
def test_rule_factories_refuse_bad_parameters(factory, bad):
    with pytest.raises(ValueError, match="must be a positive int"):
        factory(bad)


# --- the rubric: weights, failures, details ---------------------------------------------------


def test_weights_combine_exactly_as_a_weighted_mean():
    rubric = Rubric([RubricCriterion("a", 3.0, "", constant(1.0)), RubricCriterion("b", 1.0, "", constant(0.0))])
    assert rubric.score(E, RIGHT)["reward"] == 0.75  # (3·1 + 1·0) / 4
    rubric = Rubric([RubricCriterion("a", 2.0, "", constant(0.5)), RubricCriterion("b", 1.0, "", constant(0.2)),
                     RubricCriterion("off", 0.0, "logged, not paid", constant(1.0))])
    out = rubric.score(E, RIGHT)
    assert out["reward"] == pytest.approx((2 * 0.5 + 0.2) / 3)
    assert out["details"]["criteria"] == {"a": {"score": 0.5, "weight": 2.0, "reason": "fixed"},
                                          "b": {"score": 0.2, "weight": 1.0, "reason": "fixed"},
                                          "off": {"score": 1.0, "weight": 0.0, "reason": "fixed"}}
    assert out["details"]["rubric_spec"] == "rubric(a:2,b:1,off:0)"


def test_rule_based_rubric_on_hand_made_completions():
    rubric = rule_based_rubric(length_budget=40)
    assert rubric.score(E, RIGHT)["reward"] == 1.0
    loop = "the answer is the answer is the answer is the answer is"  # 55 chars, 9 4-grams, 3 distinct
    out = rubric.score(E, loop)
    assert out["reward"] == pytest.approx((2 * 0 + 1 * 3 / 9 + 1 * (1 - 15 / 40)) / 4)
    criteria = out["details"]["criteria"]
    assert criteria["no_repetition"]["reason"] == "6 of 9 word 4-grams are repeats"
    assert criteria["length"]["reason"] == "55 is 15 over the budget of 40"
    assert rubric.score(E, "")["reward"] == 0.0  # saying nothing earns nothing


def bad(kind):
    def scorer(example, completion):
        if kind == "raise":
            raise RuntimeError("boom")
        return {"range": (1.5, "too good"), "nan": (math.nan, "?"), "bool": (True, "yes"),
                "single": 0.7, "str": ("0.7", "a string")}[kind]
    return scorer


@pytest.mark.parametrize("kind, reason", [
    ("raise", "failed: RuntimeError: boom"),
    ("range", "failed: the scorer returned the score 1.5, not a number in [0, 1]"),
    ("nan", "failed: the scorer returned the score nan, not a number in [0, 1]"),
    ("bool", "failed: the scorer returned the score True, not a number in [0, 1]"),
    ("single", "failed: the scorer returned 0.7, not a (score, reason) pair"),
    ("str", "failed: the scorer returned the score '0.7', not a number in [0, 1]"),
])
def test_a_failing_criterion_scores_0_with_its_reason_and_the_others_still_count(kind, reason):
    rubric = Rubric([RubricCriterion("broken", 1.0, "", bad(kind)), RubricCriterion("fine", 1.0, "", constant(0.8))])
    out = rubric.score(E, RIGHT)
    assert out["reward"] == pytest.approx(0.4)  # (0 + 0.8) / 2: the failure never pays
    assert out["details"]["criteria"]["broken"] == {"score": 0.0, "weight": 1.0, "reason": reason}


def test_a_batched_scorer_is_called_once_and_its_failures_score_0():
    calls = []

    def batch(examples, completions):
        calls.append(len(completions))
        return [(len(c) / 10, f"{len(c)} chars") for c in completions]

    rubric = Rubric([RubricCriterion("short", 1.0, "", batch, batched=True)])
    scores = rubric.score_batch([E] * 3, ["a", "abc", "abcde"])
    assert calls == [3] and [s.total for s in scores] == [0.1, 0.3, 0.5] and scores[1].reasons == {"short": "3 chars"}
    wrong_count = Rubric([RubricCriterion("short", 1.0, "", lambda e, c: [(1.0, "one")], batched=True)])
    assert wrong_count.score_batch([E] * 2, ["a", "b"])[0].reasons["short"] == (
        "failed: the batched scorer gave 1 results for 2 completions")
    raising = Rubric([RubricCriterion("short", 1.0, "", bad("raise"), batched=True)])
    assert [s.total for s in raising.score_batch([E] * 2, ["a", "b"])] == [0.0, 0.0]


def test_malformed_input_scores_0_with_the_contract_reason():
    rubric = rule_based_rubric()
    out = rubric.score(E, b"Final: 5")
    assert out["reward"] == 0.0 and out["details"]["reason"] == "not_text"
    assert "got bytes b'Final: 5'; decode the tokens first" in out["details"]["error"]
    assert rubric.score({"prompt": "q"}, RIGHT)["details"]["reason"] == "bad_example"


@pytest.mark.parametrize("make, message", [
    (lambda: Rubric([]), "at least one RubricCriterion"),
    (lambda: Rubric([RubricCriterion("a", 1, "", constant(1))] * 2), r"\['a'\] repeat"),
    (lambda: Rubric([RubricCriterion("a", 0, "", constant(1))]), "weights sum to 0"),
    (lambda: RubricCriterion("a", -1, "", constant(1)), "finite number >= 0"),
    (lambda: RubricCriterion("a", math.inf, "", constant(1)), "finite number >= 0"),
    (lambda: RubricCriterion("two words", 1, "", constant(1)), "must be an identifier"),
    (lambda: RubricCriterion("a", 1, "", "not callable"), "is not a function"),
    (lambda: Rubric([RubricCriterion("a", 1, "", constant(1))]).score_batch([E], []), "1 examples but 0 completions"),
])
def test_bad_rubrics_are_refused_with_what_to_do(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# --- the joint reward: verifier + rubric in the reward stack ------------------------------------


def test_joint_reward_details_add_up_and_show_which_part_paid():
    rubric = rule_based_rubric(length_budget=20)
    joint = RewardStack([(1.0, Accuracy()), (0.5, rubric)]).wrap(get_verifier("final_int/cot-v1"))
    right, wrong = joint(E, RIGHT), joint(E, "I think\nFinal: 6 probably")  # 25 chars: 5 over
    assert right["reward"] == 1.5 and right["details"]["weighted"] == {"accuracy": 1.0, "rubric": 0.5}
    rubric_wrong = (2 * 1.0 + 1 * 1.0 + 1 * 0.75) / 4  # an answer line, no loop, a quarter of the way to 2× budget
    assert wrong["details"]["components"] == {"accuracy": 0.0, "rubric": rubric_wrong}
    assert wrong["reward"] == 0.5 * rubric_wrong == sum(wrong["details"]["weighted"].values())
    assert wrong["details"]["reason"] == "extra_text"  # the verifier's own verdict is kept
    criteria = wrong["details"]["term_details"]["rubric"]["criteria"]
    assert criteria["length"] == {"score": 0.75, "weight": 1.0, "reason": "25 is 5 over the budget of 20"}
    assert wrong["details"]["reward_spec"] == "1*accuracy + 0.5*rubric(final_answer:2,no_repetition:1,length:1)"


def test_the_rubric_preset_is_selectable_from_the_config():
    score = make_env("arithmetic").score
    check_rl(RLConfig(reward=RewardConfig(terms="accuracy + 0.5*rubric")))  # accepted before a run starts
    joint = make_reward(RLConfig(reward=RewardConfig(terms="accuracy + 0.5*rubric")), score)
    by_hand = RewardStack([(1.0, Accuracy()), (0.5, rule_based_rubric())]).wrap(score)
    for completion in (RIGHT, WRONG, "loop " * 200):
        assert joint(E, completion) == by_hand(E, completion)
    assert joint(E, RIGHT)["reward"] == 1.5


def test_a_training_run_logs_every_criterion_of_the_rubric_preset(tmp_path, capsys):
    assert main(["train", *TINY, "--rl.reward.terms", "accuracy + 0.5*rubric", "--out_dir", str(tmp_path / "runs")]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    rl = [row for row in map(json.loads, (run / "samples.jsonl").read_text().splitlines()) if row["stage"] == "rl"]
    assert len(rl) == 2 * 2 * 2  # steps × prompts × samples
    example = Example("q", "0")
    for row in rl:  # what the run logged is what the rubric gives on the logged completion
        expected = rule_based_rubric().score(example, row["completion"])
        assert row["details"]["term_details"]["rubric"]["criteria"] == expected["details"]["criteria"]
        assert row["reward"] == pytest.approx(row["details"]["components"]["accuracy"] + 0.5 * expected["reward"])


def test_a_rubrics_score_is_a_posttrain_reward_function():
    """A judge rubric needs a model, so the command line reaches it as a function:
    `--rl.reward.terms "accuracy + 0.3*my_judge.py:score"` with `score = rubric.score`."""
    rubric = rule_based_rubric()
    assert signature_of("my_judge.py:score", rubric.score) == "posttrain"
    term = UserFunction("my_judge.py:score", rubric.score, "posttrain", timeout=0)
    assert term(E, "loop " * 200, {"reward": 0.0, "details": {}}) == rubric.score(E, "loop " * 200)["reward"]
    details = {}
    term.record(details)
    assert details["function_details"]["my_judge.py:score"]["criteria"]["no_repetition"]["score"] < 0.01


def test_the_guides_example_runs_and_prints_what_the_guide_says(capsys):
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "your-task.md").read_text(encoding="utf-8")
    section = guide[guide.index("## Rubric and joint rewards") :]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    assert len(code.splitlines()) < 15
    exec(compile(code, "docs/guides/your-task.md", "exec"), {"__name__": "guide_rubric"})
    printed = capsys.readouterr().out.strip()
    assert printed and printed in section.split("```python", 1)[1].split("```", 1)[1]
