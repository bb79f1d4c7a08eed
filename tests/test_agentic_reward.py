"""The agentic reward: the answer's score less the cost of the steps, never a bonus."""

import pytest

from posttrain.envs.tool_arithmetic import ToolArithmeticEnv
from posttrain.rewards.agentic import AgenticReward
from posttrain.verifiers.contract import is_solved


def test_costs_are_subtracted_per_call_and_per_malformed_call():
    reward, parts = AgenticReward(step_cost=0.05, malformed_penalty=0.2)(1.0, tool_calls=2, malformed_calls=1)
    assert reward == pytest.approx(1.0 - 0.1 - 0.2)
    assert parts == {"accuracy": 1.0, "step_cost": pytest.approx(-0.1), "malformed_penalty": pytest.approx(-0.2)}
    assert AgenticReward()(0.7, 5, 5) == (0.7, {"accuracy": 0.7, "step_cost": -0.0, "malformed_penalty": -0.0})


def test_a_wrong_answer_never_earns_more_than_zero():
    for calls in range(4):
        for malformed in range(3):
            assert AgenticReward(0.03, 0.1)(0.0, calls, malformed)[0] <= 0.0


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), True, "0.1"])
def test_a_cost_must_be_a_finite_non_negative_number(bad):
    with pytest.raises(ValueError, match="step_cost must be a finite number >= 0"):
        AgenticReward(step_cost=bad)


def episode(env, turns):
    example = env.fixed_set("heldout", 1)[0]
    state = env.reset(example)
    for turn in turns(example):
        result = env.step(state, turn)
        if result.done:
            return result
    raise AssertionError("the episode did not end")


def test_the_tool_environment_pays_the_answer_less_its_steps():
    env = ToolArithmeticEnv(step_cost=0.05, malformed_penalty=0.25)

    def good(example):
        a, b = example.meta["a"], example.meta["b"]
        return ["<tool_call>calculator: nonsense</tool_call>",  # a bad call (the calculator refuses it)
                "<tool_call>calculator</tool_call>",  # malformed: no argument
                f"<tool_call>calculator: {a}*{b}</tool_call>", f"Final: {a * b}"]

    result = episode(ToolArithmeticEnv(step_cost=0.05, malformed_penalty=0.25, max_turns=4), good)
    assert result.details["reason"] == "answered"
    parts = result.details["reward_parts"]
    assert parts["accuracy"] == 1.0
    assert result.details["n_tool_calls"] == 2 and result.details["n_malformed"] == 1
    assert result.reward == pytest.approx(1.0 - 2 * 0.05 - 0.25)
    assert is_solved(result.reward, result.details)  # pass@1 counts the answer, not the costs
    # without costs the same episode earns the answer's score alone
    assert episode(ToolArithmeticEnv(max_turns=4), good).reward == 1.0
    # demonstrations are checked on the answer's score, so costs do not make them invalid
    assert env.demonstration(env.fixed_set("train", 1)[0])
