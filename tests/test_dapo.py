"""Tests for DAPO: the overlong penalty by hand, shaped rewards in the advantages, the
dynamic-sampling filter (by hand, against a loop, and with float rewards), clip-higher's
gradient boundary, and the token-level aggregation."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algorithms.core import zero_variance_group_fraction
from posttrain.algorithms.dapo import DAPO, informative_groups, overlong_penalty
from posttrain.algorithms.grpo import GRPO, group_advantages
from posttrain.types import PolicyOutputs, RolloutBatch


def test_overlong_penalty_by_hand():
    # L_max = 10, L_cache = 4: free up to 6, then (6 − L)/4: 7 -> −.25, 8 -> −.5, 9 -> −.75, 10 -> −1
    lengths = torch.arange(0, 13)
    expected = torch.tensor([0.0] * 7 + [-0.25, -0.5, -0.75, -1.0, -1.0, -1.0])
    assert torch.equal(overlong_penalty(lengths, 10, 4), expected)
    assert torch.equal(overlong_penalty(lengths, 10, 0), torch.zeros(13))  # L_cache 0: off


def _batch(rewards, ids, lengths, T=12):
    B = len(rewards)
    mask = torch.zeros(B, T)
    for b, n in enumerate(lengths):
        mask[b, 1 : 1 + n] = 1
    return RolloutBatch(tokens=torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T),
                        response_mask=mask, old_logp=torch.where(mask > 0, -1.0, 0.0),
                        rewards=torch.tensor(rewards), group_ids=torch.tensor(ids))


def test_advantages_are_grpo_of_the_shaped_rewards():
    # L_max 10, L_cache 4; two right answers of lengths 3 and 9: shaped rewards 1 and 0.25
    algo = DAPO(max_len=10, overlong_cache=4)
    batch = _batch([1.0, 1.0, 0.0], [0, 0, 0], [3, 9, 2])
    assert torch.allclose(algo.shaped_rewards(batch), torch.tensor([1.0, 0.25, 0.0]))
    adv = algo.compute_advantages(batch)["advantages"]
    expected = group_advantages(torch.tensor([1.0, 0.25, 0.0]), batch.group_ids, "group", 1e-6)
    assert torch.allclose(adv[:, 1], expected)
    assert torch.equal(batch.rewards, torch.tensor([1.0, 1.0, 0.0]))  # the batch itself is untouched
    with pytest.raises(ValueError, match="max_len"):
        DAPO(max_len=8, overlong_cache=4).compute_advantages(batch)  # a 9-token response, budget 8


def test_informative_groups_by_hand_and_filter_batch():
    # groups: 0 all right, 1 mixed, 2 all wrong, 3 mixed; floats that sum inexactly stay "equal"
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.1, 0.3, 0.1, 0.1, 0.1])
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4])
    keep = informative_groups(rewards, ids)
    assert keep.tolist() == [False, False, True, True, False, False, True, True, False, False, False]
    batch = _batch(rewards.tolist(), ids.tolist(), [2] * 11)
    kept = DAPO(max_len=48).filter_batch(batch)
    assert kept.batch_size == 4 and kept.group_ids.tolist() == [1, 1, 3, 3]
    assert DAPO(max_len=48, dynamic_sampling=False).filter_batch(batch) is batch
    # what remains has no zero-variance group
    assert zero_variance_group_fraction(kept.rewards, kept.group_ids) == 0.0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 16), n_groups=st.integers(1, 5))
def test_informative_groups_matches_a_loop(seed, B, n_groups):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, n_groups, (B,), generator=gen)
    rewards = torch.randint(0, 2, (B,), generator=gen).float()
    keep = informative_groups(rewards, ids)
    loop = [len({rewards[j].item() for j in range(B) if ids[j] == ids[i]}) > 1 for i in range(B)]
    assert keep.tolist() == loop
    n_informative = len({g for g, k in zip(ids.tolist(), loop) if k})
    assert 1 - n_informative / len(set(ids.tolist())) == pytest.approx(zero_variance_group_fraction(rewards, ids))


def test_clip_higher_and_token_mean_in_the_loss():
    algo = DAPO(max_len=10, overlong_cache=0)
    assert (algo.clip_eps_low, algo.clip_eps_high, algo.loss_agg, algo.kl_coef) == (0.2, 0.28, "token-mean", 0.0)
    batch = _batch([1.0, 0.0], [0, 0], [1, 3])
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))  # A = ±0.7071
    # row 0 (A > 0): ratio 1.25 is inside 1 + 0.28 (GRPO's 1.2 would have clipped it)
    # row 1 (A < 0): ratios 0.75 (below 1 − 0.2: clipped), 1.0, 1.0
    ratio = torch.ones(2, 12)
    ratio[0, 1], ratio[1, 1] = 1.25, 0.75
    logp = (batch.old_logp + ratio.log()).requires_grad_(True)
    loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros(2, 12)), batch)
    loss.backward()
    a = 0.5**0.5
    assert logp.grad[0, 1].item() == pytest.approx(-a * 1.25 / 4, rel=1e-5)  # token-mean: 4 tokens
    assert logp.grad[1, 1].item() == 0.0  # clipped branch active: exactly zero
    assert logp.grad[1, 2].item() == pytest.approx(a / 4, rel=1e-5)
    assert metrics["clipfrac"] == pytest.approx(1 / 4) and metrics["overlong_frac"] == 0.0
    grpo_logp = logp.detach().clone().requires_grad_(True)
    GRPO().compute_loss(PolicyOutputs(logp=grpo_logp, entropy=torch.zeros(2, 12)), batch)[0].backward()
    assert grpo_logp.grad[0, 1].item() == 0.0  # symmetric ε = 0.2 clips ratio 1.25


@pytest.mark.parametrize("params, field", [({"overlong_cache": -1}, "overlong_cache"),
                                           ({"max_len": 8, "overlong_cache": 8}, "max_len"),
                                           ({"max_len": None}, "max_len")])
def test_bad_values_name_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        DAPO(**params)
