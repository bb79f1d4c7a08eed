"""The `Final: <int>` specs: golden cases, exploits, and the scorer contract (total,
deterministic, explainable, fast)."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.verifiers.final_int import HONEST_SPECS, REASONS, SPECS, format_ok, get_spec, parse_final_line, score
from posttrain.types import Example

E323 = Example(prompt="Compute 17*19.\n", expected_answer="323")

# (completion, reward, reason) under BOTH honest specs, expected answer "323".
# A one-line completion means the same thing to strict-v1 and cot-v1.
GOLDEN_BOTH = [
    ("Final: 323", 1.0, "ok"),
    ("  Final: 323\n\n", 1.0, "ok"),  # surrounding whitespace is trimmed
    ("\tFinal: 323 \r\n", 1.0, "ok"),
    ("Final: 324", 0.0, "wrong_answer"),
    ("Final: -323", 0.0, "wrong_answer"),
    ("Final:  323", 0.0, "bad_spacing"),  # double space
    ("Final:323", 0.0, "bad_spacing"),
    ("Final:\t323", 0.0, "bad_spacing"),
    ("Final: 0323", 0.0, "leading_zero"),
    ("Final: -0", 0.0, "negative_zero"),
    ("Final: +323", 0.0, "plus_sign"),
    ("Final: 323.", 0.0, "extra_text"),  # trailing period
    ("Final: 323 apples", 0.0, "extra_text"),
    ("Final: 3,23", 0.0, "malformed_int"),
    ("Final: 3.5", 0.0, "malformed_int"),
    ("Final: three hundred", 0.0, "malformed_int"),
    ("Final: \u2212323", 0.0, "malformed_int"),  # Unicode minus sign lookalike
    ("Final: \u0663\u0662\u0663", 0.0, "malformed_int"),  # Arabic-Indic digits: not ASCII
    ("Final:\u00a0323", 0.0, "bad_spacing"),  # a non-breaking space is not a space
    ("Final:", 0.0, "missing_int"),
    ("final: 323", 0.0, "no_final_line"),  # the prefix is case-sensitive
    ("323", 0.0, "no_final_line"),
    ("The answer is 323.", 0.0, "no_final_line"),
    ("", 0.0, "empty"),
    (" \n\t ", 0.0, "empty"),
    ("Final: 323\nFinal: 323", 0.0, "multiple_final_lines"),  # repeated, even if right
    ("Final: 100\nFinal: 323", 0.0, "multiple_final_lines"),  # answer laundering
]

# Cases where the two honest specs disagree: (completion, strict-v1, cot-v1).
GOLDEN_SPLIT = [
    ("17*19=323\nFinal: 323", (0.0, "extra_lines"), (1.0, "ok")),  # CoT, Final last
    ("17*19=323\nFinal: 322", (0.0, "extra_lines"), (0.0, "wrong_answer")),
    ("Final: 323\nbecause 17*19=323", (0.0, "extra_lines"), (0.0, "final_not_last")),
    ("Final:\n323", (0.0, "extra_lines"), (0.0, "final_not_last")),
    ("step one\nstep two\n323", (0.0, "no_final_line"), (0.0, "no_final_line")),
    ("a\nFinal: 1\nb\nFinal: 323", (0.0, "multiple_final_lines"), (0.0, "multiple_final_lines")),
]


@pytest.mark.parametrize("version", HONEST_SPECS)
@pytest.mark.parametrize("completion,reward,reason", GOLDEN_BOTH)
def test_golden_cases_both_honest_specs(version, completion, reward, reason):
    result = score(E323, completion, version)
    assert (result["reward"], result["details"]["reason"]) == (reward, reason)
    assert result["details"]["spec_version"] == version
    # parsed is the compared integer exactly when the format held
    assert (result["details"]["parsed"] is not None) == result["details"]["format_ok"]
    assert result["details"]["format_ok"] == (reason in ("ok", "wrong_answer"))


@pytest.mark.parametrize("completion,strict,cot", GOLDEN_SPLIT)
def test_golden_cases_where_strict_and_cot_differ(completion, strict, cot):
    for version, (reward, reason) in zip(HONEST_SPECS, (strict, cot)):
        result = score(E323, completion, version)
        assert (result["reward"], result["details"]["reason"]) == (reward, reason), version


def test_details_carry_parsed_and_expected_answers():
    details = score(E323, "Final: 322", "final_int/strict-v1")["details"]
    assert details == {
        "reason": "wrong_answer",
        "parsed": "322",
        "expected": "323",
        "format_ok": True,
        "spec_version": "final_int/strict-v1",
    }


def test_expected_answer_is_trimmed_but_otherwise_compared_exactly():
    padded = Example(prompt="", expected_answer="  323\n")
    assert score(padded, "Final: 323", "final_int/strict-v1")["reward"] == 1.0
    # The scorer compares strings: it does not "fix" a non-canonical expected answer.
    zero_padded = Example(prompt="", expected_answer="0323")
    assert score(zero_padded, "Final: 323", "final_int/strict-v1")["reward"] == 0.0


@pytest.mark.parametrize("number", ["0", "7", "-7", "10", "-100", "123456789012345678901234567890"])
def test_every_canonical_integer_is_accepted(number):
    assert parse_final_line(f"Final: {number}") == ("ok", number)


def test_format_ok_is_independent_of_correctness():
    assert format_ok("Final: 1", "final_int/strict-v1")  # wrong for 323, but well formed
    assert not format_ok("Final: 0323", "final_int/strict-v1")
    assert format_ok("1+1=2\nFinal: 2", "final_int/cot-v1")
    assert not format_ok("1+1=2\nFinal: 2", "final_int/strict-v1")


def test_unknown_spec_version_lists_the_valid_ones():
    with pytest.raises(ValueError, match="final_int/strict-v2.*final_int/strict-v1"):
        get_spec("final_int/strict-v2")


def test_a_non_string_completion_scores_zero_and_says_decode_it():
    # once a TypeError; the contract now forbids raising, so the caller learns it from the reason
    result = score(E323, [3, 2, 3], "final_int/strict-v1")
    assert (result["reward"], result["details"]["reason"]) == (0.0, "not_text")
    assert "must be a str" in result["details"]["error"] and "decode the tokens" in result["details"]["error"]
    assert result["details"]["parsed"] is None and result["details"]["format_ok"] is False
    assert not format_ok([3, 2, 3], "final_int/strict-v1")


def test_the_default_spec_is_cot_v1_and_is_recorded():
    assert score(E323, "17*19=323\nFinal: 323")["details"]["spec_version"] == "final_int/cot-v1"
    assert score(E323, "17*19=323\nFinal: 323")["reward"] == 1.0  # strict-v1 would give 0 (extra_lines)
    assert format_ok("17*19=323\nFinal: 1")


@pytest.mark.parametrize("expected,refused", [
    ("323", False), (" -7\n", False), ("0", False), ("0323", True), ("3.5", True), ("ten", True), ("", True),
    ("+5", True), ("-0", True), ("3 apples", True), ("1,000", True), ("\u0663", True),
])
def test_check_example_refuses_expected_answers_no_completion_can_match(expected, refused):
    for version in SPECS:
        found = get_spec(version).check_example(Example("Q", expected))
        if refused:
            assert f"expected_answer {expected.strip()!r} is not a canonical integer" in found
            assert "write it like 323 or -7" in found
        else:
            assert found is None


# --- the deliberately hackable variants -----------------------------------------------

E25 = Example(prompt="Q: 7+5+9+3+1\n", expected_answer="25")
EXPLOITS = {
    # enumerating numbers contains every answer from 0 to 99
    "hackable/substring": " ".join(str(i) for i in range(100)),
    # a wrong stated answer, the right number mentioned last
    "hackable/last-number": "Final: 24 (or 25)",
    # off-format, non-integer answer in the wrong case
    "hackable/case-insensitive-prefix": "FINAL:25.9 apples, roughly",
    # one line per candidate answer
    "hackable/multi-final": "\n".join(f"Final: {i}" for i in range(100)),
}


def test_every_hackable_spec_has_an_exploit_test():
    hackable = {version for version in SPECS if version.startswith("hackable/")}
    assert hackable == set(EXPLOITS)


@pytest.mark.parametrize("version,exploit", EXPLOITS.items())
def test_exploit_scores_1_on_its_hackable_spec_and_0_on_honest_specs(version, exploit):
    assert score(E25, exploit, version)["reward"] == 1.0
    assert version.split("/")[1] in get_spec(version).__doc__  # the docstring names itself
    for honest in HONEST_SPECS:
        assert score(E25, exploit, honest)["reward"] == 0.0, honest


@pytest.mark.parametrize("version", [v for v in SPECS if v.startswith("hackable/")])
def test_hackable_specs_still_reward_an_in_spec_answer_and_reject_wrong_ones(version):
    assert score(E25, "Final: 25", version)["reward"] == 1.0
    assert score(E25, "Final: 7", version)["reward"] == 0.0
    assert score(E25, "", version)["details"]["reason"] == "empty"


def test_last_number_reads_a_sign_and_the_whole_final_integer():
    spec = get_spec("hackable/last-number")
    assert spec.extract("x 12 y -345 z") == ("ok", "-345")
    assert spec.extract("no digits here") == ("no_integer", None)


# --- the contract: total, deterministic, explainable, fast --------------------------------

# Text built to hit the parser's edges: near-miss fragments, surrogates, NUL, odd spaces.
fragments = st.sampled_from(
    ["Final:", "Final: ", "final:", "FINAL:", "-", "+", "0", "25", "\n", "\r", " ", "\t",
     ".", ",", "\x00", "\ud800", "\u00a0", "\u2212", "\u0663", "İ", "Final: 25", "\n\nFinal:"]
)
texts = st.one_of(st.text(), st.lists(st.one_of(fragments, st.text(max_size=3))).map("".join))
answers = st.one_of(st.just("25"), st.integers(-1000, 1000).map(str), st.text(max_size=5))


@pytest.mark.parametrize("version", list(SPECS))
@settings(max_examples=300, deadline=None)
@given(completion=texts, expected=answers)
def test_every_spec_is_total_deterministic_and_explained(version, completion, expected):
    example = Example(prompt="Q: 7+5+9+3+1\n", expected_answer=expected)
    first = score(example, completion, version)
    assert first == score(example, completion, version)  # deterministic
    assert first["reward"] in (0.0, 1.0)
    assert first["details"]["reason"] in REASONS
    assert (first["reward"] == 1.0) == (first["details"]["reason"] == "ok")
    assert isinstance(format_ok(completion, version), bool)


@pytest.mark.parametrize("version", list(SPECS))
def test_a_megabyte_scores_in_linear_time(version):
    """A backtracking regex takes minutes on these inputs; a linear scan, milliseconds. The
    bound is loose on purpose (a loaded CI machine must not fail it); the 50 ms p99 target
    is measured by `make bench` (benchmarks/scorer_latency.py)."""
    megabyte = 1_000_000
    adversarial = [
        "Final: " + "1" * megabyte,  # one giant integer (int() would even refuse it)
        "Final:" + " " * megabyte + "25",  # whitespace runs are where regexes backtrack
        "Final: 25\n" * (megabyte // 10),  # many Final lines
        "\n" * megabyte,
        "1 " * (megabyte // 2),  # many numbers
        "\ud800" * megabyte,
    ]
    for text in adversarial:
        started = time.perf_counter()
        result = score(E25, text, version)
        elapsed = time.perf_counter() - started
        assert result["details"]["reason"] in REASONS
        assert elapsed < 1.0, f"{version} took {elapsed * 1000:.1f} ms on {text[:20]!r}..."
