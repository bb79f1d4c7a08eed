"""Reward design: compose a scalar reward from named terms.

A scorer (verifiers/final_int.py, verifiers/math_answer.py, ...) answers one question: is this
completion right? A reward for RL may want more: pay a little for the format, charge for
length. `RewardStack` adds weighted terms on top of a scorer's result and logs every term
separately, so a run can show which term paid:

    stack = RewardStack([(1.0, Accuracy()), (0.2, Format()), (1.0, LinearLength(256, 1e-3))])
    # LinearLength and the other length terms: rewards/length.py
    scored = cot_spec(example, completion)   # 300 chars of work, then "Final: 5": right
    stack(example, completion, scored)
    # {"reward": 1.147, "details": {..the scorer's details (reason, format_ok, ...)..,
    #   "components": {"accuracy": 1.0, "format": 1.0, "length_linear": -0.053},
    #   "weighted":   {"accuracy": 1.0, "format": 0.2, "length_linear": -0.053},
    #   "reward_spec": "1*accuracy + 0.2*format(details.format_ok) + 1*length_linear(L0=256,c=0.001)"}}

A term may explain itself: a Rubric (rewards/rubric.py) returns {reward, details}, and its
details (each criterion's score, weight and reason) land in details["term_details"][name].
A verifier plus a rubric is the joint reward of Kimi K2 (the spec's JointRewardSystem):

    RewardStack([(1.0, Accuracy()), (0.5, rubric)]).wrap(verifier)

`stack.wrap(scorer)` gives back a function with the scorer contract, `(example,
completion) -> {reward, details}`, usable wherever a scorer is.

The RL stage logs each term's mean weighted value per step beside the sum ("reward/<name>":
`term_means`, `score_groups`), and the hacking monitors watch each against held-out pass@1; a
rubric term's criteria are logged too, each its mean raw score ("rubric/<term>/<criterion>").

A composite reward is a different measuring instrument from the binary scorer under it:
its `reward_spec` string names every term and weight, and numbers measured under two
reward specs are not one metric. Pass@1 stays the scorer's (details["reason"] == "ok").

Cautions the terms carry (see each docstring):
  - a format reward pays for the shape of an answer, not its truth: a policy can learn
    to emit perfectly formatted wrong answers and collect the format bonus on every sample;
  - a length penalty pays for brevity: on its own it favours short wrong answers over
    long right ones unless accuracy dominates (rewards/length.py).

Terms are pure: each is a function of (example, completion, scored) alone, with no
state, so a stack is as deterministic as the scorer under it.

A group term scores a sample against the other samples of its prompt, so it runs once the
whole group is scored (`RewardStack.score_groups`, which the controller calls each round):
Kimi k1.5's length reward (rewards/length.py) pays the shortest right answer of a group +0.5 and charges the
longest −0.5. Its value lands in details["components"] and ["weighted"] like any term's:

    stack = RewardStack([(1.0, Accuracy())], group_terms=[(1.0, KimiLength(start_step=50))])

"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from posttrain.types import Episode, Example
from posttrain.verifiers.contract import is_solved, shown

Scored = dict[str, Any]  # a scorer's result: {"reward": float, "details": dict}


class RewardTerm(Protocol):
    """One term of a reward. `name` keys the logged components; `spec` states the term
    and its parameters (it becomes part of the stack's reward_spec)."""

    @property
    def name(self) -> str: ...  # read only: a frozen dataclass's field fits

    @property
    def spec(self) -> str: ...

    def __call__(self, example: Example, completion: str, scored: Scored) -> float | Scored:
        """The term's value; or {"reward": value, "details": {...}} for a term that explains
        itself (a Rubric: every criterion's score and reason), kept in details["term_details"]."""
        ...


# ---------------------------------------------------------------------------------------
# Terms
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Accuracy:
    """The verifier's reward, unchanged: 1.0 right, 0.0 wrong for the binary specs."""

    name: str = "accuracy"

    @property
    def spec(self) -> str:
        return self.name

    def __call__(self, example: Example, completion: str, scored: Scored) -> float:
        return float(scored["reward"])


@dataclass(frozen=True)
class Format:
    """1.0 when the completion has the expected format, else 0.0.

    By default it reads the scorer's `details["format_ok"]` (final_int and math_answer set
    it: the answer is where the spec looks for it, whether or not it is right). Pass
    `check`, a function of the completion, to test another format instead, e.g.
    `think_answer_format` below or `regex_format(r"...")`.

    Caution (why a format reward can create a perverse incentive): it pays wrong answers
    too. A policy that cannot solve a prompt still earns w for a well-formatted guess, so
    guessing beats saying nothing; and once every sample is formatted, the term is the same
    for every sample of a prompt and carries no signal under a group baseline. It helps
    while some samples still miss the format (R1-Zero's authors kept one); keep w small
    and judge the run by pass@1, not by the reward."""

    check: Callable[[str], bool] | None = None
    name: str = "format"

    @property
    def spec(self) -> str:
        how = getattr(self.check, "__name__", "check") if self.check else "details.format_ok"
        return f"{self.name}({how})"

    def __call__(self, example: Example, completion: str, scored: Scored) -> float:
        if self.check is not None:
            return 1.0 if self.check(completion) else 0.0
        return 1.0 if scored["details"].get("format_ok") else 0.0


def think_answer_format(completion: str) -> bool:
    """The R1-Zero layout: `<think> ... </think>` then `<answer> ... </answer>`, nothing
    else but whitespace around them, each tag exactly once. Plain string searches: linear
    time on any input."""
    text = completion.strip()
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    if any(text.count(tag) != 1 for tag in tags):
        return False
    a, b, c, d = (text.find(tag) for tag in tags)
    return a == 0 and a < b < c < d and text[b + len(tags[1]) : c].strip() == "" and text.endswith(tags[3])


def regex_format(pattern: str) -> Callable[[str], bool]:
    """A format check that passes when `pattern` matches the WHOLE completion
    (re.fullmatch, DOTALL). Keep the pattern free of nested quantifiers such as
    `(a+)+`: model output is adversarial input, and such a pattern can backtrack for
    minutes on a crafted string."""
    compiled = re.compile(pattern, re.DOTALL)

    def check(completion: str) -> bool:
        return compiled.fullmatch(completion) is not None

    check.__name__ = f"regex({pattern!r})"
    return check


# ---------------------------------------------------------------------------------------
# Group terms: a sample against the other samples of its prompt
# ---------------------------------------------------------------------------------------


class GroupTerm(Protocol):
    """A term whose value for a sample depends on its group (the K samples of one prompt):
    a function of the group's response lengths (tokens) and verdicts, and of the RL step
    (a term may switch on late). `name` and `spec` as RewardTerm's."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> str: ...

    def __call__(self, lengths: list[int], solved: list[bool], step: int) -> list[float]: ...


# ---------------------------------------------------------------------------------------
# Weights that change with the RL step
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """A term's weight over training: `start` at step 0, linear to `end` at step `steps`,
    `end` after. Written "START->END@STEPS" in rl.reward.terms ("1->0.2@100*accuracy").

    Seed 000's production stack weighs its layers dynamically: trust the verifier more
    early, when the learned rewards have not been probed by the policy yet, and shift weight
    as training goes (or the other way round: a format bonus that helps early and should
    fade once every sample is formatted)."""

    start: float
    end: float
    steps: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start) and math.isfinite(self.end)):
            raise ValueError(f"a schedule's weights must be finite numbers, got {self.start!r} -> {self.end!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"a schedule needs a whole number of steps >= 1 to go from start to end, "
                             f"got {self.steps!r}")

    def at(self, step: int) -> float:
        return self.start + (self.end - self.start) * min(step, self.steps) / self.steps

    def scaled(self, factor: float) -> Schedule:
        return Schedule(factor * self.start, factor * self.end, self.steps)

    def __str__(self) -> str:
        return f"{self.start:g}->{self.end:g}@{self.steps}"


def finite_value(spec: str, value: Any) -> float:
    """A term's value as a float; ValueError naming the term when it is not a finite number
    (a NaN would reach the advantages of the whole group, and then every weight)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"reward term {spec} returned {shown(value)}, which is not a number ({error}); a term "
                         "returns a finite float") from None
    if not math.isfinite(number):
        raise ValueError(f"reward term {spec} returned {number}; a term returns a finite float (check what it "
                         "divides by or takes the log of)")
    return number


def weight_at(weight: float | Schedule, step: int) -> float:
    return weight.at(step) if isinstance(weight, Schedule) else weight


def weighted_spec(weight: float | Schedule, spec: str) -> str:
    """One term of a reward_spec: "0.2*format", or "(1->0.2@100)*accuracy" for a schedule."""
    return f"({weight})*{spec}" if isinstance(weight, Schedule) else f"{weight:g}*{spec}"


def deepseek_r1_terms(format_check: Callable[[str], bool] | None = None) -> list[tuple[float, RewardTerm]]:
    """RewardStack.deepseek_r1's terms (its docstring says where 1.0 and 0.2 come from), also
    rl.reward.terms's preset "r1"."""
    return [(1.0, Accuracy()), (0.2, Format(check=format_check))]


# ---------------------------------------------------------------------------------------
# The stack
# ---------------------------------------------------------------------------------------


class RewardStack:
    """reward = Σ_i w_i · term_i(example, completion, scored) + Σ_j v_j · group_term_j.

    Every term's raw value goes to details["components"] and its weighted value to
    details["weighted"], under the term's name (names must be unique); the scorer's own
    details are kept alongside, so details["reason"] still says whether the answer was
    right. Group terms are added by `score_groups`, once a prompt's samples are all scored;
    until then a sample's reward is the per-sample terms' sum."""

    def __init__(self, terms: Sequence[tuple[float | Schedule, RewardTerm]],
                 group_terms: Sequence[tuple[float, GroupTerm]] = ()) -> None:
        if not terms:
            raise ValueError("a RewardStack needs at least one (weight, term) pair, e.g. [(1.0, Accuracy())]")
        names = [term.name for _, term in terms] + [group_term.name for _, group_term in group_terms]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"term names must be unique, {duplicates} repeat; pass name=... to tell them apart")
        self.terms: list[tuple[float | Schedule, RewardTerm]] = [
            (w if isinstance(w, Schedule) else float(w), term) for w, term in terms]
        self.group_terms = [(float(v), group_term) for v, group_term in group_terms]
        self.scheduled = [(w, term) for w, term in self.terms if isinstance(w, Schedule)]
        self.version = " + ".join([weighted_spec(w, term.spec) for w, term in self.terms]
                                  + [weighted_spec(v, group_term.spec) for v, group_term in self.group_terms])

    @property
    def needs_groups(self) -> bool:
        """True when score_groups must follow scoring: group terms, or weights that depend on the step."""
        return bool(self.group_terms or self.scheduled)

    def __call__(self, example: Example, completion: str, scored: Scored) -> Scored:
        """The stack on one sample; a scheduled weight is its step-0 value here, and
        score_groups, which knows the step, puts in the step's."""
        components, term_details = {}, {}
        for _, term in self.terms:
            value = term(example, completion, scored)
            if isinstance(value, dict):  # a term with its own details (RewardTerm's declared second form)
                term_details[term.name], value = value["details"], value["reward"]
            components[term.name] = finite_value(term.spec, value)
        weighted = {term.name: weight_at(w, 0) * components[term.name] for w, term in self.terms}
        details = dict(scored["details"])
        details.update(components=components, weighted=weighted, reward_spec=self.version)
        if term_details:
            details["term_details"] = term_details
        if self.needs_groups:  # the scorer's verdict, which a group term reads once the reward is a sum
            details["solved"] = is_solved(scored["reward"], scored["details"])
        return {"reward": sum(weighted.values()), "details": details}

    def score_groups(self, episodes: list[Episode], step: int) -> dict[str, float]:
        """After this stack scored the episodes: each scheduled term reweighted to this
        step's weight, then each group term added, in place, group by group (episodes
        sharing a group_id); values go to the episodes' components and weighted details.
        Returns each group term's mean weighted value as "reward/<name>" and each scheduled
        weight as "reward_weight/<name>". Lengths are response tokens (EOS included): what a
        sample cost to draw."""
        groups: dict[int, list[Episode]] = {}
        for episode in episodes:
            if "solved" not in episode.details:
                raise ValueError("score_groups adds to rewards this stack gave: score the episodes with it first "
                                 f"(episode of group {episode.group_id} has details {sorted(episode.details)})")
            groups.setdefault(episode.group_id, []).append(episode)
            for w, term in self.scheduled:  # the step-0 weight the sample was scored with, replaced
                now = w.at(step) * episode.details["components"][term.name]
                episode.reward += now - episode.details["weighted"][term.name]
                episode.details["weighted"][term.name] = now
        sums = {group_term.name: 0.0 for _, group_term in self.group_terms}
        for members in groups.values():
            lengths = [len(e.response_ids) for e in members]
            solved = [bool(e.details["solved"]) for e in members]
            for v, group_term in self.group_terms:
                for episode, value in zip(members, group_term(lengths, solved, step)):
                    value = finite_value(group_term.spec, value)
                    episode.details["components"][group_term.name] = value
                    episode.details["weighted"][group_term.name] = v * value
                    episode.reward += v * value
                    sums[group_term.name] += v * value
        return {**{f"reward/{name}": total / max(1, len(episodes)) for name, total in sums.items()},
                **{f"reward_weight/{term.name}": w.at(step) for w, term in self.scheduled}}

    def term_means(self, episodes: list[Episode]) -> dict[str, float]:
        """Each per-sample term's mean weighted value over `episodes` (scored by this stack, their
        scheduled weights already the step's), as "reward/<name>": with score_groups' group terms,
        the parts the step's reward sums to, so a run logs which term paid for what it learns.
        A brevity term that rises while "reward/accuracy" falls is a gamed reward, visible here
        when the sum alone barely moves."""
        means = {f"reward/{term.name}": sum(e.details["weighted"][term.name] for e in episodes) / max(1, len(episodes))
                 for _, term in self.terms}
        return {**means, **criterion_means([term.name for _, term in self.terms], episodes)}

    def term_table(self, episodes: list[Episode], step: int) -> tuple[list[str], list[list[float]], list[float]]:
        """Every term's name, each episode's raw value of each (details["components"]), and each
        term's weight at `step`, group terms last: what an advantage that normalises each term
        within its group before the weighted sum reads (GDPO, algorithms/grpo.py). For `episodes`
        scored by this stack, score_groups already run for `step`: Σ weight · value is their reward."""
        names = [term.name for _, term in self.terms] + [group_term.name for _, group_term in self.group_terms]
        weights = [weight_at(w, step) for w, _ in self.terms] + [v for v, _ in self.group_terms]
        values = [[float(e.details["components"][name]) for name in names] for e in episodes]
        return names, values, weights

    def wrap(self, scorer: Callable[[Example, str], Scored]) -> Callable[[Example, str], Scored]:
        """A scorer-shaped function: run `scorer`, then this stack on its result."""

        def score(example: Example, completion: str) -> Scored:
            return self(example, completion, scorer(example, completion))

        score.version = self.version  # type: ignore[attr-defined]
        return score

    @classmethod
    def deepseek_r1(cls, format_check: Callable[[str], bool] | None = None) -> RewardStack:
        """1.0 × accuracy + 0.2 × format: our approximation of DeepSeek-R1-Zero's reward.

        What the report says (DeepSeek-AI, arXiv:2501.12948, Sec. 2.2.2): R1-Zero was
        trained with a rule-based reward of two kinds, an accuracy reward (a math answer
        in a required format such as a box, checked by rules; code checked by running test
        cases) and a format reward that makes the model put its reasoning between
        `<think>` and `</think>`. It used no neural reward model, to avoid reward hacking
        and retraining. For DeepSeek-R1 (Sec. 2.3.2) a language-consistency reward (the
        share of target-language words in the chain of thought) was added to the
        accuracy reward by direct summation.

        What it does not say: how accuracy and format were weighted or combined. The 0.2
        here is this curriculum's choice (the format is worth something, much less than
        being right), not a number from the report. `format_check` defaults to the
        scorer's format_ok; pass `think_answer_format` for the R1-Zero tag layout."""
        return cls(deepseek_r1_terms(format_check))

    def __repr__(self) -> str:
        return f"<RewardStack {self.version}>"


def criterion_means(names: Sequence[str], episodes: list[Episode]) -> dict[str, float]:
    """Each rubric term's criteria, their mean raw score over `episodes`, as
    "rubric/<term>/<criterion>" (a Rubric's details: term_details[term]["criteria"]). A sample
    whose rubric could not score it (no criteria in its details) counts 0, as it was paid: with
    equal weights the criteria's average is the term's raw mean. Not under "reward/": a
    criterion is a part of its term, not one more term of the sum."""
    sums: dict[str, float] = {}
    for name in names:
        rows = [e.details.get("term_details", {}).get(name, {}).get("criteria") for e in episodes]
        criteria = next((row for row in rows if row), None)
        for criterion in criteria or {}:
            sums[f"rubric/{name}/{criterion}"] = sum(float(row[criterion]["score"]) for row in rows if row)
    return {key: total / max(1, len(episodes)) for key, total in sums.items()}
