"""ToolEnvironment (posttrain/envs/tool_env.py) and the tool-arithmetic task: episodes end
or continue per the settings with a reason, malformed calls score 0 with a reason, the
demonstrations earn reward 1, and the docstring's small environment runs as written."""

import pickle
import random
import re
import time

import pytest

from posttrain.envs import ENVIRONMENTS, make_env
from posttrain.envs import tool_env as tool_env_module
from posttrain.envs.arithmetic import split_of
from posttrain.envs.tool_arithmetic import ToolArithmeticEnv
from posttrain.envs.tool_env import END_REASONS, ToolEnvironment
from posttrain.envs.tools import Tool, calculator_tool
from posttrain.types import ENVIRONMENT_TURN, MODEL_TURN, Example
from posttrain.verifiers import final_int


def episode(env, example, turns):
    """Drive reset/step as the agent loop does; returns the TurnResults."""
    state, results = env.reset(example), []
    for turn in turns:
        results.append(env.step(state, turn))
        if results[-1].done:
            break
    return results


@pytest.fixture(scope="module")
def env():
    return make_env("tool_arithmetic")


@pytest.fixture(scope="module")
def example(env):
    return env.fixed_set("heldout", 1)[0]


def test_the_tool_using_episode_earns_reward_1(env):
    example = Example("Q: 347*829\n", "287663", id="t")
    first, last = episode(env, example, ["<tool_call>calculator: 347*829</tool_call>", "Final: 287663"])
    assert (first.observation, first.done, first.reward) == ("<tool_result>287663</tool_result>\n", False, None)
    assert (last.done, last.reward, last.observation) == (True, 1.0, "")
    details = last.details
    assert (details["reason"], details["turns"], details["n_tool_calls"], details["n_malformed"]) == (
        "answered", 2, 1, 0)
    assert details["tool_calls"][0]["arguments"] == {"expression": "347*829"} and details["tool_calls"][0]["ok"]
    assert details["answer"]["reason"] == "ok" and details["answer"]["spec_version"] == "final_int/strict-v1"


def test_the_environment_pickles_for_ray_workers(env):
    copy = pickle.loads(pickle.dumps(env))
    example = Example("Q: 101*101\n", "10201")
    assert episode(copy, example, ["<tool_call>calculator: 101*101</tool_call>", "Final: 10201"])[-1].reward == 1.0


def test_the_answer_turn_is_scored_without_its_thinking(env, example):
    (result,) = episode(env, example, [f"<think>no tool needed?</think>Final: {example.expected_answer}"])
    assert (result.reward, result.details["n_tool_calls"]) == (1.0, 0)  # correctness pays, tool or not
    (wrong,) = episode(env, example, ["Final: 12"])
    assert (wrong.reward, wrong.details["answer"]["reason"]) == (0.0, "wrong_answer")
    (chatty,) = episode(env, example, [f"The answer\nFinal: {example.expected_answer}"])
    assert (chatty.reward, chatty.details["answer"]["reason"]) == (0.0, "extra_lines")  # strict-v1


def test_a_malformed_call_continues_with_an_error_observation(env, example):
    first, second, last = episode(env, example, ["<tool_call>calc: 1+1</tool_call>", "<tool_call>calculator 2",
                                                 "Final: 0"])
    assert first.observation == "<tool_error>unknown_tool: unknown tool 'calc'; the tools are ['calculator']" \
                                "</tool_error>\n" and not first.done
    assert second.observation.startswith("<tool_error>unclosed_tag: ") and not second.done
    assert last.details["n_malformed"] == 2 and last.reward == 0.0
    assert [m["reason"] for m in last.details["malformed"]] == ["unknown_tool", "unclosed_tag"]


def test_a_malformed_call_scores_0_with_its_reason_when_it_ends_the_episode(example):
    strict = ToolArithmeticEnv(on_malformed="end")
    (result,) = episode(strict, example, ['<tool_call>{"name": "calculator"}</tool_call>'])
    assert (result.done, result.reward, result.details["reason"]) == (True, 0.0, "malformed_call")
    assert result.details["malformed"] == [{"reason": "wrong_format", "message": "this environment reads compact "
                                            "calls, <tool_call>NAME: ARGUMENT</tool_call>, not JSON",
                                            "text": '{"name": "calculator"}'}]


def test_a_tool_call_in_the_last_turn_ends_with_reward_0(example):
    env = ToolArithmeticEnv(max_turns=2)
    results = episode(env, example, ["<tool_call>calculator: 1+1</tool_call>"] * 3)
    assert len(results) == 2 and results[-1].done and results[-1].reward == 0.0
    assert results[-1].details["reason"] == "max_turns" and results[-1].details["n_tool_calls"] == 1


def test_too_many_calls_in_one_turn(example):
    env = ToolArithmeticEnv()
    (result,) = episode(env, example, ["<tool_call>calculator: 1+1</tool_call>" * 6])
    assert result.observation.count("<tool_result>2</tool_result>") == 4
    assert "too_many_calls: 6 calls in one turn; at most 4 run" in result.observation


def test_a_flood_of_broken_calls_stays_a_short_observation(example):
    (result,) = episode(ToolArithmeticEnv(), example, ["<tool_call>" * 10_000])
    assert result.observation.count("<tool_error>") == 5 and len(result.observation) < 1_000
    assert "9996 more malformed calls in this turn, not listed" in result.observation
    (ended,) = episode(ToolArithmeticEnv(max_turns=1), example, ["<tool_call>" * 10_000])
    assert (ended.details["n_malformed"], len(ended.details["malformed"])) == (10_000, 5)


class Flaky(ToolEnvironment):
    """A tool that raises or hangs, to test the policies."""

    def __init__(self, function, on_error, timeout_seconds=5.0):
        tool = Tool("lookup", "look a key up", {"type": "object", "properties": {"key": {"type": "string"}},
                                                "required": ["key"]}, function, timeout_seconds, on_error)
        super().__init__([tool], call_format="compact")

    def score(self, example, completion):
        return final_int.score(example, completion, "final_int/strict-v1")


def fail(key):
    raise ConnectionError(f"no route to {key}")


def test_a_raising_tool_continues_per_its_policy(example):
    first, last = episode(Flaky(fail, "continue"), example, ["<tool_call>lookup: db</tool_call>", "Final: 1"])
    assert first.observation == "<tool_error>lookup: ConnectionError: no route to db</tool_error>\n"
    assert not first.done and last.details["tool_calls"][0]["reason"] == "tool_error"


def test_a_raising_tool_ends_the_episode_per_its_policy(example):
    (result,) = episode(Flaky(fail, "end"), example, ["<tool_call>lookup: db</tool_call>"])
    assert (result.done, result.reward, result.details["reason"]) == (True, 0.0, "tool_failed")
    assert (result.details["failed_tool"], result.details["error"]) == ("lookup", "ConnectionError: no route to db")


@pytest.mark.parametrize("on_error", ["continue", "end"])
def test_a_hanging_tool_times_out_within_its_limit(example, on_error):
    start = time.perf_counter()
    (result, *_) = episode(Flaky(lambda key: time.sleep(30), on_error, timeout_seconds=0.25), example,
                           ["<tool_call>lookup: db</tool_call>"])
    assert time.perf_counter() - start < 0.8
    message = "tool 'lookup' did not answer within 0.25 s"
    if on_error == "end":
        assert (result.done, result.reward, result.details["reason"], result.details["error"]) == (
            True, 0.0, "tool_failed", message)
    else:
        assert (result.done, result.observation) == (False, f"<tool_error>lookup: {message}</tool_error>\n")


def test_the_docstring_environment_runs_in_under_40_lines():
    code = re.search(r"\n(    class Squares.*?)\n\"*\Z", tool_env_module.__doc__, re.S).group(1)
    code = "\n".join(line[4:] for line in code.splitlines())
    assert len(code.strip().splitlines()) < 40
    namespace = {"ToolEnvironment": ToolEnvironment, "calculator_tool": calculator_tool, "random": random,
                 "Example": Example, "final_int": final_int, "split_of": split_of}
    exec(code, namespace)
    squares = namespace["Squares"]()
    train, heldout = squares.fixed_set("train", 50), squares.fixed_set("heldout", 50)
    assert len({e.id for e in train}) == 50 and not {e.id for e in train} & {e.id for e in heldout}
    for example in heldout[:5]:
        segments = squares.demonstration(example)
        k = int(example.prompt[3:-3])
        assert segments == [(MODEL_TURN, f"<tool_call>calculator: {k}*{k}</tool_call>"),
                            (ENVIRONMENT_TURN, f"<tool_result>{k * k}</tool_result>\n"),
                            (MODEL_TURN, f"Final: {k * k}")]


# the multi-turn protocol of roles/environment.py: the Environment's members, reset, step and both budgets
PROTOCOL = ("spec_version", "sample", "fixed_set", "solution", "score", "reset", "step", "max_turns",
            "max_total_tokens")


def test_both_environments_offer_the_whole_protocol(env):
    code = re.search(r"\n(    class Squares.*?)\n\"*\Z", tool_env_module.__doc__, re.S).group(1)
    namespace = {"ToolEnvironment": ToolEnvironment, "calculator_tool": calculator_tool}
    exec("\n".join(line[4:] for line in code.splitlines()), namespace)
    for instance in (env, namespace["Squares"]()):
        assert all(hasattr(instance, member) for member in PROTOCOL)
        assert isinstance(instance.max_turns, int) and isinstance(instance.max_total_tokens, int)
    assert (env.spec_version, namespace["Squares"]().spec_version) == ("final_int/strict-v1", "Squares/v1")


def test_tool_arithmetic_problems_and_splits(env):
    heldout, train = env.fixed_set("heldout", 200), env.fixed_set("train", 200)
    assert env.fixed_set("heldout", 50) == heldout[:50]  # a smaller set is a prefix
    assert len({e.id for e in heldout}) == 200 and not {e.id for e in heldout} & {e.id for e in train}
    for e in heldout:
        a, b = e.meta["a"], e.meta["b"]
        assert 100 <= a <= 999 and 100 <= b <= 999 and e.expected_answer == str(a * b)
        assert e.prompt == f"Q: {a}*{b}\n" and e.meta["split"] == "heldout" == split_of(f"{a}*{b}")
    assert all(e.meta["split"] == "dev" for e in env.sample("dev", 30, seed=1))
    assert env.sample("train", 5, seed=3) == env.sample("train", 5, seed=3)


@pytest.mark.parametrize("call_format", ["compact", "json"])
def test_demonstrations_earn_reward_1_and_separate_the_tool_output(call_format):
    env = ToolArithmeticEnv(call_format=call_format)
    for example in env.fixed_set("train", 20):
        segments = env.demonstration(example)
        assert [source for source, _ in segments] == [MODEL_TURN, ENVIRONMENT_TURN, MODEL_TURN]
        assert segments[1][1] == f"<tool_result>{example.expected_answer}</tool_result>\n"
        assert env.solution(example) == "".join(text for _, text in segments)
    assert '"arguments": {"expression": ' in ToolArithmeticEnv(call_format="json").solution(example)


def test_a_demonstration_that_fails_its_scorer_is_refused():
    class Wrong(ToolArithmeticEnv):
        def demonstration_turns(self, example):
            return ["Final: 1"]

    with pytest.raises(ValueError, match="does not end with reward 1"):
        Wrong().solution(Example("Q: 100*100\n", "10000"))
    with pytest.raises(ValueError, match=r"not a tool-arithmetic prompt \(want 'Q: <a>\*<b>\\n'\)"):
        ToolArithmeticEnv().solution(Example("Q: 2+2\n", "4"))


def test_settings_are_checked_and_the_task_is_registered():
    assert ENVIRONMENTS["tool_arithmetic"] is ToolArithmeticEnv
    assert make_env("tool_arithmetic", digits=4).fixed_set("dev", 1)[0].meta["a"] >= 1000
    for kwargs, message in [({"digits": 9}, "digits must be an int from 2 to 6"),
                            ({"call_format": "xml"}, "call_format must be one of"),
                            ({"on_malformed": "retry"}, "on_malformed must be one of"),
                            ({"max_turns": 0}, "max_turns must be an int >= 1"),
                            ({"level": 3}, "has no parameter(s) ['level']")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            make_env("tool_arithmetic", **kwargs)
    with pytest.raises(ValueError, match="n=5000 is too many distinct problems for digits=2"):
        ToolArithmeticEnv(digits=2).fixed_set("heldout", 5000)
    with pytest.raises(NotImplementedError, match="must define score"):
        ToolEnvironment([calculator_tool()]).score(Example("Q", "1"), "x")
    assert set(END_REASONS) == {"answered", "malformed_call", "tool_failed", "max_turns"}
