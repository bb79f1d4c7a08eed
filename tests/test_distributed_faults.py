"""A rollout worker that dies — mid-call (os._exit inside the actor) or from outside
(ray.kill) — is restarted by Ray, given the current weights, and re-issued exactly the
shards it had not returned: no episode lost, none counted twice, the run finishes."""

import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from posttrain.roles.rollout import ColocatedRollout, RolloutRequest  # noqa: E402
from posttrain.distributed.rollout_workers import RayRollout  # noqa: E402
from posttrain.envs.arithmetic import ArithmeticEnv  # noqa: E402
from posttrain.models import CharTokenizer, build_model  # noqa: E402
from posttrain.pipelines.build import sampling_params  # noqa: E402
from tests.test_distributed import STEPS, rows, same_metrics, samples, single_process, tiny, train  # noqa: E402,F401


def _request_fn(env):
    def request(step: int, round: int) -> RolloutRequest:
        return RolloutRequest(env.sample("train", 6, seed=step), 3, seed=1000 + step)
    return request


def test_worker_killed_mid_call_loses_no_episode(cluster, capsys):
    torch.manual_seed(0)
    torch.set_num_threads(1)  # as the workers: the thread count can change float results
    tokenizer = CharTokenizer()
    cfg = tiny(Path("unused"), workers=2)
    policy = build_model(cfg.model, tokenizer)
    request = _request_fn(ArithmeticEnv())
    reference = ColocatedRollout(policy, tokenizer, sampling_params(cfg), request, shards=3)
    remote = RayRollout(cfg.dist, policy, tokenizer, sampling_params(cfg), request, shards=3)
    try:
        assert len(remote.sample(0)) == 6 * 3
        pid, _ = ray.get(remote.workers[0].status.remote())
        ray.get(remote.workers[0].arm_crash.remote())  # worker 0 holds shards 0 and 2
        got = remote.sample(1)
        assert ray.get(remote.workers[0].status.remote())[0] != pid  # a new process took over
        want = reference.sample(1)
        assert len(got) == len(want) == 6 * 3
        assert sorted(e.group_id for e in got) == sorted(g for g in range(6) for _ in range(3))
        # re-issued with the same seeds and weights: exactly the draws the lost call would have made
        assert [(e.group_id, e.response_ids, e.response_logp) for e in got] == \
               [(e.group_id, e.response_ids, e.response_logp) for e in want]
        assert remote.restarts == 1
        # killed between calls: the restarted worker has no weights, refuses, and is re-armed
        ray.kill(remote.workers[1], no_restart=False)
        time.sleep(1.0)
        remote.push()
        reference.push()
        assert [e.response_ids for e in remote.sample(2)] == [e.response_ids for e in reference.sample(2)]
        assert remote.restarts == 2
    finally:
        remote.close()
    assert "rollout worker 0 died" in " ".join(capsys.readouterr().out.split())


def test_run_survives_a_killed_worker(cluster, single_process, tmp_path, monkeypatch, capsys):
    """ray.kill from outside at a random moment of step 2: the run finishes with every
    episode counted once, and, the re-issued shards drawing what the lost ones would have,
    with the single-process run's metrics."""
    instances = []
    init = RayRollout.__init__

    def remember(self, *args, **kwargs):
        init(self, *args, **kwargs)
        instances.append(self)

    monkeypatch.setattr(RayRollout, "__init__", remember)
    cfg = tiny(tmp_path, workers=2)
    killed = threading.Event()

    def killer():
        deadline = time.time() + 120
        while time.time() < deadline:
            metrics = next(tmp_path.glob("*/metrics.jsonl"), None)
            if instances and metrics and any('"stage": "rl", "step": 1,' in line for line in metrics.open()):
                ray.kill(instances[0].workers[1], no_restart=False)
                killed.set()
                return
            time.sleep(0.01)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    run = train(cfg)
    thread.join()
    assert killed.is_set()
    dist = rows(run)
    assert dist[-1]["worker_restarts"] >= 1
    log = " ".join(capsys.readouterr().out.split())  # undo the console's line wrapping
    assert "rollout worker 1 died" in log and "the run continues" in log
    counts = {}
    for s in samples(run):
        counts[(s["step"], s["group"])] = counts.get((s["step"], s["group"]), 0) + 1
    assert counts == {(step, g): 4 for step in range(STEPS) for g in range(4)}
    same_metrics(rows(single_process), dist)
