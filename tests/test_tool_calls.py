"""Reading model turns (posttrain/envs/tool_calls.py): both call formats, thinking kept
apart, every malformed call a reason and never an exception (hypothesis); and the thinking
policies across calls (posttrain/roles/thinking.py), with the chat-template check."""

import json
import time

import pytest

from posttrain.roles.thinking import (
    TrainingRow,
    context_for_next_turn,
    strip_thinking,
    template_keeps_thinking,
    training_rows,
)
from posttrain.envs.tool_calls import CALL_FORMATS, MALFORMED, ParsedTurn, parse_turn, render_call
from posttrain.envs.tools import Tool, ToolCall, ToolRegistry, calculator_tool
from posttrain.types import ENVIRONMENT_TURN, MODEL_TURN, Turn

SEARCH = Tool("search", "look up", {"type": "object", "properties": {"query": {"type": "string"},
                                                                        "k": {"type": "integer"}},
                                      "required": ["query"]}, lambda query, k=1: query)
REGISTRY = ToolRegistry([calculator_tool(), SEARCH])


def calls(text, call_format="json"):
    return parse_turn(text, REGISTRY, call_format)


def test_compact_format():
    parsed = calls("<tool_call>calculator: 347*829</tool_call>", "compact")
    assert parsed.calls == [ToolCall("calculator", {"expression": "347*829"})]
    assert (parsed.malformed, parsed.answer, parsed.thinking) == ([], "", [])
    two = calls("first <tool_call> calculator :  1+1 </tool_call> then <tool_call>calculator: 2*3</tool_call> done",
                "compact")
    assert [c.arguments["expression"] for c in two.calls] == ["1+1", "2*3"] and two.answer == "first  then  done"


def test_json_format_as_chat_templates_emit_it():
    text = '<tool_call>\n{"name": "search", "arguments": {"query": "RLHF", "k": 3}}\n</tool_call>'
    assert calls(text).calls == [ToolCall("search", {"query": "RLHF", "k": 3})]
    as_string = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2+2\\"}"}</tool_call>'
    assert calls(as_string).calls == [ToolCall("calculator", {"expression": "2+2"})]


def test_thinking_is_kept_apart_and_calls_inside_it_do_not_count():
    text = "<think>maybe <tool_call>calculator: 9*9</tool_call>? no</think>Final: 3<think>again"
    parsed = calls(text, "compact")
    assert parsed.thinking == ["maybe <tool_call>calculator: 9*9</tool_call>? no", "again"]
    assert (parsed.calls, parsed.malformed, parsed.answer, parsed.unclosed_think) == ([], [], "Final: 3", True)


@pytest.mark.parametrize("text, call_format, reasons", [
    ("<tool_call>calculator: 1+1", "compact", ["unclosed_tag"]),
    ("<tool_call>calculator: 1+1<tool_call>", "compact", ["unclosed_tag", "unclosed_tag"]),
    ("x</tool_call>Final: 2", "compact", ["stray_close_tag"]),
    ("<tool_call>  </tool_call>", "json", ["empty_call"]),
    ("<tool_call>{'name': 'calculator'}</tool_call>", "json", ["bad_json"]),
    ("<tool_call>[1, 2]</tool_call>", "json", ["not_an_object"]),
    ('<tool_call>{"arguments": {}}</tool_call>', "json", ["missing_name"]),
    ('<tool_call>{"name": "calc", "arguments": {}}</tool_call>', "json", ["unknown_tool"]),
    ('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>', "json", ["missing_argument"]),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": 5}}</tool_call>', "json", ["bad_arguments"]),
    ('<tool_call>{"name": "search", "arguments": "not json"}</tool_call>', "json", ["bad_arguments"]),
    ("<tool_call>calculator 1+1</tool_call>", "compact", ["missing_colon"]),
    ("<tool_call>calc: 1+1</tool_call>", "compact", ["unknown_tool"]),
    ("<tool_call>calculator:   </tool_call>", "compact", ["missing_argument"]),
    ("<tool_call>search: RLHF</tool_call>", "compact", ["not_compact"]),
    ('<tool_call>{"name": "calculator"}</tool_call>', "compact", ["wrong_format"]),
    ("<tool_call>calculator: 1+1</tool_call>", "json", ["bad_json"]),  # a compact call in a json environment
    ("<tool_call>a: 1</tool_call></tool_call><tool_call>", "compact", ["unknown_tool", "stray_close_tag",
                                                                       "unclosed_tag"]),
])
def test_malformed_calls_are_reasons_not_exceptions(text, call_format, reasons):
    parsed = calls(text, call_format)
    assert [m.reason for m in parsed.malformed] == reasons and parsed.calls == []
    assert parsed.has_calls and all(m.message for m in parsed.malformed)


def test_an_unclosed_call_does_not_swallow_the_next_one():
    parsed = calls("<tool_call>calculator: 1+1 <tool_call>calculator: 2</tool_call>", "compact")
    assert [m.reason for m in parsed.malformed] == ["unclosed_tag"]
    assert parsed.malformed[0].text == "<tool_call>calculator: 1+1 "
    assert parsed.calls == [ToolCall("calculator", {"expression": "2"})]


def test_malformed_messages_name_the_problem():
    (unknown,) = calls("<tool_call>calc: 1+1</tool_call>", "compact").malformed
    assert unknown.message == "unknown tool 'calc'; the tools are ['calculator', 'search']"
    assert unknown.text == "calc: 1+1"
    (missing,) = calls('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>').malformed
    assert missing.message == "missing required argument(s) ['expression'] of tool 'calculator'"
    assert parse_turn(None, REGISTRY).malformed[0].reason == "not_text"  # a caller's bug, reported
    with pytest.raises(ValueError, match="call_format must be one of"):
        parse_turn("x", REGISTRY, "xml")


@pytest.mark.parametrize("call_format", CALL_FORMATS)
def test_render_then_parse_is_the_identity(call_format):
    call = ToolCall("calculator", {"expression": "(12+7)**2"})
    assert calls(render_call(call, call_format), call_format).calls == [call]


def test_parsing_is_linear_in_the_text():
    start = time.perf_counter()
    parsed = calls("<tool_call>" * 100_000 + "</tool_call>", "compact")
    assert len(parsed.malformed) == 100_000 and time.perf_counter() - start < 3.0


def test_the_parser_never_raises_on_arbitrary_text():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    pieces = st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "</think>", "calculator", "search", ":",
                              "{", "}", '"name"', '"arguments"', '"calculator"', '"expression"', "[", "]", ",",
                              "1+1", "\n", " ", "\\", '"', "<", ">", "/", "\x00", "é", "9" * 30])
    texts = st.one_of(st.text(), st.lists(st.one_of(pieces, st.text(max_size=3)), max_size=30).map("".join))

    @hypothesis.settings(max_examples=400, deadline=None)
    @hypothesis.given(texts, st.sampled_from(CALL_FORMATS))
    def check(text, call_format):
        parsed = parse_turn(text, REGISTRY, call_format)
        assert isinstance(parsed, ParsedTurn) and isinstance(parsed.answer, str)
        assert all(m.reason in MALFORMED for m in parsed.malformed)
        assert all(call.name in REGISTRY.names() and isinstance(call.arguments, dict) for call in parsed.calls)

    check()


def test_a_well_formed_call_is_found_in_any_surrounding_text():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    plain = st.text(alphabet=st.characters(blacklist_characters="<"), max_size=40)

    @hypothesis.settings(max_examples=200, deadline=None)
    @hypothesis.given(plain, plain, st.integers(0, 10**6), st.sampled_from(CALL_FORMATS))
    def check(before, after, n, call_format):
        call = ToolCall("calculator", {"expression": f"{n}*7"})
        parsed = parse_turn(before + render_call(call, call_format) + after, REGISTRY, call_format)
        assert parsed.calls == [call] and parsed.malformed == []
        assert parsed.answer == (before + after).strip()

    check()


# ---- thinking across calls -------------------------------------------------------------------


def trajectory():
    return [Turn(MODEL_TURN, [], text="<think>a</think><tool_call>calculator: 1+1</tool_call>"),
            Turn(ENVIRONMENT_TURN, [], text="<tool_result><think>tool text</think>2</tool_result>\n"),
            Turn(MODEL_TURN, [], text="<think>b</think><tool_call>calculator: 2*3</tool_call>"),
            Turn(ENVIRONMENT_TURN, [], text="<tool_result>6</tool_result>\n")]


def test_context_for_next_turn_under_each_policy():
    turns, prompt = trajectory(), "Q: x\n"
    tool_1, tool_2 = turns[1].text, turns[3].text  # an environment turn is never edited, <think> or not
    assert context_for_next_turn(prompt, turns) == prompt + "".join(t.text for t in turns)  # keep_all
    assert context_for_next_turn(prompt, turns, "keep_last") == (
        prompt + "<tool_call>calculator: 1+1</tool_call>" + tool_1 + turns[2].text + tool_2)
    assert context_for_next_turn(prompt, turns, "drop") == (
        prompt + "<tool_call>calculator: 1+1</tool_call>" + tool_1 + "<tool_call>calculator: 2*3</tool_call>" + tool_2)
    assert context_for_next_turn(prompt, []) == prompt
    assert strip_thinking("a<think>b</think>c<think>d") == "ac"
    with pytest.raises(ValueError, match="thinking policy must be one of"):
        context_for_next_turn(prompt, turns, "keep_first")


def test_keep_all_is_one_row_and_the_others_one_row_per_model_turn():
    turns, prompt = trajectory(), "Q: x\n"
    (row,) = training_rows(prompt, turns)
    assert row == TrainingRow(prompt, turns)
    for policy in ("keep_last", "drop"):
        rows = training_rows(prompt, turns, policy)
        assert [r.turns for r in rows] == [[turns[0]], [turns[2]]]
        assert rows[0].context == prompt  # nothing to strip before the first turn
        assert rows[1].context == context_for_next_turn(prompt, turns[:2], policy)
    # why the split: turn 2 as sampled (its context + its own text, thinking included) is a
    # prefix of the context turn 4 is sampled in under keep_all, and is not under keep_last or drop
    for policy in ("keep_all", "keep_last", "drop"):
        as_sampled = context_for_next_turn(prompt, turns[:2], policy) + turns[2].text
        assert context_for_next_turn(prompt, turns, policy).startswith(as_sampled) == (policy == "keep_all")


def test_smollm2_template_keeps_earlier_thinking():
    transformers = pytest.importorskip("transformers")
    from posttrain.models import smollm2

    cache = smollm2.default_cache_dir()
    if not (cache / "tokenizer.json").is_file():
        pytest.skip("SmolLM2 is not converted on this machine (posttrain.models.smollm2.convert_smollm2)")
    check = template_keeps_thinking(transformers.AutoTokenizer.from_pretrained(cache, local_files_only=True))
    assert check.kept and "<think>th1nk1ng-marker-7c2f</think>The answer is 4." in check.rendered


# Qwen3's rule in a few lines of jinja: an assistant turn before the last user turn loses its thinking
STRIPPING_TEMPLATE = (
    "{% set ns = namespace(last_user=0) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'assistant' and loop.index0 < ns.last_user %}"
    "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def char_hf_tokenizer(tmp_path, template):
    transformers = pytest.importorskip("transformers")
    from posttrain.models.tokenizer import CharTokenizer

    CharTokenizer().save(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    tokenizer.chat_template = template
    return tokenizer


def test_a_template_that_strips_thinking_is_caught(tmp_path):
    check = template_keeps_thinking(char_hf_tokenizer(tmp_path, STRIPPING_TEMPLATE))
    assert not check.kept and "strips <think>" in check.message
    assert "<|assistant|>The answer is 4.<|user|>" in check.rendered and "th1nk1ng" not in check.rendered
    plain = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    assert template_keeps_thinking(char_hf_tokenizer(tmp_path, plain)).kept
    dropping = "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}{% endfor %}"
    assert "whole earlier assistant turn" in template_keeps_thinking(char_hf_tokenizer(tmp_path, dropping)).message
    with pytest.raises(ValueError, match="failed to render"):
        template_keeps_thinking(char_hf_tokenizer(tmp_path, "{{ messages[9].content }}"))
    with pytest.raises(ValueError, match="has no chat template"):
        template_keeps_thinking(char_hf_tokenizer(tmp_path, None))


def test_json_calls_survive_a_round_trip_through_json_dumps_of_unicode():
    call = ToolCall("search", {"query": "ünïcode \"quoted\" \n newline", "k": 2})
    text = render_call(call, "json")
    assert json.loads(text.split("\n")[1])["arguments"] == call.arguments
    assert calls(text).calls == [call]
