"""`posttrain equivalence`: train Kimi k1.5's answer-equivalence judge at toy scale and measure
the rule, the judge and the two together on held-out rows (rewards/equivalence_judge.py).

    posttrain equivalence --out runs/equivalence_judge --threads 1

writes the judge to --out (a reward-model directory: `--rl.rm.path runs/equivalence_judge`
trains a policy on the two-stage check) with the measured table in its reward_model.json,
and prints the table. Held-out rows are drawn from other references (split_references: 20
of 0..99 never appear as a training row's reference), so no held-out comparison was seen in
training; the command counts and prints the overlap, which is 0 by construction.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

from posttrain.cli.flags import parse_settings, use_threads
from posttrain.config.commands import EquivalenceConfig

if TYPE_CHECKING:  # the names only: importing them loads torch, which --help must not wait for
    from posttrain.rewards.equivalence_judge import EquivalenceChecker
    from posttrain.verifiers.answer_forms import AnswerPair


def measure(checker: EquivalenceChecker, pairs: Sequence[AnswerPair], seed: int = 0) -> dict[str, dict]:
    """The three checkers on `pairs` (EquivalenceChecker, AnswerPair rows): for each, accuracy,
    the false-positive rate (wrong rows paid, over the wrong rows) and the false-negative rate
    (right rows not paid, over the right rows), each a bootstrap 95% CI; for the rule, also
    its coverage (rows it parses) and its accuracy where it parses."""
    from posttrain.eval.stats import bootstrap_ci
    from posttrain.rewards.equivalence_judge import judge_text
    from posttrain.verifiers.answer_forms import read_final_line

    truth = [p.equivalent for p in pairs]
    rule_values = [read_final_line(p.line)[1] for p in pairs]
    rule_paid = [v is not None and v == str(p.reference) for v, p in zip(rule_values, pairs)]
    texts = [judge_text(p.reference, p.line) for p in pairs]
    probabilities = checker.judge.score_outcomes([t for t, _ in texts], [a for _, a in texts])
    judge_paid = [q >= checker.threshold for q in probabilities]
    combined_paid = [v.reward == 1.0 for v in checker.judge_lines([p.reference for p in pairs],
                                                                  [p.line for p in pairs])]

    def ci(values: list[bool]) -> dict[str, float]:
        return bootstrap_ci([float(v) for v in values], seed=seed) if values else {"mean": float("nan"), "n": 0}

    def row(paid: list[bool]) -> dict[str, dict]:
        return {"accuracy": ci([a == t for a, t in zip(paid, truth)]),
                "false_positive_rate": ci([a for a, t in zip(paid, truth) if not t]),
                "false_negative_rate": ci([not a for a, t in zip(paid, truth) if t])}

    parsed = [i for i, v in enumerate(rule_values) if v is not None]
    return {"rule": {**row(rule_paid), "coverage": ci([v is not None for v in rule_values]),
                     "accuracy_where_parsed": ci([rule_paid[i] == truth[i] for i in parsed])},
            "judge": row(judge_paid), "rule_then_judge": row(combined_paid)}


def table(measured: dict[str, dict]) -> str:
    """The measurement as a markdown table, each cell "mean [low, high]" in per cent."""
    def cell(stat: dict[str, float]) -> str:
        return f"{100 * stat['mean']:.1f}% [{100 * stat['ci_low']:.1f}, {100 * stat['ci_high']:.1f}]"

    lines = ["| checker | accuracy | wrong answers paid (FPR) | right answers missed (FNR) |", "|---|---|---|---|"]
    for name, label in (("rule", "rule alone (unparsed: not paid)"), ("judge", "judge alone"),
                        ("rule_then_judge", "rule, then judge where the rule cannot parse")):
        stats = measured[name]
        lines.append(f"| {label} | {cell(stats['accuracy'])} | {cell(stats['false_positive_rate'])} | "
                     f"{cell(stats['false_negative_rate'])} |")
    rule = measured["rule"]
    lines.append(f"\nrule coverage {cell(rule['coverage'])}; rule accuracy where it parses "
                 f"{cell(rule['accuracy_where_parsed'])}")
    return "\n".join(lines)


def cmd_equivalence(argv: list[str]) -> int:
    cfg = parse_settings(EquivalenceConfig, argv, "posttrain equivalence",
                          "Kimi k1.5's answer-equivalence judge at toy scale, trained and measured")
    use_threads(cfg.threads)
    # imported here for start-up time: the judge loads torch
    import torch

    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.rewards.equivalence_judge import (EquivalenceChecker, save_equivalence_judge,
                                                     train_equivalence_judge)
    from posttrain.rewards.process_reward_model import StepRewardScorer
    from posttrain.verifiers.answer_forms import equivalence_pairs

    tokenizer = CharTokenizer()
    train_rows = equivalence_pairs(cfg.pairs, cfg.seed)
    heldout_rows = equivalence_pairs(cfg.heldout, cfg.seed + 1, split="heldout")
    seen = {(p.line, p.reference) for p in train_rows}
    started = time.perf_counter()
    model, history = train_equivalence_judge(train_rows, steps=cfg.steps, lr=cfg.lr, seed=cfg.seed,
                                             tokenizer=tokenizer)
    seconds = time.perf_counter() - started
    checker = EquivalenceChecker(StepRewardScorer(model, tokenizer, "orm", "newline"), cfg.threshold)
    measured = measure(checker, heldout_rows, cfg.seed)
    info = {"measured": measured, "train_rows": cfg.pairs, "heldout_rows": cfg.heldout,
            "heldout_rows_also_in_training": sum((p.line, p.reference) in seen for p in heldout_rows),
            "steps": cfg.steps, "lr": cfg.lr, "seed": cfg.seed, "threshold": cfg.threshold,
            "train_seconds": round(seconds, 1), "threads": torch.get_num_threads(),
            "final_train_loss": history[-1]["loss"]}
    out = save_equivalence_judge(model, cfg.out, tokenizer, info)
    print(table(measured))
    print(f"\n{info['heldout_rows_also_in_training']} of {cfg.heldout} held-out rows also occur in training; "
          f"trained {cfg.steps} steps in {seconds:.0f} s on {info['threads']} thread(s), one seed ({cfg.seed})")
    print(f"judge written to {out} (measured numbers in {out}/reward_model.json); train a policy on it: "
          f"--rl.rm.path {out}")
    return 0
