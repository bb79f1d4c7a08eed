"""Held-out pass@1 is the fraction of problems solved, with the mean reward beside it: under
a partial-credit verifier the two differ, and the mean must not pass for pass@1."""

from __future__ import annotations

import pytest

from posttrain.config import SamplingParams
from posttrain.eval.evaluate import evaluate_pass_at_1, solved
from posttrain.types import Episode, Example


class ScriptedEngine:
    """Stands in for a RolloutEngine: each prompt's completion is its example's answer text."""

    params = SamplingParams()

    def generate(self, examples, samples_per_prompt, params=None):
        assert params.temperature == 0.0  # pass@1 is greedy
        return [Episode(example=ex, group_id=i, prompt_ids=[1], response_ids=[2], response_logp=[0.0],
                        completion=ex.expected_answer) for i, ex in enumerate(examples)]


class PartialCredit:
    """Pays the completion's number as the reward: "1" a full pass, "0.5" half credit."""

    def score(self, example, completion):
        return {"reward": float(completion), "details": {"reason": "ok" if completion == "1" else "partial"}}


def test_half_credit_is_not_half_a_pass():
    examples = [Example(f"q{i}", answer) for i, answer in enumerate(["1", "0.5", "0.5", "0"])]
    result = evaluate_pass_at_1(ScriptedEngine(), PartialCredit(), examples)
    assert result["pass@1"] == pytest.approx(0.25)  # one problem solved of four
    assert result["ci"]["mean_reward"] == pytest.approx(0.5)  # what the old pass@1 reported
    assert result["ci"]["n"] == 4


def test_a_verifiers_own_correct_flag_decides():
    example = Example("q", "1")
    flagged = Episode(example=example, group_id=0, prompt_ids=[1], response_ids=[2], response_logp=[0.0],
                      reward=0.3, details={"correct": True})
    assert solved(flagged) == 1.0
    flagged.details["correct"] = False
    flagged.reward = 1.0
    assert solved(flagged) == 0.0
    plain = Episode(example=example, group_id=0, prompt_ids=[1], response_ids=[2], response_logp=[0.0], reward=0.999)
    assert solved(plain) == 0.0


def test_a_binary_verifier_gives_the_same_number_both_ways():
    examples = [Example(f"q{i}", answer) for i, answer in enumerate(["1", "0", "1"])]
    result = evaluate_pass_at_1(ScriptedEngine(), PartialCredit(), examples)
    assert result["pass@1"] == result["ci"]["mean_reward"] == pytest.approx(2 / 3)
