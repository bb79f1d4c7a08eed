"""A verifier's verdict in the reward, paid only when a meta-verifier confirms it.

DeepSeekMath-V2 trains a proof generator against a verifier, and guards against the
verifier's false positives with a meta-verifier: a check of the verifier's verdict, not of
the proof. Here the three parts are, on the arithmetic chain task:

    generator      the policy: steps, then "Final: n" ("7+5=12,12+9=21,21+3=24\\nFinal: 24")
    verifier       a proof checker (verifiers/proof_check.py); by default StepArithmeticChecker,
                   which checks each line's own sum and passes a consistent chain that skipped a
                   term: a verifier that can be fooled, as a learned one can
    meta-verifier  the ground truth it can compute (ArithmeticProofChecker: every step
                   recomputed and followed from the problem, the answer compared)

The term pays 1 when the verifier accepts the proof AND the meta-verifier confirms it, else
0. A "verified" verdict on a wrong chain (a false positive) earns nothing, so a policy cannot
learn to write chains that fool the verifier:

    --rl.reward.terms "accuracy + 0.5*meta_verified"

On its own the term is the verifier's verdict with its false positives removed; beside
accuracy it pays a right chain of steps on top of a right answer (a right answer reached by
wrong steps gets accuracy only). Every sample's verdicts are kept in
details["term_details"]["meta_verified"], and `MetaVerifierAudit`, a step hook, logs per round:

    meta_verifier/false_positive_rate       of the chains the meta-verifier rejects, the share the
                                            verifier passed (absent when it rejects none)
    meta_verifier/step_false_positive_rate  of the wrong steps (first-error labels), the share the
                                            verifier passed (absent when no step is wrong)
    meta_verifier/false_positives           chains the verifier passed and the meta-verifier did not
    meta_verifier/verifier_pass_rate        chains the verifier passed, of all
    meta_verifier/confirmed_rate            chains both passed: the term's mean

With the ground truth as the verifier (`MetaVerified(verifier=ArithmeticProofChecker())`) the
false-positive rate is 0 by construction and the term is the chain's correctness: the audit
is worth logging only over a verifier that can be wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from posttrain.rewards.stack import RewardTerm, Scored
from posttrain.roles.hooks import StepHook
from posttrain.types import Episode, Example
from posttrain.verifiers.proof_check import ArithmeticProofChecker, Proof, ProofChecker, StepArithmeticChecker

METRIC = "meta_verifier"


@dataclass(frozen=True)
class MetaVerified:
    """1.0 when `verifier` accepts the completion's proof and `meta_verifier` confirms it, else 0.0
    (module docstring); the verdicts and the ground truth's reasons go to the term's details."""

    verifier: ProofChecker = StepArithmeticChecker()
    meta_verifier: ProofChecker = ArithmeticProofChecker()
    name: str = "meta_verified"

    @property
    def spec(self) -> str:
        return f"{self.name}(verifier={self.verifier.name},meta={self.meta_verifier.name})"

    def __call__(self, example: Example, completion: str, scored: Scored) -> Scored:
        proof = Proof.of(example, completion)
        try:
            verdict, truth = self.verifier.check(proof), self.meta_verifier.check(proof)
        except ValueError as error:
            raise ValueError(f"reward term {self.spec} checks arithmetic chains of steps and cannot read this "
                             f"example ({error}); use it with --env.name arithmetic, or drop it from "
                             "rl.reward.terms") from None
        wrong_steps = [i for i, valid in enumerate(truth.step_valid) if not valid]
        details: dict[str, Any] = {
            "verifier_passed": verdict.valid,
            "meta_confirmed": truth.valid,
            "false_positive": verdict.valid and not truth.valid,  # the case the meta-verifier exists for
            "false_negative": truth.valid and not verdict.valid,
            "wrong_steps": len(wrong_steps),
            "wrong_steps_passed": sum(verdict.step_valid[i] for i in wrong_steps),
        }
        if details["false_positive"]:  # what the verifier missed, in the ground truth's words
            details["missed"] = list(truth.reasons)
        return {"reward": 1.0 if verdict.valid and truth.valid else 0.0, "details": details}


def audit_metrics(verdicts: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The meta-verifier's rates over the details MetaVerified wrote (module docstring). A rate
    whose denominator is empty is left out rather than written as 0: "no false positives among
    no wrong chains" is not a measurement."""
    n = len(verdicts)
    if n == 0:
        return {}
    refuted = [v for v in verdicts if not v["meta_confirmed"]]
    false_positives = sum(bool(v["false_positive"]) for v in verdicts)
    wrong_steps = sum(v["wrong_steps"] for v in verdicts)
    metrics = {
        f"{METRIC}/false_positives": float(false_positives),
        f"{METRIC}/verifier_pass_rate": sum(bool(v["verifier_passed"]) for v in verdicts) / n,
        f"{METRIC}/confirmed_rate": sum(bool(v["verifier_passed"] and v["meta_confirmed"]) for v in verdicts) / n,
    }
    if refuted:
        metrics[f"{METRIC}/false_positive_rate"] = false_positives / len(refuted)
    if wrong_steps:
        metrics[f"{METRIC}/step_false_positive_rate"] = sum(v["wrong_steps_passed"] for v in verdicts) / wrong_steps
    return metrics


class MetaVerifierAudit(StepHook):
    """Logs audit_metrics over each scored round: the verdicts the term `name` of the reward
    stack left in every episode's details["term_details"]."""

    def __init__(self, name: str = "meta_verified"):
        self.name = name

    def scored(self, step: int, episodes: list[Episode]) -> dict[str, float]:
        return audit_metrics([e.details["term_details"][self.name] for e in episodes
                              if self.name in e.details.get("term_details", {})])


def audits(terms: Sequence[tuple[Any, RewardTerm]]) -> list[StepHook]:
    """One MetaVerifierAudit per MetaVerified term of a reward stack: the hooks build.py adds."""
    return [MetaVerifierAudit(term.name) for _, term in terms if isinstance(term, MetaVerified)]


# rl.reward.terms's name for the term, beside the other presets (pipelines/build.py)
META_VERIFIER_PRESETS: dict[str, Callable[[], Sequence[tuple[float, RewardTerm]]]] = {
    "meta_verified": lambda: [(1.0, MetaVerified())],
}
