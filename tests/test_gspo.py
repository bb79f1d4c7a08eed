"""Tests for GSPO: the sequence ratio by hand, parity of the loss and its gradient with a
direct per-sequence implementation, the sequence-level clip boundary, masked positions."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algorithms.gspo import GSPO, sequence_log_ratio
from posttrain.types import PolicyOutputs, RolloutBatch


def test_sequence_log_ratio_by_hand():
    # row 0: token log-ratios 0.1, 0.3 -> mean 0.2, s = e^0.2; row 1: no tokens -> 0
    logp = torch.tensor([[0.0, -0.9, -1.7, 5.0], [0.0, 0.0, 0.0, 0.0]])
    old = torch.tensor([[0.0, -1.0, -2.0, -9.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0.0]])
    assert torch.allclose(sequence_log_ratio(logp, old, mask), torch.tensor([0.2, 0.0]))
    assert math.exp(0.2) == pytest.approx(1.2214, abs=1e-4)


def _batch(seed, B=4, T=7):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T)
    for b in range(B):
        mask[b, 1 : 2 + (b * 3) % 5] = 1
    old = torch.where(mask > 0, -torch.rand(B, T, generator=gen) * 2, 0.0)
    return RolloutBatch(tokens=torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T),
                        response_mask=mask, old_logp=old, rewards=torch.tensor([1.0, 0.0, 0.3, 0.9])[:B],
                        group_ids=torch.tensor([0, 0, 1, 1])[:B])


def _direct_gspo(logp, batch, eps_low, eps_high):
    """J = 1/G Σ_i min(s_i A_i, clip(s_i) A_i), written per sequence with autograd through s_i."""
    terms = []
    for i in range(batch.batch_size):
        on = batch.response_mask[i] > 0
        s = torch.exp((logp[i][on] - batch.old_logp[i][on]).mean())
        a = batch.advantages[i][on][0]
        terms.append(torch.maximum(-a * s, -a * s.clamp(1 - eps_low, 1 + eps_high)))
    return torch.stack(terms).mean()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([1e-4, 1e-3, 0.05]))
def test_loss_and_gradient_match_a_direct_sequence_level_implementation(seed, scale):
    algo = GSPO()
    batch = _batch(seed)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    gen = torch.Generator().manual_seed(seed + 1)
    logp_a = (batch.old_logp + scale * torch.randn(4, 7, generator=gen)).requires_grad_(True)
    logp_b = logp_a.detach().clone().requires_grad_(True)
    loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp_a, entropy=torch.zeros(4, 7)), batch)
    loss.backward()
    direct = _direct_gspo(logp_b, batch, algo.clip_eps_low, algo.clip_eps_high)
    direct.backward()
    assert loss.item() == pytest.approx(direct.item(), abs=1e-6)
    assert torch.allclose(logp_a.grad, logp_b.grad, atol=1e-6)
    assert 0.0 <= metrics["seq_clipfrac"] <= 1.0


def test_the_clip_is_per_sequence_and_zeroes_the_whole_sequence_gradient():
    algo = GSPO()
    batch = _batch(0)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))  # row 1: A < 0, row 3: A > 0
    # row 1 (4 tokens): log-ratios +.01, −.01, +.0004, 0 average to 1e-4 -> s ≈ 1.0001, inside
    # row 3 (5 tokens): every token +1e-3 -> s ≈ 1.001 > 1 + 4e-4 with A > 0: clipped, 0 gradient
    shift = torch.zeros(4, 7)
    shift[1, 1:5] = torch.tensor([0.01, -0.01, 0.0004, 0.0])
    shift[3] = 1e-3
    logp = (batch.old_logp + shift * batch.response_mask).requires_grad_(True)
    loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros(4, 7)), batch)
    loss.backward()
    assert (logp.grad[3] == 0).all()
    assert (logp.grad[1][batch.response_mask[1] > 0] != 0).all()
    # token-level PPO with the same ε would zero row 1's second token (ratio e^−0.01 < 1 − 3e-4,
    # A < 0); GSPO judges the sequence as a whole
    assert metrics["seq_clipfrac"] == pytest.approx(1 / 4)


def test_masked_positions_cannot_leak():
    algo = GSPO(kl_coef=0.1)
    batch = _batch(3)
    batch = dataclasses.replace(batch, ref_logp=batch.old_logp - 0.1, **algo.compute_advantages(batch))
    off = batch.response_mask == 0
    logp = batch.old_logp + 1e-4 * batch.response_mask

    def run(logp, batch):
        logp = logp.clone().requires_grad_(True)
        loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros(4, 7)), batch)
        loss.backward()
        return loss, metrics, logp.grad

    a = run(logp, batch)
    noisy = dataclasses.replace(batch, old_logp=torch.where(off, 50.0, batch.old_logp),
                                ref_logp=torch.where(off, -50.0, batch.ref_logp))
    b = run(torch.where(off, -torch.inf, logp), noisy)
    assert torch.equal(a[0], b[0]) and a[1] == b[1] and torch.equal(a[2], b[2])


def test_defaults_and_validation():
    algo = GSPO()
    assert (algo.clip_eps_low, algo.clip_eps_high, algo.adv_norm) == (3e-4, 4e-4, "group")
    with pytest.raises(ValueError, match="loss_agg"):
        GSPO(loss_agg="token-mean")
