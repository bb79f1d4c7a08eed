"""A bundled preference file in Anthropic's hh-rlhf schema, made from the arithmetic task.

hh-rlhf (Bai et al. 2022, arXiv:2204.05862) is the preference set the first RLHF recipes
trained reward models on: each row is two whole dialogues that share every turn but the
assistant's last, the one human raters preferred and the other, each written as one text
with a blank line and the speaker before every turn:

    chosen     "\\n\\nHuman: What is 7+5+9?\\n\\nAssistant: 7+5=12,12+9=21\\nFinal: 21"
    rejected   "\\n\\nHuman: What is 7+5+9?\\n\\nAssistant: 7+5=13,13+9=22\\nFinal: 22"

Nothing may be downloaded here, so this module writes a stand-in with exactly those two
columns, so that a real hh-rlhf file (`train.jsonl` of any of its subsets) drops in where
this one is read. A third of the rows are two-turn dialogues: the human then asks to add
or subtract one more number from the result, and the pair differs only in the answer to
that second question, after an identical right first answer, as hh-rlhf's later turns do.
The rater is the arithmetic task's verifier, not a person: every chosen answer scores 1
and every rejected one 0 (the rejected side is the one-sum slip carried forward,
Problem.carried_slip, the failure DPO finds hardest on this task).

The preference reader (data/preference.py) reads each dialogue as its turns, so a pair's
prompt is every turn before the last assistant turn:

    posttrain train --algo dpo --rl.preference.pairs posttrain/data/packs/hh_rlhf_arithmetic.jsonl

Rebuild: `python -m posttrain.data.hh_rlhf_fixture` (byte-identical; `--check` exits 1 when the
shipped file differs).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from posttrain.envs.arithmetic import ArithmeticEnv, Problem
from posttrain.files import jsonl_text, write_or_check
from posttrain.types import Example

HH_RLHF_FIXTURE = Path(__file__).resolve().parent / "packs" / "hh_rlhf_arithmetic.jsonl"
FIXTURE_PAIRS = 600
FIXTURE_SEED = 2204  # one seed for the whole file; change it and every row changes
TWO_TURN_EVERY = 3  # every third row is a two-turn dialogue


def dialogue(turns: list[tuple[str, str]]) -> str:
    """hh-rlhf's text of a dialogue: each (speaker, text) after a blank line and 'Speaker: '."""
    return "".join(f"\n\n{speaker}: {text}" for speaker, text in turns)


def hh_rlhf_rows(n: int = FIXTURE_PAIRS, seed: int = FIXTURE_SEED, level: int = 2) -> list[dict[str, str]]:
    """n rows {chosen, rejected} (module docstring) from n distinct problems of the arithmetic
    task's training split at `level`; deterministic in (n, seed, level). Raises RuntimeError
    if a chosen answer does not score 1 or a rejected one scores more than 0."""
    env = ArithmeticEnv(level=level, cot=True)
    rng = random.Random(seed)
    rows = []
    for index, example in enumerate(env.fixed_set("train", n, seed=seed)):
        expression = example.prompt[len("Q: "):-1]
        asked = [("Human", f"What is {expression}?")]
        problem, scored = Problem.from_expression(expression), example
        if index % TWO_TURN_EVERY == TWO_TURN_EVERY - 1:
            op, term = rng.choice("+-"), rng.randint(1, 9)
            total = problem.running_sums()[-1]
            if op == "-" and term > total:
                op = "+"
            asked += [("Assistant", env.solution(example)), ("Human", f"Now {'add' if op == '+' else 'subtract'} "
                                                                      f"{term} {'to' if op == '+' else 'from'} that.")]
            problem = Problem((total, term), (op,))
            scored = Example(f"Q: {problem.expression}\n", str(problem.running_sums()[-1]))
        chosen = f"{problem.chain_of_thought()}\nFinal: {problem.running_sums()[-1]}"
        rejected = problem.carried_slip(rng)
        if env.score(scored, chosen)["reward"] != 1.0 or env.score(scored, rejected)["reward"] != 0.0:
            raise RuntimeError(f"{asked!r}: the verifier does not prefer {chosen!r} to {rejected!r}; the fixture "
                               "would teach the opposite of its labels")
        rows.append({"chosen": dialogue(asked + [("Assistant", chosen)]),
                     "rejected": dialogue(asked + [("Assistant", rejected)])})
    return rows


def main(argv: list[str] | None = None) -> int:
    return write_or_check({HH_RLHF_FIXTURE: jsonl_text(hh_rlhf_rows())}, "python -m posttrain.data.hh_rlhf_fixture",
                          sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
