"""`posttrain think`: what thinking buys, and what a thinking budget keeps of it (Loop B).

One fused checkpoint (SFT on /think and /no_think demonstrations, envs/thinking_modes.py),
one fixed set of problems, each answered greedily in every mode:

    /no_think            the answer at once
    /think               the running sum inside <think>…</think>, then the answer
    /think, budget B     at most B tokens of thinking, then EARLY_STOP and </think> are
                         appended and the model answers (roles/think_budget.py)

Every row gets held-out pass@1 with its bootstrap CI, the mean tokens per answer with its
CI (every token of the response: sampled, EOS and, when forced, the appended ones), the
share of rows whose budget ran out, and the paired difference to unbudgeted /think on the
same problems. `thinking.md` holds the table, `thinking.png` accuracy against tokens,
`samples.jsonl` every completion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from posttrain.config import SamplingParams
from posttrain.config.files import to_dict
from posttrain.envs import make_env
from posttrain.envs.thinking_modes import ThinkingModesEnv
from posttrain.eval.evaluate import solved
from posttrain.eval.stats import bootstrap_ci, paired_bootstrap_diff
from posttrain.models import load_checkpoint_model, load_tokenizer
from posttrain.roles.engines import make_engine
from posttrain.roles.engines.contract import example_prompt_ids
from posttrain.roles.think_budget import ThinkingUse, budgeted_generate
from posttrain.runs.checkpoints import CheckpointTask, read_task
from posttrain.runs.rundir import RunDir
from posttrain.config.scoring import ThinkConfig
from posttrain.types import Tokenizer
from posttrain.verifiers.think_tags import EARLY_STOP, THINK_OPEN, forced_text


def fused_task(checkpoint: str) -> CheckpointTask:
    """The task a checkpoint records, when it is arithmetic_think; else ValueError saying so."""
    task = read_task(Path(checkpoint))
    if task is None or task.env.name != "arithmetic_think":
        trained = "records no task" if task is None else f"was trained on env {task.env.name!r}"
        raise ValueError(f"checkpoint {checkpoint} {trained}: `posttrain think` measures a model trained on both "
                         "modes (posttrain train --env.name arithmetic_think; docs/guides/search.md, \"Thinking-mode fusion\")")
    return task


def run_think(cfg: ThinkConfig) -> dict[str, Any]:
    """Every mode and budget on cfg.size problems; prints and writes the table."""
    task = fused_task(cfg.checkpoint)
    envs = {mode: make_env("arithmetic_think", level=task.env.arithmetic_think.level, think_mode=mode)
            for mode in ("think", "no_think")}
    model, tokenizer = load_checkpoint_model(Path(cfg.checkpoint), None), load_tokenizer(Path(cfg.checkpoint))
    max_new = cfg.max_new_tokens or task.max_new_tokens
    engine = make_engine(model, tokenizer, SamplingParams(temperature=0.0, max_new_tokens=max_new))
    problems = {mode: env.fixed_set(cfg.split, cfg.size, seed=cfg.seed) for mode, env in envs.items()}
    early_stop = cfg.early_stop or EARLY_STOP
    budgets = cfg.budget_list()
    check_positions(model.config.max_seq_len, tokenizer, problems["think"], max_new, max(budgets),
                    cfg.answer_tokens, early_stop)

    rows, samples, verdicts = [], [], {}

    def record(label: str, mode: str, budget: int | None, episodes, uses: list[ThinkingUse] | None = None) -> None:
        for e in episodes:  # scored here, by text: score_episodes leaves an episode with turns (a forced one) alone
            result = envs[mode].score(e.example, e.completion)
            e.reward, e.details = float(result["reward"]), result["details"]
        verdict = [solved(e) for e in episodes]
        tokens = [len(e.response_ids) for e in episodes]
        verdicts[label] = verdict
        row = {"mode": label, "budget": budget, "pass@1": bootstrap_ci(verdict), "tokens": bootstrap_ci(tokens),
               "forced": sum(u.forced for u in uses) / len(uses) if uses else 0.0,
               "thinking_tokens": sum(u.thinking_tokens for u in uses) / len(uses) if uses else None}
        if "/think" in verdicts and label != "/think":
            row["vs_think"] = paired_bootstrap_diff(verdict, verdicts["/think"])
        rows.append(row)
        samples.extend({"mode": label, "budget": budget, "id": e.example.id, "prompt": e.example.prompt,
                        "completion": e.completion, "reward": e.reward, "reason": e.details.get("reason"),
                        "tokens": len(e.response_ids), **({"forced": u.forced, "thinking_tokens": u.thinking_tokens}
                                                          if uses else {})}
                       for e, u in zip(episodes, uses or [None] * len(episodes)))

    record("/think", "think", None, engine.generate(problems["think"], 1))
    record("/no_think", "no_think", None, engine.generate(problems["no_think"], 1))
    for budget in budgets:
        episodes, uses = budgeted_generate(engine, problems["think"], budget, cfg.answer_tokens, early_stop=early_stop)
        record(f"/think, budget {budget}", "think", budget, episodes, uses)
    return write_results(cfg, envs["think"], rows, samples, max_new, early_stop)


def check_positions(positions: int, tokenizer: Tokenizer, examples, max_new: int, budget: int, answer_tokens: int,
                    early_stop: str) -> None:
    """A forced row at the largest budget must fit the model: the prompt, <think>, the
    budget, the appended text and the answer."""
    longest = max(len(example_prompt_ids(tokenizer, e)) for e in examples)
    need = (longest + len(tokenizer.encode(THINK_OPEN)) + budget + len(tokenizer.encode(forced_text(early_stop)))
            + answer_tokens)
    if need > positions:
        raise ValueError(f"budgets: the largest budget {budget} needs {need} positions (prompt {longest}, <think>, "
                         f"the budget, the appended {forced_text(early_stop)!r}, answer_tokens {answer_tokens}), more "
                         f"than the model's {positions}: lower the budgets or train with a larger --model.max_seq_len")
    if longest + max_new > positions:
        raise ValueError(f"max_new_tokens={max_new}: the longest prompt ({longest} tokens) + max_new_tokens must fit "
                         f"the model's {positions} positions; lower it")


def write_results(cfg: ThinkConfig, env: ThinkingModesEnv, rows: list[dict], samples: list[dict], max_new: int,
                  early_stop: str) -> dict[str, Any]:
    run = RunDir.create(cfg.out_dir, cfg.name)
    run.write_json("config.json", to_dict(cfg))
    run.write_meta({"loop": "B (thinking budget)", "spec_version": env.spec_version, "checkpoint": cfg.checkpoint,
                    "dataset": {"split": cfg.split, "size": cfg.size, "seed": cfg.seed, "level": env.level},
                    "sampling": {"temperature": 0.0, "decoding": "greedy", "max_new_tokens": max_new,
                                 "answer_tokens": cfg.answer_tokens, "early_stop": early_stop}})
    run.write_jsonl("samples.jsonl", samples)
    table = markdown_table(rows)
    (run.path / "thinking.md").write_text(table + "\n", encoding="utf-8")
    plot(rows, run.path / "thinking.png")
    run.write_json("summary.json", {"rows": rows})
    Console().print(table)
    print(f"run directory: {run.path}")
    return {"rows": rows, "run_dir": str(run.path)}


def _pct(ci: dict) -> str:
    return f"{100 * ci['mean']:.1f}% [{100 * ci['ci_low']:.1f}, {100 * ci['ci_high']:.1f}]"


def markdown_table(rows: list[dict]) -> str:
    lines = ["| mode | held-out pass@1 (95% CI) | tokens per answer (95% CI) | budget ran out | vs /think (paired, points) |",
             "|---|---|---|---:|---|"]
    for r in rows:
        t = r["tokens"]
        diff = r.get("vs_think")
        versus = (f"{100 * diff['mean_diff']:+.1f} [{100 * diff['ci_low']:+.1f}, {100 * diff['ci_high']:+.1f}]"
                  if diff else "")
        forced = f"{100 * r['forced']:.0f}%" if r["budget"] is not None else ""
        lines.append(f"| {r['mode']} | {_pct(r['pass@1'])} | {t['mean']:.1f} [{t['ci_low']:.1f}, {t['ci_high']:.1f}] "
                     f"| {forced} | {versus} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Accuracy against tokens per answer: the budget curve as a line, each budget labelled,
    and the two unbudgeted modes as points of their own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def xy(points):
        return ([r["tokens"]["mean"] for r in points], [100 * r["pass@1"]["mean"] for r in points],
                [[100 * (r["pass@1"]["mean"] - r["pass@1"]["ci_low"]) for r in points],
                 [100 * (r["pass@1"]["ci_high"] - r["pass@1"]["mean"]) for r in points]])

    fig, ax = plt.subplots(figsize=(7, 4.5))
    budgeted = [r for r in rows if r["budget"] is not None]
    x, y, err = xy(budgeted)
    ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label="/think with a thinking budget", color="C0")
    for r, xi, yi in zip(budgeted, x, y):
        ax.annotate(f"B={r['budget']}", (xi, yi), textcoords="offset points", xytext=(4, -12), fontsize=8)
    for r, marker, color in zip([r for r in rows if r["budget"] is None], "s^", ("C1", "C2")):
        x, y, err = xy([r])
        ax.errorbar(x, y, yerr=err, marker=marker, markersize=8, capsize=3, linestyle="none", color=color,
                    label=f"{r['mode']} (no budget)")
    ax.set_xlabel("tokens per answer (mean; appended tokens included)")
    ax.set_ylabel("held-out pass@1 (%), 95% CI")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
