"""A curated RL run end to end on a tiny gpt_mini (pipelines/curation.py): what it records,
and an interrupted run resumed to the same metrics, pool and record as an uninterrupted
one, both after a checkpoint and before the first (the measurement is then reused)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

import posttrain.pipelines.curation as curation
from posttrain.config import ConfigError, CurationConfig
from posttrain.data.curation import PromptPool
from posttrain.envs import ArithmeticEnv
from posttrain.pipelines.checks import check_config
from posttrain.pipelines.run import run_pipeline, start_run
from posttrain.roles.controller import Controller
from posttrain.runs.rundir import RunDir
from tests.test_devices import tiny_config


class CoinFlips:
    """Arithmetic prompts of levels 1 and 2 (labels for a curriculum), scored so that an
    untrained policy solves about half its samples: a completion counts when its first
    character's code is even. Four samples of a prompt then pass 0 to 4 times."""

    spec_version = "coin-flips-v1"

    def __init__(self):
        self.task = ArithmeticEnv(levels="1,2")

    def sample(self, split, n, seed=None):
        return self.task.sample(split, n, seed)

    def fixed_set(self, split, n, seed=0):
        return self.task.fixed_set(split, n, seed)

    def score(self, example, completion):
        solved = completion[:1] != "" and ord(completion[0]) % 2 == 0
        return {"reward": float(solved), "details": {"correct": solved}}


CURATION = CurationConfig(pool_size=16, k=4, min_pass_rate=0.25, max_pass_rate=0.75, online=True, remeasure_every=3,
                          weights="failure", order="easy_to_hard")


def curated(out_dir):
    cfg = tiny_config(out_dir=str(out_dir))
    cfg.sft = dataclasses.replace(cfg.sft, steps=0)
    cfg.rl = dataclasses.replace(cfg.rl, steps=8, prompts_per_step=2, samples_per_prompt=4, curation=CURATION)
    return cfg


def run_to(out_dir, monkeypatch, stop_at: int | None = None):
    """A curated run; with `stop_at`, interrupted inside that step (as a kill would stop it)."""
    cfg = curated(out_dir)
    run = start_run(cfg, "test", CoinFlips())
    if stop_at is not None:
        step = Controller.step

        def interrupted(controller, s):
            if s == stop_at:
                raise KeyboardInterrupt
            return step(controller, s)

        monkeypatch.setattr(Controller, "step", interrupted)
    with run:
        try:
            run_pipeline(cfg, run, CoinFlips())
        except KeyboardInterrupt:
            assert stop_at is not None
    monkeypatch.undo()
    return cfg, run.path


def resume(cfg, path):
    with RunDir.resume(str(path)) as run:
        run_pipeline(cfg, run, CoinFlips())


def record(path) -> dict:
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return {"metrics": [{k: v for k, v in r.items() if not k.startswith("time/") and k != "curation/measure_seconds"}
                        for r in rows],
            "curation": (path / "curation.jsonl").read_text(),
            "summary": json.loads((path / "summary.json").read_text())["rl"]}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        return run_to(tmp_path_factory.mktemp("whole"), monkeypatch)[1]


def test_a_curated_run_records_its_pool_and_filters_online(uninterrupted):
    rows = [json.loads(line) for line in (uninterrupted / "curation.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and {row["label"] for row in rows} == {1.0, 2.0}
    in_band = [1 <= row["first_pass_rate"][0] <= 3 for row in rows]  # the band [1/4, 3/4] of 4 samples
    report = json.loads((uninterrupted / "curation.json").read_text())
    assert report["measurement"]["k"] == 4 and report["pool"] == 16 and report["kept_before_rl"] == sum(in_band)
    assert 0 < sum(in_band) < 16 and sum(report["histogram_before_rl"].values()) == 16
    for row, kept in zip(rows, in_band):  # a prompt whose status never changed is where the first measurement put it
        assert row["first_pass_rate"][1] == 4
        if row["changed_at_step"] == -1:
            assert (row["status"] == "kept") == kept
    metrics = [json.loads(line) for line in (uninterrupted / "metrics.jsonl").read_text().splitlines()]
    rl = [m for m in metrics if m["stage"] == "rl"]
    assert [m["curation/hardest_unlocked"] for m in rl] == [1] * 4 + [2] * 4  # two labels, two stages of 4 steps
    assert [s for s, m in enumerate(rl) if "curation/measure_samples" in m] == [3, 6]  # remeasure_every 3
    assert all(m["sampling_rounds"] >= 1 for m in rl) and any(m["kept_group_fraction"] < 1 for m in rl)
    samples = [json.loads(line) for line in (uninterrupted / "samples.jsonl").read_text().splitlines()]
    pool = {row["prompt"] for row in rows}
    assert {s["prompt"] for s in samples if s["stage"] == "rl"} <= pool
    assert "## Data curation" in (uninterrupted / "summary.md").read_text()


def test_a_run_interrupted_after_a_checkpoint_resumes_to_the_same_run(uninterrupted, tmp_path, monkeypatch):
    cfg, path = run_to(tmp_path / "a", monkeypatch, stop_at=5)  # checkpoints after steps 1 and 3
    assert not (path / "summary.md").exists()
    copy = shutil.copytree(path, tmp_path / "copy" / path.name)
    resume(cfg, path)
    assert record(path) == record(uninterrupted)

    # without the pool's state (what step 0..3 observed and dropped) the resumed run differs: the test can fail
    monkeypatch.setattr(PromptPool, "load_state_dict", lambda pool, state: None)
    resume(cfg, copy)
    assert record(copy)["metrics"] != record(uninterrupted)["metrics"]


def test_a_run_interrupted_before_its_first_checkpoint_reuses_its_measurement(uninterrupted, tmp_path, monkeypatch):
    steps_measured = []
    measure = curation.measure

    def counting(pool, engine, env, k, seed, step):
        steps_measured.append(step)
        return measure(pool, engine, env, k, seed, step)

    cfg, path = run_to(tmp_path / "b", monkeypatch, stop_at=0)
    monkeypatch.setattr(curation, "measure", counting)
    resume(cfg, path)
    assert steps_measured == [3, 6]  # the pass before RL was read back from curation.json, not made again
    assert record(path) == record(uninterrupted)


def test_curation_settings_that_cannot_work_are_refused_before_the_run(tmp_path):
    cfg = curated(tmp_path)
    cfg.rl = dataclasses.replace(cfg.rl, algo="dpo", curation=CurationConfig(pool_size=16))
    with pytest.raises(ConfigError, match=r"rl.curation.pool_size=16 .* 0 with a preference loss"):
        check_config(cfg)
    cfg = curated(tmp_path)
    cfg.env = dataclasses.replace(cfg.env, arithmetic=dataclasses.replace(cfg.env.arithmetic, level=2))
    cfg.rl = dataclasses.replace(cfg.rl, curation=CurationConfig(pool_size=796))
    with pytest.raises(ConfigError, match=r"rl.curation.pool_size=796 is not allowed: split 'train' of level 2 holds "
                                          r"only 795 distinct problems"):
        check_config(cfg)
    problems = tmp_path / "problems.jsonl"  # no difficulty labels
    problems.write_text("".join(json.dumps({"prompt": f"Q: {i}+1\n", "expected_answer": str(i + 1)}) + "\n"
                                for i in range(200)))
    cfg = curated(tmp_path)
    cfg.env = dataclasses.replace(cfg.env, name="jsonl", path=str(problems))
    cfg.rl = dataclasses.replace(cfg.rl, curation=CurationConfig(pool_size=16, order="easy_to_hard"))
    with pytest.raises(ConfigError, match=r"an easy-to-hard curriculum needs a difficulty label on every prompt"):
        check_config(cfg)
    cfg.rl = dataclasses.replace(cfg.rl, curation=CurationConfig(pool_size=16))
    assert any(line.startswith("curation: 16 of 16 prompts in the pool") for line in check_config(cfg))
