"""The four pillars of "Tricks or Traps" (arXiv:2508.08221) as GRPO's fields, and Lite PPO.

    adv_norm         group / group-mean-batch-std / group-mean-pooled-std / batch-mean-batch-std / none
    clip_eps_*       clip-higher: DAPO's 0.28 is GRPO's own field, not a copy
    loss_agg         token-mean vs the seq-mean modes
    overlong_filter  rows the budget cut off leave the loss, their rewards stay in the baseline

Numbers are worked by hand; overlong filtering is checked to zero exactly the truncated
rows' gradient and to leave every other row's as it was.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from posttrain.algorithms import ALGORITHMS, make_algorithm
from posttrain.algorithms.core import agg_loss
from posttrain.algorithms.dapo import DAPO
from posttrain.algorithms.grpo import GRPO, group_advantages, without_truncated_rows
from posttrain.algorithms.lite_ppo import LitePPO
from posttrain.types import Episode, Example, PolicyOutputs, RolloutBatch


def test_the_normalisations_by_hand_on_an_easy_and_a_hard_prompt():
    """Easy prompt 7 of 8 right, hard prompt 1 of 8: the group std (GRPO) blows the easy
    prompt's one failure up to the hard prompt's one success; the batch std does not."""
    rewards = torch.tensor([1.0] * 7 + [0.0] + [1.0] + [0.0] * 7)
    ids = torch.tensor([0] * 8 + [1] * 8)
    # group: mean 7/8, std √(7/8·1/8·8/7) = √(1/8) = 0.35355
    group = group_advantages(rewards, ids, "group", 0.0)
    assert group[7].item() == pytest.approx(-0.875 / math.sqrt(1 / 8))  # −2.475: the easy prompt's failure
    assert group[8].item() == pytest.approx(0.875 / math.sqrt(1 / 8))  # +2.475: the hard prompt's success
    # group mean, batch std: 8 ones of 16 -> std √(16·0.25/15) = 0.5164
    lite = group_advantages(rewards, ids, "group-mean-batch-std", 0.0)
    assert lite[7].item() == pytest.approx(-0.875 / math.sqrt(4 / 15))  # −1.694
    assert lite[0].item() == pytest.approx(0.125 / math.sqrt(4 / 15))  # +0.242
    # pooled std: centred values ±0.125 (14 of them) and ∓0.875 (2): Σ² = 14/64 + 2·49/64 = 112/64, /15
    pooled = group_advantages(rewards, ids, "group-mean-pooled-std", 0.0)
    assert pooled[7].item() == pytest.approx(-0.875 / math.sqrt(112 / 64 / 15))
    # batch mean 0.5 and batch std: no group baseline, every right answer +0.968, every wrong one −0.968
    batch = group_advantages(rewards, ids, "batch-mean-batch-std", 0.0)
    assert torch.allclose(batch, (rewards - 0.5) / math.sqrt(4 / 15))
    # none: the centred rewards
    assert torch.allclose(group_advantages(rewards, ids, "none", 0.0)[[0, 7, 8]], torch.tensor([0.125, -0.875, 0.875]))


def test_lite_ppo_is_grpo_with_two_defaults_changed():
    grpo, lite = dataclasses.asdict(GRPO()), dataclasses.asdict(LitePPO())
    changed = {k for k in grpo if grpo[k] != lite[k]}
    assert changed == {"adv_norm", "loss_agg"}
    assert lite["adv_norm"] == "group-mean-batch-std" and lite["loss_agg"] == "token-mean"
    assert ALGORITHMS["lite_ppo"] is LitePPO and issubclass(LitePPO, GRPO)
    assert LitePPO.compute_loss is GRPO.compute_loss and LitePPO.compute_advantages is GRPO.compute_advantages


def test_clip_higher_is_one_field_of_grpo_that_dapo_sets():
    """DAPO's clip-higher is GRPO's clip_eps_high with another default, read by the same
    clipped surrogate: the same loss for the same ε."""
    assert DAPO.compute_loss is not GRPO.compute_loss  # DAPO adds a metric, then calls GRPO's
    grpo = GRPO(clip_eps_high=0.28, loss_agg="token-mean")
    dapo = DAPO(max_len=8, overlong_cache=0, dynamic_sampling=False)
    assert (dapo.clip_eps_low, dapo.clip_eps_high) == (grpo.clip_eps_low, grpo.clip_eps_high)
    batch = truncated_batch()
    batch = dataclasses.replace(batch, **grpo.compute_advantages(batch))
    logp = batch.old_logp + 0.5 * batch.response_mask  # ratio e^0.5 = 1.65: clipped at 1.28 for A > 0
    outputs = PolicyOutputs(logp=logp, entropy=torch.zeros_like(logp))
    assert grpo.compute_loss(outputs, batch)[0] == dapo.compute_loss(outputs, batch)[0]
    symmetric = GRPO(loss_agg="token-mean").compute_loss(outputs, batch)[0]
    assert grpo.compute_loss(outputs, batch)[0] < symmetric  # the higher cap lets positive tokens pay more


def test_token_mean_against_seq_mean_by_hand():
    """Two rows: 1 token of loss 3, and 3 tokens of loss 1. token-mean (3 + 3) / 4 = 1.5;
    seq-mean-token-mean (3 + 1) / 2 = 2: the long row's tokens weigh 1/4 each, not 1/6."""
    loss = torch.tensor([[3.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(1.5)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)


# ---------------------------------------------------------------- overlong filtering


def truncated_batch() -> RolloutBatch:
    """Two groups of three; rows 1 and 4 were cut off by the budget (reward 0)."""
    g = torch.Generator().manual_seed(0)
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    finished = [True, False, True, True, False, True]
    episodes = []
    for i, (reward, done) in enumerate(zip(rewards, finished)):
        R = 6 if not done else 2 + i % 3
        episodes.append(Episode(example=Example("p", "1"), group_id=i // 3, prompt_ids=[5, 6, 7][: 2 + i % 2],
                                response_ids=torch.randint(10, 50, (R,), generator=g).tolist(),
                                response_logp=(-torch.rand(R, generator=g)).tolist(), reward=reward, finished=done))
    return RolloutBatch.collate(episodes, pad_id=0)


def test_collate_records_which_rows_were_cut_off():
    assert truncated_batch().truncated.tolist() == [False, True, False, False, True, False]


def test_overlong_filter_zeroes_the_truncated_rows_mask_and_keeps_them_in_the_baseline():
    batch = truncated_batch()
    plain = GRPO().compute_advantages(batch)
    out = GRPO(overlong_filter=True).compute_advantages(batch)
    mask = out["response_mask"]
    assert mask[[1, 4]].sum() == 0 and torch.equal(mask[[0, 2, 3, 5]], batch.response_mask[[0, 2, 3, 5]])
    assert out["advantages"][[1, 4]].abs().sum() == 0
    # the other rows' advantages are GRPO's with the truncated rewards in the group mean:
    # group 0 is [1, 0, 0], so row 0 gets (1 − 1/3) / std, not (1 − 1/2) / std of [1, 0]
    torch.testing.assert_close(out["advantages"][[0, 2, 3, 5]], plain["advantages"][[0, 2, 3, 5]])
    assert out["advantages"][0, batch.response_mask[0] > 0][0].item() == pytest.approx(
        (1 - 1 / 3) / math.sqrt(1 / 3), rel=1e-4)
    assert "response_mask" not in plain  # off: the mask is the sampled one


def per_row_grad(algo, batch: RolloutBatch, ref_shift: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, d loss / d logp) for logp a little off old_logp, so ratios and the KL are not trivial."""
    batch = dataclasses.replace(batch, ref_logp=batch.old_logp - ref_shift)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    gen = torch.Generator().manual_seed(3)
    logp = (batch.old_logp + 0.3 * torch.randn(batch.old_logp.shape, generator=gen)).requires_grad_(True)
    loss, _ = algo.compute_loss(PolicyOutputs(logp=logp, entropy=-logp.exp() * logp), batch)
    loss.backward()
    return loss.detach(), logp.grad


@pytest.mark.parametrize("loss_agg", ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("extra", [{}, {"kl_coef": 0.1, "entropy_coef": 0.01}])
def test_overlong_filter_zeroes_exactly_the_truncated_rows_loss(loss_agg, extra):
    """Under the seq-mean modes (a mean over all B rows) every other row's gradient is
    exactly what it was without the filter; the truncated rows' is exactly 0, with a KL
    term and an entropy bonus too (every term reads the filtered mask)."""
    batch = truncated_batch()
    params = dict(loss_agg=loss_agg, max_len=8, **extra)
    _, plain = per_row_grad(GRPO(**params), batch, 0.2)
    _, filtered = per_row_grad(GRPO(overlong_filter=True, **params), batch, 0.2)
    assert filtered[[1, 4]].abs().sum() == 0 and plain[[1, 4]].abs().sum() > 0
    torch.testing.assert_close(filtered[[0, 2, 3, 5]], plain[[0, 2, 3, 5]])


def test_under_token_mean_the_filtered_loss_is_the_loss_of_the_other_rows_alone():
    """token-mean divides by the tokens in the loss: the truncated rows' tokens leave the
    denominator too, as if they had never been sampled (but with their rewards in the baseline)."""
    batch = truncated_batch()
    algo = GRPO(overlong_filter=True, loss_agg="token-mean")
    loss, grad = per_row_grad(algo, batch)
    kept = [0, 2, 3, 5]
    advantages = GRPO().compute_advantages(batch)["advantages"]  # the same advantages, all rows in the baseline
    alone = dataclasses.replace(batch.select(kept), advantages=advantages[kept])
    gen = torch.Generator().manual_seed(3)
    logp_all = batch.old_logp + 0.3 * torch.randn(batch.old_logp.shape, generator=gen)
    logp = logp_all[kept][:, : alone.tokens.shape[1]].clone().requires_grad_(True)
    expected, _ = GRPO(loss_agg="token-mean").compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros_like(logp)),
                                                           alone)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    torch.testing.assert_close(grad[kept][:, : alone.tokens.shape[1]], logp.grad)


def test_overlong_filter_needs_the_truncation_record():
    batch = dataclasses.replace(truncated_batch(), truncated=None)
    with pytest.raises(ValueError, match="Episode.finished"):
        GRPO(overlong_filter=True).compute_advantages(batch)
    with pytest.raises(ValueError, match="overlong_filter"):
        GRPO(overlong_filter="yes")


def test_without_truncated_rows_by_hand():
    mask = torch.ones(3, 2)
    assert without_truncated_rows(mask, torch.tensor([False, True, False])).tolist() == [[1, 1], [0, 0], [1, 1]]


def test_every_grpo_descendant_can_filter():
    """DAPO (length-shaped rewards), GSPO (sequence ratio) and Lite PPO inherit the field and
    give a truncated row exactly no gradient."""
    batch = truncated_batch()
    for name, params in (("dapo", {"overlong_cache": 4}), ("gspo", {}), ("lite_ppo", {}), ("dr_grpo", {})):
        algo = make_algorithm(name, budget=8, overlong_filter=True, **params)
        _, grad = per_row_grad(algo, batch)
        assert grad[[1, 4]].abs().sum() == 0 and grad[[0, 2, 3, 5]].abs().sum() > 0, name


def test_a_batch_whose_every_row_was_cut_off_steps_with_a_zero_gradient():
    """Every row filtered: no token is in the loss, yet every parameter gets an exact 0
    gradient (as when every row is inert), and micro-batches of filtered rows alone run too."""
    from posttrain.roles.trainer import Trainer
    from tests.test_trainer import tiny_model

    episodes = truncated_batch().episodes
    for e in episodes:
        e.finished = False
    algo = GRPO(overlong_filter=True)
    batch = RolloutBatch.collate(episodes, pad_id=0)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    assert batch.response_mask.sum() == 0
    for size in (0, 1):
        model = tiny_model()
        metrics = Trainer(model, lr=1e-2, total_steps=1, micro_batch_size=size).update(batch, algo)
        assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
        assert metrics["pg_loss"] == 0.0
