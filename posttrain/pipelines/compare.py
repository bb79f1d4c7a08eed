"""`posttrain compare`: several algorithms, or rows of any settings, one SFT checkpoint,
one table, one plot.

A fair comparison changes one thing. Every algorithm here starts from the same SFT
checkpoint (trained once), sees the same prompts in the same order (prompts are seeded
by step, not by algorithm), samples as many completions, and is scored on the same
held-out problems by the same verifier. What differs is the loss.

With `online_rounds` (e.g. [1, 20]) each preference loss runs once per round count on
the same budget, so what differs is where the pairs come from: all from the starting
policy (1, offline), or fresh from the current policy in each of N rounds (online).

With `rows` (`--row NAME:KEY=VALUE,...`, pipelines/compare_rows.py) each row is the shared
config with its own settings on top, any setting: an ablation is one command.

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
from posttrain.config import TrainConfig
from posttrain.config.files import to_dict
from posttrain.eval.stats import bootstrap_ci, paired_bootstrap_diff
from posttrain.pipelines.checks import check_config
from posttrain.pipelines.compare_rows import Row, row_config
from posttrain.pipelines.run import run_pipeline, start_run
from posttrain.runs.checkpoints import latest_checkpoint
from posttrain.runs.console import console
from posttrain.runs.rundir import RunDir


def check_algos(algos: list[str]) -> None:

    known = sorted(ALGORITHMS) + sorted(PREFERENCE_LOSSES)
    unknown = [a for a in algos if a not in known]
    if unknown or not algos:
        raise ValueError(f"--algos {','.join(algos)!r}: unknown {unknown}; choose from {known}")


def variants(cfg: TrainConfig, algos: list[str], online_rounds: list[int] | None) -> list[tuple[str, TrainConfig]]:
    """(label, config) of every row, validated before anything trains. Every row keeps
    rl.algo_params (an algorithm that has no such field fails here); rl.preference.refresh_reference
    applies to the online rows only, since an offline run has no next round to refresh."""
    rows = []
    for algo in algos:
        for rounds in online_rounds or [cfg.rl.preference.online_rounds]:
            preference = dataclasses.replace(cfg.rl.preference, online_rounds=rounds,
                                             refresh_reference=cfg.rl.preference.refresh_reference and rounds > 1)
            rl = dataclasses.replace(cfg.rl, algo=algo, preference=preference)
            check_config(dataclasses.replace(cfg, rl=rl))
            label = algo if not online_rounds else f"{algo} offline" if rounds == 1 else f"{algo} online ×{rounds}"
            rows.append((label, dataclasses.replace(cfg, rl=rl)))
    return rows


def row_variants(cfg: TrainConfig, rows: list[Row]) -> list[tuple[str, TrainConfig]]:
    """(label, config) of every --row: the shared config with the row's settings, each
    checked as its run will be, before anything trains."""
    built = []
    for row in rows:
        row_cfg = row_config(cfg, row)
        check_config(row_cfg)
        built.append((row.label, row_cfg))
    return built


def compare(cfg: TrainConfig, algos: list[str] | None = None, online_rounds: list[int] | None = None,
            rows: list[Row] | None = None, differences: list[str] | None = None) -> dict:
    """One run per algorithm of `algos` (per round count of `online_rounds`), or per row of
    `rows`, each from the same start; the table, the plot and the rows as a dict.
    `differences`: row settings that change the measurement (--allow-different), noted
    under the table."""
    if rows:
        if algos or online_rounds is not None:
            raise ValueError("give --algos (one row per algorithm) or --row (one row per setting), not both; "
                             "an algorithm is a row's setting too: --row dapo:rl.algo=dapo")
        rows_to_run = row_variants(cfg, rows)
    else:
        rows_to_run = algorithm_variants(cfg, algos or [], online_rounds)
    root = RunDir.create(cfg.out_dir, "compare" + (f"-{cfg.name}" if cfg.name else ""))
    root.write_json("config.json", {**to_dict(cfg), "algos": algos, "online_rounds": online_rounds,
                                    "rows": [row.text() for row in rows or []]})

    # the shared starting point: SFT only (rl.steps = 0), unless --init names a checkpoint or every row has its own
    init = cfg.init
    if not init and any(not row_cfg.init for _, row_cfg in rows_to_run):
        sft_cfg = dataclasses.replace(cfg, name="sft", out_dir=str(root.path), rl=dataclasses.replace(cfg.rl, steps=0))
        sft_run = start_run(sft_cfg, "compare")
        run_pipeline(sft_cfg, sft_run)
        # with sft.steps 0: gpt_mini's saved random init, or the pretrained model itself
        init = str(latest_checkpoint(sft_run, "sft") or latest_checkpoint(sft_run, "init") or cfg.model.name)

    results = []
    for label, row_cfg in rows_to_run:
        run_cfg = dataclasses.replace(row_cfg, name=label.replace(" ×", "").replace(" ", "-"), out_dir=str(root.path),
                                      init=row_cfg.init or init)
        run = start_run(run_cfg, "compare")
        started = time.perf_counter()
        summary = run_pipeline(run_cfg, run)
        results.append(result_row(label, run, summary, time.perf_counter() - started) | {"init": run_cfg.init})
    add_paired_differences(root, results)

    root.write_json("compare.json", results)
    write_table(root, results, cfg, online_rounds, rows)
    if differences:  # --allow-different: a table whose rows are not one metric says so
        with open(root.path / "compare.md", "a", encoding="utf-8") as table:
            table.write("\nThese rows were measured differently (--allow-different), so their numbers are not one "
                        "metric: " + "; ".join(differences) + "\n")
    write_curves(root, results)
    console.print((root.path / "compare.md").read_text())
    return {"path": str(root.path), "rows": results}


def algorithm_variants(cfg: TrainConfig, algos: list[str], online_rounds: list[int] | None) -> list:
    """variants() of --algos and --online_rounds, after their checks."""
    check_algos(algos)
    if online_rounds is not None:
        if not online_rounds or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in online_rounds):
            raise ValueError(f"--online_rounds {online_rounds!r}: give positive round counts, e.g. 1,20 (1 = offline)")
        if not all(a in PREFERENCE_LOSSES for a in algos):
            raise ValueError(f"--online_rounds compares where preference pairs come from; every algorithm must be one "
                             f"of {sorted(PREFERENCE_LOSSES)}, got {algos}")
    return variants(cfg, algos, online_rounds)


def result_row(algo: str, run: RunDir, summary: dict, wall: float) -> dict:
    final = summary["final_stage"]  # "rl", or "pref" for a preference loss
    metrics = [r for r in run.read_jsonl("metrics.jsonl") if r.get("stage") == final]
    tail = metrics[-10:]  # the last steps: where the policy ended up, less noisy than one step

    def tail_mean(key: str) -> float:
        values = [r[key] for r in tail if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else float("nan")

    def curve(key: str) -> list[tuple[int, float]]:
        return [(r["step"], r[key]) for r in metrics if isinstance(r.get(key), (int, float))]

    heldout = run.read_jsonl(f"eval_{final}.jsonl")
    row = {"algo": algo, "run": run.path.name, "stage": final, "sft": summary["sft"], "rl": summary[final],
           "wall_seconds": wall,
           "response_length": tail_mean("response_length"), "kl_ref": tail_mean("kl_ref"),
           # the held-out completions' length in characters, and the share the generation budget cut off
           "heldout_length": bootstrap_ci([len(r["completion"]) for r in heldout]),
           "heldout_cut_off": sum(not r.get("finished", True) for r in heldout) / len(heldout),
           "curve": curve("dev_pass@1"),
           # the reward of everything sampled: DAPO's reward_mean covers only the groups it kept
           "reward_curve": [(r["step"], r.get("reward_sampled_mean", r["reward_mean"])) for r in metrics
                            if "reward_mean" in r],
           "length_curve": curve("response_length"), "cut_off_curve": curve("truncated_fraction")}
    if final == "pref":  # how much data, and whether the learned preference holds on pairs never trained on
        rounds = run.read_json("pref_rounds.json") or {}
        held_out = [r["dev_pref_accuracy"] for r in metrics if "dev_pref_accuracy" in r]
        row |= {"pairs": sum(r.get("pairs", 0) for r in rounds.values()), "train_accuracy": tail_mean("accuracy"),
                "dev_pref_accuracy": held_out[-1] if held_out else float("nan")}
    return row


def add_paired_differences(root: RunDir, rows: list[dict]) -> None:
    """Each row but the first of its start (init) gets "vs_first" and "length_vs_first":
    paired bootstrap CIs of its held-out pass@1 and mean length (characters) minus that
    first row's, on the problems both were scored on (none shared: neither), and "baseline",
    the label it was compared with. Rows from different starts are not paired: the start
    would be part of the difference."""
    def held_out(row: dict) -> dict[str, dict]:
        return {r["id"]: r for r in RunDir(root.path / row["run"]).read_jsonl(f"eval_{row['stage']}.jsonl")}

    firsts: dict[str, dict] = {}
    for row in rows:
        baseline = firsts.setdefault(row.get("init", ""), row)
        if baseline is row:
            continue
        first, mine = held_out(baseline), held_out(row)
        row["baseline"] = baseline["algo"]
        shared = [i for i in first if i in mine]
        if not shared:
            continue
        row["vs_first"] = paired_bootstrap_diff([mine[i]["reward"] for i in shared], [first[i]["reward"] for i in shared])
        row["length_vs_first"] = paired_bootstrap_diff([len(mine[i]["completion"]) for i in shared],
                                                       [len(first[i]["completion"]) for i in shared])


def write_table(root: RunDir, rows: list[dict], cfg: TrainConfig, online_rounds: list[int] | None = None,
                settings: list[Row] | None = None) -> None:
    def pct(ci: dict) -> str:
        return f"{100 * ci['mean']:.1f}% [{100 * ci['ci_low']:.1f}, {100 * ci['ci_high']:.1f}]"

    def points(diff: dict) -> str:
        return f"{100 * diff['mean_diff']:+.1f} [{100 * diff['ci_low']:+.1f}, {100 * diff['ci_high']:+.1f}]"

    def chars(ci: dict, key: str = "mean", sign: str = "") -> str:
        return f"{ci[key]:{sign}.1f} [{ci['ci_low']:{sign}.1f}, {ci['ci_high']:{sign}.1f}]"

    preference = any("pairs" in r for r in rows)
    if preference:
        count = cfg.rl.preference.online_rounds
        rounds = "" if online_rounds else (f" in {count} online rounds" if count > 1 else "")
        setup = (f"{cfg.rl.steps} steps × {cfg.rl.prompts_per_step} pairs, pairs built by the verifier from "
                 f"{cfg.rl.preference.pair_prompts} prompts × {cfg.rl.samples_per_prompt} samples at T = "
                 f"{cfg.rl.sampling.temperature}{rounds}, lr {cfg.rl.optim.lr:g}")
        if cfg.rl.algo_params:
            setup += f", {cfg.rl.algo_params}"
        if online_rounds and cfg.rl.preference.refresh_reference:
            setup += ", each online round's reference refreshed to the policy as it starts"
    else:
        setup = f"{cfg.rl.steps} RL steps × {cfg.rl.prompts_per_step} prompts × {cfg.rl.samples_per_prompt} samples"
    one_start = len({r.get("init", "") for r in rows}) == 1
    start = "Same SFT start" if one_start else "Starts as each row sets"
    first = rows[0]["algo"] if one_start else "its start's first row"
    extra = " pairs | train pref acc | held-out pref acc |" if preference else ""
    lines = [f"{start} (held-out pass@1 {', '.join(sorted({pct(r['sft']) for r in rows}))}), {setup}, shared "
             f"settings as in config.json, seed {cfg.seed}.", "",
             f"| {'row' if settings else 'algorithm'} | held-out pass@1 (95% CI) | vs {first} (paired, points) | "
             f"held-out length, chars (95% CI) | vs {first} (paired, chars) | held-out cut off | wall time | "
             "KL to ref |" + extra,
             "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if preference else "")]
    for r in rows:
        cells = (f" {r['pairs']} | {r['train_accuracy']:.2f} | {r['dev_pref_accuracy']:.2f} |" if "pairs" in r
                 else " | | |" if preference else "")
        versus = points(r["vs_first"]) if "vs_first" in r else ""
        longer = chars(r["length_vs_first"], "mean_diff", "+") if "length_vs_first" in r else ""
        lines.append(f"| {r['algo']} | {pct(r['rl'])} | {versus} | {chars(r['heldout_length'])} | {longer} | "
                     f"{100 * r['heldout_cut_off']:.1f}% | {r['wall_seconds']:.0f} s | {r['kl_ref']:.4f} |" + cells)
    if settings:
        lines += ["", "Rows (the shared settings, then these): "
                  + "; ".join(f"`{row.label}`: {', '.join(f'{k}={v}' for k, v in row.settings.items()) or 'as shared'}"
                              for row in settings) + "."]
    lines += ["", "Wall time includes the two held-out evaluations; KL is averaged over the last 10 steps. Held-out "
                  "length is the greedy completions' length in characters; cut off, the share the generation budget "
                  "ended. Overlapping CIs mean the ranking may be noise: rerun with other seeds before trusting it. "
                  f"The paired columns are each row's pass@1 (length) minus {first}'s on the same held-out problems, "
                  "with a bootstrap CI over problems; a CI that excludes 0 is a difference this seed resolves."
                  + ("" if one_start else " Rows are paired only with a row from the same start (init).")]
    if preference:
        lines += ["For preference losses, KL is measured on the policy's own samples (T = 1) of 64 dev "
                  "prompts at each evaluation; pref acc is the fraction of pairs whose implicit-reward margin is > 0, "
                  "on the training batches (last 10 steps) and on pairs from dev prompts never trained on; pairs "
                  "counts every round's."]
    (root.path / "compare.md").write_text("\n".join(lines) + "\n")


def write_curves(root: RunDir, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def smooth(values: tuple) -> list[float]:  # a 10-step moving average: one step's 256 samples are noisy
        return [sum(values[max(0, i - 9): i + 1]) / len(values[max(0, i - 9): i + 1]) for i in range(len(values))]

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (reward_ax, dev_ax), (length_ax, cut_ax) = axes
    for r in rows:
        if r["reward_curve"] and r["stage"] == "pref":
            # logged at evaluations only (the policy's own samples of 64 dev prompts): too few points to smooth
            reward_ax.plot(*zip(*r["reward_curve"]), marker="o", markersize=3, label=r["algo"])
        elif r["reward_curve"]:
            steps, reward = zip(*r["reward_curve"])
            reward_ax.plot(steps, smooth(reward), label=r["algo"])
        if r["curve"]:
            dev_ax.plot(*zip(*r["curve"]), marker="o", markersize=3, label=r["algo"])
        for ax, key in ((length_ax, "length_curve"), (cut_ax, "cut_off_curve")):
            if r.get(key):
                steps, values = zip(*r[key])
                ax.plot(steps, smooth(values), label=r["algo"])
    if all(r["stage"] == "pref" for r in rows):
        reward_ax.set(title="reward of the policy's own samples (T = 1, 64 dev prompts)", xlabel="step")
    else:
        reward_ax.set(title="train reward of all samples (10-step moving average)", xlabel="RL step")
    dev_ax.set(title="dev pass@1 (greedy)", xlabel="step")
    length_ax.set(title="train response length, tokens (10-step moving average)", xlabel="step")
    cut_ax.set(title="train samples cut off by the budget (10-step moving average)", xlabel="step")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    fig.savefig(root.path / "compare.png", dpi=100)
    plt.close(fig)
