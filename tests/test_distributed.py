"""Rollout workers on a local Ray cluster the tests start and stop themselves.

    sync, 2 workers    metrics and samples equal the single-process run's, row for row
    async, k = 2       every batch's staleness is exactly min(step, k), never more
    async, killed      resumed from a checkpoint, it trains on the episodes sampled before the kill
    TIS                the truncated importance weight worked by hand (every mode: test_mismatch.py)

A worker killed mid-step: test_distributed_faults.py. Data-parallel training: test_distributed_dp.py.
"""

import json
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from posttrain.config import TrainConfig  # noqa: E402
from posttrain.config.files import from_dict
from posttrain.roles.mismatch import MismatchCorrection  # noqa: E402
from posttrain.roles.off_policy import staleness_stats, truncated_is_weights  # noqa: E402
from posttrain.runs.rundir import RunDir  # noqa: E402
from posttrain.pipelines import rl as rl_pipeline  # noqa: E402
from posttrain.pipelines.run import run_pipeline, start_run  # noqa: E402
from posttrain.types import Episode, Example, RolloutBatch  # noqa: E402

STEPS = 4
PER_STEP = 4 * 4  # prompts_per_step × samples_per_prompt


def tiny(out: Path, **dist) -> TrainConfig:
    """A run small enough for the test suite; the length penalty makes rewards differ
    within a group, so advantages and gradients are non-zero and the weights really move."""
    cfg = from_dict(TrainConfig, {
        "model": {"dim": 32, "n_layer": 2, "n_head": 2, "hidden_dim": 64},
        "sft": {"num_examples": 16, "steps": 6, "batch_size": 8, "warmup_steps": 2},
        "rl": {"prompts_per_step": 4, "samples_per_prompt": 4, "eval_every": STEPS, "dev_size": 8, "steps": STEPS,
               "reward": {"length_penalty": 0.01, "length_free": 5}, "optim": {"lr": 1e-3, "warmup_steps": 1}},
        "heldout_size": 16, "checkpoint_every": 2, "threads": 1, "out_dir": str(out), "dist": dist})
    cfg.validate()
    return cfg


def train(cfg: TrainConfig) -> Path:
    run = start_run(cfg, "train")
    run_pipeline(cfg, run)
    return run.path


def rows(run: Path, stage: str = "rl") -> list[dict]:
    out = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in out if r["stage"] == stage]


def samples(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


DIST_KEYS = {"staleness_mean", "staleness_max", "worker_restarts"}


def same_metrics(single: list[dict], distributed: list[dict]) -> None:
    """Every metric of the single-process run, timings aside, equal in the distributed run."""
    assert len(single) == len(distributed)
    for a, b in zip(single, distributed):
        keys = [k for k in a if not k.startswith("time/")]
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, a["step"]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """The colocated run, its batch cut into the 2 shards 2 workers sample."""
    return train(tiny(tmp_path_factory.mktemp("colocated"), rollout_shards=2))


def test_sync_two_workers_equal_the_single_process_run(cluster, single_process, tmp_path):
    run = train(tiny(tmp_path, workers=2))
    single, dist = rows(single_process), rows(run)
    same_metrics(single, dist)
    same_metrics(rows(single_process, "sft"), rows(run, "sft"))
    assert all(set(b) - set(a) <= DIST_KEYS | {"time/rollout_compute"} for a, b in zip(single, dist))
    assert all(r["grad_norm"] > 0 for r in dist)  # the weights move, so the sync is exercised
    assert [r["weight_version"] for r in dist] == list(range(1, STEPS + 1))
    assert all(r["staleness_max"] == 0 and r["worker_restarts"] == 0 for r in dist)
    assert all({"time/rollout", "time/score", "time/reference", "time/train", "time/sync"} <= set(r) for r in dist)
    assert samples(run) == samples(single_process)  # the same completions, rewards, versions
    summary = lambda p: json.loads((p / "summary.json").read_text())  # noqa: E731
    assert summary(run)["rl"] == summary(single_process)["rl"]


ASYNC = {"workers": 2, "topology": "async", "max_staleness": 2}
CAP = 1.5  # rl.mismatch.cap: below the default 2, so that the cap is seen to bind


def tiny_async(out: Path) -> TrainConfig:
    cfg = tiny(out, **ASYNC)
    cfg.rl.mismatch.cap = CAP
    return cfg


@pytest.fixture(scope="module")
def async_run(cluster, tmp_path_factory):
    return train(tiny_async(tmp_path_factory.mktemp("async")))


def test_async_staleness_never_exceeds_its_setting(async_run):
    k = ASYNC["max_staleness"]
    run = async_run
    dist = rows(run)
    assert [r["step"] for r in dist] == list(range(STEPS))
    # the batch of step s was sampled by weights max(0, s - k): exactly as stale as allowed, not more
    assert [r["staleness_max"] for r in dist] == [min(s, k) for s in range(STEPS)]
    by_step = {}
    for s in samples(run):
        by_step.setdefault(s["step"], set()).add(s["weight_version"])
    assert by_step == {s: {max(0, s - k)} for s in range(STEPS)}
    assert all(0 < r["mismatch/weight_mean"] <= CAP for r in dist)
    assert all(r["staleness_max"] <= k for r in dist)
    assert dist[0]["mismatch/weight_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy: π_old = π_behaviour
    assert len(samples(run)) == STEPS * PER_STEP


class Killed(Exception):
    """Stands in for kill -9: the run stops mid-step, its in-flight requests abandoned."""


def killed_in_rl_step_1(cfg: TrainConfig, monkeypatch) -> RunDir:
    """`cfg`'s run, started and killed in RL step 1: after the update and the push of step 1,
    before its row is written (so after the checkpoint of step 0 when checkpoint_every is 1)."""
    sample_row = rl_pipeline.sample_row

    def dies_in_step_1(stage: str, step: int, episode: Episode) -> dict:
        if (stage, step) == ("rl", 1):
            raise Killed
        return sample_row(stage, step, episode)

    monkeypatch.setattr(rl_pipeline, "sample_row", dies_in_step_1)
    run = start_run(cfg, "train")
    with pytest.raises(Killed):
        run_pipeline(cfg, run)
    monkeypatch.undo()
    return run


def test_killed_async_run_resumes_to_the_same_metrics(async_run, tmp_path, monkeypatch):
    """Killed in step 1, after the checkpoint of step 0: the batches of steps 1 and 2 were in
    flight (sampled by v0). The resumed run trains on those same episodes, and the batch of
    step 3 is requested after the push of v1, as in the uninterrupted run."""
    cfg = tiny_async(tmp_path)
    cfg.checkpoint_every = 1  # the reference run checkpoints every 2 steps: checkpoints must not change numbers
    run = killed_in_rl_step_1(cfg, monkeypatch)
    assert [r["step"] for r in rows(run.path)] == [0]

    run_pipeline(cfg, RunDir.open(str(run.path)))  # what `posttrain train --resume` does
    same_metrics(rows(async_run), rows(run.path))  # reward_mean, loss, staleness, TIS, weight_version, ...
    assert samples(run.path) == samples(async_run)  # the same completions, sampled by the same versions
    summary = lambda p: json.loads((p / "summary.json").read_text())  # noqa: E731
    assert summary(run.path)["rl"] == summary(async_run)["rl"]


def test_truncated_importance_weights_by_hand():
    old = torch.tensor([[0.0, -1.0, -0.5, 0.0]])  # log π_old
    behaviour = torch.tensor([[0.0, -2.0, -0.25, -3.0]])  # log π_behaviour
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    w = truncated_is_weights(old, behaviour, mask, cap=2.0)
    # ratios e^1 = 2.718 (capped to 2), e^-0.25 = 0.779, e^3 (capped); the prompt token is masked
    assert torch.allclose(w, torch.tensor([[0.0, 2.0, 0.7788008, 2.0]]))
    batch = RolloutBatch(tokens=torch.zeros(1, 4, dtype=torch.long), attention_mask=torch.ones(1, 4),
                         response_mask=mask, old_logp=behaviour, rewards=torch.ones(1),
                         group_ids=torch.zeros(1, dtype=torch.long), advantages=torch.full((1, 4), 0.5))
    corrected, metrics = MismatchCorrection(cap=2.0).apply(batch, old)
    assert torch.equal(corrected.old_logp, old)  # the ratio's denominator is now π_old
    assert torch.allclose(corrected.advantages, 0.5 * w)
    assert metrics["mismatch/truncated_fraction"] == pytest.approx(2 / 3)


def test_staleness_beyond_the_setting_is_refused():
    ex = Example("Q: 1+1", "2")
    episodes = [Episode(ex, 0, [1], [2], [0.0], weight_version=v) for v in (3, 5)]
    batch = RolloutBatch.collate(episodes, pad_id=0)
    assert staleness_stats(batch, 5, max_staleness=2) == {"staleness_mean": 1.0, "staleness_max": 2}
    with pytest.raises(RuntimeError, match="staleness must stay in"):
        staleness_stats(batch, 6, max_staleness=2)


def test_settings_are_checked_and_the_shortcuts_map_to_them():
    import subprocess
    import sys

    from posttrain.cli.training import train_config
    from posttrain.config import ConfigError, DistConfig

    cfg = train_config(["--workers", "2", "--dist.ray_address", "auto", "--sft.steps", "0"])
    assert (cfg.dist.workers, cfg.dist.ray_address, cfg.dist.resolved_topology()) == (2, "auto", "sync")
    assert DistConfig().resolved_topology() == "colocated"
    for bad, message in [({"topology": "async"}, "dist.workers=0 is not allowed: expected at least 1"),
                         ({"topology": "ring"}, "dist.topology='ring' is not allowed"),
                         ({"workers": 2, "topology": "async", "max_staleness": 0}, "dist.max_staleness=0"),
                         ({"workers": 2, "ray_address": "127.0.0.1:9"}, "nothing answers there")]:
        with pytest.raises(ConfigError, match=message):
            DistConfig(**bad).validate()
    # a colocated run never imports Ray
    code = ("import sys, posttrain.roles.controller, posttrain.roles.rollout; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_one_shard_draws_what_the_controller_always_drew():
    """The colocated backend with one shard is the old code path: same seed, same call."""
    from posttrain.roles.rollout import ColocatedRollout, RolloutRequest, split_shards
    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.models import CharTokenizer, build_model
    from posttrain.seeds import derive_seed, generator_for
    from posttrain.pipelines.build import sampling_params

    cfg = tiny(Path("unused"))
    tokenizer = CharTokenizer()
    torch.manual_seed(0)
    policy = build_model(cfg.model, tokenizer)
    examples = ArithmeticEnv().sample("train", 5, seed=3)
    request = lambda step, round: RolloutRequest(examples, 3, derive_seed(0, "rl-sample", step))  # noqa: E731
    rollout = ColocatedRollout(policy, tokenizer, sampling_params(cfg), request, shards=1)
    old = rollout.engine.generate(examples, 3, generator_for(0, "rl-sample", 7))
    new = rollout.sample(7)
    assert [(e.group_id, e.response_ids, e.response_logp) for e in new] == \
           [(e.group_id, e.response_ids, e.response_logp) for e in old]
    # shards hold whole groups, in order, each once
    shards = split_shards(request(0, 0), 2)
    assert [(s.first_group, len(s.examples)) for s in shards] == [(0, 2), (2, 3)]
    assert len({s.seed for s in shards}) == 2
