"""The shared step loop of every training stage: resume from the last checkpoint, a progress
bar, one metrics line per step (copied to the run's experiment trackers), a checkpoint
every few steps."""

from __future__ import annotations

from typing import Callable

from posttrain.runs.checkpoints import latest_checkpoint, load_checkpoint_weights, load_trainer_state, save_checkpoint
from posttrain.runs.console import console, step_progress
from posttrain.runs.rundir import RunDir
from posttrain.types import Tokenizer


def run_stage(
    run: RunDir,
    stage: str,
    steps: int,
    step_fn: Callable[[int], dict[str, float]],
    model,
    tokenizer: Tokenizer,
    trainer,
    checkpoint_every: int,
    on_resume: Callable[[dict], None] = lambda state: None,
    extra_state: Callable[[], dict] = lambda: {},
    show: Callable[[dict], str] = lambda m: "",
    checkpoint_also: Callable[[int], bool] = lambda step: False,
    stop_after: Callable[[int], bool] = lambda step: False,
) -> None:
    """Run steps [start, steps) of a stage, where start follows the last checkpoint: each
    step's metrics are one line of metrics.jsonl, and a checkpoint follows every
    checkpoint_every steps, the last step, and any step `checkpoint_also` names. A step
    `stop_after` names (asked once its step_fn has run) is checkpointed and is the last."""
    start = 0
    checkpoint = latest_checkpoint(run, stage)
    if checkpoint is not None:
        state = load_trainer_state(checkpoint)  # first: a damaged file stops the resume before anything changes
        model.load_state_dict(load_checkpoint_weights(checkpoint, model.config).state_dict())
        trainer.load_state_dict(state["trainer"])
        on_resume(state)
        start = state["step"] + 1
        console.print(f"[yellow]resuming {stage} from {checkpoint} (step {start} of {steps})")
    for name in ("metrics.jsonl", "samples.jsonl"):
        run.truncate_jsonl(name, lambda row: row.get("stage") != stage or row.get("step", -1) < start)
    trackers = run.trackers  # --report_to's; none by default
    if trackers:  # first the stage's steps already on disk (a resume), which a tracker may lack
        trackers.catch_up(stage, run.read_jsonl("metrics.jsonl"), run.read_jsonl("samples.jsonl"))
    if start >= steps:
        return

    with step_progress(stage, steps, start) as advance:  # a bar on a terminal, plain lines in a log
        for step in range(start, steps):
            metrics = step_fn(step)
            run.append_jsonl("metrics.jsonl", [{"stage": stage, "step": step, **metrics}])
            trackers.log_metrics(stage, step, metrics)  # after the record: a tracker is its copy
            stop = stop_after(step)
            if (step + 1) % checkpoint_every == 0 or step == steps - 1 or checkpoint_also(step) or stop:
                save_checkpoint(run, stage, step, model, tokenizer, trainer, extra_state())
            advance(show(metrics))
            if stop:
                break
