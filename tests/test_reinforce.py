"""Tests for REINFORCE: baselines by hand (and the running mean's state across a
checkpoint), the loss by hand, its gradient equal to PPO's at ratio 1, masked positions."""

import dataclasses

import pytest
import torch

from posttrain.algorithms.core import clipped_surrogate
from posttrain.algorithms.reinforce import REINFORCE, ema_update
from posttrain.types import PolicyOutputs, RolloutBatch


def _batch(rewards, group_ids=None, T=4):
    B = len(rewards)
    response_mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1], [0, 1, 1, 0.0]])[:B, :T]
    return RolloutBatch(
        tokens=torch.zeros(B, T, dtype=torch.long),
        attention_mask=torch.ones(B, T),
        response_mask=response_mask,
        old_logp=torch.where(response_mask > 0, -1.0, 0.0),
        rewards=torch.tensor(rewards),
        group_ids=torch.tensor(group_ids if group_ids is not None else [0] * B),
    )


def _seq_adv(algo, batch):
    adv = algo.compute_advantages(batch)["advantages"]
    assert (adv[batch.response_mask == 0] == 0).all()
    return adv[:, 1]  # position 1 is a response token in every row


def test_baselines_by_hand():
    batch = _batch([1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1])
    assert torch.equal(_seq_adv(REINFORCE(baseline="none"), batch), torch.tensor([1.0, 0.0, 0.0, 1.0]))
    # group means 0.5, 0.5 -> ±0.5
    assert torch.equal(_seq_adv(REINFORCE(baseline="group_mean"), batch), torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_running_mean_uses_only_earlier_batches_and_survives_a_checkpoint():
    algo = REINFORCE(baseline="running_mean", ema_decay=0.9)
    # batch 1: no history -> b = 0; the average starts at its mean 0.5
    assert torch.equal(_seq_adv(algo, _batch([1.0, 0.0])), torch.tensor([1.0, 0.0]))
    assert algo.state_dict() == {"running_mean": 0.5, "num_batches": 1.0}
    # batch 2 (mean 1): b = 0.5 -> A = 0.5; then m = 0.9 · 0.5 + 0.1 · 1 = 0.55
    assert torch.equal(_seq_adv(algo, _batch([1.0, 1.0])), torch.tensor([0.5, 0.5]))
    assert algo.state_dict()["running_mean"] == pytest.approx(0.55)
    # "checkpoint" and resume: the restored algorithm continues with b = 0.55
    resumed = REINFORCE(baseline="running_mean")
    resumed.load_state_dict(algo.state_dict())
    assert torch.allclose(_seq_adv(resumed, _batch([0.0, 1.0])), torch.tensor([-0.55, 0.45]))
    assert torch.allclose(_seq_adv(algo, _batch([0.0, 1.0])), torch.tensor([-0.55, 0.45]))
    # without the state the baseline would restart at 0
    assert torch.equal(_seq_adv(REINFORCE(), _batch([0.0, 1.0])), torch.tensor([0.0, 1.0]))


def test_ema_update_matches_a_loop():
    xs = [0.3, 1.0, 0.0, 0.7, 0.2]
    m = 0.0
    for n, x in enumerate(xs):
        m = ema_update(m, x, 0.8, n)
    expected = xs[0]
    for x in xs[1:]:
        expected = 0.8 * expected + 0.2 * x
    assert m == pytest.approx(expected)


def test_loss_by_hand_is_the_sequence_log_prob_times_advantage():
    # two rows, response tokens 1-2 and 1; logp = log(0.5) on row 0, log(0.25) on row 1
    # baseline none: A = [1, 0.5]; seq-mean-token-sum: (1/2)(−1·2·log .5 − 0.5·log .25)
    # = (1/2)(1.3863 + 0.6931) = 1.0397
    batch = _batch([1.0, 0.5])
    algo = REINFORCE(baseline="none")
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    logp = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.0, 0.25, 0.0, 0.0]]).clamp(min=1e-9).log()
    loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros(2, 4)), batch)
    assert loss.item() == pytest.approx(0.5 * (2 * 0.6931472 + 0.5 * 1.3862944), abs=1e-5)
    assert metrics["pg_loss"] == pytest.approx(loss.item())


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_gradient_equals_the_clipped_surrogate_at_ratio_one(agg):
    torch.manual_seed(0)
    batch = _batch([1.0, 0.0, 0.3, 0.9])
    algo = REINFORCE(baseline="none", loss_agg=agg)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    logp = batch.old_logp.clone().requires_grad_(True)
    loss, _ = algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros(4, 4)), batch)
    (g1,) = torch.autograd.grad(loss, logp)
    logp2 = batch.old_logp.clone().requires_grad_(True)
    ppo, _ = clipped_surrogate(logp2, batch.old_logp, batch.advantages, batch.response_mask, 0.2, 0.2, agg=agg)
    (g2,) = torch.autograd.grad(ppo, logp2)
    assert torch.allclose(g1, g2, atol=1e-7)


def test_masked_positions_cannot_change_the_loss_or_gradient():
    algo = REINFORCE(baseline="group_mean", entropy_coef=0.01)
    batch = _batch([1.0, 0.0, 0.3, 0.9], [0, 0, 1, 1])
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    off = batch.response_mask == 0
    gen = torch.Generator().manual_seed(0)
    logp = torch.where(off, 0.0, -torch.rand(4, 4, generator=gen))
    entropy = torch.rand(4, 4, generator=gen)

    def run(logp, entropy, batch):
        logp = logp.clone().requires_grad_(True)
        loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=entropy), batch)
        loss.backward()
        return loss, metrics, logp.grad

    a = run(logp, entropy, batch)
    noisy = dataclasses.replace(batch, advantages=torch.where(off, torch.inf, batch.advantages),
                                old_logp=torch.where(off, 99.0, batch.old_logp))
    b = run(torch.where(off, -torch.inf, logp), torch.where(off, 1e6, entropy), noisy)
    assert torch.equal(a[0], b[0]) and a[1] == b[1] and torch.equal(a[2], b[2])
    assert (a[2][off] == 0).all()


@pytest.mark.parametrize("params, field", [({"baseline": "mean"}, "baseline"), ({"ema_decay": 1.0}, "ema_decay"),
                                           ({"loss_agg": "sum"}, "loss_agg"), ({"entropy_coef": -1}, "entropy_coef"),
                                           ({"loss_agg": "seq-mean-token-sum-norm"}, "max_len")])
def test_bad_values_name_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        REINFORCE(**params)
