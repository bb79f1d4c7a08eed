"""The meta-verifier as a reward term (rewards/meta_verifier.py) and the proof-checker interface
(verifiers/proof_check.py): verdicts and reasons by hand, a constructed batch where the
verifier passes a wrong chain and the term pays nothing for it, the audit's rates by hand,
the Lean checker's refusal, and a 2-step training run that logs the audit."""

import json

import pytest

from posttrain.config import RewardConfig, RLConfig
from posttrain.envs import make_env
from posttrain.pipelines.build import reward_stack
from posttrain.rewards.meta_verifier import MetaVerified, MetaVerifierAudit, audit_metrics, audits
from posttrain.types import Episode, Example
from posttrain.verifiers import proof_check
from posttrain.verifiers.proof_check import (ArithmeticProofChecker, LeanProofChecker, Proof, ProofCheckerUnavailable,
                                             StepArithmeticChecker, lean_statements, to_lean)
from tests.test_pipeline import TINY, only_run_dir, posttrain

EXAMPLE = Example(prompt="Q: 7+5+9+3\n", expected_answer="24")
RIGHT = "7+5=12,12+9=21,21+3=24\nFinal: 24"
SKIPPED_TERM = "7+5=12,12+3=15\nFinal: 15"  # every line's sum holds, the 9 is skipped: the verifier is fooled
BAD_SUM = "7+5=12,12+9=20,20+3=23\nFinal: 23"  # 12+9 is 21: the verifier catches it
GARBAGE = "hello"
BATCH = [RIGHT, SKIPPED_TERM, BAD_SUM, GARBAGE]


def test_the_two_arithmetic_checkers_by_hand():
    lenient, truth = StepArithmeticChecker(), ArithmeticProofChecker()
    fooled = Proof.of(EXAMPLE, SKIPPED_TERM)
    assert fooled.steps == ("7+5=12", "12+3=15", "Final: 15")
    assert lenient.check(fooled).valid and lenient.check(fooled).step_valid == (True, True, True)
    assert truth.check(fooled).step_valid == (True, False, False)
    assert truth.check(fooled).reasons == (
        "step 2 '12+3=15': not the problem's next operation on the previous result",
        "step 3 'Final: 15': the chain skipped terms")
    bad_sum = Proof.of(EXAMPLE, BAD_SUM)
    assert lenient.check(bad_sum).step_valid == (True, False, True, True)
    assert lenient.check(bad_sum).reasons == ("step 2 '12+9=20': 12+9 is 21, not 20",)
    assert truth.check(bad_sum).reasons == ("step 2 '12+9=20': 12+9 is 21, not 20",
                                            "step 3 '20+3=23': builds on an earlier error",
                                            "step 4 'Final: 23': builds on an earlier error")
    assert truth.check(Proof.of(EXAMPLE, RIGHT)).valid and truth.check(Proof.of(EXAMPLE, RIGHT)).reasons == ()
    assert truth.check(Proof.of(EXAMPLE, GARBAGE)).reasons == ("step 1 'hello': not 'a+b=c' or 'Final: n'",)
    empty = truth.check(Proof.of(EXAMPLE, ""))
    assert not empty.valid and empty.reasons == ("no steps: an empty completion proves nothing",)
    huge = "1" * 5000 + "+1=2"  # past int()'s digit limit: a reason, not a crash
    assert truth.check(Proof.of(EXAMPLE, huge)).reasons == (f"step 1 {huge!r}: not 'a+b=c' or 'Final: n'",)
    assert lenient.check(Proof.of(EXAMPLE, "12-15=-2")).reasons == ("step 1 '12-15=-2': 12-15 is -3, not -2",)
    right_steps_wrong_answer = truth.check(Proof.of(EXAMPLE, "7+5=12,12+9=21,21+3=24\nFinal: 25"))
    assert right_steps_wrong_answer.reasons == ("step 4 'Final: 25': not the last step's result",)


def test_a_verified_wrong_chain_earns_nothing_and_is_counted():
    term = MetaVerified()
    results = [term(EXAMPLE, completion, {"reward": 0.0, "details": {}}) for completion in BATCH]
    assert [r["reward"] for r in results] == [1.0, 0.0, 0.0, 0.0]
    verdicts = [r["details"] for r in results]
    assert [v["verifier_passed"] for v in verdicts] == [True, True, False, False]
    assert [v["false_positive"] for v in verdicts] == [False, True, False, False]
    assert verdicts[1]["missed"][0] == "step 2 '12+3=15': not the problem's next operation on the previous result"
    assert [v["wrong_steps"] for v in verdicts] == [0, 2, 3, 1]
    assert [v["wrong_steps_passed"] for v in verdicts] == [0, 2, 2, 0]
    # by hand: 3 chains refuted, 1 of them passed; 6 wrong steps, 4 of them passed
    assert audit_metrics(verdicts) == {
        "meta_verifier/false_positives": 1.0, "meta_verifier/false_positive_rate": pytest.approx(1 / 3),
        "meta_verifier/step_false_positive_rate": pytest.approx(4 / 6),
        "meta_verifier/verifier_pass_rate": 0.5, "meta_verifier/confirmed_rate": 0.25}


def test_with_the_ground_truth_as_verifier_there_is_nothing_to_catch():
    term = MetaVerified(verifier=ArithmeticProofChecker())
    verdicts = [term(EXAMPLE, c, {"reward": 0.0, "details": {}})["details"] for c in BATCH]
    metrics = audit_metrics(verdicts)
    assert metrics["meta_verifier/false_positive_rate"] == 0.0
    assert metrics["meta_verifier/step_false_positive_rate"] == 0.0
    assert term.spec == "meta_verified(verifier=arithmetic,meta=arithmetic)"


def test_rates_without_a_denominator_are_left_out():
    verdicts = [MetaVerified()(EXAMPLE, RIGHT, {"reward": 1.0, "details": {}})["details"]]
    assert audit_metrics(verdicts) == {"meta_verifier/false_positives": 0.0, "meta_verifier/verifier_pass_rate": 1.0,
                                       "meta_verifier/confirmed_rate": 1.0}
    assert audit_metrics([]) == {}


def test_rl_reward_terms_names_it_and_the_stack_pays_accuracy_plus_confirmed_verification():
    stack = reward_stack(RLConfig(reward=RewardConfig(terms="accuracy + 0.5*meta_verified")))
    assert stack is not None
    assert stack.version == "1*accuracy + 0.5*meta_verified(verifier=step_arithmetic,meta=arithmetic)"
    env = make_env("arithmetic")
    scored = [stack(EXAMPLE, c, env.score(EXAMPLE, c)) for c in BATCH]
    assert [s["reward"] for s in scored] == [1.5, 0.0, 0.0, 0.0]
    assert scored[1]["details"]["term_details"]["meta_verified"]["false_positive"] is True
    # the hook build.py adds reads those details off the scored episodes
    hooks = audits(stack.terms)
    assert [type(h) for h in hooks] == [MetaVerifierAudit]
    episodes = [Episode(EXAMPLE, 0, prompt_ids=[1], response_ids=[2], response_logp=[0.0], completion=c,
                        details=result["details"]) for c, result in zip(BATCH, scored)]
    assert hooks[0].scored(1, episodes)["meta_verifier/false_positives"] == 1.0


def test_a_non_arithmetic_example_is_refused_with_the_term_named():
    with pytest.raises(ValueError, match=r"meta_verified\(verifier=step_arithmetic.*--env.name arithmetic"):
        MetaVerified()(Example(prompt="What is the capital of France?", expected_answer="Paris"), "Paris",
                       {"reward": 1.0, "details": {}})


def test_lean_refuses_and_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(proof_check.shutil, "which", lambda tool: None)
    monkeypatch.setattr(proof_check.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ProofCheckerUnavailable) as refused:
        LeanProofChecker().check(Proof.of(EXAMPLE, RIGHT))
    message = str(refused.value)
    assert message.startswith("Lean 4 proof checking is not available: missing elan; lake; lean; "
                              "the Python package lean-interact; a runner")
    assert "elan-init.sh" in message and "pip install lean-interact" in message
    # with a toolchain and the package present, what is still missing is the translation: no fake Lean verdict
    monkeypatch.setattr(proof_check.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(proof_check.importlib.util, "find_spec", lambda name: object())
    assert LeanProofChecker().missing() == ["a runner that feeds to_lean's source to lean-interact and reads its verdicts"]
    with pytest.raises(ProofCheckerUnavailable, match="missing a runner"):
        LeanProofChecker().check(Proof.of(EXAMPLE, RIGHT))


def test_the_lean_translation_against_golden_source():
    # the skipped term: every step's statement is true, the final claim 7+5+9+3 = 15 is false, so Lean rejects it
    assert to_lean(Proof.of(EXAMPLE, SKIPPED_TERM)) == (
        "import Mathlib.Tactic.NormNum\n"
        "-- the problem: 7+5+9+3\n"
        "-- step 1\n"
        "example : (7 : Int) + 5 = 12 := by norm_num\n"
        "-- step 2\n"
        "example : (12 : Int) + 3 = 15 := by norm_num\n"
        "-- step 3: the final claim\n"
        "example : (7 : Int) + 5 + 9 + 3 = 15 := by norm_num\n")
    # the wrong sum is its own false statement; the final claim (23) is false too
    assert lean_statements(Proof.of(EXAMPLE, BAD_SUM)) == [
        "example : (7 : Int) + 5 = 12 := by norm_num", "example : (12 : Int) + 9 = 20 := by norm_num",
        "example : (20 : Int) + 3 = 23 := by norm_num", "example : (7 : Int) + 5 + 9 + 3 = 23 := by norm_num"]
    # subtraction in Int (Nat's would stop at 0), a negative running value, a step with no statement
    minus = Example(prompt="Q: 3-5+2\n", expected_answer="0")
    assert to_lean(Proof.of(minus, "3-5=-2,oops,-2+2=0\nFinal: 0")).splitlines()[1:] == [
        "-- the problem: 3-5+2",
        "-- step 1", "example : (3 : Int) - 5 = -2 := by norm_num",
        "-- step 2: not 'a+b=c' or 'Final: n', so no statement (invalid without Lean)",
        "-- step 3", "example : (-2 : Int) + 2 = 0 := by norm_num",
        "-- step 4: the final claim", "example : (3 : Int) - 5 + 2 = 0 := by norm_num"]
    assert lean_statements(Proof.of(EXAMPLE, GARBAGE)) == [None]
    with pytest.raises(ValueError, match="not an arithmetic example"):
        to_lean(Proof.of(Example(prompt="What is the capital of France?", expected_answer="Paris"), "Paris"))


def test_a_two_step_run_logs_the_audit(tmp_path):
    proc = posttrain("train", *TINY, "--rl.steps", "2", "--rl.reward.terms", "accuracy + 0.5*meta_verified",
                     "--out_dir", str(tmp_path))
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    rows = [json.loads(line) for line in (only_run_dir(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    rl_rows = [row for row in rows if "meta_verifier/verifier_pass_rate" in row]
    assert len(rl_rows) == 2, rows
    for row in rl_rows:
        assert 0.0 <= row["meta_verifier/confirmed_rate"] <= row["meta_verifier/verifier_pass_rate"] <= 1.0
        assert row["meta_verifier/false_positives"] >= 0.0
        # a sample's term pays 0.5 only when confirmed: the logged term mean is half the confirmed rate
        assert row["reward/meta_verified"] == pytest.approx(0.5 * row["meta_verifier/confirmed_rate"])
