"""Rubric rewards: a weighted list of criteria, each scoring a completion in [0, 1] with a reason.

A verifier answers "is the final answer right?". Open-ended work (an explanation, a plan, a
tool-using answer) also has qualities no checker can settle alone: is the answer on topic,
complete, clear? Kimi K2 (arXiv:2507.20534, Sec. 3.2) trains on both: verifiable rewards
where a checker exists, and a rubric scored by the model itself ("self-critique") where
none does. Here a rubric is

    Rubric([RubricCriterion("format", 2.0, "a `Final:` answer line", final_answer_line()),
            RubricCriterion("no_loops", 1.0, "no repeated word 4-grams", no_repetition())])

and scores like a verifier, `rubric.score(example, completion) -> {reward, details}`:

    reward = Σ_c w_c · s_c / Σ_c w_c            (a weighted mean: the reward stays in [0, 1])
    details["criteria"][c] = {"score": s_c, "weight": w_c, "reason": "..."}

A criterion's scorer is any function `(example, completion) -> (score, reason)`: the rule
functions below, each a small pure function; or an LLM judge (rewards/judge.py), which scores
a whole batch in one forward pass and so is declared `batched=True`, taking lists.

A criterion never crashes the rubric and never pays for its own failure: a scorer that
raises, or returns something that is not a number in [0, 1], scores 0 for that criterion,
and its reason says what went wrong.

Combining with a verifier (the spec's "joint reward") is the reward stack's job
(rewards/stack.py): a Rubric is also a RewardTerm, so

    RewardStack([(1.0, Accuracy()), (0.5, rubric)]).wrap(verifier)

pays 1.0 × the verifier's reward + 0.5 × the rubric's, with details["weighted"] saying which
part paid how much and details["term_details"]["rubric"] holding every criterion's score and
reason. `posttrain train --rl.reward.terms "accuracy + 0.5*rubric"` does the same with
`rule_based_rubric()` (pipelines/build.py).

Caution: a rubric is a softer instrument than a verifier, and easier to hack: a rule pays for
a surface feature (a format, a length), and a judge pays for what fools it. Keep its weight
below the verifier's where there is one, and judge a run by the verifier's pass@1.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from posttrain.rewards.stack import Scored
from posttrain.types import Example
from posttrain.verifiers.contract import admit, shown

# (example, completion) -> (score in [0, 1], reason); batched: (examples, completions) -> a list of them
CriterionScorer = Callable[..., Any]


@dataclass(frozen=True)
class RubricCriterion:
    """One quality a completion is scored on. `weight` is its share of the rubric's total
    (weights are relative: 2 and 1 mean two thirds and one third); `description` says in a
    sentence what earns the score, for a reader and for the judge's prompt."""

    name: str
    weight: float
    description: str
    scorer: CriterionScorer
    batched: bool = False  # True: scorer(examples, completions) -> [(score, reason), ...] in one call

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            raise ValueError(f"criterion name {shown(self.name)} must be an identifier (letters, digits, _): it keys "
                             "the logged details")
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight) or self.weight < 0:
            raise ValueError(f"criterion {self.name!r}: weight {shown(self.weight)} must be a finite number >= 0")
        if not callable(self.scorer):
            raise ValueError(f"criterion {self.name!r}: scorer {shown(self.scorer)} is not a function; give one "
                             "taking (example, completion) and returning (score in [0, 1], reason)")


@dataclass(frozen=True)
class RubricScore:
    """A completion's rubric result: every criterion's score, weight and reason, and the
    weighted mean of the scores (`total`)."""

    scores: dict[str, float]
    weights: dict[str, float]
    reasons: dict[str, str]
    total: float

    def details(self) -> dict[str, dict[str, Any]]:
        return {name: {"score": self.scores[name], "weight": self.weights[name], "reason": self.reasons[name]}
                for name in self.scores}


def checked(result: Any) -> tuple[float, str]:
    """A scorer's result as (score, reason), or (0.0, what was wrong with it): a result that
    is not a (number in [0, 1], str) pair is a failure, and a failure never pays."""
    if not (isinstance(result, tuple) and len(result) == 2):
        return 0.0, f"failed: the scorer returned {shown(result)}, not a (score, reason) pair"
    score, reason = result
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0.0 <= score <= 1.0:
        return 0.0, f"failed: the scorer returned the score {shown(score)}, not a number in [0, 1]"
    return float(score), str(reason)


def message(error: BaseException, limit: int = 200) -> str:
    """An exception's message cut to `limit` characters; never raises (a hostile __str__ can)."""
    try:
        return str(error)[:limit]
    except Exception:
        return f"<a {type(error).__name__} whose message cannot be shown>"


class Rubric:
    """A weighted list of criteria, scored like a verifier and usable as a RewardTerm.

    `score(example, completion)` -> {reward, details}; `score_batch(examples, completions)`
    -> a RubricScore per completion, calling each batched scorer once for the whole batch."""

    def __init__(self, criteria: Sequence[RubricCriterion], name: str = "rubric", scored_by: str = "") -> None:
        """`name` keys the rubric's term in a reward stack; `scored_by` names the instrument
        behind the criteria when it is not the code (a judge's model, prompt scale and
        threshold), so that the spec changes when the judge does."""
        criteria = list(criteria)
        if not criteria:
            raise ValueError("a Rubric needs at least one RubricCriterion")
        names = [c.name for c in criteria]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"criterion names must be unique, {repeated} repeat")
        if sum(c.weight for c in criteria) <= 0:
            raise ValueError(f"the criteria's weights sum to 0 ({dict(zip(names, (c.weight for c in criteria)))}); "
                             "give at least one a positive weight")
        self.criteria, self.name, self.scored_by = criteria, name, scored_by
        self.total_weight = sum(c.weight for c in criteria)

    @property
    def spec(self) -> str:
        """The criteria and weights, e.g. "rubric(format:2,no_repetition:1)", then what
        scored them if given; part of a stack's reward_spec."""
        by = f" by {self.scored_by}" if self.scored_by else ""
        return f"{self.name}(" + ",".join(f"{c.name}:{c.weight:g}" for c in self.criteria) + ")" + by

    def score_batch(self, examples: Sequence[Example], completions: Sequence[str]) -> list[RubricScore]:
        if len(examples) != len(completions):
            raise ValueError(f"{len(examples)} examples but {len(completions)} completions; give one example per "
                             "completion (repeat an example for its K samples)")
        per_criterion = {c.name: self._run(c, examples, completions) for c in self.criteria}
        weights = {c.name: float(c.weight) for c in self.criteria}
        results = []
        for i in range(len(completions)):
            scores = {name: per_criterion[name][i][0] for name in weights}
            reasons = {name: per_criterion[name][i][1] for name in weights}
            total = sum(weights[n] * scores[n] for n in weights) / self.total_weight
            results.append(RubricScore(scores, weights, reasons, total))
        return results

    def _run(self, criterion: RubricCriterion, examples: Sequence[Example],
             completions: Sequence[str]) -> list[tuple[float, str]]:
        """Each completion's (score, reason) under one criterion; an exception or a bad
        result scores 0 with the reason, one row at a time where the scorer is per row."""
        def failure(error: Exception) -> tuple[float, str]:
            return 0.0, f"failed: {type(error).__name__}: {message(error)}"

        if criterion.batched:
            try:
                results = list(criterion.scorer(list(examples), list(completions)))
            except Exception as error:
                return [failure(error)] * len(completions)
            if len(results) != len(completions):
                reason = f"failed: the batched scorer gave {len(results)} results for {len(completions)} completions"
                return [(0.0, reason)] * len(completions)
            return [checked(r) for r in results]
        out = []
        for example, completion in zip(examples, completions):
            try:
                out.append(checked(criterion.scorer(example, completion)))
            except Exception as error:
                out.append(failure(error))
        return out

    def score(self, example: Example, completion: str) -> Scored:
        """The verifier contract: {"reward": weighted mean in [0, 1], "details": {"reason",
        "criteria": {name: {score, weight, reason}}, "rubric_spec"}}. Never raises: a
        malformed example or a completion that is not text scores 0 with the contract's reason."""
        checked_example, reason, error = admit(example, completion)
        if checked_example is None:
            return {"reward": 0.0, "details": {"reason": reason, "error": error, "rubric_spec": self.spec}}
        [result] = self.score_batch([checked_example], [completion])
        return {"reward": result.total, "details": {"reason": "ok", "criteria": result.details(),
                                                    "rubric_spec": self.spec}}

    # the RewardTerm protocol (rewards/stack.py): the stack keeps the details under term_details[name]
    def __call__(self, example: Example, completion: str, scored: Scored) -> Scored:
        return self.score(example, completion)

    def __repr__(self) -> str:
        return f"<Rubric {self.spec}>"


# ---------------------------------------------------------------------------------------
# Rule-based criteria: each factory returns a pure scorer (example, completion) -> (score, reason)
# ---------------------------------------------------------------------------------------


def final_answer_line(prefix: str = "Final:") -> CriterionScorer:
    """1 when the last non-empty line starts with `prefix` and has an answer after it, else 0.
    It checks the answer's place, not its truth: that is the verifier's job."""

    def final_answer(example: Example, completion: str) -> tuple[float, str]:
        lines = [line.strip() for line in completion.splitlines() if line.strip()]
        if not lines:
            return 0.0, "the completion is empty"
        if not lines[-1].startswith(prefix):
            return 0.0, f"the last line does not start with {prefix!r}: {shown(lines[-1], 40)}"
        if not lines[-1][len(prefix):].strip():
            return 0.0, f"nothing follows {prefix!r} on the last line"
        return 1.0, f"the last line gives an answer after {prefix!r}"

    return final_answer


def within_length(budget: int, length: Callable[[str], int] = len) -> CriterionScorer:
    """1 up to `budget` (characters, or whatever `length` counts), then falling linearly to 0
    at twice the budget: a little over costs a little, a runaway answer gets nothing. An
    empty completion gets 0: a length criterion must not make saying nothing pay."""
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"within_length: budget {shown(budget)} must be a positive int (characters by default)")

    def length_budget(example: Example, completion: str) -> tuple[float, str]:
        if not completion.strip():
            return 0.0, "the completion is empty: brevity alone does not pay"
        n = length(completion)
        if n <= budget:
            return 1.0, f"{n} within the budget of {budget}"
        score = max(0.0, 1.0 - (n - budget) / budget)
        return score, f"{n} is {n - budget} over the budget of {budget}"

    return length_budget


def no_repetition(n: int = 4) -> CriterionScorer:
    """The fraction of the completion's word n-grams that are distinct: 1 for text that never
    repeats itself, near 0 for a degenerate loop ("the answer is the answer is ..."), the
    failure a policy falls into when it is rewarded for length or runs out of ideas. An
    empty completion gets 0 (there is nothing to credit); one shorter than n words, 1."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"no_repetition: n {shown(n)} must be a positive int (the n-gram length in words)")

    def distinct_ngrams(example: Example, completion: str) -> tuple[float, str]:
        words = completion.split()
        if not words:
            return 0.0, "the completion is empty: nothing to score"
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        if not grams:
            return 1.0, f"fewer than {n} words: nothing to repeat"
        distinct = len(set(grams))
        return distinct / len(grams), f"{len(grams) - distinct} of {len(grams)} word {n}-grams are repeats"

    return distinct_ngrams


def mentions(items: Sequence[str] = (), meta_key: str = "required") -> CriterionScorer:
    """The fraction of required items the completion mentions (case-insensitive substring).
    The items are `items`, or when that is empty, the example's meta[meta_key] (a list of
    str), so each example can name its own."""
    fixed = [str(item) for item in items]

    def mentions_required(example: Example, completion: str) -> tuple[float, str]:
        required = fixed or example.meta.get(meta_key)
        if not isinstance(required, (list, tuple)) or not required or not all(isinstance(r, str) for r in required):
            raise ValueError(f"no items to look for: pass items=[...] or give the example meta[{meta_key!r}] as a "
                             f"list of str (it has {shown(example.meta.get(meta_key))})")
        text = completion.lower()
        missing = [item for item in required if item.lower() not in text]
        found = len(required) - len(missing)
        reason = f"mentions {found} of {len(required)}" + (f"; missing {missing}" if missing else "")
        return found / len(required), reason

    return mentions_required


def rule_based_rubric(length_budget: int = 512) -> Rubric:
    """The rubric `--rl.reward.terms "...+rubric"` names: an answer line (weight 2: it is what a
    verifier reads), no repetition loops and a length budget (weight 1 each)."""
    return Rubric([
        RubricCriterion("final_answer", 2.0, "the last line gives the answer after 'Final:'", final_answer_line()),
        RubricCriterion("no_repetition", 1.0, "the words do not loop: distinct word 4-grams", no_repetition(4)),
        RubricCriterion("length", 1.0, f"at most {length_budget} characters, 0 at twice that",
                        within_length(length_budget)),
    ])
