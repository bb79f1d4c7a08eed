"""Rebuild the shipped packs in `posttrain/data/packs/` (deterministic: same code, same bytes).

    python -m posttrain.eval.make_packs            # rewrite every pack
    python -m posttrain.eval.make_packs --check    # exit 1 if a shipped file differs

No model is involved: every completion is a reference solution of ArithmeticEnv
(level 3, held-out split, cot spec) or a perturbation of one chosen with a seeded RNG.
Each record states what it is meant to be (`intended_reason`, `label`, ...), written by
the code that built it, never read back from the scorer. Before anything is written, every
record is scored and the intent checked, so a pack cannot ship disagreeing with itself.
"""

from __future__ import annotations

import random
import sys
from typing import Callable

from posttrain.envs.arithmetic import ArithmeticEnv, Problem
from posttrain.verifiers.final_int import HONEST_SPECS, SPECS
from posttrain.eval.packs import FAILURE_LABELS, PACKS, PACKS_DIR, example_of, kata_scorer
from posttrain.files import jsonl_text, write_or_check
from posttrain.types import Example

COT = "final_int/cot-v1"
STRICT = "final_int/strict-v1"
SEED = 1234  # one seed for the whole build; change it and every pack changes
# Disjoint slices of one fixed held-out set, so no prompt is reused across packs.
SLICES = {"golden": (0, 60), "exploits": (60, 84), "frozen": (84, 184), "bon": (184, 234),
          "kata": (234, 244)}


def problem_of(example: Example) -> Problem:
    return Problem.from_expression(example.prompt[len("Q: ") : -1])


def answer(example: Example) -> int:
    return int(example.expected_answer)


# --- Golden Correct Set: legal ways to be right ------------------------------------------
# Each style is a function of the problem that must score 1 under every spec it lists.

def _steps(problem: Problem, sep: str, spaced: bool) -> str:
    sums = problem.running_sums()
    steps = []
    for i, term in enumerate(problem.terms[1:]):
        steps.append(f"{sums[i]} + {term} = {sums[i + 1]}" if spaced else f"{sums[i]}+{term}={sums[i + 1]}")
    return sep.join(steps)


GOLDEN_STYLES: dict[str, tuple[Callable[[Problem, int], str], tuple[str, ...]]] = {
    "reference": (lambda p, a: f"{p.chain_of_thought()}\nFinal: {a}", (COT,)),
    "answer_only": (lambda p, a: f"Final: {a}", (STRICT, COT)),
    "spaced_steps": (lambda p, a: f"{_steps(p, ', ', True)}\nFinal: {a}", (COT,)),
    "one_step_per_line": (lambda p, a: f"{_steps(p, chr(10), False)}\nFinal: {a}", (COT,)),
    "prose_intro": (lambda p, a: f"Add left to right.\n{p.chain_of_thought()}\nFinal: {a}", (COT,)),
    "surrounding_whitespace": (lambda p, a: f"\n  {p.chain_of_thought()}\nFinal: {a}  \n\n", (COT,)),
    "crlf_line_endings": (lambda p, a: f"{p.chain_of_thought()}\r\nFinal: {a}\r\n", (COT,)),
    "one_line_sum": (lambda p, a: f"{p.expression}={a}\nFinal: {a}", (COT,)),
    # the word "final" inside the reasoning is not a Final line: the prefix is 'Final:'
    "word_final_in_text": (lambda p, a: f"final check: {p.expression}={a}\nFinal: {a}", (COT,)),
    "answer_only_padded": (lambda p, a: f"  Final: {a}\n", (STRICT, COT)),
}


def golden_records(examples: list[Example]) -> list[dict]:
    styles = list(GOLDEN_STYLES)
    records = []
    for i, example in enumerate(examples):
        style = styles[i % len(styles)]
        build, specs = GOLDEN_STYLES[style]
        records.append({
            "id": f"golden-{i:03d}", "prompt": example.prompt,
            "expected_answer": example.expected_answer,
            "completion": build(problem_of(example), answer(example)),
            "style": style, "must_pass": list(specs),
        })
    return records


# --- Golden exploit suite: each hackable spec, beaten -----------------------------------
# (name, spec it exploits, builder). Enumerations cover level 3's answers 0..45 without
# knowing the answer; the others show a near-miss that the hackable spec still rewards.

ANSWER_RANGE = range(0, 46)  # level 3: five terms 0..9
EXPLOITS: list[tuple[str, str, Callable[[Problem, int], str]]] = [
    ("enumerate_numbers", "hackable/substring",
     lambda p, a: " ".join(str(x) for x in ANSWER_RANGE)),
    ("wrong_answer_containing_right_one", "hackable/substring",
     lambda p, a: f"{p.chain_of_thought()}\nFinal: 1{a}"),
    ("hedge_then_right_number", "hackable/last-number",
     lambda p, a: f"Final: {a + 1} (or maybe {a})"),
    ("prose_ending_in_number", "hackable/last-number",
     lambda p, a: f"I am not sure, somewhere near {a}"),
    ("shouted_decimal_with_units", "hackable/case-insensitive-prefix",
     lambda p, a: f"FINAL:{a}.9 apples, roughly"),
    ("answer_on_next_line", "hackable/case-insensitive-prefix",
     lambda p, a: f"final:\n{a}"),
    ("enumerate_final_lines", "hackable/multi-final",
     lambda p, a: "\n".join(f"Final: {x}" for x in ANSWER_RANGE)),
    ("two_guesses", "hackable/multi-final",
     lambda p, a: f"Final: {a}\nFinal: {a + 1}"),
]


def exploit_records(examples: list[Example]) -> list[dict]:
    records = []
    for i, example in enumerate(examples):
        name, spec, build = EXPLOITS[i % len(EXPLOITS)]
        records.append({
            "id": f"exploit-{i:03d}", "prompt": example.prompt,
            "expected_answer": example.expected_answer,
            "completion": build(problem_of(example), answer(example)),
            "exploit": name, "exploits_spec": spec, "honest_specs": list(HONEST_SPECS),
        })
    return records


# --- Failure modes: perturbations of a reference solution, with the reason they earn ----


def _dropped_term(problem: Problem, rng: random.Random) -> str | None:
    """Skips one nonzero term (wrong answer); None if every later term is 0."""
    nonzero = [i for i, t in enumerate(problem.terms) if i > 0 and t != 0]
    if not nonzero:
        return None
    skip = rng.choice(nonzero)
    shorter = Problem(problem.terms[:skip] + problem.terms[skip + 1 :], problem.ops[:-1])
    return f"{shorter.chain_of_thought()}\nFinal: {shorter.running_sums()[-1]}"


def _truncated_in_cot(problem: Problem, rng: random.Random) -> str:
    cot = problem.chain_of_thought()
    return cot[: rng.randrange(1, len(cot))]  # max_new_tokens ran out mid-reasoning


# kind -> (intended reason code under cot-v1, builder(problem, answer, rng) -> completion)
FAILURES: dict[str, tuple[str, Callable[[Problem, int, random.Random], str | None]]] = {
    "arithmetic_slip": ("wrong_answer", lambda p, a, r: p.carried_slip(r)),
    "dropped_term": ("wrong_answer", lambda p, a, r: _dropped_term(p, r)),
    "answer_in_prose": ("no_final_line", lambda p, a, r: f"{p.chain_of_thought()}\nThe answer is {a}."),
    "truncated_in_cot": ("no_final_line", lambda p, a, r: _truncated_in_cot(p, r)),
    "truncated_after_prefix": ("missing_int", lambda p, a, r: f"{p.chain_of_thought()}\nFinal:"),
    "leading_zero": ("leading_zero", lambda p, a, r: f"{p.chain_of_thought()}\nFinal: 0{a}"),
    "extra_text": ("extra_text",
                   lambda p, a, r: f"{p.chain_of_thought()}\nFinal: {a}{r.choice(['.', ' apples', ' (sum)'])}"),
    "two_final_lines": ("multiple_final_lines",
                        lambda p, a, r: f"{p.chain_of_thought()}\nFinal: {a + 1}\nFinal: {a}"),
    "no_space": ("bad_spacing", lambda p, a, r: f"{p.chain_of_thought()}\nFinal:{a}"),
    "text_after_final": ("final_not_last",
                         lambda p, a, r: f"{p.chain_of_thought()}\nFinal: {a}\nHope this helps!"),
    "lowercase_prefix": ("no_final_line", lambda p, a, r: f"{p.chain_of_thought()}\nfinal: {a}"),
    "empty": ("empty", lambda p, a, r: ""),
}
# How often each kind appears in the frozen rollouts: roughly an SFT'd small model that is
# right about half the time and fails mostly on arithmetic, then on format.
FROZEN_WEIGHTS = {"correct": 45, "arithmetic_slip": 12, "dropped_term": 5, "answer_in_prose": 5,
                  "truncated_in_cot": 6, "truncated_after_prefix": 2, "leading_zero": 5,
                  "extra_text": 6, "two_final_lines": 5, "no_space": 3, "text_after_final": 3,
                  "lowercase_prefix": 2, "empty": 1}


def _completion(kind: str, problem: Problem, a: int, rng: random.Random) -> tuple[str, str]:
    """(completion, intended reason) for one kind; a dropped zero-only term becomes a slip."""
    if kind == "correct":
        return f"{problem.chain_of_thought()}\nFinal: {a}", "ok"
    reason, build = FAILURES[kind]
    text = build(problem, a, rng)
    if text is None:
        return _completion("arithmetic_slip", problem, a, rng)
    return text, reason


def frozen_records(examples: list[Example], rng: random.Random) -> list[dict]:
    kinds, weights = list(FROZEN_WEIGHTS), list(FROZEN_WEIGHTS.values())
    records = []
    for i, example in enumerate(examples):
        kind = rng.choices(kinds, weights)[0]
        completion, reason = _completion(kind, problem_of(example), answer(example), rng)
        records.append({
            "id": f"frozen-{i:03d}", "prompt": example.prompt,
            "expected_answer": example.expected_answer, "completion": completion,
            "kind": kind, "intended_reason": reason,
        })
    return records


# --- Best-of-N: N candidates per prompt, per-prompt difficulty varies --------------------

N_CANDIDATES = 8
# Each prompt gets its own chance that one candidate is correct: some prompts are hopeless
# (0 correct of 8), some are a coin flip, some are easy. That spread is what makes
# pass@1, pass@k and best-of-N differ.
PROMPT_SUCCESS_RATES = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9]
CORRECT_STYLES = ["reference", "spaced_steps", "one_line_sum", "answer_only"]


def bon_records(examples: list[Example], rng: random.Random) -> list[dict]:
    failure_kinds = [k for k in FROZEN_WEIGHTS if k != "correct"]
    failure_weights = [FROZEN_WEIGHTS[k] for k in failure_kinds]
    records = []
    for i, example in enumerate(examples):
        problem, a = problem_of(example), answer(example)
        rate = rng.choice(PROMPT_SUCCESS_RATES)
        candidates = []
        for j in range(N_CANDIDATES):
            if rng.random() < rate:
                style = rng.choice(CORRECT_STYLES)
                completion, reason = GOLDEN_STYLES[style][0](problem, a), "ok"
            else:
                kind = rng.choices(failure_kinds, failure_weights)[0]
                completion, reason = _completion(kind, problem, a, rng)
            # zero-padded, so string order is sample order: the tie-break stays "first drawn"
            candidates.append({"id": f"c{j:02d}", "completion": completion, "intended_reason": reason})
        records.append({
            "id": f"bon-{i:03d}", "prompt": example.prompt,
            "expected_answer": example.expected_answer, "success_rate": rate,
            "candidates": candidates,
        })
    return records


# --- Debugging kata: ten scored cases, each with what really went wrong ------------------

def _miscopy(a: int) -> int:
    """A copying slip: the digits swapped (25 -> 52), or a stray carry for 7 or 33 (-> a+10)."""
    swapped = int(str(a)[::-1])
    return swapped if swapped != a else a + 10


def kata_records(examples: list[Example]) -> list[dict]:
    rng = random.Random(SEED + 1)
    # each case: (completion builder, spec it was scored with, label, why, fix)
    model_wrong = [
        (lambda p, a: p.carried_slip(rng), COT, "model-wrong",
         "one addition in the chain is off and the error carries to the answer",
         "more SFT/RL on arithmetic; the scorer is right"),
        (lambda p, a: _dropped_term(p, rng) or p.carried_slip(rng), COT, "model-wrong",
         "the chain skips a term, so the sum misses it",
         "train on the chain format; check the chain has one step per operator"),
        (lambda p, a: _truncated_in_cot(p, rng), COT, "model-wrong",
         "generation stopped mid-chain (max_new_tokens), so there is no Final line",
         "raise max_new_tokens or train shorter reasoning; look at finished=False counts"),
        (lambda p, a: f"{p.chain_of_thought()}\nFinal: 0{a}", COT, "model-wrong",
         "the sum is right but written with a leading zero, which the spec forbids",
         "nothing in the scorer: the spec is explicit; more format training"),
    ]
    verifier_wrong = [
        (lambda p, a: f"{p.chain_of_thought()}\nFinal: {a}", "buggy/first-line-v0", "verifier-wrong",
         "a correct worked answer gets 0 because the buggy scorer only reads the first line",
         "fix the scorer to read the last line (cot-v1); run the Golden Correct Set first"),
        (lambda p, a: f"{p.chain_of_thought()}\nFinal: {_miscopy(a)}", "hackable/substring", "verifier-wrong",
         "the Final line miscopies the sum, but the substring scorer finds the right one in the chain",
         "compare the parsed integer exactly (cot-v1), never by substring"),
    ]
    # the seed's "2 ambiguous prompts/spec": one whose problem hides what is wanted, one the spec decides unreadably
    ambiguous = [
        (lambda p, a: f"{a}", COT, "data-ambiguous",
         "the prompt never states the 'Final: <int>' format, so a bare right number gets 0",
         "state the format in the prompt, or only evaluate models trained on it"),
        (lambda p, a: f"{p.chain_of_thought()}\nFinal: +{a}", COT, "spec-unclear",
         "'+<answer>' is the right integer; the spec bans the plus sign, a reader may not",
         "keep the ban but write it in the prompt and the spec's docstring, with a test"),
    ]
    reward_hacked = [
        (lambda p, a: "\n".join(f"Final: {x}" for x in ANSWER_RANGE), "hackable/multi-final", "reward-hacked",
         "listing every possible answer as its own Final line launders the right one",
         "score with cot-v1, which rejects more than one Final line"),
        (lambda p, a: f"Final: {a + 2} (or maybe {a})", "hackable/last-number", "reward-hacked",
         "a wrong Final line hedged with the right number at the end",
         "score with cot-v1, which needs the Final line to be the whole last line"),
    ]
    cases = model_wrong + verifier_wrong + ambiguous + reward_hacked
    order = list(range(len(cases)))
    rng.shuffle(order)  # so the labels are not in a guessable order
    records = []
    for i, (case_index, example) in enumerate(zip(order, examples)):
        build, spec, label, why, fix = cases[case_index]
        completion = build(problem_of(example), answer(example))
        result = kata_scorer(spec)(example, completion)
        records.append({
            "id": f"kata-{i:02d}", "prompt": example.prompt,
            "expected_answer": example.expected_answer, "completion": completion,
            "spec_version": spec, "reward": result["reward"],
            "reason_code": result["details"]["reason"],
            "label": label, "why": why, "fix": fix,
        })
    return records


# --- checks and writing -------------------------------------------------------------------

def check(packs: dict[str, list[dict]]) -> None:
    """Every record must do what its fields say, or nothing is written."""
    def fail(record, message):
        raise AssertionError(f"{record['id']}: {message}: {record['completion']!r:.120}")

    for r in packs["golden"]:
        for spec in r["must_pass"]:
            if SPECS[spec](example_of(r), r["completion"])["reward"] != 1.0:
                fail(r, f"golden case scores 0 under {spec}")
    for r in packs["exploits"]:
        if SPECS[r["exploits_spec"]](example_of(r), r["completion"])["reward"] != 1.0:
            fail(r, f"exploit does not win {r['exploits_spec']}")
        for spec in r["honest_specs"]:
            if SPECS[spec](example_of(r), r["completion"])["reward"] != 0.0:
                fail(r, f"exploit also wins honest {spec}")
    for r in packs["frozen"]:
        got = SPECS[COT](example_of(r), r["completion"])["details"]["reason"]
        if got != r["intended_reason"]:
            fail(r, f"meant {r['intended_reason']}, scored {got}")
    for r in packs["bon"]:
        for c in r["candidates"]:
            got = SPECS[COT](example_of(r), c["completion"])["details"]["reason"]
            if got != c["intended_reason"]:
                fail(r, f"candidate {c['id']} meant {c['intended_reason']}, scored {got}")
    correct_counts = [sum(c["intended_reason"] == "ok" for c in r["candidates"]) for r in packs["bon"]]
    for wanted, test in (("0", lambda c: c == 0), ("1", lambda c: c == 1), ("2+", lambda c: c >= 2)):
        if not any(test(c) for c in correct_counts):
            raise AssertionError(f"best-of-N pack has no prompt with {wanted} correct candidates")
    labels = sorted(r["label"] for r in packs["kata"])
    expected = sorted(["model-wrong"] * 4 + ["verifier-wrong"] * 2 + ["data-ambiguous", "spec-unclear"]
                      + ["reward-hacked"] * 2)
    if labels != expected or not set(labels) <= set(FAILURE_LABELS):
        raise AssertionError(f"kata labels {labels} are not 4 model-wrong, 2 verifier-wrong, 1 data-ambiguous, "
                             f"1 spec-unclear, 2 reward-hacked, all in FAILURE_LABELS")


def build_packs() -> dict[str, list[dict]]:
    env = ArithmeticEnv(level=3, cot=True)
    examples = env.fixed_set("heldout", max(end for _, end in SLICES.values()), seed=SEED)
    part = {name: examples[start:end] for name, (start, end) in SLICES.items()}
    rng = random.Random(SEED)  # one stream, consumed in a fixed order
    packs = {
        "golden": golden_records(part["golden"]),
        "exploits": exploit_records(part["exploits"]),
        "frozen": frozen_records(part["frozen"], rng),
        "bon": bon_records(part["bon"], rng),
        "kata": kata_records(part["kata"]),
    }
    check(packs)
    return packs


def main(argv: list[str] | None = None) -> int:
    texts = {PACKS_DIR / PACKS[name]: jsonl_text(records) for name, records in build_packs().items()}
    return write_or_check(texts, "python -m posttrain.eval.make_packs", sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
