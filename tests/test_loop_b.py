"""Loop B: best-of-N checked on a case worked by hand, the tie-break, determinism, the
oracle identity BoN = pass@N, and a non-oracle selector that gets hacked."""

import json

import pytest

from posttrain.verifiers.final_int import get_spec
from posttrain.search.best_of_n import Candidate, PromptCandidates, best_of_n, load_candidates, pick_best, run_bon
from posttrain.eval.packs import pack_path
from posttrain.types import Example

COT = get_spec("final_int/cot-v1")


def group(pid, answer, pattern, ids=None):
    """One prompt whose candidates are right (1) or wrong (0) as in `pattern`."""
    example = Example(prompt=f"Q: {pid}\n", expected_answer=str(answer), id=pid)
    ids = ids or [f"c{j:02d}" for j in range(len(pattern))]
    texts = [f"Final: {answer if ok else answer + 1}" for ok in pattern]
    return PromptCandidates(example, tuple(Candidate(i, t) for i, t in zip(ids, texts)))


# 3 prompts x 4 candidates:  p1 = 0 1 0 1 (c=2),  p2 = 1 1 1 1 (c=4),  p3 = 0 0 0 0 (c=0)
TINY = [group("p1", 7, [0, 1, 0, 1]), group("p2", 12, [1, 1, 1, 1]), group("p3", 30, [0, 0, 0, 0])]


def test_hand_worked_metrics():
    result = best_of_n(TINY, COT, n=4)
    s = result["summary"]
    assert s["pass@1_first_sample"] == pytest.approx(1 / 3)  # only p2's first candidate is right
    # pass@1 unbiased = mean(c/n) = (2/4 + 4/4 + 0/4) / 3
    assert s["pass@k"][1] == pytest.approx(0.5)
    # pass@2: p1 = 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6; p2 = 1; p3 = 0
    assert s["pass@k"][2] == pytest.approx((5 / 6 + 1) / 3)
    # pass@3: p1 = 1 - C(2,3)/C(4,3) = 1 (only 2 wrong ones, so any 3 include a right one)
    assert s["pass@k"][3] == pytest.approx(2 / 3)
    assert s["pass@k"][4] == pytest.approx(2 / 3)
    assert s["bon_pass_rate"] == pytest.approx(2 / 3)  # oracle: BoN == pass@N
    assert s["selection_is_oracle"] is True
    assert s["prompts_by_n_correct"] == {0: 1, 1: 0, 2: 1, 3: 0, 4: 1}
    rows = {r["id"]: r for r in result["rows"]}
    assert [rows[p]["chosen_id"] for p in ("p1", "p2", "p3")] == ["c01", "c00", "c00"]
    assert [rows[p]["n_correct"] for p in ("p1", "p2", "p3")] == [2, 4, 0]


def test_n_smaller_than_pack_uses_the_first_n():
    s = best_of_n(TINY, COT, n=2)["summary"]
    # first two: p1 = 0 1 (c=1), p2 = 1 1 (c=2), p3 = 0 0
    assert s["pass@k"][1] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert s["bon_pass_rate"] == pytest.approx(2 / 3)


def test_tie_break_picks_smallest_id_not_first_position():
    # the right answers sit at ids c03 and c01, listed in that order: c01 must win
    g = group("p", 5, [0, 1, 0, 1], ids=["c02", "c03", "c00", "c01"])
    row = best_of_n([g], COT, n=4)["rows"][0]
    assert row["chosen_id"] == "c01"
    # all equal (all wrong): the smallest id overall, wherever it sits
    g = group("q", 5, [0, 0, 0, 0], ids=["c02", "c03", "c00", "c01"])
    assert best_of_n([g], COT, n=4)["rows"][0]["chosen_id"] == "c00"
    assert pick_best([(Candidate("b", ""), 1.0), (Candidate("a", ""), 1.0)]).id == "a"
    assert pick_best([(Candidate("b", ""), 1.0), (Candidate("a", ""), 0.5)]).id == "b"


def test_deterministic():
    first, second = best_of_n(TINY, COT, n=4), best_of_n(TINY, COT, n=4)
    assert first == second


def test_selecting_with_a_hackable_spec_is_not_the_oracle():
    # c00 is a wrong answer that hackable/last-number rewards; c01 is right
    example = Example(prompt="Q: 2+3\n", expected_answer="5", id="h")
    g = PromptCandidates(example, (Candidate("c00", "Final: 6 (or maybe 5)"), Candidate("c01", "Final: 5")))
    result = best_of_n([g], get_spec("hackable/last-number"), n=2, eval_fn=COT)
    assert result["rows"][0]["chosen_id"] == "c00"  # tie at 1.0 under the hack: smallest id
    assert result["summary"]["bon_pass_rate"] == 0.0
    assert result["summary"]["pass@k"][2] == 1.0  # an oracle would have got it
    assert result["summary"]["selection_is_oracle"] is False


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="has 4 candidates, fewer than n=5"):
        best_of_n(TINY, COT, n=5)
    with pytest.raises(ValueError, match="n must be a positive int"):
        best_of_n(TINY, COT, n=0)


def test_run_bon_on_the_shipped_pack(tmp_path, capsys):
    s4 = run_bon("bon", 4, "final_int/cot-v1", str(tmp_path), "bon4")
    s8 = run_bon(pack_path("bon"), 8, "final_int/cot-v1", str(tmp_path), "bon8")
    assert s4["pass@1_first_sample"] == s8["pass@1_first_sample"] == pytest.approx(0.46)
    assert s4["bon_pass_rate"] == s4["pass@k"][4] == pytest.approx(0.70)
    assert s8["bon_pass_rate"] == s8["pass@k"][8] == pytest.approx(0.76)
    assert s8["prompts_by_n_correct"][0] == 12
    assert "oracle" in capsys.readouterr().out
    rows = [r for r in (tmp_path.glob("*-bon8/samples.jsonl"))][0].read_text().splitlines()
    assert len(rows) == 50 and '"chosen_id"' in rows[0]
    assert len(load_candidates(pack_path("bon"))[0].candidates) == 8


def test_run_bon_with_the_math_verifier_on_int_answers(tmp_path, capsys):
    pytest.importorskip("math_verify")
    # p1: c00 wrong, c01 right (0.5 = 1/2); p2: both wrong; int expected answers, as JSON gives them
    records = [{"id": "p1", "prompt": "Half of 1?", "expected_answer": "\\frac{1}{2}",
                "candidates": [{"id": "c00", "completion": "\\boxed{2}"}, {"id": "c01", "completion": "Final: 0.5"}]},
               {"id": "p2", "prompt": "3+4?", "expected_answer": 7,
                "candidates": [{"id": "c00", "completion": "\\boxed{8}"}, {"id": "c01", "completion": "no idea"}]}]
    path = tmp_path / "math_bon.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = run_bon(str(path), 2, "math/boxed-or-final-v1", str(tmp_path), "math")
    assert summary["pass@1_first_sample"] == 0.0
    assert summary["bon_pass_rate"] == summary["pass@k"][2] == 0.5
    assert summary["pass@k"][1] == pytest.approx(0.25)  # mean of c/n = (1/2 + 0/2) / 2
    assert summary["spec_version"] == "math/boxed-or-final-v1"
    rows = [json.loads(line) for line in next(tmp_path.glob("*-math/samples.jsonl")).read_text().splitlines()]
    assert [r["chosen_id"] for r in rows] == ["c01", "c00"] and rows[1]["expected_answer"] == "7"
    with pytest.raises(ValueError, match=r"unknown verifier 'math/v9'; valid names: .*math/boxed-or-final-v1"):
        run_bon(str(path), 2, "math/v9", str(tmp_path), "x")
    capsys.readouterr()
