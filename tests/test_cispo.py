"""Tests for CISPO: the clipped, stop-gradient IS weight by hand, the contrast with PPO's
clip (no token's gradient is dropped), equality with PPO at ratio 1, masked positions."""

import dataclasses

import pytest
import torch

from posttrain.algorithms.cispo import CISPO, cispo_loss
from posttrain.algorithms.core import clipped_surrogate
from posttrain.types import PolicyOutputs, RolloutBatch

# one row, four tokens, old_logp = 0:
#   token  adv  ratio  weight = clip(ratio, 0, 1.2)   PPO (ε = 0.2) clipped?
#   0      +1   1.5    1.2                            yes: gradient 0
#   1      −1   0.5    0.5                            yes: gradient 0
#   2      +1   0.9    0.9                            no
#   3      −1   1.1    1.1                            no
ADV = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
RATIO = torch.tensor([[1.5, 0.5, 0.9, 1.1]])


def _grad(fn):
    logp = RATIO.log().clone().requires_grad_(True)
    loss, metrics = fn(logp)
    loss.backward()
    return loss, metrics, logp.grad


def test_gradient_is_the_clipped_weight_times_the_advantage_on_every_token():
    loss, metrics, grad = _grad(lambda lp: cispo_loss(lp, torch.zeros(1, 4), ADV, torch.ones(1, 4), 1.0, 0.2))
    weight = torch.tensor([[1.2, 0.5, 0.9, 1.1]])
    # d/dlogp of −mean(sg[w] · A · logp) = −w · A / 4
    assert torch.allclose(grad, -weight * ADV / 4)
    assert (grad != 0).all()
    # loss value: −mean(w · A · log r) = −(1.2·.4055 − .5·(−.6931) + .9·(−.1054) − 1.1·.0953)/4
    expected = -(weight * ADV * RATIO.log()).mean()
    assert loss.item() == pytest.approx(expected.item())
    assert metrics["is_clipfrac"] == pytest.approx(1 / 4)  # only token 0 (weight 1.5 -> 1.2)
    _, _, ppo_grad = _grad(lambda lp: clipped_surrogate(lp, torch.zeros(1, 4), ADV, torch.ones(1, 4), 0.2, 0.2))
    assert ppo_grad[0, 0] == 0 and ppo_grad[0, 1] == 0  # what CISPO keeps and PPO drops


def test_a_lower_bound_when_asked():
    _, metrics, grad = _grad(lambda lp: cispo_loss(lp, torch.zeros(1, 4), ADV, torch.ones(1, 4), 0.2, 0.2))
    assert grad[0, 1].item() == pytest.approx(0.8 / 4)  # weight 0.5 raised to 1 − 0.2
    assert metrics["is_clipfrac"] == pytest.approx(2 / 4)


def _batch():
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 0], [0, 1, 1, 1.0]])
    old = torch.where(mask > 0, -torch.rand(4, 4, generator=torch.Generator().manual_seed(0)), 0.0)
    return RolloutBatch(tokens=torch.zeros(4, 4, dtype=torch.long), attention_mask=torch.ones(4, 4),
                        response_mask=mask, old_logp=old, rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]),
                        group_ids=torch.tensor([0, 0, 1, 1]))


def test_at_ratio_one_cispo_and_grpo_have_the_same_gradient():
    from posttrain.algorithms.grpo import GRPO

    batch = _batch()
    batch = dataclasses.replace(batch, **CISPO().compute_advantages(batch))
    grads = []
    for algo in (CISPO(), GRPO(loss_agg="token-mean")):
        logp = batch.old_logp.clone().requires_grad_(True)
        algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros(4, 4)), batch)[0].backward()
        grads.append(logp.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-7)


def test_masked_positions_cannot_leak():
    algo = CISPO(entropy_coef=0.1)
    batch = _batch()
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    off = batch.response_mask == 0
    logp = batch.old_logp + 0.3 * batch.response_mask

    def run(logp, batch):
        logp = logp.clone().requires_grad_(True)
        loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.ones(4, 4)), batch)
        loss.backward()
        return loss, metrics, logp.grad

    a = run(logp, batch)
    noisy = dataclasses.replace(batch, old_logp=torch.where(off, -torch.inf, batch.old_logp),
                                advantages=torch.where(off, torch.inf, batch.advantages))
    b = run(torch.where(off, torch.inf, logp), noisy)
    assert torch.equal(a[0], b[0]) and a[1] == b[1] and torch.equal(a[2], b[2])


def test_defaults_and_validation():
    algo = CISPO()
    assert (algo.clip_eps_low, algo.clip_eps_high, algo.loss_agg, algo.uses_reference) == (1.0, 0.2, "token-mean", False)
    with pytest.raises(ValueError, match="clip_eps_high"):
        CISPO(clip_eps_high=-0.1)
    with pytest.raises(ValueError, match="adv_norm"):
        CISPO(adv_norm="std")
