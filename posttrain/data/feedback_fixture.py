"""A bundled preference file in UltraFeedback's schema, made from the arithmetic task.

The seed's capstone trains DPO on UltraFeedback (Cui et al. 2023, arXiv:2310.01377):
prompts answered by several models, each answer rated 1-10 by GPT-4, binarised into the
best-rated answer (chosen) against another (rejected). Nothing may be downloaded here, so
this module writes a small stand-in with the same columns (those of the binarised set,
`HuggingFaceH4/ultrafeedback_binarized`), from a task the library can check:

    prompt          "Q: 7+5+9+3+1\\n"                     the user's request, as text
    prompt_id       sha256 of the prompt, hex             as the binarised set names rows
    chosen          [{"role": "user", "content": prompt},
                     {"role": "assistant", "content": "7+5=12,12+9=21,21+3=24,24+1=25\\nFinal: 25"}]
    rejected        the same conversation, with a slip: "7+5=12,12+9=20,20+3=23,23+1=24\\nFinal: 24"
    score_chosen    10.0                                  on UltraFeedback's 1..10 scale
    score_rejected  1 + 9 × (share of steps labelled right before the slip), e.g. 3.25

The rater is the arithmetic step checker (verifiers/steps.py: a step is right while every
step so far holds and follows the problem), not GPT-4, so the scores are exact where
UltraFeedback's are noisy; and every rejected answer is the failure offline DPO finds
hardest on this task: one addition off by 1-3, then that wrong sum carried forward
correctly (docs/guides/preference.md). Prompts come from the training split, so a
policy trained on the file is still measured on problems it never saw.

`posttrain train --algo dpo --rl.preference.pairs FEEDBACK_FIXTURE` reads the file as it is (a
`prompt` column beside chosen/rejected conversations whose first turns repeat it, as in
UltraFeedback; the scores and the id stay in each pair's meta).

Rebuild: `python -m posttrain.data.feedback_fixture` (byte-identical; `--check` exits 1
when the shipped file differs).
"""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path
from typing import Any

from posttrain.envs.arithmetic import ArithmeticEnv, Problem
from posttrain.files import jsonl_text, write_or_check
from posttrain.types import Example
from posttrain.verifiers.steps import arithmetic_step_labels

FEEDBACK_FIXTURE = Path(__file__).resolve().parent / "packs" / "ultrafeedback_arithmetic.jsonl"
FIXTURE_PAIRS = 800  # 100 DPO steps × 32 pairs see each pair 4 times: below the stage's overfitting warning (8)
FIXTURE_SEED = 2310  # one seed for the whole file; change it and every row changes
COLUMNS = ("prompt", "prompt_id", "chosen", "rejected", "score_chosen", "score_rejected")



def step_score(example: Example, completion: str) -> float:
    """1 + 9 × (share of the completion's steps the step checker labels right): 10 for a
    right chain, down to 1 for one wrong from its first step; UltraFeedback's 1..10 scale."""
    _, labels = arithmetic_step_labels(example, completion)
    return 1.0 + 9.0 * sum(labels) / len(labels)


def feedback_rows(n: int = FIXTURE_PAIRS, seed: int = FIXTURE_SEED, level: int = 3) -> list[dict[str, Any]]:
    """n rows in UltraFeedback-binarised's schema (module docstring), prompts n distinct
    problems of the arithmetic task's training split at `level`. Deterministic in (n, seed,
    level)."""
    env = ArithmeticEnv(level=level, cot=True)
    rng = random.Random(seed)
    rows = []
    for example in env.fixed_set("train", n, seed=seed):
        chosen = env.solution(example)
        rejected = Problem.from_expression(example.prompt[len("Q: "):-1]).carried_slip(rng)
        if env.score(example, chosen)["reward"] != 1.0 or env.score(example, rejected)["reward"] != 0.0:
            raise RuntimeError(f"{example.prompt!r}: the verifier does not prefer {chosen!r} to {rejected!r}; the "
                               "fixture would teach the opposite of its scores")
        user = {"role": "user", "content": example.prompt}
        rows.append({
            "prompt": example.prompt,
            "prompt_id": hashlib.sha256(example.prompt.encode()).hexdigest(),
            "chosen": [user, {"role": "assistant", "content": chosen}],
            "rejected": [user, {"role": "assistant", "content": rejected}],
            "score_chosen": step_score(example, chosen),
            "score_rejected": step_score(example, rejected),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    return write_or_check({FEEDBACK_FIXTURE: jsonl_text(feedback_rows())}, "python -m posttrain.data.feedback_fixture",
                          sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
