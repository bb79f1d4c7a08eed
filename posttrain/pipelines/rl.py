"""Stage 2: reinforcement learning against the verifier, one controller step at a time."""

from __future__ import annotations

import time
from pathlib import Path

from posttrain.config import TrainConfig
from posttrain.eval.evaluate import evaluate_pass_at_1
from posttrain.pipelines.build import build_controller
from posttrain.pipelines.curation import prepare_pool, remeasure, write_record
from posttrain.runs.checkpoints import latest_checkpoint
from posttrain.runs.console import console
from posttrain.runs.monitors import check_all
from posttrain.runs.report import RUN_MONITORS
from posttrain.runs.rundir import RunDir, sample_row
from posttrain.runs.stage import run_stage


def rl_stage(cfg: TrainConfig, run: RunDir, env, tokenizer, policy, start_weights: Path) -> None:
    """RL from the policy as it is, against the environment's verifier (or the reward
    built on it): the controller's steps, with dev-set pass@1 every rl.eval_every steps,
    every sample logged, the monitors watching, and checkpoints to resume from. With
    rl.curation, the prompts come from a curated pool, measured before the first step
    (pipelines/curation.py) and recorded in curation.jsonl and curation.json."""
    controller = build_controller(cfg, env, tokenizer, policy, start_weights)
    engine = controller.rollout.engine  # the local engine dev-set evaluation samples from
    pool = controller.prompts
    if pool is not None and latest_checkpoint(run, "rl") is None:  # else its state comes with the checkpoint
        prepare_pool(cfg, run, pool, engine, env)
    dev = env.fixed_set("dev", cfg.rl.dev_size, seed=0)
    history = [r for r in run.read_jsonl("metrics.jsonl") if r.get("stage") == "rl"]  # for the live monitors

    def rl_step(step: int) -> dict[str, float]:
        step_start = time.perf_counter()
        measured = remeasure(cfg, pool, engine, env, step) if pool is not None else {}
        metrics, episodes = controller.step(step)
        metrics.update(measured)
        if (step + 1) % cfg.rl.eval_every == 0 or step == cfg.rl.steps - 1:
            metrics["dev_pass@1"] = evaluate_pass_at_1(engine, env, dev)["pass@1"]
        samples = [sample_row("rl", step, e) for e in episodes]
        run.append_jsonl("samples.jsonl", samples)
        run.trackers.log_samples("rl", step, samples)  # --report_to: a few of them as a table
        metrics["time/step"] = time.perf_counter() - step_start  # wall time; roles can overlap (async)
        warn_as_it_happens(history, {"step": step, **metrics})
        return metrics

    try:
        run_stage(run, "rl", cfg.rl.steps, rl_step, policy, tokenizer, controller.trainer, cfg.checkpoint_every,
                  on_resume=controller.load_state_dict, extra_state=controller.state_dict,
                  show=lambda m: f"reward {m['reward_mean']:.2f}  len {m['response_length']:.0f}"
                                 + (f"  dev {m['dev_pass@1']:.2f}" if "dev_pass@1" in m else ""))
        if pool is not None:
            write_record(run, pool)  # the pool as RL left it: who was dropped on the way, how often each was drawn
    finally:
        controller.close()


def warn_as_it_happens(history: list[dict], row: dict) -> None:
    """Print a monitor's alert on the step it first fires (summary.md lists them all again)."""
    history[:] = [r for r in history if r["step"] < row["step"]] + [row]
    for alert in check_all(history, RUN_MONITORS):
        if alert["step"] == row["step"]:
            console.print(f"[bold red]warning[/] step {alert['step']}: {alert['message']}")


