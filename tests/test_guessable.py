"""Multiple-choice and true/false items out of RL data: the rule reads the answer before the
prompt (an open problem is never dropped for its wording), and rl.curation.exclude_guessable
screens them out of a curated pool with their reason."""

from __future__ import annotations

import dataclasses

import pytest

from posttrain.config import TrainConfig
from posttrain.data.guessable import guessable
from posttrain.pipelines.curation import build_pool, summary_line
from posttrain.types import Example

CHOICES = "Which is prime?\nA) 4\nB) 7\nC) 9\nD) 12\n"


@pytest.mark.parametrize("prompt, answer, why", [
    ("Is 7 prime?", "True", "true/false: a guess is paid 1/2 of the time"),
    ("Is 9 prime? Answer yes or no.", "no.", "true/false: a guess is paid 1/2 of the time"),
    (CHOICES, "B", "multiple choice (4 options): a guess is paid 1/4 of the time"),
    (CHOICES.replace("A) ", "(A) ").replace("B) ", "(B) "), "(B)", "multiple choice (4 options): a guess is paid 1/4 of the time"),
    ("Pick one.\nA. red\nB. blue\n", "A", "multiple choice (2 options): a guess is paid 1/2 of the time"),
    (CHOICES, "E", None),  # not one of the listed options
    ("What is the first letter of the alphabet?", "A", None),  # a letter answer, no options listed
    ("Plan A) failed; what is 7*6?", "42", None),  # option-like text, an open answer
    ("What is 7*6?", "42", None),
])
def test_the_rule_reads_the_answer_then_the_options(prompt, answer, why):
    assert guessable(Example(prompt, answer)) == why


class MixedTask:
    """40 open products, 20 yes/no items and 20 three-option items, all in train; one
    held-out and one dev problem (build_pool screens the pool against them)."""

    def __init__(self):
        self.train = [Example(f"What is {a}*7?", str(a * 7)) for a in range(40)]
        self.train += [Example(f"Is {a} even?", "yes" if a % 2 == 0 else "no") for a in range(20)]
        self.train += [Example(f"Which is {a}+1?\nA) {a}\nB) {a + 1}\nC) {a + 2}\n", "B") for a in range(20)]

    def fixed_set(self, split, n, seed=0):
        return self.train[:n] if split == "train" else [Example(f"What is 1000*{split == 'dev'}?", "0")]


def test_a_curated_pool_screens_out_guessable_items():
    cfg = TrainConfig()
    cfg = dataclasses.replace(cfg, heldout_size=1, rl=dataclasses.replace(
        cfg.rl, dev_size=1, curation=dataclasses.replace(cfg.rl.curation, pool_size=80, exclude_guessable=True)))
    pool = build_pool(cfg, MixedTask())
    reasons = [reason for _, reason in pool.screened_out]
    assert [example.prompt for example in pool.examples] == [f"What is {a}*7?" for a in range(40)]
    assert len(reasons) == 40 and {reason.split(":")[0] for reason in reasons} == {
        "true/false", "multiple choice (3 options)"}
    assert summary_line(pool).startswith("40 screened out (dedup, decontamination, guessable, topic balance), "
                                         "40 of 40 prompts")
    off = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, curation=dataclasses.replace(
        cfg.rl.curation, exclude_guessable=False)))
    assert len(build_pool(off, MixedTask()).examples) == 80
