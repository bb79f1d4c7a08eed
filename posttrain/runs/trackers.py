"""Experiment trackers (`--report_to`): a copy of the run directory in TensorBoard, trackio,
Weights & Biases or MLflow, as TRL, verl and OpenRLHF offer.

The run directory stays the record: metrics.jsonl, samples.jsonl and summary.json are
written first, and a tracker gets a copy. Every tracker has the same three methods:

    log_metrics(stage, step, scalars)   one metrics.jsonl line, names prefixed by stage
                                        ("rl/reward_mean", "sft/loss"), at the stage's step
    log_samples(stage, step, rows)      a small table of that step's samples.jsonl rows
    close()

What each writes, and where (nothing reaches a server unless its own variable says so):

    tensorboard  <run>/tensorboard/<stage>/events.out.tfevents.*: one event-file directory
                 per stage, since each stage counts its steps from 0
    trackio      its local store (TRACKIO_DIR, default ~/.cache/huggingface/trackio),
                 project "posttrain", the run directory's name as the run's name
    wandb        <run>/wandb/, offline unless WANDB_MODE is set (then `wandb sync` uploads it)
    mlflow       SQLite at <run>/mlflow.db, artifacts in <run>/mlartifacts/, unless
                 MLFLOW_TRACKING_URI is set; "@" in a name becomes "_at_" (MLflow allows
                 only letters, digits and _ - . : / and space)

The held-out results go to the same trackers at the end of the run: "<stage>/heldout_pass@1"
with its 95% CI and n, at the stage's last step + 1 (the number of steps it trained).

Resume. A resumed run repeats the steps after its last checkpoint, and a tracker may hold
some of them already (the killed process logged them). At the start of every stage the
stage's rows on disk are replayed through the trackers (`Trackers.catch_up`), so a tracker
is brought level with the record however much it had; then the new steps follow. So that
no step is logged twice:
  - tensorboard writes the stage anew: a new event file whose first event is
    `purge_step` = the first step it writes (0 after a replay), and TensorBoard hides every
    earlier event at that step or later, so what it shows equals metrics.jsonl;
  - trackio, wandb and mlflow cannot delete what they hold, so each skips the steps its own
    store already has for the stage (trackio and mlflow: read back from the store; wandb: the
    run's summary, which W&B restores when an online run resumes). A skipped step keeps the
    killed process's values, which equal the resumed ones (resume is exact) except wall
    times. Offline, W&B does not resume a run: each process leaves its own
    `offline-run-*` directory under one run id, and the newest holds the whole history
    (the replay), so sync that one (`wandb sync <run>/wandb/latest-run`).

A tracker that fails mid-run (a full disk, a server gone) is reported once, as a warning,
and left out for the rest of the process; the run goes on, and a later `--resume` brings
that tracker level again through the replay. The libraries are imported only when named:
`report_to="none"` imports none of them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from posttrain.config import ConfigError
from posttrain.runs.console import console

PROJECT = "posttrain"  # the trackio / W&B project and MLflow experiment, unless their own variables name one
SAMPLE_ROWS = 8  # per step: one group of the main job (8 samples of one prompt); samples.jsonl keeps all of them
SAMPLE_COLUMNS = ("id", "prompt", "completion", "reward", "reason")


class Tracker(Protocol):
    def log_metrics(self, stage: str, step: int, scalars: dict[str, float]) -> None: ...

    def log_samples(self, stage: str, step: int, rows: list[dict]) -> None: ...

    def close(self) -> None: ...


def tracker_run_id(run_path: Path) -> str:
    """A stable id for the run directory (W&B run id, MLflow tag): the same across resumes,
    made of hex digits, which every tracker accepts."""
    return hashlib.sha1(run_path.name.encode()).hexdigest()[:16]


def sample_table(rows: list[dict]) -> list[list[Any]]:
    """The first SAMPLE_ROWS samples.jsonl rows as table rows (SAMPLE_COLUMNS)."""
    return [[row.get("id"), row.get("prompt"), row.get("completion"), row.get("reward"),
             (row.get("details") or {}).get("reason")] for row in rows[:SAMPLE_ROWS]]


# ---------------------------------------------------------------------------------------
# one class per tracker; each imports its library when it is built (they are optional)
# ---------------------------------------------------------------------------------------


class TensorBoardTracker:
    # torch.utils.tensorboard writes the event files; the `tensorboard` package is what it needs
    modules = ("tensorboard",)
    install = "pip install tensorboard"

    def __init__(self, run_path: Path, config: dict):
        from torch.utils.tensorboard import SummaryWriter  # optional: imported only for --report_to tensorboard

        self.make_writer, self.root, self.writers = SummaryWriter, run_path / "tensorboard", {}

    def writer(self, stage: str, step: int):
        if stage not in self.writers:
            # the first step this process writes for the stage purges that step and all later
            # ones from earlier event files: a resumed stage reads as the record, not twice
            self.writers[stage] = self.make_writer(str(self.root / stage), purge_step=step)
        return self.writers[stage]

    def log_metrics(self, stage: str, step: int, scalars: dict[str, float]) -> None:
        writer = self.writer(stage, step)
        for name, value in scalars.items():
            writer.add_scalar(name, value, step)
        writer.flush()  # each step on disk now: a kill loses none that the record has

    def log_samples(self, stage: str, step: int, rows: list[dict]) -> None:
        def cell(value: Any) -> str:  # one markdown table cell: no line breaks, no column separators
            return str(value).replace("|", "\\|").replace("\n", "\\n")

        lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in sample_table(rows)]
        self.writer(stage, step).add_text(f"{stage}/samples", "\n".join(lines), step)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


class TrackioTracker:
    modules = ("trackio",)
    install = "pip install trackio"

    def __init__(self, run_path: Path, config: dict):
        import trackio  # optional: imported only for --report_to trackio
        from trackio.sqlite_storage import SQLiteStorage

        self.table = trackio.Table
        # resume="allow": a resumed run directory continues its trackio run (same name)
        self.run = trackio.init(project=PROJECT, name=run_path.name, config=config, resume="allow",
                                auto_log_cpu=False, auto_log_gpu=False, embed=False)
        # the last step trackio holds per (stage, metrics|samples): those steps are not logged again
        self.held: dict[tuple[str, str], int] = {}
        for row in SQLiteStorage.get_logs(PROJECT, run_path.name):
            for key in row:
                if "/" in key:
                    stage, name = key.split("/", 1)
                    kind = "samples" if name == "samples" else "metrics"
                    self.held[stage, kind] = max(self.held.get((stage, kind), -1), row["step"])

    def log_metrics(self, stage: str, step: int, scalars: dict[str, float]) -> None:
        if step > self.held.get((stage, "metrics"), -1):
            self.run.log(scalars, step=step)

    def log_samples(self, stage: str, step: int, rows: list[dict]) -> None:
        if step > self.held.get((stage, "samples"), -1):
            self.run.log({f"{stage}/samples": self.table(columns=list(SAMPLE_COLUMNS), data=sample_table(rows))},
                         step=step)

    def close(self) -> None:
        self.run.finish()


class WandbTracker:
    modules = ("wandb",)
    install = "pip install wandb"

    def __init__(self, run_path: Path, config: dict):
        import wandb  # optional: imported only for --report_to wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT), name=run_path.name, id=tracker_run_id(run_path),
            resume="allow", config=config, dir=str(run_path),
            mode=None if "WANDB_MODE" in os.environ else "offline",  # the user's choice wins; else no network
            settings=wandb.Settings(console="off"))  # leave stdout to the progress bars
        self.held: dict[str, int] = {}

    def last_held(self, stage: str) -> int:
        """The last step of `stage` W&B held when this process first logged the stage: the
        `<stage>/step` of the summary a resumed online run gets back (-1 offline)."""
        if stage not in self.held:
            self.held[stage] = int(self.run.summary.get(f"{stage}/step", -1))
            # each stage's metrics are plotted against its own step
            self.run.define_metric(f"{stage}/step")
            self.run.define_metric(f"{stage}/*", step_metric=f"{stage}/step")
        return self.held[stage]

    def log_metrics(self, stage: str, step: int, scalars: dict[str, float]) -> None:
        if step > self.last_held(stage):
            self.run.log({f"{stage}/step": step, **scalars})

    def log_samples(self, stage: str, step: int, rows: list[dict]) -> None:
        if step > self.last_held(stage):
            # commit=False: the table joins the same history row as the step's metrics, logged next
            table = self.wandb.Table(columns=list(SAMPLE_COLUMNS), data=sample_table(rows))
            self.run.log({f"{stage}/samples": table}, commit=False)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    # the local store is SQLite, which MLflow reaches through SQLAlchemy and migrates with alembic
    modules = ("mlflow", "sqlalchemy", "alembic")
    install = "pip install mlflow-skinny sqlalchemy alembic"

    def __init__(self, run_path: Path, config: dict):
        from mlflow.entities import Metric, Param  # optional: imported only for --report_to mlflow
        from mlflow.tracking import MlflowClient

        self.metric = Metric
        local = not os.environ.get("MLFLOW_TRACKING_URI")
        self.client = client = MlflowClient(tracking_uri=f"sqlite:///{run_path / 'mlflow.db'}" if local else None)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(
            name, artifact_location=(run_path / "mlartifacts").as_uri() if local else None)
        tag = tracker_run_id(run_path)
        found = client.search_runs([experiment_id], filter_string=f"tags.posttrain_run = '{tag}'")
        if found:  # a resumed run directory continues its MLflow run
            self.run_id = found[0].info.run_id
        else:
            self.run_id = client.create_run(experiment_id, run_name=run_path.name,
                                            tags={"posttrain_run": tag}).info.run_id
            params = [Param(key, str(value)) for key, value in flatten(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters per request
                client.log_batch(self.run_id, params=params[i:i + 100])
        # the last step MLflow holds per stage, from each metric's history: those are not logged again
        self.held: dict[str, int] = {}
        for key in client.get_run(self.run_id).data.metrics:
            stage = key.split("/", 1)[0]
            steps = [m.step for m in client.get_metric_history(self.run_id, key)]
            self.held[stage] = max(self.held.get(stage, -1), *steps)

    def log_metrics(self, stage: str, step: int, scalars: dict[str, float]) -> None:
        if step > self.held.get(stage, -1):
            now = int(time.time() * 1000)
            self.client.log_batch(self.run_id, metrics=[self.metric(mlflow_name(name), value, now, step)
                                                        for name, value in scalars.items()])

    def log_samples(self, stage: str, step: int, rows: list[dict]) -> None:
        # one JSON artifact per step, at a fixed path: logging it again replaces it
        table = [dict(zip(SAMPLE_COLUMNS, row)) for row in sample_table(rows)]
        self.client.log_dict(self.run_id, table, f"samples/{stage}/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def mlflow_name(name: str) -> str:
    """`name` in the characters MLflow allows: "rl/dev_pass@1" -> "rl/dev_pass_at_1"."""
    return re.sub(r"[^/\w.\-: ]", "_", name.replace("@", "_at_"))


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """{"rl": {"optim": {"lr": 1e-4}}} -> {"rl.optim.lr": 1e-4}: the config as MLflow's flat parameters."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


TRACKER_CLASSES: dict[str, type] = {
    "tensorboard": TensorBoardTracker, "trackio": TrackioTracker, "wandb": WandbTracker, "mlflow": MlflowTracker,
}


def check_trackers(names: list[str]) -> None:
    """Refuse, before anything starts, a tracker whose library is not installed (found
    without importing it, so the check costs nothing)."""
    for name in names:
        cls = TRACKER_CLASSES[name]
        missing = [module for module in cls.modules if importlib.util.find_spec(module) is None]
        if missing:
            raise ConfigError(f"report_to names {name!r}, but {' and '.join(missing)} "
                              f"{'is' if len(missing) == 1 else 'are'} not installed: "
                              f"{cls.install} (or pip install 'posttrain[trackers]' for every tracker), "
                              "or drop it from --report_to")


# ---------------------------------------------------------------------------------------
# the trackers of one run, called as one
# ---------------------------------------------------------------------------------------


class Trackers:
    """The trackers a run reports to. A call reaches each of them; one that raises is
    reported once and left out from then on, and the run goes on (the run directory is the
    record). Empty, as for report_to="none", every call does nothing."""

    def __init__(self, trackers: dict[str, Tracker]):
        self.live = dict(trackers)

    def __bool__(self) -> bool:
        return bool(self.live)

    def each(self, call: Callable[[Tracker], None], what: str) -> None:
        for name, tracker in list(self.live.items()):
            try:
                call(tracker)
            except Exception as error:  # a copy failing must not stop the run that makes the record
                self.drop(name, what, error)

    def drop(self, name: str, what: str, error: Exception) -> None:
        self.live.pop(name, None)
        console.print(f"[bold red]warning[/] tracker {name} failed at {what} ({type(error).__name__}: {error}); "
                      f"it gets nothing more from this process. The run directory has every step: fix the cause "
                      f"and `--resume` the run to bring {name} level again")

    def log_metrics(self, stage: str, step: int, metrics: dict[str, Any]) -> None:
        """One metrics.jsonl line (without "stage" and "step"): its numbers, named "<stage>/<name>"."""
        if not self.live:  # report_to="none": every step passes here, so do nothing at all
            return
        scalars = {f"{stage}/{name}": float(value) for name, value in metrics.items()
                   if isinstance(value, (int, float))}
        self.each(lambda tracker: tracker.log_metrics(stage, step, scalars), f"{stage} step {step}")

    def log_samples(self, stage: str, step: int, rows: list[dict]) -> None:
        self.each(lambda tracker: tracker.log_samples(stage, step, rows), f"{stage} step {step}'s samples")

    def catch_up(self, stage: str, metrics_rows: list[dict], sample_rows: list[dict]) -> None:
        """Replay the stage's rows already in the run directory, step by step (samples, then
        metrics, as the live run logs them); each tracker skips the steps it holds."""
        samples: dict[int, list[dict]] = {}
        for row in sample_rows:
            if row.get("stage") == stage:
                samples.setdefault(row["step"], []).append(row)
        for row in metrics_rows:
            if row.get("stage") == stage:
                if row["step"] in samples:
                    self.log_samples(stage, row["step"], samples[row["step"]])
                self.log_metrics(stage, row["step"], {k: v for k, v in row.items() if k not in ("stage", "step")})

    def close(self) -> None:
        self.each(lambda tracker: tracker.close(), "close")
        self.live.clear()


NO_TRACKERS = Trackers({})

@contextmanager
def reporting(run: Any, names: list[str], config: dict) -> Iterator[Trackers]:
    """The trackers `names` open on `run` (a RunDir) for the block, as `run.trackers`, where
    the step loop (runs/stage.py) and the RL stage find them; closed at the block's end. With
    no names nothing is imported and run.trackers stays NO_TRACKERS."""
    if not names:
        yield NO_TRACKERS
        return
    check_trackers(names)  # the CLI checked before the run began (check_train); a caller of run_pipeline may not have
    trackers = Trackers({})
    for name in names:
        try:
            trackers.live[name] = TRACKER_CLASSES[name](Path(run.path), config)
        except Exception as error:  # as for a failure mid-run: the run goes on without it
            trackers.drop(name, "start", error)
    run.trackers = trackers
    try:
        yield trackers
    finally:
        run.trackers = NO_TRACKERS
        trackers.close()
