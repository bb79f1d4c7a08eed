"""math/boxed-or-final-v1: golden equivalences through math-verify, extraction rules,
the scorer contract (total, explainable), and the time limit (a pathological answer
ends in "timeout" within its bound, from any thread)."""

import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("math_verify")

from posttrain.verifiers import math_worker
from posttrain.verifiers.math_answer import MAX_ANSWER_CHARS, REASONS, SPECS, MathAnswerSpec, extract_answer, score
from posttrain.types import Example


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
    ("0.1", "\\boxed{10\\%}"),
]

# (expected, completion, reason)
NOT_EQUIVALENT = [
    ("\\frac{1}{2}", "\\boxed{0.6}", "wrong_answer"),
    ("-3", "\\boxed{3}", "wrong_answer"),
    ("\\pi", "\\boxed{3.14159}", "wrong_answer"),  # fewer digits than its rounding
    ("[0, 1]", "\\boxed{(0,1)}", "wrong_answer"),  # closed vs open interval
    ("4", "\\boxed{3, 4}", "wrong_answer"),  # a set of guesses is not the answer
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


@pytest.mark.parametrize("expected,completion", EQUIVALENT)
def test_golden_equivalences(expected, completion):
    result = score(ex(expected), completion)
    assert result["details"]["reason"] == "ok", result
    assert result["reward"] == 1.0
    assert result["details"]["format_ok"] is True


@pytest.mark.parametrize("expected,completion,reason", NOT_EQUIVALENT)
def test_non_equivalences_and_format_failures(expected, completion, reason):
    result = score(ex(expected), completion)
    assert result["details"]["reason"] == reason, result
    assert result["reward"] == (1.0 if reason == "ok" else 0.0)


def test_extraction_handles_escaped_and_nested_braces():
    assert extract_answer("x \\boxed{\\{1, \\frac{a}{b}\\}} y") == ("ok", "\\{1, \\frac{a}{b}\\}", "boxed")
    assert extract_answer("  Final: $-7$ \nthanks")[1] == "-7"  # rest of the LAST Final line
    assert extract_answer("\\boxed 5") == ("no_answer", None, None)  # no brace: not a box


def test_details_explain_the_result():
    d = score(ex("\\frac{1}{2}"), "\\boxed{0.5}")["details"]
    assert d["parsed"] == "0.5" and d["answer_source"] == "boxed"
    assert d["answer_math"] == "1/2" and d["expected_math"] == "1/2"
    assert d["spec_version"] == "math/boxed-or-final-v1" and d["worker"] == "process"
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
    spec = SPECS["math/boxed-or-final-v1"]
    assert spec.check_example(ex("\\frac{1}{2}")) is None
    assert "expected_answer is empty" in spec.check_example(ex("  \n"))


# Text that reaches math-verify: random answers inside a box or on a Final line.
pieces = st.sampled_from(list("0123456789+-*/^()[]{}\\,.xπ $ \n\x00\udc80") + ["\\frac", "\\sqrt", "\\pi", "\\{"])
answers = st.lists(pieces, max_size=20).map("".join)
completions = st.one_of(
    st.text(max_size=60),
    answers.map(lambda a: "\\boxed{" + a + "}"),
    answers.map(lambda a: "Work.\nFinal: " + a),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completion=completions)
def test_total_on_any_str(completion):
    result = score(ex("\\frac{1}{2}"), completion)
    assert result["reward"] in (0.0, 1.0)
    assert result["details"]["reason"] in REASONS
    assert (result["reward"] == 1.0) == (result["details"]["reason"] == "ok")


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


def test_only_one_spec_and_unknown_versions_fail_clearly():
    assert list(SPECS) == ["math/boxed-or-final-v1"]
    with pytest.raises(ValueError, match="unknown spec_version"):
        score(ex("1"), "\\boxed{1}", spec_version="math/v0")
