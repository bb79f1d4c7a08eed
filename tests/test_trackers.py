"""--report_to: each experiment tracker holds an exact copy of metrics.jsonl, read back
through the tracker's own reader; a resumed run logs no step twice; a bad setting stops
before any run directory exists; report_to="none" imports no tracker library."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.config import TRACKERS, ConfigError, TrainConfig
from posttrain.runs.console import console
from posttrain.runs.trackers import SAMPLE_ROWS, TRACKER_CLASSES, Trackers, mlflow_name
from tests.test_pipeline import TINY, only_run_dir, posttrain

LIBRARIES = ("tensorboard", "trackio", "wandb", "mlflow")


def metrics_rows(run: Path, stage: str) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["stage"] == stage]


def numbers(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k not in ("stage", "step") and isinstance(v, (int, float))}


def tensorboard_scalars(run: Path, stage: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the stage as TensorBoard shows it: (step, value) per tag, in order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard" / stage), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def tensorboard_texts(run: Path, stage: str) -> dict[int, str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard" / stage), size_guidance={"tensors": 0})
    events.Reload()
    return {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors(f"{stage}/samples/text_summary")}


def trackio_logs(trackio_dir: Path, run_name: str) -> list[dict]:
    """The run's rows through trackio's own reader, in a fresh process: trackio reads
    TRACKIO_DIR once, when it is imported."""
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
            "print(json.dumps(SQLiteStorage.get_logs('posttrain', sys.argv[1]), default=str))")
    out = subprocess.run([sys.executable, "-c", code, run_name], env={**os.environ, "TRACKIO_DIR": str(trackio_dir)},
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_train(*args: str, env: dict | None = None, timeout: int = 600) -> str:
    proc = posttrain("train", *TINY, *args, env=env)
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output
    return output


@pytest.fixture(scope="module")
def copied(tmp_path_factory):
    """A tiny run (6 SFT steps, 3 RL steps) reported to tensorboard and trackio."""
    out = tmp_path_factory.mktemp("copied")
    env = {**os.environ, "TRACKIO_DIR": str(out / "trackio")}
    run_train("--rl.steps", "3", "--report_to", "tensorboard,trackio", "--out_dir", str(out / "runs"), env=env)
    return only_run_dir(out / "runs"), out / "trackio"


def test_tensorboard_holds_every_number_of_metrics_jsonl(copied):
    run, _ = copied
    summary = json.loads((run / "summary.json").read_text())
    for stage, steps in (("sft", 6), ("rl", 3)):
        rows = metrics_rows(run, stage)
        assert [row["step"] for row in rows] == list(range(steps))
        scalars = tensorboard_scalars(run, stage)
        expected: dict[str, list[tuple[int, float]]] = {}
        for row in rows:
            for name, value in numbers(row).items():
                expected.setdefault(f"{stage}/{name}", []).append((row["step"], value))
        ci = summary[stage]  # the held-out result, at the step after the stage's last
        for name, key in (("heldout_pass@1", "mean"), ("heldout_ci_low", "ci_low"), ("heldout_ci_high", "ci_high"),
                          ("heldout_n", "n")):
            expected[f"{stage}/{name}"] = [(steps, float(ci[key]))]
        assert sorted(scalars) == sorted(expected)
        for tag, points in expected.items():
            assert [step for step, _ in scalars[tag]] == [step for step, _ in points], tag
            # event files hold float32
            assert [v for _, v in scalars[tag]] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-30), tag
        assert "rl/reward_mean" in expected or stage == "sft"
    # a table of each RL step's first samples, as in samples.jsonl
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    texts = tensorboard_texts(run, "rl")
    assert sorted(texts) == [0, 1, 2]
    for step, text in texts.items():
        first = [s for s in samples if s["step"] == step][:SAMPLE_ROWS]
        body = text.splitlines()[2:]  # after the header and the separator
        assert len(body) == SAMPLE_ROWS == 8
        assert [line.split(" | ")[0].lstrip("| ") for line in body] == [s["id"] for s in first]


def test_trackio_holds_every_number_of_metrics_jsonl(copied):
    run, trackio_dir = copied
    logs = trackio_logs(trackio_dir, run.name)
    summary = json.loads((run / "summary.json").read_text())
    for stage, steps in (("sft", 6), ("rl", 3)):
        mine = [row for row in logs if any(k.startswith(f"{stage}/") and k != f"{stage}/samples" for k in row)]
        rows = metrics_rows(run, stage)
        # one trackio row per metrics.jsonl line, then the held-out result
        assert [row["step"] for row in mine] == list(range(steps)) + [steps]
        for row, logged in zip(rows, mine):
            assert {k: logged[f"{stage}/{k}"] for k in numbers(row)} == numbers(row)
            assert len([k for k in logged if k.startswith(f"{stage}/")]) == len(numbers(row))
        assert mine[-1][f"{stage}/heldout_pass@1"] == summary[stage]["mean"]
        assert mine[-1][f"{stage}/heldout_n"] == summary[stage]["n"] == 16
    tables = [row for row in logs if "rl/samples" in row]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [row["step"] for row in tables] == [0, 1, 2]
    for row in tables:
        table = row["rl/samples"]["_value"]
        first = [s for s in samples if s["step"] == row["step"]][:SAMPLE_ROWS]
        assert [r["completion"] for r in table] == [s["completion"] for s in first]
        assert [r["reward"] for r in table] == [s["reward"] for s in first]


def latest_rl_checkpoint(run: Path) -> int:
    pointer = run / "checkpoints" / "rl" / "latest"
    return int(pointer.read_text().strip().removeprefix("step_")) if pointer.exists() else -1


# slow: a kill timed mid-step, 12 steps; tracker copies of a resumed run are also checked by catch_up's unit tests
@pytest.mark.slow
def test_a_resumed_run_logs_no_step_twice(tmp_path):
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    args = ["--rl.steps", "12", "--checkpoint_every", "4", "--report_to", "tensorboard,trackio"]
    proc = posttrain("train", *TINY, *args, "--out_dir", str(tmp_path / "runs"), env=env)
    # stop it while it has logged steps after its last checkpoint (the resume repeats those),
    # check that while it is frozen, then kill it
    deadline, killed_after = time.time() + 300, None
    while time.time() < deadline and killed_after is None:
        assert proc.poll() is None, "the run finished before it could be killed; " + proc.stdout.read()
        runs = [p for p in (tmp_path / "runs").glob("*") if p.is_dir()]
        if runs and latest_rl_checkpoint(runs[0]) >= 3 and (runs[0] / "metrics.jsonl").exists():
            os.kill(proc.pid, signal.SIGSTOP)
            logged = [r["step"] for r in metrics_rows(runs[0], "rl")]
            if logged and logged[-1] > latest_rl_checkpoint(runs[0]):
                killed_after = (latest_rl_checkpoint(runs[0]), logged[-1])
                os.kill(proc.pid, signal.SIGKILL)
            else:
                os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.005)
    proc.wait()
    assert killed_after is not None and proc.returncode == -signal.SIGKILL
    run = only_run_dir(tmp_path / "runs")
    checkpoint, last_logged = killed_after
    # flushed at every step, right after the record's line: the kill may fall between the two
    assert tensorboard_scalars(run, "rl")["rl/reward_mean"][-1][0] in (last_logged - 1, last_logged)

    resumed = posttrain("train", "--resume", str(run), env=env)
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output
    assert "resuming rl" in output and f"(step {checkpoint + 1} of 12)" in " ".join(output.split())

    logs = trackio_logs(tmp_path / "trackio", run.name)
    for stage, steps in (("sft", 6), ("rl", 12)):
        rows = metrics_rows(run, stage)
        assert [row["step"] for row in rows] == list(range(steps))
        # TensorBoard: each step once (the resumed writer purged what it rewrote), equal to the record
        for tag, points in tensorboard_scalars(run, stage).items():
            name = tag.split("/", 1)[1]
            expected = [(r["step"], numbers(r)[name]) for r in rows if name in numbers(r)]
            if not name.startswith("heldout_"):
                assert [s for s, _ in points] == [s for s, _ in expected], tag
                assert [v for _, v in points] == pytest.approx([v for _, v in expected], rel=1e-6, abs=1e-30), tag
        # trackio: each step once; a step it held before the kill keeps that value, equal to the
        # record (resume is exact) except the wall times
        mine = [row for row in logs if any(k.startswith(f"{stage}/") and k != f"{stage}/samples" for k in row)]
        assert [row["step"] for row in mine] == list(range(steps)) + [steps]
        for row, logged in zip(rows, mine):
            untimed = {k: v for k, v in numbers(row).items() if not k.startswith("time/")}
            assert {k: logged[f"{stage}/{k}"] for k in untimed} == untimed
    assert [row["step"] for row in logs if "rl/samples" in row] == list(range(12))


def test_unknown_tracker_is_refused_before_any_run_directory(tmp_path, capsys):
    from posttrain.cli import main

    for value in ("tensorbord", "none,wandb", "wandb,wandb"):
        assert main(["train", "--report_to", value, "--out_dir", str(tmp_path / "runs")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"report_to={value!r} is not allowed" in err and "tensorboard, trackio, wandb, mlflow" in err
    assert not (tmp_path / "runs").exists()


def test_missing_tracker_library_is_refused_before_any_run_directory(tmp_path, capsys, monkeypatch):
    from posttrain.cli import main

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: find_spec finds nothing
    assert main(["train", "--report_to", "tensorboard,wandb", "--out_dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "report_to names 'wandb', but wandb is not installed: pip install wandb" in err
    assert "pip install 'posttrain[trackers]'" in err
    assert not (tmp_path / "runs").exists()


def test_report_to_none_imports_no_tracker_library(tmp_path):
    args = ["train", *TINY, "--rl.steps", "1", "--out_dir", str(tmp_path)]
    code = (f"import sys\nfrom posttrain.cli import main\nassert main({args!r}) == 0\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {LIBRARIES!r} "
            "or m.startswith('torch.utils.tensorboard')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
    assert not (only_run_dir(tmp_path) / "tensorboard").exists()


class Recorder:
    def __init__(self, fail_at_call: int = -1):
        self.calls, self.fail_at_call, self.closed = [], fail_at_call, False

    def log_metrics(self, stage, step, scalars):
        self.calls.append((stage, step, scalars))
        if len(self.calls) == self.fail_at_call:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def log_samples(self, stage, step, rows):
        self.calls.append((stage, step, len(rows)))

    def close(self):
        self.closed = True


def test_a_failing_tracker_is_reported_once_and_the_others_go_on():
    good, bad = Recorder(), Recorder(fail_at_call=2)
    trackers = Trackers({"good": good, "bad": bad})
    with console.capture() as captured:
        for step in range(4):
            trackers.log_metrics("rl", step, {"reward_mean": step / 4, "dev_pass@1": 1, "note": "not a number"})
        trackers.log_samples("rl", 4, [{}] * 3)
        trackers.close()
    out = " ".join(captured.get().split())
    assert out.count("warning") == 1
    assert "tracker bad failed at rl step 1 (OSError: [Errno 28] No space left on device)" in out
    assert good.calls == [("rl", s, {"rl/reward_mean": s / 4, "rl/dev_pass@1": 1.0}) for s in range(4)] + [("rl", 4, 3)]
    assert len(bad.calls) == 2 and not bad.closed and good.closed


def test_catch_up_replays_the_stage_in_step_order():
    rec = Recorder()
    metrics = [{"stage": "sft", "step": 0, "loss": 2.0}, {"stage": "rl", "step": 0, "reward_mean": 0.25},
               {"stage": "rl", "step": 1, "reward_mean": 0.5, "time/step": 0.1}]
    samples = [{"stage": "rl", "step": s, "id": f"{s}-{i}"} for s in (0, 1) for i in range(3)]
    Trackers({"rec": rec}).catch_up("rl", metrics, samples)
    assert rec.calls == [("rl", 0, 3), ("rl", 0, {"rl/reward_mean": 0.25}),
                         ("rl", 1, 3), ("rl", 1, {"rl/reward_mean": 0.5, "rl/time/step": 0.1})]


def test_report_to_setting():
    assert TrainConfig().trackers() == []
    assert TrainConfig(report_to=" tensorboard , trackio").trackers() == ["tensorboard", "trackio"]
    TrainConfig(report_to="mlflow,wandb").validate()
    for bad in ("", "none,tensorboard", "tensorboard,tensorboard", "comet"):
        with pytest.raises(ConfigError, match="^report_to="):
            TrainConfig(report_to=bad).validate()
    assert set(TRACKERS) == set(TRACKER_CLASSES) == set(LIBRARIES)
    assert mlflow_name("rl/dev_pass@1") == "rl/dev_pass_at_1"


# The two trackers outside the dev extra, when installed (pip install 'posttrain[trackers]'):
# the tracker objects on their own, a run and its resume.


def test_mlflow_copy_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    from posttrain.runs.trackers import MlflowTracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "20260101-000000-x"
    run.mkdir()
    rows = [{"stage": "rl", "step": s, "reward_mean": s / 8, "dev_pass@1": 0.5} for s in range(6)]
    first = Trackers({"mlflow": MlflowTracker(run, {"rl": {"lr": 1e-4}})})
    for row in rows[:4]:  # the killed process got to step 3
        first.log_metrics("rl", row["step"], numbers(row))
    first.close()
    again = Trackers({"mlflow": MlflowTracker(run, {"rl": {"lr": 1e-4}})})
    again.catch_up("rl", rows[:2], [])  # the resume from a checkpoint at step 1 replays 0-1, then logs 2-5
    for row in rows[2:]:  # steps 2-3 with other values, to show they are skipped, not logged again
        again.log_metrics("rl", row["step"], {**numbers(row), **({"reward_mean": 99.0} if row["step"] < 4 else {})})
    again.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    [found] = client.search_runs([client.get_experiment_by_name("posttrain").experiment_id])
    history = client.get_metric_history(found.info.run_id, "rl/reward_mean")
    # each step once; steps 2-3 keep what the first process logged
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(s, s / 8) for s in range(6)]
    assert len(client.get_metric_history(found.info.run_id, "rl/dev_pass_at_1")) == 6
    assert found.data.params["rl.optim.lr"] == "0.0001"


def test_wandb_writes_offline_inside_the_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from posttrain.runs.trackers import WandbTracker, tracker_run_id

    monkeypatch.delenv("WANDB_MODE", raising=False)
    run = tmp_path / "20260101-000000-x"
    run.mkdir()
    trackers = Trackers({"wandb": WandbTracker(run, {"seed": 0})})
    for step in range(3):
        trackers.log_samples("rl", step, [{"id": "a", "completion": "Final: 3", "reward": 1.0}])
        trackers.log_metrics("rl", step, {"reward_mean": step / 2})
    trackers.close()
    assert trackers.live == {}
    [offline] = (run / "wandb").glob(f"offline-run-*-{tracker_run_id(run)}")
    assert (offline / f"run-{tracker_run_id(run)}.wandb").stat().st_size > 0
    assert len(list((offline / "files" / "media" / "table" / "rl").glob("samples_*.table.json"))) == 3
