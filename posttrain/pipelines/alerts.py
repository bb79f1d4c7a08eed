"""What the RL stage does when a hacking monitor fires (rl.alerts.action): warn, stop, or roll back.

The monitors (posttrain/runs/monitors.py) watch the metrics as they are logged. Seed 000's
mitigations for reward hacking include stopping early on detection; this is that policy:

    warn       print the alert and train on (the default: a monitor detects, it does not
               diagnose, and a false alarm should not cost a good run its last steps)
    stop       the step an rl.alerts.monitors monitor first fires is the stage's last: checkpointed,
               recorded in early_stop.json (under the stage's name), then the held-out
               evaluation as usual
    rollback   as stop, and the policy is put back to the weights of the step where dev
               pass@1 was best (kept in checkpoints/<stage>_best/ whenever a new best is logged),
               so the stage's last checkpoint, and everything evaluated from it, is the
               model from before the reward started paying for the wrong thing

A stopped stage stays stopped: a resumed run reads early_stop.json and ends the stage at
the same step (a kill between the record and the checkpoint replays up to that step, where
the deterministic run fires the same alert again).
"""

from __future__ import annotations

from posttrain.config import RLConfig
from posttrain.models.policy import SavablePolicy
from posttrain.runs.checkpoints import latest_checkpoint, load_checkpoint_weights, save_checkpoint
from posttrain.runs.console import console
from posttrain.runs.monitors import RUN_MONITORS, check_all
from posttrain.runs.rundir import RunDir
from posttrain.types import Tokenizer

RECORD = "early_stop.json"


class AlertPolicy:
    """Watches one training stage's metric rows as they come (the RL stage's, or a
    preference stage's); `should_stop` says whether the step just run is the last."""

    def __init__(self, rl: RLConfig, run: RunDir, stage: str, policy: SavablePolicy, tokenizer: Tokenizer) -> None:
        self.action, self.stop_on = rl.alerts.action, {name.strip() for name in rl.alerts.monitors.split(",")}
        self.run, self.policy, self.tokenizer, self.stage = run, policy, tokenizer, stage
        self.best_stage = f"{stage}_best"  # checkpoints/<stage>_best/: the best dev pass@1's weights (rollback)
        self.history = [r for r in run.read_jsonl("metrics.jsonl") if r.get("stage") == stage]
        self.stopped_at: int | None = None

    def last_step(self, steps: int) -> int:
        """The stage's step count: `steps`, or one past the step a stopped run ended on."""
        record = stopped_stages(self.run).get(self.stage)
        return steps if record is None else record["step"] + 1

    def after_step(self, step: int, metrics: dict[str, float]) -> None:
        """Print the alerts that start at this step; keep the best weights; act on an alert."""
        earlier = [r for r in self.history if r["step"] < step]
        if self.action == "rollback" and "dev_pass@1" in metrics:
            best = max((r["dev_pass@1"] for r in earlier if "dev_pass@1" in r), default=float("-inf"))
            if metrics["dev_pass@1"] > best:  # strictly: the monitor's peak is where the best was first reached
                save_checkpoint(self.run, self.best_stage, step, self.policy, self.tokenizer, keep_last=1)
        self.history[:] = earlier + [{"step": step, **metrics}]
        fired = [a for a in check_all(self.history, RUN_MONITORS) if a["step"] == step]
        for alert in fired:
            console.print(f"[bold red]warning[/] step {alert['step']}: {alert['message']}")
        acted_on = [a for a in fired if a["monitor"] in self.stop_on]
        if self.action == "warn" or not acted_on:
            return
        record = {"step": step, "action": self.action, "monitor": acted_on[0]["monitor"],
                  "message": acted_on[0]["message"]}
        if self.action == "rollback":
            record.update(self.roll_back())
        self.run.write_json(RECORD, {**stopped_stages(self.run), self.stage: record})
        self.stopped_at = step
        console.print(f"[bold red]stopping[/] at step {step} ({self.action}): rl.alerts.action={self.action} acts on "
                      f"{record['monitor']}" + (f"; weights of step {record['restored_step']} put back"
                                                if record.get("restored_step") is not None else ""))

    def roll_back(self) -> dict:
        """Load the best-dev weights into the policy: what the stop step's checkpoint will hold."""
        best = latest_checkpoint(self.run, self.best_stage)
        if best is None:  # no dev pass@1 was logged before the alert (rl.eval_every too large)
            return {"restored_step": None, "restored_because": "no dev pass@1 was logged before the alert: the "
                    "policy is kept as it is (lower rl.eval_every to have a step to roll back to)"}
        self.policy.load_state_dict(load_checkpoint_weights(best, self.policy.config).state_dict())
        return {"restored_step": int(best.name.removeprefix("step_")), "restored_from": str(best)}

    def should_stop(self, step: int) -> bool:
        return self.stopped_at == step


def stopped_stages(run: RunDir) -> dict[str, dict]:
    """early_stop.json: each stopped stage's record, by stage name ({} when none stopped)."""
    return run.read_json(RECORD) or {}
