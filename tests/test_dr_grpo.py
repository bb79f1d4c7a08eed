"""Tests for Dr. GRPO: it is GRPO with exactly two defaults changed, its advantages and
loss by hand, and the length bias it removes, seen in the per-token gradient."""

import dataclasses

import pytest
import torch

from posttrain.algorithms.dr_grpo import DrGRPO
from posttrain.algorithms.grpo import GRPO, group_advantages
from posttrain.types import PolicyOutputs, RolloutBatch


def test_dr_grpo_is_grpo_with_the_two_divisors_deleted():
    assert issubclass(DrGRPO, GRPO) and DrGRPO.compute_loss is GRPO.compute_loss
    grpo = {f.name: f.default for f in dataclasses.fields(GRPO)}
    dr = {f.name: f.default for f in dataclasses.fields(DrGRPO)}
    changed = {k for k in grpo if grpo[k] != dr[k]}
    # adv_norm drops /std, loss_agg drops /|o_i|; the constant that replaces |o_i| is max_len,
    # the generation budget, which has no default of its own (make_algorithm's budget fills it)
    assert changed == {"adv_norm", "loss_agg"}
    assert dr["adv_norm"] == "none" and dr["loss_agg"] == "seq-mean-token-sum-norm"


def _batch(rewards, ids, lengths, T=6):
    B = len(rewards)
    mask = torch.zeros(B, T)
    for b, n in enumerate(lengths):
        mask[b, 1 : 1 + n] = 1
    return RolloutBatch(tokens=torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T),
                        response_mask=mask, old_logp=torch.where(mask > 0, -1.0, 0.0),
                        rewards=torch.tensor(rewards), group_ids=torch.tensor(ids))


def test_advantages_and_loss_by_hand():
    # group {1, 0, 0}: mean 1/3 -> A = [2/3, −1/3, −1/3] (no std); lengths 1, 2, 4
    batch = _batch([1.0, 0.0, 0.0], [0, 0, 0], [1, 2, 4])
    algo = DrGRPO(max_len=5)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    assert torch.allclose(batch.advantages[:, 1], torch.tensor([2 / 3, -1 / 3, -1 / 3]))
    # ratio 1: loss = (1/3) Σ_i Σ_t (−A_i) / 5 = (1/3)(−2/3·1 + 1/3·2 + 1/3·4)/5 = (1/3)(4/3)/5 = 0.0889
    loss, _ = algo.compute_loss(PolicyOutputs(logp=batch.old_logp.clone(), entropy=torch.zeros(3, 6)), batch)
    assert loss.item() == pytest.approx((4 / 3) / 15)


def test_every_token_of_a_wrong_answer_is_pushed_down_equally_whatever_its_length():
    # two wrong answers of lengths 2 and 4 in a group with one right answer
    batch = _batch([1.0, 0.0, 0.0], [0, 0, 0], [1, 2, 4])
    grads = {}
    for name, algo in {"grpo": GRPO(), "dr_grpo": DrGRPO(max_len=5)}.items():
        b = dataclasses.replace(batch, **algo.compute_advantages(batch))
        logp = b.old_logp.clone().requires_grad_(True)
        algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros(3, 6)), b)[0].backward()
        grads[name] = logp.grad
    # GRPO: the 1/|o_i| makes a long wrong answer's tokens less penalised (grad 1/4 vs 1/2 of A/B)
    assert grads["grpo"][2, 1].item() == pytest.approx(grads["grpo"][1, 1].item() / 2)
    # Dr. GRPO: the same per-token push, A / (B · max_len) = (−1/3)/(3 · 5), negated for the loss
    assert grads["dr_grpo"][2, 1].item() == pytest.approx(grads["dr_grpo"][1, 1].item())
    assert grads["dr_grpo"][1, 1].item() == pytest.approx((1 / 3) / 15)


def test_shifting_rewards_in_a_group_changes_nothing_and_scaling_scales():
    torch.manual_seed(0)
    ids = torch.arange(3).repeat_interleave(4)
    r = torch.randn(12, dtype=torch.float64)
    shift = torch.randn(3, dtype=torch.float64)[ids] * 5
    algo = DrGRPO(max_len=48)
    a = group_advantages(r, ids, algo.adv_norm, algo.adv_eps)
    assert torch.allclose(a, group_advantages(r + shift, ids, algo.adv_norm, algo.adv_eps))
    assert torch.allclose(3 * a, group_advantages(3 * r, ids, algo.adv_norm, algo.adv_eps))


def test_max_len_is_required():
    with pytest.raises(ValueError, match="max_len"):
        DrGRPO(max_len=None)
