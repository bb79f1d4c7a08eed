"""Tests for RLOO: the leave-one-out baseline by hand and against a loop, the identity
RLOO = GRPO-without-std × K/(K − 1), shift invariance, and that the loss is REINFORCE's."""

import dataclasses
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algorithms.grpo import group_advantages
from posttrain.algorithms.reinforce import REINFORCE
from posttrain.algorithms.rloo import RLOO, leave_one_out_baseline
from posttrain.types import PolicyOutputs, RolloutBatch


def test_leave_one_out_by_hand():
    # one group {1, 0, 0, 1}: Σ = 2; b_0 = (2 − 1)/3 = 1/3 -> A = 2/3; b_1 = (2 − 0)/3 -> A = −2/3
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    b = leave_one_out_baseline(r, torch.zeros(4, dtype=torch.long))
    assert torch.allclose(b, torch.tensor([1 / 3, 2 / 3, 2 / 3, 1 / 3]))
    assert torch.allclose(r - b, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    # a group of one has no others: b = r, A = 0
    assert leave_one_out_baseline(torch.tensor([0.7]), torch.tensor([3])).item() == pytest.approx(0.7)


def _loop(rewards, ids):
    r, ids = rewards.tolist(), ids.tolist()
    out = []
    for i in range(len(r)):
        others = [r[j] for j in range(len(r)) if ids[j] == ids[i] and j != i]
        out.append(statistics.fmean(others) if others else r[i])
    return torch.tensor(out, dtype=rewards.dtype)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 20), n_groups=st.integers(1, 5))
def test_leave_one_out_matches_a_loop_and_the_grpo_identity(seed, B, n_groups):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, n_groups, (B,), generator=gen) * 11  # unsorted, sparse, uneven K
    rewards = torch.randn(B, generator=gen, dtype=torch.float64)
    b = leave_one_out_baseline(rewards, ids)
    assert torch.allclose(b, _loop(rewards, ids), atol=1e-12)
    # r_i − b_i = K/(K − 1) · (r_i − mean): GRPO with adv_norm="none", rescaled per group
    K = torch.tensor([(ids == g).sum().item() for g in ids.tolist()], dtype=torch.float64)
    grpo_none = group_advantages(rewards, ids, "none", 1e-6)
    factor = torch.where(K > 1, K / (K - 1).clamp(min=1), 0.0)
    assert torch.allclose(rewards - b, grpo_none * factor, atol=1e-12)


def _batch(rewards, ids):
    B = len(rewards)
    mask = torch.tensor([[0.0, 1.0, 1.0]] * B)
    return RolloutBatch(tokens=torch.zeros(B, 3, dtype=torch.long), attention_mask=torch.ones(B, 3),
                        response_mask=mask, old_logp=-mask, rewards=torch.tensor(rewards, dtype=torch.float64),
                        group_ids=torch.tensor(ids))


def test_rloo_advantages_are_grpo_without_std_times_k_over_k_minus_1():
    batch = _batch([1.0, 0.0, 0.0, 0.0, 0.5, 1.0, 0.25, 0.0], [0, 0, 0, 0, 1, 1, 1, 1])
    adv = RLOO().compute_advantages(batch)["advantages"][:, 1]
    grpo = group_advantages(batch.rewards, batch.group_ids, "none", 1e-6)
    assert torch.allclose(adv, grpo * 4 / 3, atol=1e-12)
    assert adv[0].item() == pytest.approx(1.0)  # 1 − (0 + 0 + 0)/3


def test_shifting_a_groups_rewards_changes_nothing():
    torch.manual_seed(0)
    ids = torch.arange(4).repeat_interleave(3)
    r = torch.randn(12, dtype=torch.float64)
    shift = torch.randn(4, dtype=torch.float64)[ids] * 10
    assert torch.allclose(r - leave_one_out_baseline(r, ids), (r + shift) - leave_one_out_baseline(r + shift, ids))


def test_rloo_is_reinforce_with_one_baseline_swapped():
    assert issubclass(RLOO, REINFORCE) and RLOO().baseline == "leave_one_out"
    with pytest.raises(ValueError, match="leave_one_out"):
        RLOO(baseline="group_mean")
    # same loss code: with equal advantages, equal losses
    batch = _batch([1.0, 0.0], [0, 0])
    batch = dataclasses.replace(batch, rewards=batch.rewards.float(), **RLOO().compute_advantages(batch))
    batch = dataclasses.replace(batch, advantages=batch.advantages.float())
    outputs = PolicyOutputs(logp=batch.old_logp.clone(), entropy=torch.zeros(2, 3))
    assert RLOO().compute_loss(outputs, batch)[0] == REINFORCE().compute_loss(outputs, batch)[0]
    # stateless: no running mean is touched
    algo = RLOO()
    algo.compute_advantages(batch)
    assert algo.state_dict()["num_batches"] == 0.0
