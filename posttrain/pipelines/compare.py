"""`posttrain compare`: several algorithms, one SFT checkpoint, one table, one plot.

A fair comparison changes one thing. Every algorithm here starts from the same SFT
checkpoint (trained once), sees the same prompts in the same order (prompts are seeded
by step, not by algorithm), samples as many completions, and is scored on the same
held-out problems by the same verifier. What differs is the loss.

With `online_rounds` (e.g. [1, 20]) each preference loss runs once per round count on
the same budget, so what differs is where the pairs come from: all from the starting
policy (1, offline), or fresh from the current policy in each of N rounds (online).

Every row after the first also gets a paired difference to the first row: both are
scored on the same held-out problems, so the bootstrap resamples problems with both
verdicts attached and per-problem difficulty cancels (eval/stats.py). That CI is much
narrower than the two rows' own CIs, and it is the one that says whether they differ.
"""

from __future__ import annotations

import dataclasses
import time

from posttrain.algorithms import ALGORITHMS
from posttrain.algorithms.preference import PREFERENCE_LOSSES
from posttrain.config import RLConfig, TrainConfig
from posttrain.config_file import to_dict
from posttrain.eval.stats import paired_bootstrap_diff
from posttrain.pipelines.checks import check_config
from posttrain.pipelines.run import run_pipeline, start_run
from posttrain.runs.checkpoints import latest_checkpoint
from posttrain.runs.console import console
from posttrain.runs.rundir import RunDir


def check_algos(algos: list[str]) -> None:

    known = sorted(ALGORITHMS) + sorted(PREFERENCE_LOSSES)
    unknown = [a for a in algos if a not in known]
    if unknown or not algos:
        raise ValueError(f"--algos {','.join(algos)!r}: unknown {unknown}; choose from {known}")


def variants(cfg: TrainConfig, algos: list[str], online_rounds: list[int] | None) -> list[tuple[str, RLConfig]]:
    """(label, RL settings) of every row, validated before anything trains. Every row keeps
    rl.algo_params (an algorithm that has no such field fails here); rl.refresh_reference
    applies to the online rows only, since an offline run has no next round to refresh."""
    rows = []
    for algo in algos:
        for rounds in online_rounds or [cfg.rl.online_rounds]:
            rl = dataclasses.replace(cfg.rl, algo=algo, online_rounds=rounds,
                                     refresh_reference=cfg.rl.refresh_reference and rounds > 1)
            check_config(dataclasses.replace(cfg, rl=rl))
            label = algo if not online_rounds else f"{algo} offline" if rounds == 1 else f"{algo} online ×{rounds}"
            rows.append((label, rl))
    return rows


def compare(cfg: TrainConfig, algos: list[str], online_rounds: list[int] | None = None) -> dict:
    check_algos(algos)
    if online_rounds is not None:

        if not online_rounds or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in online_rounds):
            raise ValueError(f"--online_rounds {online_rounds!r}: give positive round counts, e.g. 1,20 (1 = offline)")
        if not all(a in PREFERENCE_LOSSES for a in algos):
            raise ValueError(f"--online_rounds compares where preference pairs come from; every algorithm must be one "
                             f"of {sorted(PREFERENCE_LOSSES)}, got {algos}")
    rows_to_run = variants(cfg, algos, online_rounds)
    root = RunDir.create(cfg.out_dir, "compare" + (f"-{cfg.name}" if cfg.name else ""))
    root.write_json("config.json", {**to_dict(cfg), "algos": algos, "online_rounds": online_rounds})

    # the shared starting point: SFT only (rl.steps = 0), unless --init names a checkpoint
    init = cfg.init
    if not init:
        sft_cfg = dataclasses.replace(cfg, name="sft", out_dir=str(root.path), rl=dataclasses.replace(cfg.rl, steps=0))
        sft_run = start_run(sft_cfg, "compare")
        run_pipeline(sft_cfg, sft_run)
        # with sft.steps 0: gpt_mini's saved random init, or the pretrained model itself
        init = str(latest_checkpoint(sft_run, "sft") or latest_checkpoint(sft_run, "init") or cfg.model.name)

    rows = []
    for label, rl in rows_to_run:
        run_cfg = dataclasses.replace(cfg, name=label.replace(" ×", "").replace(" ", "-"), out_dir=str(root.path),
                                      init=init, rl=rl)
        run = start_run(run_cfg, "compare")
        started = time.perf_counter()
        summary = run_pipeline(run_cfg, run)
        rows.append(result_row(label, run, summary, time.perf_counter() - started))
    add_paired_differences(root, rows)

    root.write_json("compare.json", rows)
    write_table(root, rows, cfg, online_rounds)
    write_curves(root, rows)
    console.print((root.path / "compare.md").read_text())
    return {"path": str(root.path), "rows": rows}


def result_row(algo: str, run: RunDir, summary: dict, wall: float) -> dict:
    final = summary["final_stage"]  # "rl", or "pref" for a preference loss
    metrics = [r for r in run.read_jsonl("metrics.jsonl") if r.get("stage") == final]
    tail = metrics[-10:]  # the last steps: where the policy ended up, less noisy than one step

    def tail_mean(key: str) -> float:
        values = [r[key] for r in tail if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else float("nan")

    row = {"algo": algo, "run": run.path.name, "stage": final, "sft": summary["sft"], "rl": summary[final],
           "wall_seconds": wall,
           "response_length": tail_mean("response_length"), "kl_ref": tail_mean("kl_ref"),
           "curve": [(r["step"], r["dev_pass@1"]) for r in metrics if "dev_pass@1" in r],
           # the reward of everything sampled: DAPO's reward_mean covers only the groups it kept
           "reward_curve": [(r["step"], r.get("reward_sampled_mean", r["reward_mean"])) for r in metrics
                            if "reward_mean" in r]}
    if final == "pref":  # how much data, and whether the learned preference holds on pairs never trained on
        rounds = run.read_json("pref_rounds.json") or {}
        held_out = [r["dev_pref_accuracy"] for r in metrics if "dev_pref_accuracy" in r]
        row |= {"pairs": sum(r.get("pairs", 0) for r in rounds.values()), "train_accuracy": tail_mean("accuracy"),
                "dev_pref_accuracy": held_out[-1] if held_out else float("nan")}
    return row


def add_paired_differences(root: RunDir, rows: list[dict]) -> None:
    """Each row after the first gets "vs_first": the paired bootstrap CI of its held-out
    pass@1 minus the first row's, on the problems both were scored on."""
    def verdicts(row: dict) -> dict[str, float]:
        return {r["id"]: r["reward"] for r in RunDir(root.path / row["run"]).read_jsonl(f"eval_{row['stage']}.jsonl")}

    first = verdicts(rows[0])
    for row in rows[1:]:
        mine = verdicts(row)
        shared = [i for i in first if i in mine]
        row["vs_first"] = paired_bootstrap_diff([mine[i] for i in shared], [first[i] for i in shared])


def write_table(root: RunDir, rows: list[dict], cfg: TrainConfig, online_rounds: list[int] | None = None) -> None:
    def pct(ci: dict) -> str:
        return f"{100 * ci['mean']:.1f}% [{100 * ci['ci_low']:.1f}, {100 * ci['ci_high']:.1f}]"

    def points(diff: dict) -> str:
        return f"{100 * diff['mean_diff']:+.1f} [{100 * diff['ci_low']:+.1f}, {100 * diff['ci_high']:+.1f}]"

    preference = any("pairs" in r for r in rows)
    if preference:
        rounds = "" if online_rounds else (f" in {cfg.rl.online_rounds} online rounds" if cfg.rl.online_rounds > 1 else "")
        setup = (f"{cfg.rl.steps} steps × {cfg.rl.prompts_per_step} pairs, pairs built by the verifier from "
                 f"{cfg.rl.pair_prompts} prompts × {cfg.rl.samples_per_prompt} samples at T = "
                 f"{cfg.rl.sampling.temperature}{rounds}, lr {cfg.rl.lr:g}")
        if cfg.rl.algo_params:
            setup += f", {cfg.rl.algo_params}"
        if online_rounds and cfg.rl.refresh_reference:
            setup += ", each online round's reference refreshed to the policy as it starts"
    else:
        setup = f"{cfg.rl.steps} RL steps × {cfg.rl.prompts_per_step} prompts × {cfg.rl.samples_per_prompt} samples"
    extra = " pairs | train pref acc | held-out pref acc |" if preference else ""
    lines = [f"Same SFT start (held-out pass@1 {pct(rows[0]['sft'])}), {setup}, seed {cfg.seed}.", "",
             f"| algorithm | held-out pass@1 (95% CI) | vs {rows[0]['algo']} (paired, points) | wall time | mean length "
             "| KL to ref |" + extra,
             "|---|---|---|---|---|---|" + ("---|---|---|" if preference else "")]
    for r in rows:
        cells = (f" {r['pairs']} | {r['train_accuracy']:.2f} | {r['dev_pref_accuracy']:.2f} |" if "pairs" in r
                 else " | | |" if preference else "")
        versus = points(r["vs_first"]) if "vs_first" in r else ""
        lines.append(f"| {r['algo']} | {pct(r['rl'])} | {versus} | {r['wall_seconds']:.0f} s | "
                     f"{r['response_length']:.1f} | {r['kl_ref']:.4f} |" + cells)
    lines += ["", "Wall time includes the two held-out evaluations; mean length and KL are averaged over the last "
                  "10 steps. Overlapping CIs mean the ranking may be noise: rerun with other seeds before trusting it. "
                  f"The paired column is each row's pass@1 minus {rows[0]['algo']}'s on the same held-out problems, "
                  "with a bootstrap CI over problems; a CI that excludes 0 is a difference this seed resolves."]
    if preference:
        lines += ["For preference losses, length and KL are measured on the policy's own samples (T = 1) of 64 dev "
                  "prompts at each evaluation; pref acc is the fraction of pairs whose implicit-reward margin is > 0, "
                  "on the training batches (last 10 steps) and on pairs from dev prompts never trained on; pairs "
                  "counts every round's."]
    (root.path / "compare.md").write_text("\n".join(lines) + "\n")


def write_curves(root: RunDir, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    for r in rows:
        if r["reward_curve"] and r["stage"] == "pref":
            # logged at evaluations only (the policy's own samples of 64 dev prompts): too few points to smooth
            left.plot(*zip(*r["reward_curve"]), marker="o", markersize=3, label=r["algo"])
        elif r["reward_curve"]:
            steps, reward = zip(*r["reward_curve"])
            # a 10-step moving average: single-step rewards of 256 samples are noisy
            smooth = [sum(reward[max(0, i - 9): i + 1]) / len(reward[max(0, i - 9): i + 1]) for i in range(len(reward))]
            left.plot(steps, smooth, label=r["algo"])
        if r["curve"]:
            steps, dev = zip(*r["curve"])
            right.plot(steps, dev, marker="o", markersize=3, label=r["algo"])
    if all(r["stage"] == "pref" for r in rows):
        left.set(title="reward of the policy's own samples (T = 1, 64 dev prompts)", xlabel="step")
    else:
        left.set(title="train reward of all samples (10-step moving average)", xlabel="RL step")
    right.set(title="dev pass@1 (greedy)", xlabel="step")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(root.path / "compare.png", dpi=100)
    plt.close(fig)
