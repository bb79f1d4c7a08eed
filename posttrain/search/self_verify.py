"""Generate → verify → revise, with a meta-verifier that audits the verifier.

Self-correction is easy to claim and easy to fool yourself about: a revision loop that
"fixes" answers also breaks some, and a verifier that flags steps is only as good as its
false-positive and false-negative rates. So every number here is measured against ground
truth (the arithmetic step checker, verifiers/steps.py), which plays the meta-verifier:

    1. generate   a draft, one step at a time (search/budget.py::extend_steps), so each
                  step's drawn ids and log-probs are known
    2. verify     a step verifier scores every step; the first step scoring below the
                  threshold is flagged
    3. revise     the draft is cut before the flagged step and regrown from there (up to
                  max_revisions times); a draft with no flagged step is accepted as it is
    4. audit      the meta-verifier labels every step the verifier judged: false positives
                  (a wrong step passed), false negatives (a right step flagged), and for
                  each revision whether it fixed a wrong answer, broke a right one, or
                  changed nothing

Step verifiers (`STEP_VERIFIERS` in compare-style runs, search/compare.py):

    self     the policy checks itself: a step's score is exp of its mean token log-prob as
             drawn, a running minimum over the steps (low confidence = suspect). No second
             model; `posttrain prm` measured this ranking better than its trained PRM
    prm      a trained process reward model's probability that the step is right
    oracle   the step checker itself: FP = FN = 0, the ceiling of what revision can buy
             with this policy's regrowths

This loop audits after the fact, at test time. The same meta-verifier acts during training as
a reward term (rewards/meta_verifier.py, `--rl.reward.terms "accuracy + 0.5*meta_verified"`):
a step verifier's pass is paid only when the step checker confirms it, and the verifier's
false-positive rate is logged every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from posttrain.config import SamplingParams
from posttrain.config.files import to_dict
from posttrain.envs import make_env
from posttrain.eval.stats import bootstrap_ci, noise_rule, paired_bootstrap_diff
from posttrain.models import load_checkpoint_model, load_tokenizer
from posttrain.rewards.process_reward_model import StepFormat, get_step_format, load_step_scorer
from posttrain.roles.engines import Engine, make_engine
from posttrain.runs.checkpoints import read_task
from posttrain.runs.rundir import RunDir
from posttrain.config.scoring import VerifyConfig
from posttrain.search.budget import Partial, Problem, extend_steps
from posttrain.search.methods import OracleStepScorer
from posttrain.seeds import derive_seed

# (prompts, each row's steps as drawn: (text, log-probs) per step) -> a score in [0, 1] per step
StepVerifier = Callable[[list[str], list[list[tuple[str, list[float]]]]], list[list[float]]]


def policy_confidence(prompts: list[str], rows: list[list[tuple[str, list[float]]]]) -> list[list[float]]:
    """The policy as its own verifier: exp of each step's mean token log-prob, as drawn, as a
    running minimum over the steps so far (once an unlikely step was written, every later one
    is suspect too). The same rule as `posttrain prm`'s untrained baseline
    (pipelines/prm.py::policy_confidence), read off the sampler instead of a second pass."""
    out = []
    for steps in rows:
        lowest, scores = 0.0, []
        for _, logp in steps:
            lowest = min(lowest, sum(logp) / len(logp) if logp else 0.0)
            scores.append(math.exp(lowest))
        out.append(scores)
    return out


def step_texts(row: list[tuple[str, list[float]]], fmt: StepFormat) -> list[str]:
    """Each drawn step's text without its separator ("7+5=12," -> "7+5=12")."""
    return [(fmt.split(text) or [""])[0] for text, _ in row]


def scorer_verifier(scorer, fmt: StepFormat) -> StepVerifier:
    """A PRM (or the oracle) as a step verifier: its probability for each step's text."""

    def verify(prompts: list[str], rows: list[list[tuple[str, list[float]]]]) -> list[list[float]]:
        return scorer.score_steps(prompts, [step_texts(row, fmt) for row in rows])

    return verify


@dataclass
class Attempt:
    """A solution as a list of steps, each the partial after it (ids, text, log-probs)."""

    steps: list[Partial] = field(default_factory=list)

    @property
    def last(self) -> Partial:
        return self.steps[-1] if self.steps else Partial()

    def drawn(self) -> list[tuple[str, list[float]]]:
        """Each step's own text and log-probs (not the prefix's)."""
        out, before = [], Partial()
        for step in self.steps:
            out.append((step.text[len(before.text):], step.logp[len(before.logp):]))
            before = step
        return out


def grow(engine: Engine, problems: list[Problem], attempts: list[Attempt], separators: tuple[str, ...],
         step_tokens: int, max_new_tokens: int, generator: torch.Generator | None) -> None:
    """Extend every unfinished attempt one step at a time until each ends or its budget is spent."""
    while True:
        open_rows = [k for k, a in enumerate(attempts) if not a.last.done]
        if not open_rows:
            return
        grown = extend_steps(engine, [(problems[k], attempts[k].last) for k in open_rows], separators, step_tokens,
                             max_new_tokens, generator)
        progressed = False
        for k, partial in zip(open_rows, grown):
            if partial is not None:
                attempts[k].steps.append(partial)
                progressed = True
        if not progressed:
            return  # every open attempt's budget is spent


@dataclass
class VerifyResult:
    draft_correct: list[bool]
    final_correct: list[bool]
    # per judged step of the drafts: (the verifier passed it, the meta-verifier's label)
    step_verdicts: list[tuple[bool, bool]]
    revisions: list[tuple[bool, bool]]  # per revision: (correct before, correct after)
    tokens: list[int]


def verify_and_revise(engine: Engine, problems: list[Problem], verifier: StepVerifier, fmt: StepFormat,
                      separators: tuple[str, ...], threshold: float, max_revisions: int, step_tokens: int,
                      max_new_tokens: int, is_correct: Callable[[Problem, Partial], bool],
                      generator: torch.Generator | None = None) -> VerifyResult:
    """Drafts, verification, up to max_revisions regrowths from the first flagged step, and
    the meta-verifier's audit (module docstring), batched across problems."""
    prompts = [p.example.prompt for p in problems]
    meta = OracleStepScorer([p.example for p in problems])
    attempts = [Attempt() for _ in problems]
    grow(engine, problems, attempts, separators, step_tokens, max_new_tokens, generator)
    draft_correct = [is_correct(p, a.last) for p, a in zip(problems, attempts)]
    step_verdicts: list[tuple[bool, bool]] = []
    revisions: list[tuple[bool, bool]] = []
    pending = list(range(len(problems)))
    for round in range(max_revisions + 1):
        if not pending:
            break
        rows = [attempts[k].drawn() for k in pending]
        scores = verifier([prompts[k] for k in pending], rows)
        flagged = {}
        for k, row, step_scores in zip(pending, rows, scores):
            first_bad = next((i for i, s in enumerate(step_scores) if s < threshold), None)
            if round == 0:  # the audit is of the verifier's verdicts on the drafts
                labels = meta.score_steps([prompts[k]], [step_texts(row, fmt)])[0]
                step_verdicts += [(s >= threshold, bool(label)) for s, label in zip(step_scores, labels)]
            if first_bad is not None:
                flagged[k] = first_bad
        if round == max_revisions or not flagged:
            break
        before = {k: is_correct(problems[k], attempts[k].last) for k in flagged}
        for k, first_bad in flagged.items():
            attempts[k].steps = attempts[k].steps[:first_bad]
        revising = [attempts[k] for k in flagged]
        grow(engine, [problems[k] for k in flagged], revising, separators, step_tokens, max_new_tokens, generator)
        revisions += [(before[k], is_correct(problems[k], attempts[k].last)) for k in flagged]
        pending = list(flagged)
    return VerifyResult(draft_correct, [is_correct(p, a.last) for p, a in zip(problems, attempts)], step_verdicts,
                        revisions, [p.budget.spent for p in problems])


def audit(result: VerifyResult) -> dict[str, float]:
    """The meta-verifier's rates: false positives among wrong steps, false negatives among
    right steps, and what the revisions did."""
    wrong = [passed for passed, label in result.step_verdicts if not label]
    right = [passed for passed, label in result.step_verdicts if label]
    return {
        "false_positive_rate": sum(wrong) / len(wrong) if wrong else float("nan"),  # wrong steps it passed
        "false_negative_rate": sum(not p for p in right) / len(right) if right else float("nan"),  # right ones it flagged
        "wrong_steps": len(wrong), "right_steps": len(right),
        "revisions": len(result.revisions),
        "fixed": sum(not b and a for b, a in result.revisions),  # wrong before, right after
        "broke": sum(b and not a for b, a in result.revisions),  # right before, wrong after
    }


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


# --------------------------------------------------------------------------------------
# `posttrain verify`: every step verifier on one set of drafts' problems, one table
# --------------------------------------------------------------------------------------


def run_verify(cfg: VerifyConfig) -> dict:
    """cfg: a VerifyConfig. Each verifier (self, prm when given, oracle) runs the loop on the
    same problems with the same sampling seed, so the drafts are the same draws and the
    rows differ by the verifier alone."""
    trained = read_task(Path(cfg.checkpoint))
    env_cfg = trained.env if trained else cfg.env
    env = make_env(env_cfg.name, **env_cfg.kwargs())
    tokenizer = load_tokenizer(Path(cfg.checkpoint))
    max_new = cfg.max_new_tokens or (trained.max_new_tokens if trained else 64)
    engine = make_engine(load_checkpoint_model(Path(cfg.checkpoint), None), tokenizer,
                           SamplingParams(temperature=cfg.temperature, max_new_tokens=max_new))
    examples = env.fixed_set(cfg.split, cfg.size, seed=cfg.seed)
    fmt = get_step_format("arithmetic")
    verifiers = {"self (policy confidence)": policy_confidence}
    if cfg.prm:
        verifiers["PRM"] = scorer_verifier(load_step_scorer(cfg.prm), fmt)
    verifiers["oracle (step checker)"] = scorer_verifier(OracleStepScorer(examples), fmt)

    def is_correct(problem: Problem, partial: Partial) -> bool:
        return partial.done and env.score(problem.example, partial.text)["reward"] >= 1.0

    rows = []
    for threshold in cfg.threshold_list():
        for name, verifier in verifiers.items():
            if name.startswith("oracle") and threshold != cfg.threshold_list()[0]:
                continue  # the oracle's scores are 0 or 1: every threshold gives the same row
            problems = Problem.of(examples, tokenizer, max_new * (1 + cfg.max_revisions))
            generator = torch.Generator().manual_seed(derive_seed(cfg.seed, "verify"))  # the same drafts in every row
            result = verify_and_revise(engine, problems, verifier, fmt, (",", "\n"), threshold, cfg.max_revisions,
                                       cfg.step_tokens, max_new, is_correct, generator)
            draft, final = [float(c) for c in result.draft_correct], [float(c) for c in result.final_correct]
            rows.append({"verifier": name, "threshold": threshold, **audit(result), "draft": bootstrap_ci(draft),
                         "revised": bootstrap_ci(final), "gain": paired_bootstrap_diff(final, draft),
                         "tokens": mean(result.tokens)})
    run = RunDir.create(cfg.out_dir, cfg.name)
    run.write_json("config.json", to_dict(cfg))
    run.write_meta({"loop": "B (verify)", "spec_version": env.spec_version, "checkpoint": cfg.checkpoint,
                    "dataset": {"split": cfg.split, "size": cfg.size, "seed": cfg.seed},
                    "sampling": {"temperature": cfg.temperature, "max_new_tokens": max_new},
                    "meta_verifier": "verifiers/steps.py check_arithmetic_steps (first-error labels)"})
    table = verify_table(rows, cfg)
    (run.path / "verify.md").write_text(table + "\n", encoding="utf-8")
    summary = {"rows": rows, "run_dir": str(run.path)}
    run.write_json("summary.json", summary)
    print(table)
    print(f"run directory: {run.path}")
    return summary


def verify_table(rows: list[dict], cfg: VerifyConfig) -> str:
    def pct(ci: dict) -> str:
        return f"{100 * ci['mean']:.1f}% [{100 * ci['ci_low']:.1f}, {100 * ci['ci_high']:.1f}]"

    lines = [f"up to {cfg.max_revisions} revisions, {cfg.size} problems, a step flagged below the threshold",
             "", "| step verifier | threshold | false positives (wrong steps passed) | false negatives (right steps flagged) "
             "| draft accuracy | after revision | revision's effect [95% CI] | revisions: fixed / broke / of | "
             "tokens per problem |", "|---|---:|---:|---:|---|---|---|---|---:|"]
    for r in rows:
        gain = r["gain"]
        lines.append(
            f"| {r['verifier']} | {r['threshold']} | {100 * r['false_positive_rate']:.1f}% of {r['wrong_steps']} "
            f"| {100 * r['false_negative_rate']:.1f}% of {r['right_steps']} | {pct(r['draft'])} | {pct(r['revised'])} "
            f"| {100 * gain['mean_diff']:+.1f} [{100 * gain['ci_low']:+.1f}, {100 * gain['ci_high']:+.1f}] "
            f"{gain['verdict']}; noise rule: {noise_rule(gain['mean_diff'], gain['n'])['verdict']} "
            f"| {r['fixed']} / {r['broke']} / {r['revisions']} | {r['tokens']:.1f} |")
    return "\n".join(lines)
