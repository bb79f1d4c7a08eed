"""What a preference stage measures once before its first step and once after its last,
beside the dev-set numbers it logs every rl.eval_every steps (pipelines/preference.py):

    temperature sensitivity   held-out pass@1, mean reward and length sampled at each of
                              rl.preference.eval_temperatures (eval/sensitivity.py)
    out of distribution       greedy pass@1 on a shifted task (rl.preference.ood_level: arithmetic
                              at another level; rl.preference.ood_path: a file of other problems),
                              beside greedy pass@1 on the same number of held-out problems

Each for the starting policy and the trained one, so the table says what training changed.
Written to <stage>_diagnostics.json ({"start": ..., "trained": ...}); summary.md shows it
(runs/report.py). Both are off by default: they cost 2 × (temperatures + 2) passes over
rl.preference.diagnostic_prompts problems.
"""

from __future__ import annotations

import dataclasses

from posttrain.config import TrainConfig
from posttrain.envs import make_env
from posttrain.eval.evaluate import evaluate_pass_at_1
from posttrain.eval.sensitivity import temperature_table
from posttrain.models.policy import SavablePolicy
from posttrain.pipelines.build import sampling_params
from posttrain.roles.engines import Engine, make_engine
from posttrain.runs.checkpoints import latest_checkpoint
from posttrain.runs.console import console
from posttrain.runs.preference_report import diagnostics_lines
from posttrain.runs.rundir import RunDir
from posttrain.types import Environment, Tokenizer

# the environments rl.preference.ood_level shifts (their `level` setting), and those that read
# rl.preference.ood_path as their held-out file (their `heldout_path`)
LEVELLED_ENVS = ("arithmetic", "arithmetic_think")
FILE_ENVS = ("jsonl", "math", "code", "gsm8k")


def ood_environment(cfg: TrainConfig) -> Environment | None:
    """The shifted task: the run's environment at rl.preference.ood_level, or reading
    rl.preference.ood_path as its held-out problems; None when neither is set. ValueError
    naming the setting when the task has no such knob."""
    pref, kwargs = cfg.rl.preference, cfg.env.kwargs()
    if pref.ood_level:
        if cfg.env.name not in LEVELLED_ENVS:
            raise ValueError(f"rl.preference.ood_level={pref.ood_level} shifts an arithmetic task's level, and "
                             f"env.name={cfg.env.name!r} has none: for a file task give rl.preference.ood_path")
        trained_on = kwargs.get("levels") or str(cfg.env.arithmetic_level())
        if str(pref.ood_level) in trained_on.replace(" ", "").split(","):
            raise ValueError(f"rl.preference.ood_level={pref.ood_level} is a level the run trains on ({trained_on}), "
                             "so its problems are not out of distribution: pick another level (1-5)")
        kwargs = {k: v for k, v in kwargs.items() if k != "levels"}  # one level: the shifted one
        return make_env(cfg.env.name, **{**kwargs, "level": pref.ood_level})
    if pref.ood_path:
        if cfg.env.name not in FILE_ENVS:
            raise ValueError(f"rl.preference.ood_path={pref.ood_path!r} is read as a file task's held-out problems, "
                             f"and env.name={cfg.env.name!r} reads no file: use one of {', '.join(FILE_ENVS)}, or "
                             "rl.preference.ood_level for arithmetic")
        return make_env(cfg.env.name, **{**kwargs, "heldout_path": pref.ood_path})
    return None


class PreferenceDiagnostics:
    """The start's numbers, measured as the stage is built (before any step: no checkpoint
    of the stage exists yet), and the trained policy's, measured by `after_training`."""

    def __init__(self, cfg: TrainConfig, run: RunDir, stage: str, env: Environment, tokenizer: Tokenizer,
                 policy: SavablePolicy) -> None:
        self.cfg, self.run, self.env, self.tokenizer, self.policy = cfg, run, env, tokenizer, policy
        self.file, self.temperatures = f"{stage}_diagnostics.json", cfg.rl.preference.temperatures()
        self.ood_env = ood_environment(cfg)
        self.on = bool(self.temperatures or self.ood_env is not None) and cfg.rl.steps > 0
        n = cfg.rl.preference.diagnostic_prompts
        self.heldout = env.fixed_set("heldout", n, seed=0) if self.on else []
        self.ood = self.ood_env.fixed_set("heldout", n, seed=0) if self.on and self.ood_env is not None else []
        record = self.run.read_json(self.file) or {}
        if self.on and "start" not in record and latest_checkpoint(run, stage) is None:
            self.run.write_json(self.file, {"start": self.measure()})

    def after_training(self) -> None:
        """The trained policy's numbers, once (a second call, or a resumed finished run, keeps them)."""
        record = self.run.read_json(self.file) or {}
        if self.on and "trained" not in record:
            record["trained"] = self.measure()
            self.run.write_json(self.file, record)
            for line in diagnostics_lines(record):
                console.print(line, highlight=False, markup=False)

    def engine_at(self, temperature: float) -> Engine:
        params = dataclasses.replace(sampling_params(self.cfg), temperature=temperature)
        return make_engine(self.policy, self.tokenizer, params, shares_weights=True)

    def measure(self) -> dict:
        """{"temperatures": rows, "ood": {"heldout_pass@1", "ood_pass@1", "n_heldout", "n_ood"}}, each part when on."""
        out: dict = {}
        if self.temperatures:
            out["temperatures"] = temperature_table(self.engine_at, self.env, self.heldout, self.temperatures,
                                                    self.cfg.seed)
        if self.ood_env is not None:
            greedy = [r for r in out.get("temperatures", []) if r["temperature"] == 0]  # measured already
            heldout = greedy[0]["pass@1"] if greedy else evaluate_pass_at_1(self.engine_at(0.0), self.env,
                                                                            self.heldout)["pass@1"]
            ood = evaluate_pass_at_1(self.engine_at(0.0), self.ood_env, self.ood)["pass@1"]
            out["ood"] = {"heldout_pass@1": heldout, "ood_pass@1": ood, "n_heldout": len(self.heldout),
                          "n_ood": len(self.ood)}
        self.policy.train()
        return out

