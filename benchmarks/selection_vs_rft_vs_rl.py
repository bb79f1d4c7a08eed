"""Selection vs rejection-sampling fine-tuning vs RL at one sample budget (issue 21, item 5).

From ONE SFT checkpoint on the default arithmetic task, every method gets the same number of
sampled completions, and all are scored on the same held-out problems:

    best-of-N      nothing trained; N samples per held-out problem at test time, picked by the
                   verifier (an oracle: pass@N) or by majority vote over final answers (no oracle)
    STaR           posttrain star: iterations × prompts × K samples, the verified ones fine-tuned
                   on, each iteration from the start (--star.restart true)
    RFT            the same, each iteration continuing from the last (--star.restart false)
    GRPO           posttrain train: steps × prompts × K samples, one policy-gradient update per batch

    PYTHONPATH=. .venv/bin/python benchmarks/selection_vs_rft_vs_rl.py --init CHECKPOINT [--seeds 0,1]

The training runs go side by side as subprocesses (--jobs at a time, one thread each); the
best-of-N samples are drawn in this process. The table goes to <out_dir>/table.md, the
numbers to <out_dir>/results.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def training_commands(init: str, seed: int, out: Path, budget: dict) -> dict[str, list[str]]:
    common = ["--init", init, "--sft.steps", "0", "--threads", "1", "--seed", str(seed), "--out_dir", str(out),
              "--heldout_size", str(budget["heldout"])]
    star = ["star", *common, "--star.iterations", str(budget["iterations"]), "--star.prompts",
            str(budget["star_prompts"]), "--star.samples_per_prompt", str(budget["k"])]
    return {  # GRPO first: the longest run starts first when they go --jobs at a time
        "GRPO": ["train", *common, "--name", "grpo", "--algo", "grpo", "--rl.steps", str(budget["grpo_steps"]),
                 "--rl.prompts_per_step", str(budget["grpo_prompts"]), "--rl.samples_per_prompt", str(budget["k"])],
        "STaR": [*star, "--name", "star", "--star.restart", "true"],
        "RFT": [*star, "--name", "rft", "--star.restart", "false"],
        "RFT + step check": [*star, "--name", "rft-steps", "--star.restart", "false", "--star.step_check", "true"],
    }


# the run directory's suffix of each trained method (<timestamp>-<name>)
RUN_NAMES = {"GRPO": "grpo", "STaR": "star", "RFT": "rft", "RFT + step check": "rft-steps"}


def run_command(args: list[str], log: Path) -> float:
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, "-m", "posttrain", *args], stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        raise RuntimeError(f"`posttrain {' '.join(args)}` failed (exit {done.returncode}); see {log}")
    return time.perf_counter() - started


def verdicts(path: Path) -> dict[str, float]:
    return {json.loads(line)["id"]: json.loads(line)["reward"] for line in path.read_text().splitlines()}


def newest_run(folder: Path, method: str) -> Path:
    """The newest run of `method` in a seed's folder: an earlier invocation's runs stay beside it."""
    runs = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.endswith(f"-{RUN_NAMES[method]}")
                  and not p.name.startswith("."))
    if not runs:
        raise FileNotFoundError(f"no finished {method} run (*-{RUN_NAMES[method]}) in {folder}")
    return runs[-1]


def trained_row(method: str, run: Path) -> dict:
    """Held-out verdicts, samples, tokens and time of a finished star or train run; the time
    is the run's own (GRPO: its steps, dev evaluations included; star: its iterations, each
    with its held-out evaluation), so rows measured apart compare alike."""
    if method == "GRPO":
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        config = json.loads((run / "config.json").read_text())["rl"]
        rows = config["prompts_per_step"] * config["samples_per_prompt"]
        steps = [m for m in metrics if m["stage"] == "rl"]
        samples = sum(rows * m.get("sampling_rounds", 1) for m in steps)
        tokens = sum(rows * m.get("sampling_rounds", 1) * m["response_length"] for m in steps)
        return {"method": method, "verdicts": verdicts(run / "eval_rl.jsonl"), "samples": samples,
                "tokens": round(tokens), "wall_seconds": sum(m.get("time/step", 0.0) for m in steps),
                "run": str(run)}
    log = json.loads((run / "star_iterations.json").read_text())
    last = log["iterations"][-1]["iteration"]
    return {"method": method, "verdicts": verdicts(run / f"eval_star{last}.jsonl"),
            "samples": sum(r["samples"] + r["rationalization_samples"] for r in log["iterations"]),
            "tokens": sum(r["tokens"] for r in log["iterations"]),
            "wall_seconds": sum(r["seconds"] for r in log["iterations"]), "run": str(run),
            "kept": [r["kept"] for r in log["iterations"]], "kept_wrong_chain": wrong_chains(run),
            "per_iteration": [r["heldout"]["mean"] for r in log["iterations"]]}


def wrong_chains(run: Path) -> list[int]:
    """Per iteration, the kept rationales whose running sums differ from the reference chain
    though their final answer passed: what an outcome verifier lets through. On the
    arithmetic task the correct chain is unique, so "differs" means "has a wrong step"."""
    from posttrain.envs import make_env
    from posttrain.types import Example

    env = make_env("arithmetic")
    counts = []
    for data in sorted(run.glob("star_data_*.jsonl"), key=lambda p: int(p.stem.rsplit("_", 1)[1])):
        rows = [json.loads(line) for line in data.read_text().splitlines()]
        counts.append(sum(r["completion"] != env.solution(Example(r["prompt"], r["expected_answer"])) for r in rows))
    return counts


def majority_answer(episodes) -> object:
    """The episode whose parsed final answer is the most common among `episodes` (ties: the
    answer seen first); an unparsed answer never wins while a parsed one exists."""
    from posttrain.search.methods import majority_index

    return episodes[majority_index([e.details.get("parsed") for e in episodes])]


def best_of_n_rows(init: str, seed: int, ns: list[int], heldout: int) -> list[dict]:
    """Best-of-N from the starting policy: max(ns) samples per held-out problem at the RL
    sampling settings; the first N of them for each N, chosen by the verifier or by vote."""
    import torch

    from posttrain.config import TrainConfig
    from posttrain.envs import make_env
    from posttrain.eval.evaluate import solved
    from posttrain.models import load_checkpoint_model, load_tokenizer
    from posttrain.pipelines.build import sampling_params
    from posttrain.roles.environment import score_episodes
    from posttrain.roles.engines import RolloutEngine
    from posttrain.seeds import generator_for

    torch.set_num_threads(1)
    cfg = TrainConfig()
    env = make_env(cfg.env.name, **cfg.env.kwargs())
    problems = env.fixed_set("heldout", heldout, seed=0)
    policy, tokenizer = load_checkpoint_model(Path(init)), load_tokenizer(Path(init))
    engine = RolloutEngine(policy, tokenizer, sampling_params(cfg), shares_weights=True)
    started = time.perf_counter()
    k = max(ns)
    episodes = []
    for start in range(0, len(problems), 50):  # 50 problems × k samples per call: the cache stays small
        episodes += engine.generate(problems[start:start + 50], k, generator_for(seed, "bon", start))
    score_episodes(env.score, episodes)
    wall = time.perf_counter() - started
    groups = [episodes[i * k:(i + 1) * k] for i in range(len(problems))]
    rows = []
    for n in ns:
        tokens = sum(len(e.response_ids) for g in groups for e in g[:n])
        oracle = {p.id: float(any(solved(e) for e in g[:n])) for p, g in zip(problems, groups)}
        vote = {p.id: solved(majority_answer(g[:n])) for p, g in zip(problems, groups)}
        for method, chosen in ((f"best-of-{n}, majority vote", vote), (f"best-of-{n}, verifier (oracle)", oracle)):
            rows.append({"method": method, "verdicts": chosen, "samples": n * len(problems), "tokens": tokens,
                         "wall_seconds": wall * n / k, "test_time": True})
    return rows


def table(results: dict[int, list[dict]], start: dict[str, float], budget: dict, seconds: float) -> str:
    from posttrain.eval.stats import bootstrap_ci, paired_bootstrap_diff

    def pct(ci: dict) -> str:
        return f"{100 * ci['mean']:.1f}% [{100 * ci['ci_low']:.1f}, {100 * ci['ci_high']:.1f}]"

    seeds = sorted(results)
    ids = sorted(start)
    start_ci = bootstrap_ci([start[i] for i in ids])
    lines = [f"| method | samples | tokens sampled | held-out pass@1, seed {seeds[0]} (95% CI) | vs SFT start, "
             f"paired (points, seed {seeds[0]}) | pass@1 per seed ({', '.join(map(str, seeds))}) | vs GRPO, paired "
             "(points, per seed) | wall time |",
             "|---|---|---|---|---|---|---|---|",
             f"| SFT start (greedy) | 0 | 0 | {pct(start_ci)} | | {100 * start_ci['mean']:.1f}% | | |"]
    grpo = {s: next(r for r in results[s] if r["method"] == "GRPO") for s in seeds}

    def versus_grpo(rows: list[dict]) -> str:
        if rows[0]["method"] == "GRPO":
            return ""
        diffs = [paired_bootstrap_diff([r["verdicts"][i] for i in ids], [grpo[s]["verdicts"][i] for i in ids])
                 for s, r in zip(seeds, rows)]
        return "; ".join(f"{100 * d['mean_diff']:+.1f} [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]"
                         for d in diffs)

    for j, row in enumerate(results[seeds[0]]):
        per_seed = [results[s][j] for s in seeds]
        ci = bootstrap_ci([row["verdicts"][i] for i in ids])
        diff = paired_bootstrap_diff([row["verdicts"][i] for i in ids], [start[i] for i in ids])
        means = [100 * sum(r["verdicts"][i] for i in ids) / len(ids) for r in per_seed]
        where = "test time" if row.get("test_time") else "training"
        lines.append(f"| {row['method']} | {row['samples']:,} ({where}) | {row['tokens']:,} | {pct(ci)} | "
                     f"{100 * diff['mean_diff']:+.1f} [{100 * diff['ci_low']:+.1f}, {100 * diff['ci_high']:+.1f}] | "
                     f"{', '.join(f'{m:.1f}%' for m in means)} | {versus_grpo(per_seed)} | "
                     f"{sum(r['wall_seconds'] for r in per_seed) / len(per_seed):.0f} s |")
    lines += ["", f"Budget: STaR/RFT {budget['iterations']} iterations × {budget['star_prompts']} prompts × "
                  f"{budget['k']} samples; GRPO {budget['grpo_steps']} steps × {budget['grpo_prompts']} prompts × "
                  f"{budget['k']} samples; best-of-N draws N samples for each of the {budget['heldout']} held-out "
                  f"problems." + (f" Whole comparison: {seconds / 60:.1f} min." if seconds else ""), ""]
    for seed in seeds:
        for row in results[seed]:
            if "kept" in row:
                lines.append(f"- {row['method']}, seed {seed}: held-out pass@1 after each iteration "
                             f"{', '.join(f'{100 * m:.1f}%' for m in row['per_iteration'])}; kept "
                             f"{', '.join(map(str, row['kept']))} rationales, of which "
                             f"{', '.join(map(str, row.get('kept_wrong_chain', [])))} had a wrong step "
                             "(right final answer, running sums not the reference chain)")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--init", default="", help="the SFT checkpoint every method starts from")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds; each runs every method")
    parser.add_argument("--out_dir", default="runs/selection_vs_rft_vs_rl")
    parser.add_argument("--jobs", type=int, default=2, help="training runs at a time (one thread each)")
    parser.add_argument("--samples", type=int, default=25_600, help="sampled training completions per method")
    parser.add_argument("--k", type=int, default=8, help="samples per prompt, for every method")
    parser.add_argument("--iterations", type=int, default=4, help="STaR/RFT iterations")
    parser.add_argument("--grpo_prompts", type=int, default=32, help="GRPO prompts per step")
    parser.add_argument("--heldout", type=int, default=500, help="held-out problems")
    parser.add_argument("--table_only", action="store_true",
                        help="rebuild table.md from <out_dir>/results.json and the runs it names; run nothing")
    args = parser.parse_args()
    out = Path(args.out_dir)
    if args.table_only:
        # best-of-N from results.json (its samples were never saved); the trained runs read again from disk
        saved = json.loads((out / "results.json").read_text())
        results = {int(seed): [r for r in rows if r.get("test_time")] + [trained_row(method, newest_run(
                       out / f"seed{seed}", method)) for method in RUN_NAMES if method != "GRPO"]
                   + [trained_row("GRPO", newest_run(out / f"seed{seed}", "GRPO"))]
                   for seed, rows in saved["results"].items()}
        text = table(results, saved["start"], saved["budget"], saved.get("seconds", 0.0))
        (out / "table.md").write_text(text)
        (out / "results.json").write_text(json.dumps({**saved, "results": results}, indent=1))
        print(text)
        return
    if not args.init or not Path(args.init).is_dir():
        raise SystemExit(f"--init {args.init!r}: no such checkpoint directory (runs/<id>/checkpoints/sft/step_N)")
    per_round = args.iterations * args.k
    if args.samples % per_round or args.samples % (args.grpo_prompts * args.k):
        raise SystemExit(f"--samples {args.samples} must split evenly into {args.iterations} STaR iterations × "
                         f"{args.k} samples and into GRPO steps of {args.grpo_prompts} × {args.k}")
    budget = {"k": args.k, "iterations": args.iterations, "star_prompts": args.samples // per_round,
              "grpo_steps": args.samples // (args.grpo_prompts * args.k), "grpo_prompts": args.grpo_prompts,
              "heldout": args.heldout}
    seeds = [int(s) for s in args.seeds.split(",")]
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    jobs = {(seed, method): (cmd, out / f"seed{seed}")
            for seed in seeds
            for method, cmd in training_commands(args.init, seed, out / f"seed{seed}", budget).items()}
    for _, folder in jobs.values():
        folder.mkdir(exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {key: pool.submit(run_command, cmd, folder / f"{key[1]}.log") for key, (cmd, folder) in jobs.items()}
        # best-of-N in this process while the training runs go
        bon = {seed: best_of_n_rows(args.init, seed, [args.k, args.samples // args.heldout], args.heldout)
               for seed in seeds}
        for future in futures.values():
            future.result()  # raises if the run failed

    results = {}
    for seed in seeds:
        trained = [m for m in RUN_NAMES if m != "GRPO"] + ["GRPO"]  # GRPO last: the rows compare to it
        results[seed] = list(bon[seed]) + [trained_row(m, newest_run(out / f"seed{seed}", m)) for m in trained]
    start = verdicts(newest_run(out / f"seed{seeds[0]}", "STaR") / "eval_start.jsonl")
    seconds = time.perf_counter() - started
    text = table(results, start, budget, seconds)
    (out / "table.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"budget": budget, "start": start, "results": results,
                                                  "seconds": seconds}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
