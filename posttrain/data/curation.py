"""Data curation: which training prompts RL samples, and how often.

GRPO learns from a prompt only when its K samples disagree: a group all right or all wrong
has advantage 0 in every row. For a prompt the policy solves with probability p, the 0/1
reward's variance p(1 − p) is the density of gradient signal the prompt carries: it peaks
at p = ½ and vanishes at 0 and 1 (Bae et al. 2025, arXiv:2504.03380, bound the expected
improvement below by it). A pool the policy always or never solves spends its samples on
nothing. Three levers, each off by default:

    filter      measure each prompt's pass rate under the current policy (k samples each,
                pipelines/curation.py) and draw only those inside a band
                [min_pass_rate, max_pass_rate]: 1/8..7/8 with k = 8 drops the solved and the
                hopeless; 0..0 keeps only what the policy fails k times of k
    online      keep measuring while training, for free: every sampled group is a fresh
                measurement of its prompt. A group outside the band is left out of its step
                and refilled by the controller's sampling rounds, the loop DAPO's dynamic
                sampling runs (roles/controller.py, rl.max_sampling_rounds); its prompt leaves
                the pool until a re-measurement brings it back (PRIME, arXiv:2502.01456,
                filters its batches to 0.2..0.8 this way)
    curriculum  weights "failure": P(prompt) ∝ 1 − its latest pass rate, so what the policy
                fails is drawn more; "signal": ∝ p(1 − p), the signal density itself, so
                neither the solved nor the hopeless are drawn; order "easy_to_hard": the pool's difficulty labels
                (meta["difficulty"], else meta["level"]) unlock one at a time over the run

and one more before anything is measured: `cap_topics` (rl.curation.balance_topics) caps every
topic of the pool at the median topic's count, so the topic the data source happened to hold
most of does not take most draws (Kimi k1.5 tagged its RL prompts by domain and discipline to
keep them balanced; the median cap is this repository's rule, data/balance.py's).

A step's prompts are drawn i.i.d. (with replacement, as env.sample draws them) from the
prompts that are in the band and unlocked, by `probabilities(step)`, from a generator
seeded by (seed, step, round): a resumed run draws what an uninterrupted one draws, given
the state that state_dict() saves (pass rates, who left the pool and why, draw counts).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from posttrain.config import CURATION_ORDERS, CURATION_WEIGHTS
from posttrain.data.balance import balance_by, median_caps, topic_label
from posttrain.runs.console import console
from posttrain.seeds import derive_seed
from posttrain.types import Episode, Example
from posttrain.verifiers.contract import is_solved

KEPT = "kept"


def band_verdict(passes: int, tries: int, low: float, high: float) -> str:
    """KEPT when the pass rate passes/tries is inside [low, high], else why not: "solved"
    or "hopeless" (all or none passed), "too easy" or "too hard" (outside the band)."""
    rate = passes / tries
    if low <= rate <= high:
        return KEPT
    if rate > high:
        return "solved" if passes == tries else "too easy"
    return "hopeless" if passes == 0 else "too hard"


def curriculum_weights(mode: str, pass_rates: list[float | None]) -> list[float]:
    """Each prompt's weight under `mode`: "uniform" 1; "failure" 1 − p (what the policy fails
    most is drawn most, a solved prompt never); "signal" p(1 − p) (neither the solved nor the
    hopeless). A prompt not yet measured gets the mode's largest weight, 1 or ¼."""
    if mode == "failure":
        return [1.0 if p is None else 1.0 - p for p in pass_rates]
    if mode == "signal":
        return [0.25 if p is None else p * (1.0 - p) for p in pass_rates]
    return [1.0] * len(pass_rates)


def unlocked_labels(labels: list[float], step: int, steps: int) -> int:
    """How many of the sorted distinct difficulty `labels` an easy → hard curriculum has
    unlocked at `step` of `steps`: the run is cut into len(labels) equal stages and stage j
    adds the j-th easiest label (the easier ones stay in the pool, so they are not forgotten)."""
    return min(len(labels), len(labels) * step // max(1, steps) + 1)


def difficulty(example: Example) -> float | None:
    """An example's difficulty label: meta["difficulty"], else meta["level"] (arithmetic's)."""
    label = example.meta.get("difficulty", example.meta.get("level"))
    return float(label) if isinstance(label, (int, float)) and not isinstance(label, bool) else None


NO_TOPIC = "no topic"  # the bucket of the prompts that name neither a topic nor a difficulty label


def cap_topics(examples: list[Example], seed: int) -> tuple[list[Example], list[tuple[Example, str]]]:
    """Every topic of the pool (data/balance.py::topic_label: meta["topic"], else the
    difficulty label; NO_TOPIC for neither) capped at the median topic's count, rounded up, by
    a draw seeded from `seed`. Returns the kept examples in their order and the dropped ones with
    their reason, for curation.jsonl. Raises ValueError when no example names a topic or a
    label: there is nothing to balance by."""
    if examples and all(topic_label(e.meta) is None for e in examples):
        raise ValueError(f"rl.curation.balance_topics: none of the {len(examples)} pool prompts names a topic "
                         "(meta.topic: a `topic` column of a data file) or a difficulty label (meta.difficulty, "
                         "meta.level), so there is nothing to balance by; label the data, or set it false")

    def topic(example: Example) -> str:
        return topic_label(example.meta) or NO_TOPIC

    kept, report = balance_by(examples, topic, median_caps, random.Random(seed))
    kept_ids = {id(e) for e in kept}
    dropped = [(e, f"topic balance: {topic(e)} held {report[topic(e)]['before']} prompts, capped at the median "
                   f"topic's {report[topic(e)]['kept']}") for e in examples if id(e) not in kept_ids]
    return kept, dropped


@dataclass
class Measurement:
    """A prompt's latest pass count: `passes` of `tries` samples, at `step` (-1: before RL)."""

    passes: int
    tries: int
    step: int

    @property
    def rate(self) -> float:
        return self.passes / self.tries


class PromptPool:
    """The curated training prompts and what is known of each.

    examples   the pool, distinct prompts (screened by data/decontamination.py)
    seed       the run's seed: step s, round r draws from derive_seed(seed, "rl-prompts", s[, r])
    steps      the run's RL steps (the easy → hard schedule spreads its stages over them)
    band       (min_pass_rate, max_pass_rate), inclusive; (0, 1) filters nothing
    online     filter each step's groups by the band, and drop from the pool a prompt whose
               fresh measurement leaves it
    weights    "uniform", "failure" (∝ 1 − pass rate) or "signal" (∝ p(1 − p))
    order      "none" or "easy_to_hard"
    screened_out  the prompts dropped before the pool was made (dedup, decontamination, guessable,
               topic balance), with the reason: for the record
    """

    def __init__(self, examples: list[Example], *, seed: int, steps: int, band: tuple[float, float] = (0.0, 1.0),
                 online: bool = False, weights: str = "uniform", order: str = "none",
                 screened_out: list[tuple[Example, str]] = ()):
        if not examples:
            raise ValueError("the curated pool is empty: nothing is left to train on; raise rl.curation.pool_size")
        if weights not in CURATION_WEIGHTS or order not in CURATION_ORDERS:
            raise ValueError(f"weights must be one of {list(CURATION_WEIGHTS)} and order one of {list(CURATION_ORDERS)}, "
                             f"got {weights!r} and {order!r}")
        self.examples, self.seed, self.steps = examples, seed, steps
        self.band, self.online, self.weights, self.order = band, online, weights, order
        self.screened_out = list(screened_out)  # (prompt, why) of the prompts dropped before the pool was made
        self.index = {e.prompt: i for i, e in enumerate(examples)}
        if len(self.index) < len(examples):
            raise ValueError("the curated pool holds a prompt twice; dedup it first (data/decontamination.py)")
        self.labels = [difficulty(e) for e in examples]
        if order == "easy_to_hard" and None in self.labels:
            unlabelled = examples[self.labels.index(None)]
            raise ValueError(f"an easy-to-hard curriculum needs a difficulty label on every prompt (meta.difficulty "
                             f"or meta.level, a number), and {unlabelled.prompt.strip()[:60]!r} has none: label the "
                             "data, or use a mixed-level task (--env.arithmetic.levels 2,3,5 for arithmetic)")
        self.distinct_labels = sorted({label for label in self.labels if label is not None})
        n = len(examples)
        self.measured: list[Measurement | None] = [None] * n  # the latest measurement of each prompt
        self.first: list[Measurement | None] = [None] * n  # the one before RL, for the record
        self.status = [KEPT] * n  # KEPT, or why the prompt is out of the pool (band_verdict's words)
        self.changed_at = [-1] * n  # the step its status last changed (-1: before RL)
        self.draws = [0] * n  # how often each prompt was drawn into a step
        self.dropped_online = 0  # prompts the online filter took out of the pool, in all
        self.fallback_steps = 0  # steps that found no prompt in the band and drew from every unlocked one

    # -- measuring ----------------------------------------------------------------------------

    def set_measurement(self, passes: list[int], tries: int, step: int = -1) -> None:
        """The pass counts of a pass over the whole pool (pipelines/curation.py), in pool
        order; each prompt's status follows the band."""
        if len(passes) != len(self.examples):
            raise ValueError(f"{len(passes)} pass counts for a pool of {len(self.examples)} prompts")
        for i, count in enumerate(passes):
            self._record(i, Measurement(count, tries, step))
            if self.first[i] is None:
                self.first[i] = self.measured[i]

    def _record(self, i: int, measurement: Measurement) -> None:
        self.measured[i] = measurement
        verdict = band_verdict(measurement.passes, measurement.tries, *self.band)
        if verdict != self.status[i]:
            self.status[i], self.changed_at[i] = verdict, measurement.step

    def observe(self, step: int, episodes: list[Episode]) -> None:
        """Each group of a step's sampled episodes is a fresh measurement of its prompt: its
        pass rate is the prompt's latest (what the curriculum's weights read). Online, a prompt
        whose group falls outside the band leaves the pool."""
        for i, passes, tries in self._groups(episodes).values():
            before = self.status[i]
            measurement = Measurement(passes, tries, step)
            if self.online:
                self._record(i, measurement)
                self.dropped_online += before == KEPT and self.status[i] != KEPT
            else:
                self.measured[i] = measurement

    def keep_groups(self, episodes: list[Episode]) -> set[int]:
        """The group ids whose pass rate is inside the band (every group unless online)."""
        groups = self._groups(episodes)
        if not self.online:
            return set(groups)
        return {g for g, (_, passes, tries) in groups.items() if band_verdict(passes, tries, *self.band) == KEPT}

    def _groups(self, episodes: list[Episode]) -> dict[int, tuple[int, int, int]]:
        """group id -> (pool index, passes, tries) of a step's scored episodes."""
        groups: dict[int, tuple[int, int, int]] = {}
        for e in episodes:
            i, passes, tries = groups.get(e.group_id, (self.index[e.example.prompt], 0, 0))
            groups[e.group_id] = (i, passes + is_solved(e.reward, e.details), tries + 1)
        return groups

    # -- drawing -------------------------------------------------------------------------------

    def probabilities(self, step: int) -> list[float]:
        """P(prompt i is each draw of `step`), the formula the draws follow: 0 outside the
        band or not yet unlocked, the rest ∝ its weight (curriculum_weights). When no
        prompt is in the band, every unlocked prompt is a candidate; when every candidate's
        weight is 0 (all solved), they are drawn uniformly."""
        unlocked = self.unlocked(step)
        candidates = [i for i in unlocked if self.status[i] == KEPT] or unlocked
        weights = curriculum_weights(self.weights, [None if self.measured[i] is None else self.measured[i].rate
                                                    for i in candidates])
        if sum(weights) == 0:
            weights = [1.0] * len(candidates)
        total = sum(weights)
        probabilities = [0.0] * len(self.examples)
        for i, weight in zip(candidates, weights):
            probabilities[i] = weight / total
        return probabilities

    def unlocked(self, step: int) -> list[int]:
        """The pool indices the easy → hard schedule allows at `step` (all without an order)."""
        if self.order == "none":
            return list(range(len(self.examples)))
        allowed = set(self.distinct_labels[: unlocked_labels(self.distinct_labels, step, self.steps)])
        return [i for i, label in enumerate(self.labels) if label in allowed]

    def draw(self, step: int, round: int, n: int) -> list[Example]:
        """n prompts for `step` (sampling round `round`), i.i.d. by probabilities(step)."""
        unlocked = self.unlocked(step)
        if not any(self.status[i] == KEPT for i in unlocked):
            if self.fallback_steps == 0:
                console.print(f"[yellow]curation: at step {step} no prompt of the pool is inside the pass-rate band "
                              f"{list(self.band)} (all solved or hopeless); drawing from all {len(unlocked)} unlocked "
                              "prompts until one is back in it (a re-measurement: rl.curation.remeasure_every)")
            self.fallback_steps += round == 0
        tag = (step,) if round == 0 else (step, round)
        rng = random.Random(derive_seed(self.seed, "rl-prompts", *tag))
        chosen = rng.choices(range(len(self.examples)), weights=self.probabilities(step), k=n)
        for i in chosen:
            self.draws[i] += 1
        return [self.examples[i] for i in chosen]

    # -- what a step logs, what a checkpoint saves -------------------------------------------------

    def step_metrics(self, step: int) -> dict[str, float]:
        kept = [i for i in range(len(self.examples)) if self.status[i] == KEPT]
        rates = [m.rate for m in self.measured if m is not None]
        metrics = {"curation/pool_kept": float(len(kept)), "curation/dropped_online": float(self.dropped_online)}
        if rates:  # the latest pass rates of the whole pool: how much of it the policy solves now
            metrics["curation/pool_pass_rate"] = sum(rates) / len(rates)
        if self.order == "easy_to_hard":
            metrics["curation/hardest_unlocked"] = self.distinct_labels[
                unlocked_labels(self.distinct_labels, step, self.steps) - 1]
        return metrics

    def fingerprint(self) -> str:
        """sha256 of the pool's prompts in order: a checkpoint of another pool is refused."""
        return hashlib.sha256("\0".join(e.prompt for e in self.examples).encode()).hexdigest()

    def state_dict(self) -> dict:
        pack = [None if m is None else (m.passes, m.tries, m.step) for m in self.measured]
        first = [None if m is None else (m.passes, m.tries, m.step) for m in self.first]
        return {"pool": self.fingerprint(), "measured": pack, "first": first,
                "status": list(self.status), "changed_at": list(self.changed_at), "draws": list(self.draws),
                "dropped_online": self.dropped_online, "fallback_steps": self.fallback_steps}

    def load_state_dict(self, state: dict) -> None:
        if state["pool"] != self.fingerprint():
            raise ValueError("the checkpoint's curated pool is not the pool this run built (its config or data "
                             "changed since): resume with the settings and data the run started with")
        self.measured = [None if m is None else Measurement(*m) for m in state["measured"]]
        self.first = [None if m is None else Measurement(*m) for m in state["first"]]
        self.status, self.changed_at = list(state["status"]), list(state["changed_at"])
        self.draws = list(state["draws"])
        self.dropped_online, self.fallback_steps = state["dropped_online"], state["fallback_steps"]
