"""Reading a model turn: its thinking, its tool calls and its answer text, and every
malformed call as an error with a reason; the parser never raises.

    parse_turn(text, registry, call_format="json") -> ParsedTurn(thinking, calls, malformed, answer)

The formats

    <think>…</think>   the model's reasoning. Everything inside is thinking, not calls: a
                       model that muses "maybe <tool_call>…" has not called anything. An
                       unclosed <think> makes the rest of the turn thinking (flagged).

    json (Hermes / Qwen, what chat templates with `tools=` teach a model to emit):
        <tool_call>
        {"name": "calculator", "arguments": {"expression": "347*829"}}
        </tool_call>
    The body is one JSON object with a string "name" and an object "arguments" (an
    "arguments" given as a string holding a JSON object is read too: models do that).

    compact (for tiny character-level models: 42 characters, where json takes 87):
        <tool_call>calculator: 347*829</tool_call>
    The tool's name, a colon, then its single string argument, surrounding whitespace
    stripped. Only tools with exactly one string parameter can be called this way.

A turn may hold several calls; they run in order. Whatever lies outside <think> blocks and
calls is the answer text (stripped): a turn without calls is the model's final answer.

Malformed calls (MALFORMED): each becomes a MalformedCall(reason, message, text) and the
parse goes on after it. The environment decides what one costs (posttrain/envs/tool_env.py:
an error observation the model can react to, or the episode ends with reward 0).

Cost: one left-to-right scan with str.find, linear in the text, whatever it holds.

Chat-API messages (bottom of the file): an OpenAI-compatible assistant message, as DeepSeek's
API and vLLM's server return one (reasoning and tool calls as fields), maps onto this text and
back (`turn_from_chat_message`, `chat_message_from_turn`), and the API's role-"tool" messages
onto the observation the environment writes (`observation_from_tool_messages` and back).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.tools import ToolCall, ToolRegistry, check_arguments
from posttrain.verifiers.think_tags import THINK_CLOSE, THINK_OPEN, split_thinking

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
CALL_FORMATS = ("json", "compact")

MALFORMED: dict[str, str] = {
    "not_text": "the turn is not a string (a bug in the caller, reported rather than raised)",
    "unclosed_tag": "a <tool_call> has no </tool_call> before the turn ends or the next <tool_call>",
    "stray_close_tag": "a </tool_call> with no <tool_call> before it",
    "empty_call": "nothing between <tool_call> and </tool_call>",
    "bad_json": "json format: the body is not valid JSON",
    "not_an_object": "json format: the body is JSON but not an object with \"name\" and \"arguments\"",
    "missing_name": "json format: no string \"name\" in the call",
    "wrong_format": "compact format: the body is JSON (a call in the json format)",
    "missing_colon": "compact format: no ':' between the tool name and its argument",
    "not_compact": "compact format: the tool does not take a single string argument",
    "unknown_tool": "no tool of that name is registered",
    "missing_argument": "the call lacks an argument the tool requires (or the compact argument is empty)",
    "bad_arguments": "the arguments do not fit the tool's schema (unexpected key, wrong JSON type)",
    "too_many_calls": "more calls in one turn than the environment runs (ToolEnvironment.max_calls_per_turn)",
}


@dataclass(frozen=True)
class MalformedCall:
    reason: str  # one of MALFORMED
    message: str  # what exactly was wrong, for the error observation and the details
    text: str  # the offending text as the model wrote it (cut to 200 characters)

    def details(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "text": self.text}


@dataclass
class ParsedTurn:
    thinking: list[str] = field(default_factory=list)  # the text of each <think> block, in order
    calls: list[ToolCall] = field(default_factory=list)  # well-formed calls, in order
    malformed: list[MalformedCall] = field(default_factory=list)
    answer: str = ""  # the text outside thinking and calls, stripped
    unclosed_think: bool = False  # a <think> never closed: the rest of the turn was read as thinking

    @property
    def has_calls(self) -> bool:
        """Did the model try to call a tool at all (well-formed or not)?"""
        return bool(self.calls or self.malformed)


def parse_turn(text: str, registry: ToolRegistry, call_format: str = "json") -> ParsedTurn:
    """Split one model turn into thinking, calls, malformed calls and answer (module
    docstring). Raises only for a `call_format` that is not one of CALL_FORMATS (a
    programming error, caught when the environment is built)."""
    if call_format not in CALL_FORMATS:
        raise ValueError(f"call_format must be one of {CALL_FORMATS}, got {call_format!r}")
    if not isinstance(text, str):
        return ParsedTurn(malformed=[MalformedCall("not_text", f"the turn is {type(text).__name__}, not text",
                                                   repr(text)[:200])])
    parsed = ParsedTurn()
    parsed.thinking, rest, parsed.unclosed_think = split_thinking(text)
    next_tag = _TagFinder(rest)
    answer, position = [], 0
    while True:
        start, stray = next_tag(CALL_OPEN, position), next_tag(CALL_CLOSE, position)
        if stray >= 0 and (start < 0 or stray < start):  # a close tag before any open one
            answer.append(rest[position:stray])
            parsed.malformed.append(MalformedCall("stray_close_tag", MALFORMED["stray_close_tag"], CALL_CLOSE))
            position = stray + len(CALL_CLOSE)
            continue
        if start < 0:
            answer.append(rest[position:])
            break
        answer.append(rest[position:start])
        body_start = start + len(CALL_OPEN)
        end, following = next_tag(CALL_CLOSE, body_start), next_tag(CALL_OPEN, body_start)
        if end < 0 or (0 <= following < end):
            stop = following if following >= 0 else len(rest)
            parsed.malformed.append(MalformedCall("unclosed_tag", MALFORMED["unclosed_tag"], rest[start:stop][:200]))
            position = stop
            continue
        call_or_error = read_call(rest[body_start:end], registry, call_format)
        if isinstance(call_or_error, ToolCall):
            parsed.calls.append(call_or_error)
        else:
            parsed.malformed.append(call_or_error)
        position = end + len(CALL_CLOSE)
    parsed.answer = "".join(answer).strip()
    return parsed


class _TagFinder:
    """text.find(tag, position) for positions that only move forward, remembering each
    tag's last hit: without it, 10^5 unclosed <tool_call> tags before one far </tool_call>
    would rescan the text 10^5 times."""

    def __init__(self, text: str):
        self.text = text
        self.hits: dict[str, tuple[int, int]] = {}  # tag -> (searched from, found at or -1)

    def __call__(self, tag: str, position: int) -> int:
        if tag in self.hits:
            searched_from, found = self.hits[tag]
            # the last hit is still the next one when it lies at or after `position` (or there was none)
            if searched_from <= position and (found < 0 or found >= position):
                return found
        found = self.text.find(tag, position)
        self.hits[tag] = (position, found)
        return found


def read_call(body: str, registry: ToolRegistry, call_format: str) -> ToolCall | MalformedCall:
    """One call's body (between the tags) as a ToolCall checked against the registry."""
    quoted = body.strip()[:200]
    if not body.strip():
        return MalformedCall("empty_call", MALFORMED["empty_call"], quoted)
    if call_format == "compact":
        if quoted.startswith("{"):
            return MalformedCall("wrong_format", "this environment reads compact calls, <tool_call>NAME: ARGUMENT"
                                 "</tool_call>, not JSON", quoted)
        name, colon, argument = body.partition(":")
        name, argument = name.strip(), argument.strip()
        if not colon:
            return MalformedCall("missing_colon", f"write <tool_call>NAME: ARGUMENT</tool_call>, got {quoted!r}",
                                 quoted)
        tool = registry.get(name)
        if tool is None:
            return _unknown(name, registry, quoted)
        key = tool.single_string_argument()
        if key is None:
            return MalformedCall("not_compact", f"tool {name!r} takes {sorted(tool.parameters.get('properties', {}))}"
                                 ", not one string: call it in the json format", quoted)
        if not argument:
            return MalformedCall("missing_argument", f"tool {name!r} was called with an empty {key!r}", quoted)
        return ToolCall(name, {key: argument})
    try:
        call = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as error:  # RecursionError: "[[[[…" thousands deep
        return MalformedCall("bad_json", f"the call is not valid JSON ({str(error)[:100]}); write "
                             '{"name": NAME, "arguments": {...}}', quoted)
    if not isinstance(call, dict):
        return MalformedCall("not_an_object", MALFORMED["not_an_object"], quoted)
    called, arguments = call.get("name"), call.get("arguments", {})  # anything JSON holds, until checked
    if not isinstance(called, str) or not called:
        return MalformedCall("missing_name", MALFORMED["missing_name"], quoted)
    if isinstance(arguments, str):  # '"arguments": "{\"expression\": \"1+1\"}"'
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            pass  # reported below as not an object
    tool = registry.get(called)
    if tool is None:
        return _unknown(called, registry, quoted)
    problem = check_arguments(tool, arguments)
    if problem:
        kind, message = problem
        return MalformedCall(kind, message, quoted)
    return ToolCall(called, arguments)


def _unknown(name: str, registry: ToolRegistry, quoted: str) -> MalformedCall:
    return MalformedCall("unknown_tool", f"unknown tool {name[:50]!r}; the tools are {registry.names()}", quoted)


def render_call(call: ToolCall, call_format: str) -> str:
    """The text of a well-formed call in a format: what a demonstration shows the model."""
    if call_format == "compact":
        (value,) = call.arguments.values()
        return f"{CALL_OPEN}{call.name}: {value}{CALL_CLOSE}"
    payload: dict[str, Any] = {"name": call.name, "arguments": call.arguments}
    return f"{CALL_OPEN}\n{json.dumps(payload)}\n{CALL_CLOSE}"


# ---- OpenAI-compatible chat messages: DeepSeek's API, vLLM's server --------------------------
#
# DeepSeek's chat API in thinking mode, and vLLM's OpenAI-compatible server started with a tool
# parser (--enable-auto-tool-choice --tool-call-parser NAME) and a reasoning parser
# (--reasoning-parser NAME), return an assistant turn as fields, not text:
#
#     {"role": "assistant", "reasoning_content": "...", "content": "" (or null),
#      "tool_calls": [{"id": "call_0", "type": "function",
#                      "function": {"name": "calculator", "arguments": "{\"expression\": \"347*829\"}"}}]}
#
# `arguments` is a JSON object written as a string. Newer vLLM releases call the reasoning field
# `reasoning` (renamed from `reasoning_content`, as its 0.11.2 documentation notes); both are read. A tool's result goes back
# as one message per call: {"role": "tool", "tool_call_id": "call_0", "content": "287663"}.
# The functions below map these onto the loop's text (<think>, <tool_call> in the json format,
# <tool_result>) and back. Bad input is a ValueError naming the field: unlike a model's text, a
# message is a caller's data, and a wrong one is the caller's bug.

RESULT_OPEN, RESULT_CLOSE = "<tool_result>", "</tool_result>"
REASONING_FIELDS = ("reasoning_content", "reasoning")  # DeepSeek and older vLLM; newer vLLM


def turn_from_chat_message(message: dict[str, Any]) -> str:
    """An API's assistant message -> the loop's text of that turn: its reasoning as a
    <think> block, its content, then each tool call in the json format, in order."""
    if not isinstance(message, dict) or message.get("role") != "assistant":
        raise ValueError(f"expected an assistant message (a dict with role 'assistant'), got {str(message)[:100]!r}")
    given = {key: message[key] for key in REASONING_FIELDS if message.get(key)}
    if len(set(given.values())) > 1:
        raise ValueError(f"the message has both {' and '.join(given)}, and they differ: which is the reasoning?")
    reasoning, content = next(iter(given.values()), ""), message.get("content") or ""
    for key, value in (("reasoning", reasoning), ("content", content)):
        if not isinstance(value, str):
            raise ValueError(f"the message's {key} is {type(value).__name__}, not text")
    calls = [render_call(call_from_api(entry, i), "json") for i, entry in enumerate(message.get("tool_calls") or [])]
    think = f"{THINK_OPEN}{reasoning}{THINK_CLOSE}\n" if reasoning else ""
    return think + content + "".join(f"\n{call}" if content or i else call for i, call in enumerate(calls))


def call_from_api(entry: Any, index: int) -> ToolCall:
    """One tool_calls[index] entry -> ToolCall, with its arguments string parsed."""
    where = f"tool_calls[{index}]"
    function = entry.get("function") if isinstance(entry, dict) else None
    if not isinstance(function, dict):
        raise ValueError(f"{where} has no 'function' object: expected {{'id', 'type': 'function', "
                         f"'function': {{'name', 'arguments'}}}}, got {str(entry)[:100]!r}")
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.function has no 'name' string (got {name!r})")
    if not isinstance(arguments, str):
        raise ValueError(f"{where}.function.arguments must be a JSON object written as a string, as the API "
                         f"sends it; got {type(arguments).__name__}")
    try:
        parsed = json.loads(arguments or "{}")  # a call without arguments may send ""
    except (json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{where}.function.arguments is not valid JSON ({str(error)[:80]}): {arguments[:100]!r}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{where}.function.arguments is JSON but not an object: {arguments[:100]!r}")
    return ToolCall(name, parsed)


def chat_message_from_turn(text: str, registry: ToolRegistry, call_ids: list[str]) -> dict[str, Any]:
    """The loop's text of a model turn -> the API's assistant message (json-format calls, each
    given its id from call_ids). A malformed call is a ValueError: the API has no way to say one."""
    parsed = parse_turn(text, registry, "json")
    if parsed.malformed:
        first = parsed.malformed[0]
        raise ValueError(f"the turn has a malformed call ({first.reason}: {first.message}), which no message can hold")
    if len(call_ids) != len(parsed.calls):
        raise ValueError(f"{len(parsed.calls)} calls in the turn but {len(call_ids)} call ids")
    message: dict[str, Any] = {"role": "assistant", "content": parsed.answer or None}
    if parsed.thinking:
        message["reasoning_content"] = "".join(parsed.thinking)
    if parsed.calls:
        message["tool_calls"] = [{"id": call_id, "type": "function", "function": {
            "name": call.name, "arguments": json.dumps(call.arguments)}} for call_id, call in zip(call_ids, parsed.calls)]
    return message


def observation_from_tool_messages(messages: list[dict[str, Any]], call_ids: list[str]) -> str:
    """The API's tool messages answering one assistant turn -> the loop's observation: one
    <tool_result> per call, in the order of call_ids (the assistant message's tool_calls)."""
    by_id = {}
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "tool":
            raise ValueError(f"messages[{i}] is not a tool message (role 'tool'): {str(message)[:100]!r}")
        call_id, content = message.get("tool_call_id"), message.get("content")
        if not isinstance(call_id, str) or not call_id:
            raise ValueError(f"messages[{i}] has no 'tool_call_id' string: which call does it answer?")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}] (tool_call_id {call_id!r}) has content of type "
                             f"{type(content).__name__}; a tool's result is text")
        by_id[call_id] = content
    missing, unknown = [c for c in call_ids if c not in by_id], sorted(set(by_id) - set(call_ids))
    if missing or unknown:
        raise ValueError(f"the tool messages do not answer the calls: no result for {missing}, "
                         f"results for calls never made {unknown}")
    return "".join(f"{RESULT_OPEN}{by_id[call_id]}{RESULT_CLOSE}\n" for call_id in call_ids)


def tool_messages_from_observation(observation: str, call_ids: list[str]) -> list[dict[str, Any]]:
    """The loop's observation -> one API tool message per <tool_result>, paired with call_ids in
    order. An observation holding a <tool_error> (a failed or malformed call) is refused: the
    API has no error flag, and passing the error as a result would blur the two."""
    results, position = [], 0
    while (start := observation.find(RESULT_OPEN, position)) >= 0:
        end = observation.find(RESULT_CLOSE, start)
        if end < 0:
            raise ValueError(f"a {RESULT_OPEN} without {RESULT_CLOSE} in the observation")
        results.append(observation[start + len(RESULT_OPEN):end])
        position = end + len(RESULT_CLOSE)
    if "<tool_error>" in observation:
        raise ValueError("the observation holds a <tool_error>, which a tool message cannot mark as an error")
    if len(results) != len(call_ids):
        raise ValueError(f"{len(results)} results in the observation but {len(call_ids)} call ids")
    return [{"role": "tool", "tool_call_id": call_id, "content": result} for call_id, result in zip(call_ids, results)]
