"""The reference runs on a sample of rows when only the KL log reads it (rl.kl.track_rows):
the logged KL is k3 on exactly those rows, the loss never sees the difference, and every
reader of the whole ref_logp (a KL term in the loss) still gets every row."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posttrain.envs import make_env
from posttrain.models import save_checkpoint_model
from posttrain.pipelines.build import build_controller
from posttrain.roles.reference import evenly_spaced_rows
from tests.test_devices import tiny_config, tiny_policy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def recorded_controller(tmp_path, algo_params=None, **kl):
    """A tiny gpt_mini controller, 4 prompts × 4 samples, whose reference records what it scores;
    `kl`: settings of the rl.kl section."""
    cfg = tiny_config()
    cfg.rl = dataclasses.replace(cfg.rl, prompts_per_step=4, samples_per_prompt=4, algo_params=algo_params or {},
                                 kl=dataclasses.replace(cfg.rl.kl, **kl))
    policy, tokenizer = tiny_policy()
    save_checkpoint_model(policy, tokenizer, tmp_path / "start")
    controller = build_controller(cfg, make_env("arithmetic"), tokenizer, policy, tmp_path / "start")
    # an untrained policy never scores: reward odd lengths, so the update moves the weights
    controller.reward = lambda example, completion: {"reward": float(len(completion) % 2), "details": {}}
    scored = []  # (the batch the reference read, its log-probs)
    logp = controller.reference.logp
    controller.reference.logp = lambda batch: scored.append((batch, logp(batch))) or scored[-1][1]
    return controller, scored


def k3(batch, ref_logp) -> float:
    log_ratio = ref_logp - batch.old_logp
    per_token = torch.exp(log_ratio) - log_ratio - 1
    return ((per_token * batch.response_mask).sum() / batch.response_mask.sum()).item()


def test_evenly_spaced_rows_cover_the_batch():
    assert evenly_spaced_rows(16, 4) == [0, 4, 8, 12]
    assert evenly_spaced_rows(10, 3) == [0, 3, 6]
    assert evenly_spaced_rows(5, 5) == [0, 1, 2, 3, 4]


def test_the_kl_log_reads_the_reference_on_a_sample_of_rows_and_the_update_is_unchanged(tmp_path):
    sampled, sampled_log = recorded_controller(tmp_path / "a", track_rows=4)
    full, full_log = recorded_controller(tmp_path / "b", track_rows=0)
    for step in range(2):  # step 0's reference is the policy itself (KL 0); step 1 has moved
        sampled_metrics, _ = sampled.step(step)
        full_metrics, _ = full.step(step)
        assert sampled_metrics["grad_norm"] == full_metrics["grad_norm"]  # the loss never read π_ref
    assert [b.batch_size for b, _ in sampled_log] == [4, 4] and [b.batch_size for b, _ in full_log] == [16, 16]
    # the same episodes on both runs: the logged KL is k3 on rows 0, 4, 8, 12 of the whole batch
    batch, ref_logp = full_log[-1]
    rows = [0, 4, 8, 12]
    by_hand = k3(batch.select(rows), ref_logp[rows])
    assert by_hand > 0
    assert sampled_metrics["kl_ref"] == pytest.approx(by_hand, rel=1e-5)
    assert full_metrics["kl_ref"] == pytest.approx(k3(batch, ref_logp), rel=1e-6)


@pytest.mark.parametrize("setting", [{"algo_params": {"kl_coef": 0.01}}, {"track_rows": 16},
                                     # the adaptive controller steers β by the KL (it needs a β > 0 to steer)
                                     {"target": 0.05, "algo_params": {"kl_coef": 0.01}}])
def test_a_kl_term_in_the_loss_or_a_sample_as_large_as_the_batch_scores_every_row(tmp_path, setting):
    controller, scored = recorded_controller(tmp_path, **{"track_rows": 4, **setting})
    controller.step(0)
    assert [b.batch_size for b, _ in scored] == [16]


def test_a_negative_sample_size_is_refused():
    from posttrain.config import ConfigError

    cfg = tiny_config()
    cfg.rl = dataclasses.replace(cfg.rl, kl=dataclasses.replace(cfg.rl.kl, track_rows=-1))
    with pytest.raises(ConfigError, match="rl.kl.track_rows"):
        cfg.validate()


def test_every_row_is_scored_when_an_alert_stops_on_the_kl():
    from posttrain.config import AlertsConfig, RLConfig
    from posttrain.pipelines.build import kl_log_rows

    assert kl_log_rows(RLConfig()) == 64  # the default: warn only
    # kl_explosion is in the default rl.alerts.monitors
    assert kl_log_rows(RLConfig(alerts=AlertsConfig(action="stop"))) == 0
    assert kl_log_rows(RLConfig(alerts=AlertsConfig(action="rollback", monitors="proxy_gold_divergence"))) == 64
