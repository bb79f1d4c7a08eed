"""Arithmetic: the default verifiable task, short enough for a character-level model.

    prompt:      "Q: 7+5+9+3+1\\n"
    completion:  "7+5=12,12+9=21,21+3=24,24+1=25\\nFinal: 25"     (cot=True, spec cot-v1)
    completion:  "Final: 25"                                      (cot=False, spec strict-v1)

The running-sum chain of thought gives the model one small step per comma, which is what
lets a tiny model learn the task. The rollout appends the end-of-sequence token.

Difficulty levels (terms are drawn uniformly and independently):

    level  terms  numbers  operators  distinct problems  train / dev / heldout
    1      2      0..9     +          100                90 / 3 / 7
    2      3      0..9     +          1,000              795 / 102 / 103
    3      5      0..9     +          100,000            79,977 / 9,975 / 10,048  (default)
    4      5      0..99    +          10^10              ~80% / 10% / 10%: unlimited
    5      5      0..9     + and -    1,600,000          ~80% / 10% / 10%; answers may be < 0

A mixed task (`levels="2,3,5"`) draws each problem's level uniformly from the list and
labels every example with it (`meta["level"]`): one distribution of easy and hard problems,
for a curriculum to order (posttrain/data/curation.py) and for its held-out set to cover.

`words=0.5` writes the prompts' numbers in English words ("Q: six+six+four\n") and that share
of the worked solutions in words too, the rest in digits: two "languages" a chain of thought
can mix, for R1's language-consistency reward (verifiers/number_words.py, rewards/language.py).

Is the held-out split big enough? A pass@1 estimated from m problems has a standard error
of up to 0.5/sqrt(m). Level 1's 7 held-out problems (±0.19) and level 2's 103 (±0.05) are
for smoke tests and curricula, not for claims; from level 3 up a held-out set of 1,000 or
more problems (±0.016) is available. `fixed_set` raises when a split cannot supply n.

Splits never overlap, by construction: a problem's split is a pure function of its
canonical expression ("7+5+9+3+1"), through sha256 into 100 buckets: train 0..79, dev
80..89, heldout 90..99. The level is not hashed, so an expression that exists at two
levels ("3+4+5+6+7" at levels 3 and 4) lands in the same split at both, and a curriculum
cannot leak held-out problems into training. Python's `hash()` is salted per process and
would reshuffle the splits every run, so it is never used.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from dataclasses import dataclass
from typing import Any, Iterator

from posttrain.verifiers.number_words import digits_to_words, words_to_digits
from posttrain.types import Example
from posttrain.verifiers.final_int import HONEST_SPECS, SPECS, get_spec

SPLIT_BUCKETS = {"train": range(0, 80), "dev": range(80, 90), "heldout": range(90, 100)}
# Recorded in every run's meta.json: change the rule and every split changes with it.
SPLIT_RULE = (
    "bucket = first 8 bytes of sha256(expression), big-endian, mod 100; "
    "train 0-79, dev 80-89, heldout 90-99"
)


@dataclass(frozen=True)
class Level:
    n_terms: int
    max_term: int  # terms are drawn from 0..max_term
    allow_minus: bool  # operators drawn from {+, -} instead of {+}

    @property
    def operators(self) -> str:
        return "+-" if self.allow_minus else "+"

    @property
    def n_problems(self) -> int:
        return (self.max_term + 1) ** self.n_terms * len(self.operators) ** (self.n_terms - 1)


LEVELS = {
    1: Level(n_terms=2, max_term=9, allow_minus=False),
    2: Level(n_terms=3, max_term=9, allow_minus=False),
    3: Level(n_terms=5, max_term=9, allow_minus=False),
    4: Level(n_terms=5, max_term=99, allow_minus=False),
    5: Level(n_terms=5, max_term=9, allow_minus=True),
}

# Up to this many problems, fixed_set lists the whole split (exact, and quick: level 3's
# 100,000 expressions hash in about half a second); above it, it samples distinct ones.
ENUMERATE_UP_TO = 200_000


@dataclass(frozen=True)
class Problem:
    terms: tuple[int, ...]
    ops: tuple[str, ...]  # ops[i] joins terms[i] and terms[i + 1]

    @property
    def expression(self) -> str:
        parts = [str(self.terms[0])]
        for op, term in zip(self.ops, self.terms[1:]):
            parts += [op, str(term)]
        return "".join(parts)

    def running_sums(self) -> list[int]:
        sums = [self.terms[0]]
        for op, term in zip(self.ops, self.terms[1:]):
            sums.append(sums[-1] + term if op == "+" else sums[-1] - term)
        return sums

    def chain_of_thought(self) -> str:
        """'7+5=12,12+9=21,...': one step per operator, each starting from the last sum."""
        sums = self.running_sums()
        steps = [
            f"{sums[i]}{op}{term}={sums[i + 1]}"
            for i, (op, term) in enumerate(zip(self.ops, self.terms[1:]))
        ]
        return ",".join(steps)

    def carried_slip(self, rng: random.Random) -> str:
        """A wrong solution as a policy writes one: the chain with one running sum off by 1..3
        (never below 0), every later step carried on from it and the Final line its last sum;
        each later addition is right, from a wrong start, so only checking the arithmetic of
        that one step catches it (the packs' arithmetic slip; DPO's rejected side in the
        UltraFeedback-schema fixture)."""
        sums = self.running_sums()
        step = rng.randrange(1, len(sums))
        delta = rng.choice([-3, -2, -1, 1, 2, 3])
        if sums[step] + delta < 0:
            delta = -delta
        wrong = sums[:step] + [s + delta for s in sums[step:]]
        chain = ",".join(f"{wrong[i]}{op}{term}={wrong[i + 1]}" for i, (op, term) in
                         enumerate(zip(self.ops, self.terms[1:])))
        return f"{chain}\nFinal: {wrong[-1]}"

    @staticmethod
    def from_expression(expression: str) -> Problem:
        terms, ops, digits = [], [], ""
        for char in expression:
            if char.isascii() and char.isdigit():
                digits += char
            elif char in "+-" and digits:
                terms.append(int(digits))
                ops.append(char)
                digits = ""
            else:
                raise ValueError(f"not an arithmetic expression: {expression!r}")
        if not digits:
            raise ValueError(f"not an arithmetic expression: {expression!r}")
        return Problem(tuple(terms + [int(digits)]), tuple(ops))


def split_of(expression: str) -> str:
    """The split a problem belongs to, from a stable hash of its canonical expression."""
    bucket = int.from_bytes(hashlib.sha256(expression.encode()).digest()[:8], "big") % 100
    return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def all_expressions(level: int) -> Iterator[str]:
    """Every problem of a level as its canonical expression, in lexicographic order.
    Strings, not Problem objects: building 100,000 dataclasses would triple the time."""
    shape = LEVELS[level]
    numbers = [str(term) for term in range(shape.max_term + 1)]
    for terms in itertools.product(numbers, repeat=shape.n_terms):
        for ops in itertools.product(shape.operators, repeat=shape.n_terms - 1):
            yield terms[0] + "".join(op + term for op, term in zip(ops, terms[1:]))


@functools.lru_cache(maxsize=None)
def expressions_by_split(level: int) -> dict[str, tuple[str, ...]]:
    """All expressions of a (small) level grouped by split; computed once per process."""
    groups: dict[str, list[str]] = {split: [] for split in SPLIT_BUCKETS}
    for expression in all_expressions(level):
        groups[split_of(expression)].append(expression)
    return {split: tuple(expressions) for split, expressions in groups.items()}


def _check_choice(field: str, value: Any, allowed: list) -> None:
    # compare types too: `True in [1, 2]` holds, because bool is a subclass of int
    if not any(value == choice and type(value) is type(choice) for choice in allowed):
        raise ValueError(f"{field} must be one of {allowed}, got {value!r}")


class ArithmeticEnv:
    """Sum-of-terms problems with a `Final: <int>` answer.

    level          difficulty 1..5 (table in the module docstring); 3 is the default task.
    cot            True: the reference completion shows the running sums (spec cot-v1);
                   False: it is only `Final: <int>` (spec strict-v1).
    seed           seeds the environment's own stream for `sample(..., seed=None)`.
    spec_version   override the scorer, e.g. with a hackable variant for red-teaming; it
                   must accept this environment's reference solutions.
    levels         a mixed task instead of one level: "2,3,5" draws each problem's level
                   uniformly from these; "" = `level` alone.
    words          0: numbers in digits. In (0, 1]: prompts in number words, and this share of
                   the problems (a hash of each decides) solved in words, the rest in digits.
    """

    def __init__(
        self, level: int = 3, cot: bool = True, seed: int = 0, spec_version: str | None = None, levels: str = "",
        words: float = 0.0,
    ):
        _check_choice("level", level, list(LEVELS))
        self.levels = parse_levels(levels, level)
        if isinstance(words, bool) or not isinstance(words, (int, float)) or not 0 <= words <= 1 or (
                words and any(LEVELS[lv].allow_minus for lv in self.levels)):
            raise ValueError(f"words must be a share in [0, 1] (0 = digits), on levels without minus signs (1-4: "
                             f"'-' would read as the hyphen of 'twenty-six'), got words={words!r} on levels "
                             f"{list(self.levels)}")
        self.words = float(words)
        _check_choice("cot", cot, [True, False])
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if spec_version is None:
            spec_version = "final_int/cot-v1" if cot else "final_int/strict-v1"
        _check_choice("spec_version", spec_version, list(SPECS))
        self.level, self.cot, self.seed = level, cot, seed
        self._spec = get_spec(spec_version)
        self._rng = random.Random(seed)
        # A scorer that rejects the environment's own demonstrations would train nothing:
        # catch that mismatch here (e.g. cot=True with strict-v1) instead of mid-run.
        probe = self._example(self._draw(random.Random(0), self.levels[0]), self.levels[0])
        if self.score(probe, self.solution(probe))["reward"] != 1.0:
            raise ValueError(
                f"spec_version {spec_version!r} gives 0 to this environment's reference "
                f"solution with cot={cot} ({self.solution(probe)!r}); use cot=False with "
                f"'final_int/strict-v1' or cot=True with 'final_int/cot-v1'"
            )

    @property
    def spec_version(self) -> str:
        return self._spec.version

    @property
    def name(self) -> str:
        return (f"arithmetic-L{'+'.join(map(str, self.levels))}" + ("-cot" if self.cot else "")
                + (f"-words{self.words:g}" if self.words else ""))

    @property
    def split_rule(self) -> str:
        return SPLIT_RULE

    @property
    def honest(self) -> bool:
        """False when scored by a deliberately hackable spec."""
        return self.spec_version in HONEST_SPECS

    # --- problems --------------------------------------------------------------------

    def _draw(self, rng: random.Random, level: int) -> Problem:
        shape = LEVELS[level]
        terms = tuple(rng.randint(0, shape.max_term) for _ in range(shape.n_terms))
        ops = tuple(rng.choice(shape.operators) for _ in range(shape.n_terms - 1))
        return Problem(terms, ops)

    def _example(self, problem: Problem, level: int) -> Example:
        return Example(
            prompt=f"Q: {digits_to_words(problem.expression) if self.words else problem.expression}\n",
            expected_answer=str(problem.running_sums()[-1]),
            id=f"arith-L{level}-{problem.expression}",
            meta={
                "level": level,
                "terms": list(problem.terms),
                "ops": list(problem.ops),
                "split": split_of(problem.expression),
            },
        )

    # --- the environment interface -----------------------------------------------------

    def sample(self, split: str, n: int, seed: int | None = None) -> list[Example]:
        """n problems drawn i.i.d. from `split` (repeats possible), by rejection sampling; a
        mixed task first draws each problem's level. With an int `seed` the draw is
        reproducible on its own; with None it continues the environment's stream, so
        successive training batches differ."""
        check_split_request(split, n)
        rng = self._rng if seed is None else random.Random(seed)
        examples: list[Example] = []
        while len(examples) < n:
            # one level draws no level: the stream (and every number measured on it) stays as it was
            level = self.levels[0] if len(self.levels) == 1 else rng.choice(self.levels)
            problem = self._draw(rng, level)
            while split_of(problem.expression) != split:
                problem = self._draw(rng, level)
            examples.append(self._example(problem, level))
        return examples

    def fixed_set(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """n DISTINCT problems of `split`, the same ones every call: the evaluation set.
        A smaller set is a prefix of a larger one with the same seed. A mixed task takes
        its levels in turn, each level's own fixed set in order (a level that runs out
        leaves its turns to the others; a prompt two levels share is taken once)."""
        if len(self.levels) == 1:
            return self._level_fixed_set(self.levels[0], split, n, seed)
        check_split_request(split, n)
        queues = [iter(self._level_fixed_set(level, split, min(n, level_split_size(level, split)), seed))
                  for level in self.levels]
        chosen: dict[str, Example] = {}
        while len(chosen) < n and queues:
            for queue in list(queues):
                example = next(queue, None)
                if example is None:
                    queues.remove(queue)
                elif len(chosen) < n:
                    chosen.setdefault(example.prompt, example)
        if len(chosen) < n:
            raise ValueError(f"split {split!r} of levels {list(self.levels)} holds only {len(chosen)} distinct "
                             f"problems, fewer than n={n}; ask for fewer or add a higher level")
        return list(chosen.values())

    def _level_fixed_set(self, level: int, split: str, n: int, seed: int) -> list[Example]:
        check_split_request(split, n)
        rng = random.Random(seed)
        shape = LEVELS[level]
        if shape.n_problems <= ENUMERATE_UP_TO:
            in_split = list(expressions_by_split(level)[split])  # a copy: we shuffle it
            if len(in_split) < n:
                raise ValueError(
                    f"split {split!r} of level {level} holds only {len(in_split)} "
                    f"distinct problems, fewer than n={n}; ask for fewer or use a higher level"
                )
            rng.shuffle(in_split)
            return [self._example(Problem.from_expression(e), level) for e in in_split[:n]]
        chosen: dict[str, Problem] = {}  # dicts keep insertion order: deterministic output
        max_draws = 50 * n + 10_000  # ~10 draws per dev/heldout hit, plus room for repeats
        for _ in range(max_draws):
            problem = self._draw(rng, level)
            if split_of(problem.expression) == split:
                chosen.setdefault(problem.expression, problem)
                if len(chosen) == n:
                    return [self._example(p, level) for p in chosen.values()]
        raise ValueError(
            f"found only {len(chosen)} distinct problems of split {split!r} at level "
            f"{level} in {max_draws} draws, fewer than n={n}; ask for fewer"
        )

    def solution(self, example: Example) -> str:
        """The reference completion (an SFT demonstration); it scores 1 under this env's
        spec. It is computed from the prompt, not copied from `expected_answer`, so scoring
        it checks that the two agree."""
        if not (example.prompt.startswith("Q: ") and example.prompt.endswith("\n")):
            raise ValueError(f"not an arithmetic prompt (want 'Q: <expr>\\n'): {example.prompt!r}")
        problem = Problem.from_expression(words_to_digits(example.prompt[len("Q: ") : -1]))
        final = f"Final: {problem.running_sums()[-1]}"
        if not self.cot:
            return final
        chain = problem.chain_of_thought()
        return f"{digits_to_words(chain) if self.solved_in_words(problem) else chain}\n{final}"

    def solved_in_words(self, problem: Problem) -> bool:
        """Whether the worked solution is in words: a stable hash of the problem against the
        share `words`, so each problem keeps its language from run to run."""
        draw = int.from_bytes(hashlib.sha256(f"words:{problem.expression}".encode()).digest()[:8], "big") % 1000
        return draw < 1000 * self.words

    def score(self, example: Example, completion: str) -> dict[str, Any]:
        """The one scorer contract; delegates to the spec (see final_int.py)."""
        return self._spec(example, completion)

    def __repr__(self) -> str:
        mixed = f", levels={','.join(map(str, self.levels))!r}" if len(self.levels) > 1 else ""
        return (
            f"ArithmeticEnv(level={self.level}, cot={self.cot}, seed={self.seed}, "
            f"spec_version={self.spec_version!r}{mixed}" + (f", words={self.words:g})" if self.words else ")")
        )


def parse_levels(levels: str, level: int) -> tuple[int, ...]:
    """The levels of a task: `levels` ("2,3,5", distinct, in the order given) or, when it
    is "", `level` alone; ValueError naming what is wrong."""
    if not isinstance(levels, str):
        raise ValueError(f"levels must be a comma-separated str such as '2,3,5', got {levels!r}")
    if not levels.strip():
        return (level,)
    parts = [part.strip() for part in levels.split(",")]
    if not all(part.isdigit() and int(part) in LEVELS for part in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"levels must list distinct levels of {list(LEVELS)}, comma-separated (e.g. '2,3,5'), "
                         f"got {levels!r}")
    if level != 3:
        raise ValueError(f"give level ({level}) or levels ({levels!r}), not both: levels already names every level")
    return tuple(int(part) for part in parts)


def level_split_size(level: int, split: str) -> int:
    """How many distinct problems `split` of `level` holds (a large level: more than any set asks)."""
    if LEVELS[level].n_problems <= ENUMERATE_UP_TO:
        return len(expressions_by_split(level)[split])
    return LEVELS[level].n_problems


def check_split_request(split: Any, n: Any) -> None:
    """What every hash-split environment checks of sample/fixed_set's arguments: a known
    split and a count that is an int >= 0 (a bool is refused, though it is an int)."""
    _check_choice("split", split, list(SPLIT_BUCKETS))
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
