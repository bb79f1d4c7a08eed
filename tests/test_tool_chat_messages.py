"""An OpenAI-compatible assistant message (DeepSeek's API, vLLM's server) onto the loop's text
and back, and tool result messages onto the loop's observation and back; bad input named."""

import copy

import pytest

from posttrain.envs.tool_calls import (chat_message_from_turn, observation_from_tool_messages, parse_turn,
                                       tool_messages_from_observation, turn_from_chat_message)
from posttrain.envs.tool_env import ToolEnvironment
from posttrain.envs.tools import ToolCall, ToolRegistry, calculator_tool

REGISTRY = ToolRegistry([calculator_tool()])

# Recorded by hand in the shape DeepSeek's chat API returns in thinking mode (written here; no
# network): reasoning apart from content, two calls whose arguments are JSON strings.
RECORDED = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "I need 347*829 and 12*12 before I can compare them.",
    "tool_calls": [
        {"id": "call_00_a1", "type": "function",
         "function": {"name": "calculator", "arguments": "{\"expression\": \"347*829\"}"}},
        {"id": "call_01_b2", "type": "function",
         "function": {"name": "calculator", "arguments": "{\"expression\": \"12*12\"}"}},
    ],
}
IDS = ["call_00_a1", "call_01_b2"]
RESULTS = [{"role": "tool", "tool_call_id": "call_00_a1", "content": "287663"},
           {"role": "tool", "tool_call_id": "call_01_b2", "content": "144"}]


def test_a_recorded_message_becomes_the_loops_text_and_comes_back_unchanged():
    text = turn_from_chat_message(RECORDED)
    assert text == ("<think>I need 347*829 and 12*12 before I can compare them.</think>\n"
                    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347*829"}}\n</tool_call>\n'
                    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*12"}}\n</tool_call>')
    parsed = parse_turn(text, REGISTRY)  # what the environment reads of it
    assert parsed.calls == [ToolCall("calculator", {"expression": "347*829"}),
                            ToolCall("calculator", {"expression": "12*12"})]
    assert parsed.thinking == [RECORDED["reasoning_content"]] and parsed.answer == "" and not parsed.malformed
    assert chat_message_from_turn(text, REGISTRY, IDS) == RECORDED


def test_vllms_reasoning_field_and_a_final_answer_read_the_same_way():
    answer = {"role": "assistant", "reasoning": "287663 > 144.", "content": "Final: 287663"}  # newer vLLM
    text = turn_from_chat_message(answer)
    assert text == "<think>287663 > 144.</think>\nFinal: 287663"
    back = chat_message_from_turn(text, REGISTRY, [])
    assert back == {"role": "assistant", "content": "Final: 287663", "reasoning_content": "287663 > 144."}


def test_tool_messages_become_the_observation_the_environment_writes_and_back():
    observation = observation_from_tool_messages(list(reversed(RESULTS)), IDS)  # paired by id, not position
    env = ToolEnvironment(REGISTRY)
    written = "".join(env.format_result(REGISTRY.call(c)) for c in parse_turn(turn_from_chat_message(RECORDED),
                                                                              REGISTRY).calls)
    assert observation == written == "<tool_result>287663</tool_result>\n<tool_result>144</tool_result>\n"
    assert tool_messages_from_observation(observation, IDS) == RESULTS


def broken(path: str, value):
    """RECORDED with one field replaced (path like 'tool_calls.0.function.arguments')."""
    message = copy.deepcopy(RECORDED)
    *parents, last = path.split(".")
    target = message
    for key in parents:
        target = target[int(key)] if key.isdigit() else target[key]
    if value is KeyError:
        del target[int(last) if last.isdigit() else last]
    else:
        target[int(last) if last.isdigit() else last] = value
    return message


@pytest.mark.parametrize("message, words", [
    (broken("role", "user"), "expected an assistant message"),
    (broken("tool_calls.0.function", KeyError), r"tool_calls\[0\] has no 'function' object"),
    (broken("tool_calls.1.function.name", KeyError), r"tool_calls\[1\].function has no 'name'"),
    (broken("tool_calls.0.function.arguments", "{\"expression\": "), r"tool_calls\[0\].function.arguments is not "
                                                                     "valid JSON"),
    (broken("tool_calls.0.function.arguments", {"expression": "1+1"}), "written as a string"),
    (broken("tool_calls.0.function.arguments", "[1, 2]"), "not an object"),
    ({**RECORDED, "reasoning": "something else"}, "both reasoning_content and reasoning"),
])
def test_bad_assistant_messages_are_refused_naming_the_field(message, words):
    with pytest.raises(ValueError, match=words):
        turn_from_chat_message(message)


def test_bad_tool_messages_and_observations_are_refused_naming_what_is_wrong():
    with pytest.raises(ValueError, match=r"no result for \['call_01_b2'\]"):
        observation_from_tool_messages(RESULTS[:1], IDS)
    with pytest.raises(ValueError, match="has no 'tool_call_id'"):
        observation_from_tool_messages([{"role": "tool", "content": "1"}], ["x"])
    with pytest.raises(ValueError, match="content of type int"):
        observation_from_tool_messages([{"role": "tool", "tool_call_id": "x", "content": 1}], ["x"])
    with pytest.raises(ValueError, match="<tool_error>"):
        tool_messages_from_observation("<tool_error>calculator: division by zero</tool_error>\n", ["x"])
    with pytest.raises(ValueError, match="malformed call"):
        chat_message_from_turn("<tool_call>{not json}</tool_call>", REGISTRY, ["x"])
