"""math/boxed-or-final-v1 and -v2: golden equivalences through math-verify (under both),
extraction rules, the scorer contract (total, explainable), the time limit (a pathological
answer ends in "timeout" within its bound, from any thread), and v2's refusals: each wrong
answer v1 credits (asserted, so v1 stays as old runs scored it) is refused by v2 with its
reason, while right answers of every kind still pay."""

import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("math_verify")

from posttrain.verifiers import math_worker
from posttrain.verifiers.math_answer import (DEFAULT_SPEC, MAX_ANSWER_CHARS, REASONS, SPECS, MathAnswerSpec,
                                             extract_answer, relations, score)
from posttrain.types import Example


V1, V2 = "math/boxed-or-final-v1", "math/boxed-or-final-v2"


def ex(expected: str) -> Example:
    return Example(prompt="Solve.", expected_answer=expected)


# (expected, completion): math-verify must call these equal.
EQUIVALENT = [
    ("\\frac{1}{2}", "\\boxed{0.5}"),
    ("\\frac{1}{2}", "\\boxed{1/2}"),
    ("0.5", "Final: \\frac{1}{2}"),
    ("\\frac{3}{4}", "\\boxed{\\dfrac{3}{4}}"),
    ("0.75", "The answer is $\\boxed{\\frac34}$."),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
    ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\frac{1}{\\sqrt{2}}}"),
    ("\\pi", "\\boxed{\\pi}"),
    ("2\\pi", "Final: $2\\pi$"),
    ("-3", "\\boxed{-3}"),
    ("-\\frac{1}{3}", "Final: -1/3"),
    ("1024", "\\boxed{2^{10}}"),
    ("1000", "\\boxed{1,000}"),
    ("\\{1, 2\\}", "\\boxed{\\{2, 1\\}}"),
    ("(0, 1]", "\\boxed{(0,1]}"),
    ("x = 2", "\\boxed{2}"),
    ("(x+1)^2", "\\boxed{x^2+2x+1}"),
    ("\\frac{1}{1+\\frac{1}{2}}", "\\boxed{\\frac{2}{3}}"),  # nested braces in the gold
    ("\\frac{2}{3}", "so \\boxed{\\frac{1}{1+\\frac{1}{2}}} is it"),  # nested in the box
    ("5", "We add: 2+3=5.\nFinal: 5."),  # trailing period dropped
    ("5", "First \\boxed{4}, no wait: \\boxed{5}"),  # the last box counts
    ("5", "\\boxed{4}\nFinal: 5"),  # the Final line comes later, so it counts
    ("5", "Final: 4\nActually \\boxed {5}"),  # space before the brace
]

# (expected, completion, reason)
NOT_EQUIVALENT = [
    ("\\frac{1}{2}", "\\boxed{0.6}", "wrong_answer"),
    ("-3", "\\boxed{3}", "wrong_answer"),
    ("\\pi", "\\boxed{3.14159}", "wrong_answer"),  # fewer digits than its rounding
    ("[0, 1]", "\\boxed{(0,1)}", "wrong_answer"),  # closed vs open interval
    ("4", "\\boxed{3, 4}", "wrong_answer"),  # a set of guesses is not the answer (v2: set_for_scalar)
    ("5", "\\boxed{5}\nFinal: 4", "wrong_answer"),  # the later answer counts
    ("\\sqrt{2}", "\\boxed{2}", "wrong_answer"),
    ("5", "The answer is 5.", "no_answer"),
    ("5", "final: 5", "no_answer"),  # the prefix is case-sensitive
    ("5", "   \n\t", "empty"),
    ("5", "\\boxed{}", "empty_answer"),
    ("5", "Final:   ", "empty_answer"),
    ("5", "\\boxed{5", "unclosed_box"),
    ("5", "\\boxed{" + "1" * (MAX_ANSWER_CHARS + 5) + "}", "answer_too_long"),
    ("5", "\\boxed{" + "{" * 12 + "5" + "}" * 12 + "}", "nesting_too_deep"),
    ("5", "\\boxed{5.}", "ok"),  # (not a failure: '5.' is 5 after the period is dropped)
]


@pytest.mark.parametrize("version", [V1, V2])
@pytest.mark.parametrize("expected,completion", EQUIVALENT)
def test_golden_equivalences(expected, completion, version):
    result = score(ex(expected), completion, version)
    assert result["details"]["reason"] == "ok", result
    assert result["reward"] == 1.0
    assert result["details"]["format_ok"] is True


@pytest.mark.parametrize("version", [V1, V2])
@pytest.mark.parametrize("expected,completion,reason", NOT_EQUIVALENT)
def test_non_equivalences_and_format_failures(expected, completion, reason, version):
    if version == V2 and completion == "\\boxed{3, 4}":
        reason = "set_for_scalar"  # the same 0.0, now with the reason that says why
    result = score(ex(expected), completion, version)
    assert result["details"]["reason"] == reason, result
    assert result["reward"] == (1.0 if reason == "ok" else 0.0)


# --- v2: what math-verify cannot judge is refused -----------------------------------------

# (expected, answer in a box, v2's reason, the sign it names, v1's reward): the four
# first, then their neighbours. v1's 1.0s are wrong answers it pays for (or, for '10\\%' as
# 0.1, a right one v2 gives up so that '4\\%' never pays for 4).
REFUSED = [
    ("4", "5 = 4", "relation_not_expected", "=", 1.0),  # math-verify reads the right-hand side
    ("4", "4\\%", "percent_not_expected", "%", 1.0),  # 0.04, which math-verify also takes for 4
    ("4", "4 \\approx 5", "relation_unjudged", "\\approx", 1.0),  # it drops what follows the ≈
    ("4", "\\{4\\}", "set_for_scalar", None, 1.0),  # the module docstring: a set is not 4
    ("4", "4 = 4", "relation_not_expected", "=", 1.0),  # true, but say the value
    ("4", "x = 4", "relation_not_expected", "=", 1.0),
    ("4", "4 \\le 5", "relation_not_expected", "\\le", 0.0),
    ("4", "5 > 4", "relation_not_expected", ">", 0.0),
    ("4", "4 \\neq 5", "relation_not_expected", "\\neq", 0.0),
    ("4", "4 ≈ 5", "relation_unjudged", "≈", 1.0),
    ("4", "4 \\approx 4.0", "relation_unjudged", "\\approx", 1.0),
    ("4", "5 \\to 4", "relation_unjudged", "\\to", 1.0),
    ("4", "5 := 4", "relation_unjudged", ":=", 1.0),
    ("4", "5 \\Rightarrow 4", "relation_unjudged", "\\Rightarrow", 1.0),
    ("[0, 1]", "5 \\in [0,1]", "relation_unjudged", "\\in", 0.0),
    ("x = 4", "x = 5 = 4", "relation_not_expected", "=", 1.0),  # one '=' more than expected
    ("x = 2", "2 \\approx 5", "relation_unjudged", "\\approx", 1.0),  # whatever is expected
    ("4", "4%", "percent_not_expected", "%", 1.0),
    ("4", "4 \\text{ percent}", "percent_not_expected", "percent", 1.0),
    ("0.04", "4\\%", "percent_not_expected", "%", 1.0),
    ("0.1", "10\\%", "percent_not_expected", "%", 1.0),  # right, and refused: see above
    ("4", "4, 4", "set_for_scalar", None, 1.0),  # math-verify: the set {4}
    ("4", "[4,4]", "set_for_scalar", None, 1.0),
    ("4", "\\{4\\} \\cup \\{4\\}", "set_for_scalar", None, 1.0),
    ("4", "(4, 4)", "set_for_scalar", None, 0.0),  # a tuple
    ("\\{4\\}", "4", "scalar_for_set", None, 1.0),  # and the other way round
    ("[0, 1]", "1", "scalar_for_set", None, 0.0),
]


@pytest.mark.parametrize("expected,answer,reason,sign,v1_reward", REFUSED)
def test_v2_refuses_what_math_verify_cannot_judge(expected, answer, reason, sign, v1_reward):
    result = score(ex(expected), f"so \\boxed{{{answer}}}.", V2)
    assert (result["reward"], result["details"]["reason"]) == (0.0, reason), result
    assert result["details"]["refused_symbol"] == sign
    assert result["details"]["format_ok"] is True and result["details"]["parsed"] == answer
    # text refusals come before any sympy; kind refusals say what math-verify parsed
    assert result["details"]["worker"] is (None if sign else "process")


@pytest.mark.parametrize("expected,answer,reason,sign,v1_reward", REFUSED)
def test_v1_is_unchanged_and_credits_what_v2_refuses(expected, answer, reason, sign, v1_reward):
    result = score(ex(expected), f"so \\boxed{{{answer}}}.", V1)
    assert result["reward"] == v1_reward, result
    assert set(result["details"]) == {"reason", "parsed", "expected", "answer_source", "format_ok", "answer_math",
                                      "expected_math", "worker", "error", "spec_version"}  # v1's details, as before


# (expected, answer, expected_kind, answer_kind): right answers v2 still pays, of every kind
PAID = [
    ("\\frac{1}{2}", "\\frac12", "scalar", "scalar"),
    ("\\frac{1}{2}", "0.5", "scalar", "scalar"),
    ("\\sqrt{8}", "2\\sqrt2", "scalar", "scalar"),
    ("4", "\\left(4\\right)", "scalar", "scalar"),  # '\\left' is not '\\le'
    ("4", "4 \\text{ cm}", "scalar", "scalar"),  # units other than %: math-verify's rule
    ("\\infty", "\\infty", "scalar", "scalar"),  # '\\infty' is not '\\in'
    ("\\{1, 2\\}", "\\{2, 1\\}", "set", "set"),
    ("\\{1, 2\\}", "1, 2", "set", "set"),
    ("\\{4\\}", "\\{4\\}", "set", "set"),
    ("(0, 1]", "(0,1]", "set", "set"),
    ("x = 2", "x=2", "relation", "relation"),
    ("x = 2", "2 = x", "relation", "relation"),
    ("x = 2", "2", "relation", "scalar"),  # the equation names a value; the value pays
    ("x < 2", "2 > x", "relation", "relation"),  # one relation, sides swapped
    ("x < 2", "(-\\infty, 2)", "relation", "set"),
    ("x \\le 2", "x \\leq 2", "relation", "relation"),
    ("x=2, y=3", "y=3, x=2", "set", "set"),
    ("10\\%", "10\\%", "scalar", "scalar"),  # an expected percentage takes math-verify's rule:
    ("10\\%", "10", "scalar", "scalar"),
    ("10\\%", "0.1", "scalar", "scalar"),
]


@pytest.mark.parametrize("expected,answer,expected_kind,answer_kind", PAID)
def test_v2_still_pays_right_answers_of_every_kind(expected, answer, expected_kind, answer_kind):
    result = score(ex(expected), f"\\boxed{{{answer}}}", V2)
    assert (result["reward"], result["details"]["reason"]) == (1.0, "ok"), result
    d = result["details"]
    assert (d["expected_kind"], d["answer_kind"], d["refused_symbol"]) == (expected_kind, answer_kind, None)


def test_v2_still_says_wrong_answer_for_a_wrong_answer_of_the_right_kind():
    for expected, answer in (("x < 2", "x > 2"), ("x = 2", "x = 3"), ("x = 2", "2 = 3"), ("\\{1, 2\\}", "\\{1, 3\\}"),
                             ("10\\%", "0.1\\%"), ("4", "5")):
        assert score(ex(expected), f"\\boxed{{{answer}}}", V2)["details"]["reason"] == "wrong_answer", (expected, answer)


def test_relations_are_whole_signs_and_commands():
    # a command is read whole: '\\left' is not '\\le', '\\infty' and '\\int' are not '\\in'
    assert relations("\\left( x \\right) \\infty \\int_0^1 \\neq") == ([("\\neq", "≠")], [])
    assert relations("a := b \\leq c > d \\not= e") == ([("\\leq", "≤"), (">", "<"), ("=", "=")], [":=", "\\not"])
    assert relations("\\frac{1}{2}") == ([], [])


def test_extraction_handles_escaped_and_nested_braces():
    assert extract_answer("x \\boxed{\\{1, \\frac{a}{b}\\}} y") == ("ok", "\\{1, \\frac{a}{b}\\}", "boxed")
    assert extract_answer("  Final: $-7$ \nthanks")[1] == "-7"  # rest of the LAST Final line
    assert extract_answer("\\boxed 5") == ("no_answer", None, None)  # no brace: not a box


def test_details_explain_the_result():
    d = score(ex("\\frac{1}{2}"), "\\boxed{0.5}")["details"]
    assert d["parsed"] == "0.5" and d["answer_source"] == "boxed"
    assert d["answer_math"] == "1/2" and d["expected_math"] == "1/2"
    assert d["spec_version"] == V2 and d["worker"] == "process"  # v2 is the default
    assert (d["expected_kind"], d["answer_kind"], d["refused_symbol"]) == ("scalar", "scalar", None)
    assert set(REASONS) >= {"ok", "wrong_answer", "no_answer", "unparsable", "timeout"}


def test_expected_answer_math_verify_cannot_read_is_reported_not_raised():
    result = score(ex("}"), "\\boxed{5}")
    assert result["details"]["reason"] == "expected_unparsable"
    assert result["reward"] == 0.0


def test_deterministic():
    first = score(ex("\\sqrt{8}"), "\\boxed{2\\sqrt{2}}")
    assert all(score(ex("\\sqrt{8}"), "\\boxed{2\\sqrt{2}}") == first for _ in range(3))


def test_megabyte_completion_is_fast():
    huge = "\\boxed{" + "9" * 1_000_000  # unclosed, and far too long
    start = time.monotonic()
    assert score(ex("5"), huge)["details"]["reason"] == "answer_too_long"
    assert score(ex("5"), "x" * 1_000_000 + "\nFinal: 5")["details"]["reason"] == "ok"
    assert score(ex("5"), "{" * 1_000_000)["details"]["reason"] == "no_answer"
    assert time.monotonic() - start < 1.0


def test_a_non_str_completion_scores_zero_and_says_decode_it():
    # once a TypeError; the contract now forbids raising, so the caller learns it from the reason
    result = score(ex("5"), b"\\boxed{5}")
    assert (result["reward"], result["details"]["reason"]) == (0.0, "not_text")
    assert "decode the tokens" in result["details"]["error"]
    assert result["details"]["worker"] is None  # refused before any math-verify work


def test_an_int_expected_answer_scores_as_its_string():
    assert score({"prompt": "2+2?", "expected_answer": 4}, "\\boxed{4}")["reward"] == 1.0
    assert score({"prompt": "2+2?", "expected_answer": 4}, "\\boxed{2^2}")["details"]["expected"] == "4"
    assert score({"prompt": "2+2?", "expected_answer": -4}, "Final: 4")["details"]["reason"] == "wrong_answer"


def test_check_example_refuses_only_an_empty_expected_answer():
    for spec in SPECS.values():
        assert spec.check_example(ex("\\frac{1}{2}")) is None
        assert "expected_answer is empty" in spec.check_example(ex("  \n"))


# Text that reaches math-verify: random answers inside a box or on a Final line.
pieces = st.sampled_from(list("0123456789+-*/^()[]{}\\,.xπ $ \n\x00\udc80=<%≈") + ["\\frac", "\\sqrt", "\\pi", "\\{",
                                                                                 "\\le", "\\approx", "\\%"])
answers = st.lists(pieces, max_size=20).map("".join)
completions = st.one_of(
    st.text(max_size=60),
    answers.map(lambda a: "\\boxed{" + a + "}"),
    answers.map(lambda a: "Work.\nFinal: " + a),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completion=completions, expected=st.sampled_from(["\\frac{1}{2}", "x = 2", "\\{1, 2\\}", "10\\%"]))
def test_total_on_any_str_and_v2_never_pays_what_v1_does_not(completion, expected):
    results = {version: score(ex(expected), completion, version) for version in (V1, V2)}
    for result in results.values():
        assert result["reward"] in (0.0, 1.0)
        assert result["details"]["reason"] in REASONS
        assert (result["reward"] == 1.0) == (result["details"]["reason"] == "ok")
    assert results[V2]["reward"] <= results[V1]["reward"]  # v2 is v1 with refusals, nothing more


# --- the time limit ---------------------------------------------------------------------

PATHOLOGICAL = "\\boxed{9^{9^{9^{9}}}}"  # a number with ~10^8 digits: sympy never finishes


def test_timeout_ends_within_its_bound_and_says_timeout():
    spec = MathAnswerSpec(timeout_seconds=1.0)
    score(ex("1"), "\\boxed{1}")  # make sure the worker is up: startup is not the deadline
    start = time.monotonic()
    result = spec(ex("1"), PATHOLOGICAL)
    elapsed = time.monotonic() - start
    assert result["details"]["reason"] == "timeout" and result["reward"] == 0.0
    assert elapsed < 2.0, elapsed  # 1 s deadline + killing and reaping the worker
    # the next call gets a fresh worker and a normal answer
    assert spec(ex("1/2"), "\\boxed{0.5}")["details"]["reason"] == "ok"


def test_works_from_a_non_main_thread():
    results = []

    def run():
        results.append(score(ex("\\frac{1}{2}"), "\\boxed{0.5}"))
        results.append(MathAnswerSpec(timeout_seconds=1.0)(ex("1"), PATHOLOGICAL))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert [r["details"]["reason"] for r in results] == ["ok", "timeout"]


def test_thread_fallback_when_no_worker_can_start(monkeypatch):
    worker = math_worker._Worker()
    worker.unavailable = "simulated: subprocesses are not allowed here"
    monkeypatch.setattr(math_worker, "_WORKER", worker)
    result = score(ex("\\frac{1}{2}"), "\\boxed{0.5}")
    assert result["details"]["reason"] == "ok" and result["details"]["worker"] == "thread"

    def slow_compare(expected, answer):  # stands in for a runaway sympy call, without the CPU
        time.sleep(1.5)
        return {"status": "ok", "equal": True}

    monkeypatch.setattr(math_worker, "compare", slow_compare)
    start = time.monotonic()
    result = MathAnswerSpec(timeout_seconds=0.3)(ex("5"), "\\boxed{5}")
    assert result["details"]["reason"] == "timeout" and time.monotonic() - start < 1.0


def test_both_specs_are_registered_v2_is_the_default_and_unknown_versions_fail_clearly():
    assert list(SPECS) == [V1, V2] and DEFAULT_SPEC == V2
    assert score(ex("4"), "\\boxed{5 = 4}")["details"]["spec_version"] == V2
    with pytest.raises(ValueError, match="unknown spec_version"):
        score(ex("1"), "\\boxed{1}", spec_version="math/v0")
