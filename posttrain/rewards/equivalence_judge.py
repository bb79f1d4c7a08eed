"""Kimi k1.5's answer-equivalence check at toy scale: the rule first, a learned judge where
the rule cannot read the answer.

Kimi k1.5 (arXiv:2501.12599, Sec. 2.3.5) pays a math answer when it equals the reference,
and because free-form answers defeat string rules it trains reward models to judge that
(about 800k examples; a value-head classifier and a chain-of-thought judge). The spec's
rule for such a judge (CX-02): use a verifier wherever the rule is writable, a learned
model only where it is not. So the check has two stages:

    line = the completion's last `Final:` line                  (answer_forms.last_final_line)
    rule:  `Final: <int>` or `Final: <number in words>`         (answer_forms.read_final_line)
           parsed            -> 1.0 if the value equals the reference, else 0.0: the rule decides
           not parsed, but a `Final:` line with text after it
                             -> the judge: 1.0 if σ(logit) >= threshold, else 0.0
           no `Final:` line  -> 0.0: there is no answer to judge

The policy, in one line: **where the rule parses, the rule decides**, so no answer the rule
reads as wrong is ever paid, whatever the judge thinks; the judge's errors are confined to
the answers no rule here reads ("Final: 42.0", "Final: forty two", "Final: 42 apples").

The judge is an outcome reward model (rewards/process_reward_model.py's ORM: a gpt_mini body,
a scalar head at <eos>, binary cross-entropy through the one Trainer) trained on generated
(reference, answer) rows labelled by construction (verifiers/answer_forms.py). It reads

    [bos] "42=" " forty two" [eos]        the reference, '=', then what follows 'Final:'

`EquivalenceChecker` keeps the verifier contract (`score(example, completion) -> {reward,
details}`, total: never raises on any example or str), so it plugs in where a reward model
does: `--rl.rm.path DIR` (the RL stage trains on it, the environment's verifier stays the
gold and held-out pass@1's judge) or `--rl.reward.terms rm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.rewards.process_reward_model import (StepRecord, StepRewardScorer, load_step_scorer,
                                                    save_step_reward_model, train_step_reward_model)
from posttrain.rewards.reward_model import RewardModel
from posttrain.types import Tokenizer
from posttrain.verifiers.answer_forms import AnswerPair, last_final_line, read_final_line
from posttrain.verifiers.contract import admit
from posttrain.verifiers.final_int import FINAL_PREFIX

SPEC_VERSION = "equivalence/rule-then-judge-v1"
CHECKER_NAME = "answer_equivalence"  # recorded in the saved judge's info, so rl.rm.path knows it
MAX_ANSWER_CHARS = 40  # the longest generated answer is 28 characters; longer text is cut before encoding


def judge_config(vocab_size: int) -> GPTMiniConfig:
    """The judge's body: two layers of width 64 (120k parameters), so that attention can carry
    the reference's digits to the answer written after them; one setting, not tuned, small
    enough that the command's 2,000 steps take about 90 s on one core. 64 positions hold the
    reference, '=' and a 40-character answer."""
    return GPTMiniConfig(vocab_size=vocab_size, dim=64, n_layer=2, n_head=4, hidden_dim=192, max_seq_len=64)


def judge_text(reference: int | str, line: str) -> tuple[str, str]:
    """(prompt, completion) as the judge reads them: "42=" and what follows 'Final:' (cut to
    MAX_ANSWER_CHARS: an answer that long is no answer form the judge was taught)."""
    answer = line[len(FINAL_PREFIX) :] if line.startswith(FINAL_PREFIX) else line
    return f"{reference}=", answer[:MAX_ANSWER_CHARS]


def answer_records(pairs: Sequence[AnswerPair]) -> list[StepRecord]:
    """The rows as an ORM trains on them: one 'step' (the answer), its label the verdict."""
    records = []
    for pair in pairs:
        prompt, answer = judge_text(pair.reference, pair.line)
        label = float(pair.equivalent)
        records.append(StepRecord(prompt=prompt, steps=[answer], labels=[label], outcome=label))
    return records


def train_equivalence_judge(pairs: Sequence[AnswerPair], steps: int = 2000, lr: float = 2e-3, batch_size: int = 64,
                            seed: int = 0, tokenizer: Tokenizer | None = None) -> tuple[RewardModel, list[dict]]:
    """A fresh judge (judge_config) fitted with BCE on `pairs` through the one Trainer
    (train_step_reward_model, kind "orm"); returns (model in eval mode, metrics per step).
    The defaults, `posttrain equivalence`'s: 2,000 steps of 64 rows (8 passes over its
    16,000 rows) at a constant 2e-3 for a body trained from scratch (4e-3 did worse in the
    one trial it had)."""
    tokenizer = tokenizer or CharTokenizer()
    torch.manual_seed(seed)
    model = RewardModel(GPTMini(judge_config(tokenizer.vocab_size)))
    # step_format "newline": one answer is one step, joined with nothing around it
    history = train_step_reward_model(model, tokenizer, answer_records(pairs), kind="orm", step_format="newline",
                                      steps=steps, lr=lr, batch_size=batch_size, seed=seed)
    return model, history


def save_equivalence_judge(model: RewardModel, directory: str | Path, tokenizer: Tokenizer,
                           info: dict[str, Any] | None = None) -> Path:
    """The ORM's directory (body, head, tokenizer), marked as this checker's judge."""
    return save_step_reward_model(model, directory, tokenizer, "orm", "newline", {**(info or {}),
                                                                                 "checker": CHECKER_NAME})


@dataclass(frozen=True)
class Verdict:
    """One answer judged: the reward, which stage decided, and why."""

    reward: float
    source: str  # "rule", "judge", or "none" (nothing to judge)
    reason: str
    judge_probability: float | None = None


class EquivalenceChecker:
    """Rule first, the judge only where the rule cannot parse (module docstring). Total:
    any example and any str completion get a verdict, never an exception; a malformed
    example or a non-str completion scores 0.0 with the contract's reason."""

    spec_version = SPEC_VERSION

    def __init__(self, judge: StepRewardScorer, threshold: float = 0.5) -> None:
        if judge.kind != "orm":
            raise ValueError(f"the equivalence judge is an outcome model (kind 'orm'), got kind {judge.kind!r}: "
                             "train it with train_equivalence_judge")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold={threshold!r}: the judge's probability at which an answer is paid must be "
                             "strictly between 0 and 1 (0.5: the judge's own decision; higher pays fewer wrong "
                             "answers and misses more right ones)")
        self.judge, self.threshold = judge, threshold

    @classmethod
    def load(cls, directory: str | Path, threshold: float = 0.5) -> EquivalenceChecker:
        return cls(load_step_scorer(directory), threshold)

    def judge_lines(self, references: Sequence[int | str], lines: Sequence[str]) -> list[Verdict]:
        """A verdict per (reference, final line), the judge run once over all the lines the
        rule could not parse (one forward pass per batch)."""
        verdicts: list[Verdict | None] = []
        unparsed: list[int] = []
        for i, (reference, line) in enumerate(zip(references, lines)):
            reason, value = read_final_line(line)
            if value is not None:
                ok = value == str(reference)
                verdicts.append(Verdict(float(ok), "rule", "ok" if ok else "wrong_answer"))
            elif not line.startswith(FINAL_PREFIX) or not line[len(FINAL_PREFIX) :].strip():
                verdicts.append(Verdict(0.0, "none", reason))  # no answer written: nothing to judge
            else:
                verdicts.append(None)
                unparsed.append(i)
        texts = [judge_text(references[i], lines[i]) for i in unparsed]
        probabilities = self.judge.score_outcomes([p for p, _ in texts], [a for _, a in texts]) if texts else []
        for i, probability in zip(unparsed, probabilities):
            paid = probability >= self.threshold
            verdicts[i] = Verdict(float(paid), "judge", "judged_equal" if paid else "judged_different", probability)
        return [v for v in verdicts if v is not None]

    def score(self, example: Any, completion: Any) -> dict[str, Any]:
        checked, refused, error = admit(example, completion)
        if checked is None or refused:
            return {"reward": 0.0, "details": {"reason": refused, "error": error, "source": "none",
                                               "truncated": False, "spec_version": self.spec_version}}
        expected = checked.expected_answer.strip()
        reason, value = read_final_line(f"{FINAL_PREFIX} {expected}")
        if value is None:
            return {"reward": 0.0, "details": {
                "reason": "bad_example", "source": "none", "truncated": False, "spec_version": self.spec_version,
                "error": f"expected_answer {expected[:40]!r} is not an integer ({reason}); the equivalence checker "
                         "compares integer answers"}}
        line = last_final_line(completion)
        verdict = self.judge_lines([value], [line])[0]
        return {"reward": verdict.reward, "details": {
            "reason": verdict.reason, "source": verdict.source, "judge_probability": verdict.judge_probability,
            "line": line[:80], "expected": expected, "truncated": len(line) > len(FINAL_PREFIX) + MAX_ANSWER_CHARS,
            "spec_version": self.spec_version}}

    __call__ = score
