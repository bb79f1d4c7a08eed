"""Your scorer tests (M4): copy to my_course/tests/test_rubric.py and run `pytest my_course/tests`.

Every test asserts the reward AND at least one key `details` field (here the reason code), so
the scorer stays explainable: a test that checks only the reward passes for the wrong reason
as happily as for the right one. Add your cases to CASES: correct ones, formatting edge cases
(whitespace, Unicode lookalikes, repeated Final lines, number formats) and ambiguous ones,
where the expected behaviour is "no reward" unless the spec says otherwise.
"""

import pytest

from posttrain.eval.packs import example_of, load_pack
from posttrain.verifiers import get_verifier

SPEC = "final_int/cot-v1"  # the spec under test: its version is part of every number it produces
score = get_verifier(SPEC)
EXAMPLE = {"prompt": "Compute 17*19. Output exactly one line: Final: <int>.", "expected_answer": "323"}

# (completion, reward, reason code): what the spec says each one gets, and why
CASES = [
    # correct, in spec
    ("Final: 323", 1.0, "ok"),
    ("17*19=323\nFinal: 323", 1.0, "ok"),  # cot-v1: worked steps, then the Final line last
    ("  Final: 323\n", 1.0, "ok"),  # surrounding whitespace is trimmed
    # format failures: the right number, outside the spec
    ("323", 0.0, "no_final_line"),
    ("The answer is 323.", 0.0, "no_final_line"),
    ("Final:  323", 0.0, "bad_spacing"),  # two spaces
    ("Final: 0323", 0.0, "leading_zero"),
    ("Final: 323.", 0.0, "extra_text"),
    # ambiguous: no reward, because the spec says so (and must say it in writing)
    ("Final: +323", 0.0, "plus_sign"),
    # answer laundering
    ("Final: 322\nFinal: 323", 0.0, "multiple_final_lines"),
    # YOUR CASES HERE
]


@pytest.mark.parametrize("completion, reward, reason", CASES)
def test_reward_and_reason(completion, reward, reason):
    result = score(EXAMPLE, completion)
    assert result["reward"] == reward
    assert result["details"]["reason"] == reason


def test_the_scorer_does_not_solve_the_problem():
    # a wrong expected answer is paid for: the scorer verifies against it, it never computes 17*19
    wrong_key = {**EXAMPLE, "expected_answer": "324"}
    assert score(wrong_key, "Final: 324")["reward"] == 1.0
    assert score(wrong_key, "Final: 323")["details"]["reason"] == "wrong_answer"


def test_the_golden_correct_set_scores_full_reward():
    # the anti-false-negative gate: every in-spec correct completion must get 1
    for record in load_pack("golden"):
        if SPEC in record["must_pass"]:
            result = score(example_of(record), record["completion"])
            assert result["reward"] == 1.0, (record["id"], result["details"])
