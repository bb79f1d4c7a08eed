"""Stage 2: reinforcement learning against the verifier, one controller step at a time."""

from __future__ import annotations

import time
from pathlib import Path

from rich.markup import escape

from posttrain.config import TrainConfig
from posttrain.config.files import to_dict
from posttrain.models.policy import SavablePolicy
from posttrain.eval.evaluate import evaluate_pass_at_1
from posttrain.pipelines.alerts import AlertPolicy
from posttrain.pipelines.build import build_controller
from posttrain.pipelines.curation import build_pool, prepare_pool, remeasure, write_record
from posttrain.runs.checkpoints import latest_checkpoint
from posttrain.runs.console import console
from posttrain.runs.diagnosis import LiveDiagnosis
from posttrain.runs.rundir import RunDir, sample_row
from posttrain.runs.stage import run_stage
from posttrain.types import Environment, Tokenizer


def rl_stage(cfg: TrainConfig, run: RunDir, env: Environment, tokenizer: Tokenizer, policy: SavablePolicy,
             start_weights: Path, stage: str = "rl") -> None:
    """RL from the policy as it is, against the environment's verifier (or the reward
    built on it): the controller's steps, with dev-set pass@1 every rl.eval_every steps,
    every sample logged, the monitors watching (and acting, per rl.alerts.action:
    pipelines/alerts.py), the diagnosis naming each cause of a run that cannot learn once
    (runs/diagnosis.py), and checkpoints to resume from. `stage` names its checkpoints,
    metrics and samples rows (a --stages run's: the algorithm). With rl.curation, the prompts
    come from a curated pool, measured before the first step (pipelines/curation.py) and
    recorded in curation.jsonl and curation.json."""
    pool = build_pool(cfg, env)  # rl.curation's pool of training prompts, or None
    controller = build_controller(cfg, env, tokenizer, policy, start_weights, pool)
    engine = controller.rollout.engine  # the engine in this process: dev-set evaluation samples from it
    if pool is not None and latest_checkpoint(run, stage) is None:  # else its state comes with the checkpoint
        prepare_pool(cfg, run, pool, engine, env)
    dev = env.fixed_set("dev", cfg.rl.dev_size, seed=0)
    alerts = AlertPolicy(cfg.rl, run, stage, policy, tokenizer)
    # why the run is not learning, if it is not (runs/diagnosis.py): each cause printed once, when first seen
    diagnosis = LiveDiagnosis([r for r in run.read_jsonl("metrics.jsonl") if r.get("stage") == stage],
                              [s for s in run.read_jsonl("samples.jsonl") if s.get("stage") == stage], to_dict(cfg))

    def rl_step(step: int) -> dict[str, float]:
        step_start = time.perf_counter()
        measured = remeasure(cfg, pool, engine, env, step) if pool is not None else {}
        metrics, episodes = controller.step(step)
        metrics.update(measured)
        if (step + 1) % cfg.rl.eval_every == 0 or step == cfg.rl.steps - 1:
            eval_start = time.perf_counter()
            metrics["dev_pass@1"] = evaluate_pass_at_1(engine, env, dev)["pass@1"]
            metrics["time/dev_eval"] = time.perf_counter() - eval_start  # inside time/step, outside the roles
        samples = [sample_row(stage, step, e) for e in episodes]
        run.append_jsonl("samples.jsonl", samples)
        run.trackers.log_samples(stage, step, samples)  # --report_to: a few of them as a table
        metrics["time/step"] = time.perf_counter() - step_start  # wall time; roles can overlap (async)
        alerts.after_step(step, metrics)
        for finding in diagnosis.after_step(step, metrics, samples):
            console.print(f"[bold yellow]diagnosis[/] {escape(finding.line())}")
        return metrics

    try:
        run_stage(run, stage, alerts.last_step(cfg.rl.steps), rl_step, policy, tokenizer, controller.trainer,
                  cfg.checkpoint_every, on_resume=controller.load_state_dict, extra_state=controller.state_dict,
                  stop_after=alerts.should_stop,
                  show=lambda m: f"reward {m['reward_mean']:.2f}  len {m['response_length']:.0f}"
                                 + (f"  dev {m['dev_pass@1']:.2f}" if "dev_pass@1" in m else ""))
        if pool is not None:
            write_record(run, pool)  # the pool as RL left it: who was dropped on the way, how often each was drawn
    finally:
        controller.close()

