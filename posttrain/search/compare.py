"""`posttrain search`: test-time methods side by side at fixed token budgets (Loop B).

One policy (a checkpoint), one fixed set of problems, one table: for every budget B of
generated tokens per problem, the accuracy of each method with its bootstrap CI and the
tokens it actually spent (search/budget.py: it may stop short of B, never exceed it).

    greedy                   one completion at temperature 0 (the same at every budget)
    majority vote            N = B // max_new_tokens samples, the most common answer
    best-of-N (verifier)     the same N samples, selected by the task's verifier: an oracle,
                             its accuracy is pass@N, the ceiling of selection
    best-of-N (policy log-prob)  the same N samples, the one the policy itself found most
                             likely (mean log-prob per token): selection with no second model
    best-of-N (ORM/PRM agg)  the same N samples, selected by --orm or --prm
    beam (PRM), MCTS (PRM)   step-level search guided by --prm (search/methods.py, mcts.py); the
                             beam is as wide as the budget pays for (--beam_width 0)
    beam (oracle steps)      beam search guided by the step checker itself (arithmetic only;
                             left out on a task without one): what a perfect PRM would buy

The N-sample methods read the same samples, so their differences are selection alone.
`compare.md` holds the table, `search.png` accuracy against tokens spent, `samples.jsonl`
every chosen completion.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any, Callable

import torch
from rich.console import Console
from rich.table import Table

from posttrain.config import ConfigError, SamplingParams
from posttrain.config.files import to_dict
from posttrain.envs import make_env
from posttrain.eval.stats import bootstrap_ci
from posttrain.models import load_checkpoint_model, load_tokenizer
from posttrain.rewards.process_reward_model import AGGREGATIONS, get_step_format, load_step_scorer, task_step_format
from posttrain.roles.engines import make_engine
from posttrain.runs.checkpoints import read_task
from posttrain.runs.rundir import RunDir
from posttrain.config.scoring import SearchConfig
from posttrain.search.budget import Partial, Problem, sample_completions
from posttrain.search.mcts import mcts
from posttrain.search.methods import OracleStepScorer, beam_search, greedy, majority_vote, pick_highest
from posttrain.seeds import derive_seed
from posttrain.types import Environment, Example
from posttrain.verifiers.steps import problem_of

SEPARATORS = {"arithmetic": (",", "\n"), "newline": ("\n",), "answer_tag": ("\n",)}  # where extend_steps stops a step


def run_search(cfg: SearchConfig) -> dict[str, Any]:
    """Every method at every budget on cfg.size problems; prints and writes the table."""
    trained = read_task(Path(cfg.checkpoint))
    env_cfg = trained.env if trained else cfg.env
    env = make_env(env_cfg.name, **env_cfg.kwargs())
    model = load_checkpoint_model(Path(cfg.checkpoint), None)
    tokenizer = load_tokenizer(Path(cfg.checkpoint))
    max_new = cfg.max_new_tokens or (trained.max_new_tokens if trained else 64)
    engine = make_engine(model, tokenizer, SamplingParams(temperature=cfg.temperature, max_new_tokens=max_new))
    examples = env.fixed_set(cfg.split, cfg.size, seed=cfg.seed)
    scorers = {"ORM": load_step_scorer(cfg.orm) if cfg.orm else None,
               "PRM": load_step_scorer(cfg.prm, cfg.aggregation) if cfg.prm else None}
    fmt = get_step_format(search_step_format(cfg, env_cfg.name, scorers["PRM"]))
    separators = SEPARATORS[fmt.name]
    oracle_steps = OracleStepScorer(examples) if all(problem_of(e) for e in examples) else None

    def correct(example, partial: Partial | None) -> float:
        return float(partial is not None and partial.done and env.score(example, partial.text)["reward"] >= 1.0)

    rows, samples = [], []

    def record(method: str, budget: int, problems: list[Problem], answers: list[Partial | None]) -> None:
        scores = [correct(p.example, a) for p, a in zip(problems, answers)]
        ci = bootstrap_ci(scores)
        spent = sum(p.budget.spent for p in problems) / len(problems)
        rows.append({"method": method, "budget": budget, "accuracy": ci["mean"], "ci_low": ci["ci_low"],
                     "ci_high": ci["ci_high"], "tokens_spent": spent, "n": len(problems)})
        samples.extend({"method": method, "budget": budget, "id": p.example.id, "completion": a.text if a else None,
                        "correct": s, "tokens": p.budget.spent} for p, a, s in zip(problems, answers, scores))

    torch.manual_seed(cfg.seed)
    budgets = cfg.budget_list()
    problems = Problem.of(examples, tokenizer, max(budgets))
    record("greedy", max_new, problems, greedy(engine, problems, max_new))
    for budget in budgets:
        generator = torch.Generator().manual_seed(derive_seed(cfg.seed, "search", budget))
        n = budget // max_new
        if n >= 1:
            problems = Problem.of(examples, tokenizer, budget)
            drawn = sample_completions(engine, problems, n, max_new, generator)
            record(f"majority vote ({n})", budget, problems,
                   [majority_vote(c, functools.partial(answer_of, env, p.example)) for p, c in zip(problems, drawn)])
            verdicts = [[correct(p.example, c) for c in cands] for p, cands in zip(problems, drawn)]
            record(f"best-of-{n} (verifier)", budget, problems, [pick_highest(c, v) for c, v in zip(drawn, verdicts)])
            # no second model: the policy's mean log-prob of its own tokens, as drawn
            confidence = [[sum(c.logp) / len(c.logp) if c.logp else -math.inf for c in cands] for cands in drawn]
            record(f"best-of-{n} (policy log-prob)", budget, problems,
                   [pick_highest(c, v) for c, v in zip(drawn, confidence)])
            for kind, scorer in scorers.items():
                if scorer is not None:
                    for name, select in selectors(kind, scorer).items():
                        picked = [pick_highest(c, select([p.example.prompt] * len(c), [x.text for x in c]))
                                  for p, c in zip(problems, drawn)]
                        record(f"best-of-{n} ({name})", budget, problems, picked)
        step_scorers = {"PRM": scorers["PRM"], "oracle steps": oracle_steps}
        for name, scorer in step_scorers.items():
            if scorer is None:
                continue
            problems = Problem.of(examples, tokenizer, budget)
            width = cfg.beam_width or max(1, budget // (max_new * cfg.expansions))
            answers = beam_search(engine, problems, scorer, fmt, separators, width, cfg.expansions,
                                  cfg.step_tokens, max_new, generator, aggregation=cfg.aggregation)
            record(f"beam {width}x{cfg.expansions} ({name})", budget, problems, answers)
            if name == "PRM":
                problems = Problem.of(examples, tokenizer, budget)
                answers = mcts(engine, problems, scorer, fmt, separators, cfg.mcts_children, cfg.step_tokens,
                               max_new, cfg.c_uct, generator, aggregation=cfg.aggregation)
                record(f"MCTS ({name})", budget, problems, answers)
    return write_results(cfg, env, rows, samples, max_new)


def answer_of(env: Environment, example: Example, text: str) -> str | None:
    """A completion's final answer, as the verifier parses it (its details' "parsed"); the
    last line for a verifier that reports no parse; None, which casts no vote, when it found
    no answer (a "None" string would otherwise outvote the real answers)."""
    parsed = env.score(example, text)["details"].get("parsed", text.strip().split("\n")[-1])
    return None if parsed is None else str(parsed)


def search_step_format(cfg: SearchConfig, env_name: str, prm) -> str:
    """Where the steps of a search end: --step_format when given, else the PRM's own format
    (the one it was trained to read), else the task's. A PRM trained on another format than
    the one asked for is refused: it would score steps cut where it never saw a cut."""
    own = prm.format.name if prm is not None else task_step_format(env_name)
    if cfg.step_format and prm is not None and cfg.step_format != own:
        raise ConfigError(f"step_format={cfg.step_format!r} is not allowed: the PRM in {cfg.prm} reads steps in "
                          f"the {own!r} format; leave --step_format out to search with the PRM's")
    return cfg.step_format or own


def selectors(kind: str, scorer) -> dict[str, Callable]:
    """How a scorer ranks whole completions: an ORM's one score; a PRM's step scores under
    each aggregation (min, product, last)."""
    if kind == "ORM":
        return {"ORM": scorer.score_outcomes}
    return {f"PRM {aggregation}": functools.partial(_aggregated, scorer, aggregation=aggregation)
            for aggregation in AGGREGATIONS}


def _aggregated(scorer, prompts: list[str], texts: list[str], aggregation: str) -> list[float]:
    steps = [scorer.format.split(t) or [""] for t in texts]
    return [AGGREGATIONS[aggregation](s) for s in scorer.score_steps(prompts, steps)]


def write_results(cfg: SearchConfig, env: Environment, rows: list[dict], samples: list[dict],
                  max_new: int) -> dict[str, Any]:
    run = RunDir.create(cfg.out_dir, cfg.name)
    run.write_json("config.json", to_dict(cfg))
    run.write_meta({"loop": "B (search)", "spec_version": env.spec_version, "checkpoint": cfg.checkpoint,
                    "dataset": {"split": cfg.split, "size": cfg.size, "seed": cfg.seed},
                    "sampling": {"temperature": cfg.temperature, "max_new_tokens": max_new},
                    "budget": "generated tokens per problem; prefill and scorer passes not counted"})
    run.write_jsonl("samples.jsonl", samples)
    table = markdown_table(rows)
    (run.path / "compare.md").write_text(table + "\n", encoding="utf-8")
    plot(rows, run.path / "search.png")
    summary = {"rows": rows, "run_dir": str(run.path)}
    run.write_json("summary.json", summary)
    print_table(rows)
    print(f"run directory: {run.path}")
    return summary


def markdown_table(rows: list[dict]) -> str:
    lines = ["| budget (tokens/problem) | method | accuracy [95% CI] | tokens spent |", "|---:|---|---|---:|"]
    for r in rows:
        lines.append(f"| {r['budget']} | {r['method']} | {100 * r['accuracy']:.1f}% "
                     f"[{100 * r['ci_low']:.1f}, {100 * r['ci_high']:.1f}] | {r['tokens_spent']:.1f} |")
    return "\n".join(lines)


def print_table(rows: list[dict]) -> None:
    table = Table(title="test-time search at fixed token budgets")
    for column in ("budget", "method", "accuracy [95% CI]", "tokens spent"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for r in rows:
        table.add_row(str(r["budget"]), r["method"], f"{100 * r['accuracy']:.1f}% [{100 * r['ci_low']:.1f}, "
                      f"{100 * r['ci_high']:.1f}]", f"{r['tokens_spent']:.1f}")
    Console().print(table)


def plot(rows: list[dict], path: Path) -> None:
    """Accuracy against mean tokens spent per problem, one line per method family. A method
    that finished nothing at a budget (0%: it cannot afford one solution there) is left out
    of the curve; the table keeps it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families: dict[str, list[dict]] = {}
    for r in rows:  # "best-of-8 (ORM)" and "best-of-16 (ORM)" are one line; so are the votes and the beams
        family = re.sub(r"best-of-\d+", "best-of-N", r["method"])
        family = re.sub(r"majority vote \(\d+\)", "majority vote", re.sub(r"beam \d+x\d+", "beam", family))
        if r["accuracy"] > 0:
            families.setdefault(family, []).append(r)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    markers = "os^vDP*Xh<>p"
    for k, (family, points) in enumerate(families.items()):
        points = sorted(points, key=lambda r: r["tokens_spent"])
        ax.errorbar([r["tokens_spent"] for r in points], [100 * r["accuracy"] for r in points],
                    yerr=[[100 * (r["accuracy"] - r["ci_low"]) for r in points],
                          [100 * (r["ci_high"] - r["accuracy"]) for r in points]],
                    marker=markers[k % len(markers)], capsize=3, label=family, color=f"C{k % 10}", alpha=0.85)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("generated tokens per problem (mean spent)")
    ax.set_ylabel("accuracy (%, 95% CI)")
    if families:  # every method at 0% leaves no line to label
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
