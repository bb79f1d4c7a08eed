"""Tests for REINFORCE++: the KL-shaped reward-to-go by hand and against a loop, global
whitening, the k1/k2 choice, the reference requirement, and masked positions."""

import dataclasses

import pytest
import torch

from posttrain.algorithms.core import masked_mean, masked_var, masked_whiten
from posttrain.algorithms.reinforce_pp import ReinforcePP
from posttrain.types import PolicyOutputs, RolloutBatch


def _batch(old_logp, ref_logp, mask, rewards):
    B, T = mask.shape
    return RolloutBatch(tokens=torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T),
                        response_mask=mask, old_logp=old_logp, rewards=torch.tensor(rewards),
                        group_ids=torch.arange(B), ref_logp=ref_logp)


def test_reward_to_go_by_hand():
    # one row, 3 response tokens, k1 = old − ref = [.1, .2, .3], β = 0.5, R = 1
    # token rewards [−.05, −.1, 1 − .15] = [−.05, −.1, .85]; reward-to-go [.7, .75, .85]
    mask = torch.tensor([[0, 1, 1, 1, 0.0]])
    old = torch.tensor([[0, -1.0, -1.0, -1.0, 0]])
    ref = old - torch.tensor([[0, 0.1, 0.2, 0.3, 0]])
    algo = ReinforcePP(kl_coef=0.5)
    out = algo.compute_advantages(_batch(old, ref, mask, [1.0]))
    assert torch.allclose(out["returns"], torch.tensor([[0, 0.7, 0.75, 0.85, 0]]))
    # whitened over the batch's 3 tokens: mean .7667, unbiased std .0764
    assert torch.allclose(out["advantages"], masked_whiten(out["returns"], mask, eps=1e-8))
    assert out["advantages"][0, 1].item() == pytest.approx((0.7 - 0.76667) / 0.076376, abs=1e-3)
    # k2 = ½ (log ratio)²: [.005, .02, .045]; β = 0.5 -> rewards [−.0025, −.01, 1 − .0225]
    out2 = ReinforcePP(kl_coef=0.5, kl_estimator="k2").compute_advantages(_batch(old, ref, mask, [1.0]))
    assert torch.allclose(out2["returns"][0, 1:4], torch.tensor([0.965, 0.9675, 0.9775]))


def test_reward_to_go_matches_a_loop_and_whitening_is_global():
    torch.manual_seed(0)
    B, T = 5, 8
    mask = torch.zeros(B, T)
    for b in range(B):
        mask[b, 2 : 3 + b] = 1
    old = torch.where(mask > 0, -torch.rand(B, T), 0.0)
    ref = torch.where(mask > 0, old + 0.3 * torch.randn(B, T), 0.0)
    rewards = torch.rand(B).tolist()
    out = ReinforcePP(kl_coef=0.1).compute_advantages(_batch(old, ref, mask, rewards))
    for b in range(B):
        idx = [t for t in range(T) if mask[b, t] > 0]
        r = [-0.1 * (old[b, t] - ref[b, t]).item() for t in idx]
        r[-1] += rewards[b]
        rtg = [sum(r[k:]) for k in range(len(r))]
        assert torch.allclose(out["returns"][b, idx], torch.tensor(rtg), atol=1e-6)
    # one mean and one std for the whole batch, not per row or group
    assert masked_mean(out["advantages"], mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(out["advantages"], mask).item() == pytest.approx(1.0, abs=1e-5)


def test_reference_is_needed_only_with_a_kl_and_the_kl_is_not_in_the_loss():
    mask = torch.tensor([[0, 1, 1.0]])
    old = torch.tensor([[0, -1.0, -2.0]])
    batch = _batch(old, None, mask, [1.0])
    assert ReinforcePP().uses_reference and not ReinforcePP(kl_coef=0).uses_reference
    assert not ReinforcePP().uses_critic
    with pytest.raises(ValueError, match="ref_logp"):
        ReinforcePP().compute_advantages(batch)
    algo = ReinforcePP(kl_coef=0.0)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    loss, metrics = algo.compute_loss(PolicyOutputs(logp=old.clone(), entropy=torch.zeros(1, 3)), batch)
    assert loss.item() == pytest.approx(masked_mean(-batch.advantages, mask).item())
    with pytest.raises(ValueError, match="kl_estimator"):
        ReinforcePP(kl_estimator="k3")


def test_masked_positions_cannot_change_the_advantages():
    torch.manual_seed(1)
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1.0]])
    old = torch.where(mask > 0, -torch.rand(2, 5), 0.0)
    ref = torch.where(mask > 0, old - 0.2, 0.0)
    clean = ReinforcePP().compute_advantages(_batch(old, ref, mask, [1.0, 0.0]))
    off = mask == 0
    dirty = ReinforcePP().compute_advantages(
        _batch(torch.where(off, -torch.inf, old), torch.where(off, 7.0, ref), mask, [1.0, 0.0]))
    assert torch.equal(clean["advantages"], dirty["advantages"])
    assert (clean["advantages"][off] == 0).all()
