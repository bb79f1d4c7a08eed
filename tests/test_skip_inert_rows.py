"""Leaving rows with no gradient out of the update (rl.update.skip_inert_rows) gives the same update.

A row whose advantages are all 0 adds exactly nothing to a policy-gradient loss whose every
term is a multiple of the advantage. The trainer leaves such rows out when the algorithm
declares them inert; these tests check the gradient and the optimizer step are those of the
full minibatch for every algorithm and aggregation where it applies, that it never applies
where a row still pulls on the weights, and that the check can fail.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posttrain.algorithms import ALGORITHMS, make_algorithm
from posttrain.algorithms.core import LOSS_AGG_MODES
from posttrain.roles.trainer import Trainer
from posttrain.types import Episode, Example, RolloutBatch
from tests.test_trainer import tiny_model

# group 0 all right, group 1 mixed, group 2 all wrong, group 3 mixed: half the rows are inert
GROUP_REWARDS = [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]]


def grouped_batch(seed: int = 0) -> RolloutBatch:
    """Rows of ragged prompt and response lengths (1..7 response tokens), so token and row
    shares differ and the rows left out are not all of one length."""
    g = torch.Generator().manual_seed(seed)
    episodes = []
    for group, rewards in enumerate(GROUP_REWARDS):
        for reward in rewards:
            P, R = int(torch.randint(2, 6, (1,), generator=g)), int(torch.randint(1, 8, (1,), generator=g))
            episodes.append(Episode(example=Example("p", "1"), group_id=group,
                                    prompt_ids=torch.randint(5, 100, (P,), generator=g).tolist(),
                                    response_ids=torch.randint(5, 100, (R,), generator=g).tolist(),
                                    response_logp=(-torch.rand(R, generator=g) * 3).tolist(), reward=reward))
    return RolloutBatch.collate(episodes, pad_id=0)


def scored(algo, batch: RolloutBatch, skip: bool) -> RolloutBatch:
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    return dataclasses.replace(batch, rows_with_gradient=algo.rows_with_gradient(batch) if skip else None)


def update(algo, batch: RolloutBatch, micro_batch_size: int = 0, steps: int = 1) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(the last step's gradient, the weights after `steps` AdamW steps, its metrics)."""
    model = tiny_model()
    trainer = Trainer(model, lr=1e-2, total_steps=steps, micro_batch_size=micro_batch_size, grad_clip=0,
                      weight_decay=0.1)
    for _ in range(steps):
        metrics = trainer.update(batch, algo)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return grads, torch.cat([p.detach().flatten() for p in model.parameters()]), metrics


def inert_cases():
    """Every registered algorithm that declares zero-advantage rows inert, with every loss
    aggregation it accepts."""
    for name, cls in ALGORITHMS.items():
        if not cls.zero_advantage_rows_are_inert:
            continue
        modes = ["seq-mean-token-mean"] if name == "gspo" else LOSS_AGG_MODES
        for mode in modes:
            yield pytest.param(name, mode, id=f"{name}-{mode}")


def group_baseline(name: str) -> dict:
    return {"baseline": "group_mean"} if name == "reinforce" else {}


@pytest.mark.parametrize("name, mode", list(inert_cases()))
def test_leaving_inert_rows_out_gives_the_full_update(name, mode):
    algo = make_algorithm(name, loss_agg=mode, budget=16, **group_baseline(name))
    full = scored(algo, grouped_batch(), skip=False)
    skipping = scored(algo, grouped_batch(), skip=True)
    kept = skipping.rows_with_gradient
    assert kept is not None and 0 < kept.sum() < len(kept)  # some rows really are left out
    assert torch.equal(kept, torch.tensor([0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1], dtype=torch.bool))
    whole, _, _ = update(algo, full)
    assert whole.abs().max() > 1e-4
    for size in (0, 1, 4):
        grads, _, _ = update(algo, skipping, micro_batch_size=size)
        torch.testing.assert_close(grads, whole, atol=1e-6, rtol=0)


def test_several_adamw_steps_land_on_the_same_weights():
    algo = make_algorithm("grpo")
    _, full, _ = update(algo, scored(algo, grouped_batch(), skip=False), steps=3)
    _, skipping, _ = update(algo, scored(algo, grouped_batch(), skip=True), steps=3)
    torch.testing.assert_close(skipping, full, atol=1e-6, rtol=0)


def test_a_batch_with_no_gradient_at_all_still_steps_the_optimizer_as_the_full_batch_would():
    """Every group flat: one row still runs, so each parameter gets a gradient of exactly 0
    and AdamW applies its momentum and decay, as after the full batch. With .grad None it
    would skip the parameters and the weights would differ."""
    algo = make_algorithm("grpo")
    informative = scored(algo, grouped_batch(), skip=False)
    flat = grouped_batch(seed=1)
    flat = dataclasses.replace(flat, rewards=torch.ones_like(flat.rewards))
    weights = {}
    for skip in (False, True):
        model = tiny_model()
        trainer = Trainer(model, lr=1e-2, total_steps=2, grad_clip=0, weight_decay=0.1)
        trainer.update(informative, algo)  # momentum to carry into the flat step
        batch = scored(algo, flat, skip)
        assert skip is False or not batch.rows_with_gradient.any()
        metrics = trainer.update(batch, algo)
        assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
        weights[skip] = torch.cat([p.detach().flatten() for p in model.parameters()])
        assert metrics["pg_loss"] == 0.0
    torch.testing.assert_close(weights[True], weights[False], atol=1e-7, rtol=0)


def test_the_check_can_fail_leaving_out_a_row_that_has_a_gradient_changes_it():
    algo = make_algorithm("grpo")
    batch = scored(algo, grouped_batch(), skip=True)
    wrong = batch.rows_with_gradient.clone()
    wrong[3] = False  # a row of the mixed group 1, whose advantage is not 0
    whole, _, _ = update(algo, scored(algo, grouped_batch(), skip=False))
    grads, _, _ = update(algo, dataclasses.replace(batch, rows_with_gradient=wrong))
    assert (grads - whole).abs().max() > 1e-4


@pytest.mark.parametrize("name, params", [
    ("grpo", {"kl_coef": 0.04}),  # the KL term pulls on every row
    ("grpo", {"entropy_coef": 0.01}),  # so does an entropy bonus
    ("cispo", {"entropy_coef": 0.01}),
    ("ppo", {}),  # the critic learns from every row's return
    ("reinforce_pp", {"kl_coef": 0.0}),  # not declared: its whitened advantages are never all 0
    ("kimi", {}),  # τ/2 · ℓ² pulls on a row whose advantage is 0 once π has moved from π_old
])
def test_it_never_applies_where_a_row_still_pulls_on_the_weights(name, params):
    algo = make_algorithm(name, budget=16, **params)
    batch = grouped_batch()
    if algo.uses_critic:
        batch = dataclasses.replace(batch, values=torch.zeros_like(batch.old_logp))
    batch = dataclasses.replace(batch, ref_logp=batch.old_logp - 0.1)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    assert algo.rows_with_gradient(batch) is None


def test_with_a_kl_term_zero_advantage_rows_do_have_a_gradient():
    """Why a KL term turns skipping off: the same flat rows, alone, move the weights."""
    algo = make_algorithm("grpo", kl_coef=0.04)
    batch = grouped_batch()
    batch = dataclasses.replace(batch, ref_logp=batch.old_logp - 0.1)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    flat_rows = batch.select(torch.tensor([0, 1, 2]))
    grads, _, _ = update(algo, flat_rows)
    assert grads.abs().max() > 1e-5


def test_metrics_are_means_over_the_rows_that_trained():
    algo = make_algorithm("grpo")
    batch = scored(algo, grouped_batch(), skip=True)
    _, _, metrics = update(algo, batch)
    trained = batch.select(batch.rows_with_gradient.nonzero().squeeze(1))
    _, _, expected = update(algo, dataclasses.replace(trained, rows_with_gradient=None))
    for key in ("pg_loss", "entropy", "clipfrac"):
        assert metrics[key] == pytest.approx(expected[key], abs=1e-6), key


def test_a_sub_batch_runs_without_the_padding_of_rows_it_does_not_hold():
    batch = grouped_batch()
    short = batch.select(torch.tensor([0]))
    trimmed = short.without_trailing_padding()
    width = int(short.attention_mask.sum())
    assert trimmed.tokens.shape == (1, width) < short.tokens.shape
    assert torch.equal(trimmed.response_mask, short.response_mask[:, :width])
    assert batch.without_trailing_padding() is batch  # collate already cut the whole batch


# --- what the pillars and Kimi's length reward add ---------------------------------------------


def test_a_length_reward_makes_flat_groups_informative_and_skipping_stays_exact():
    """All-right group 0 and all-wrong group 2 are inert under the verifier's reward; Kimi's
    length reward ranks their samples by length, so their rows get advantages and train.
    Whatever is left out must still give the full batch's gradient."""
    from posttrain.rewards.length import KimiLength
    from posttrain.rewards.stack import Accuracy, RewardStack

    batch = grouped_batch()
    episodes = batch.episodes
    stack = RewardStack([(1.0, Accuracy())], group_terms=[(1.0, KimiLength())])
    for e in episodes:
        e.details = stack(e.example, "", {"reward": e.reward, "details": {}})["details"]
    stack.score_groups(episodes, step=0)
    shaped = RolloutBatch.collate(episodes, pad_id=0)
    algo = make_algorithm("grpo")
    kept = scored(algo, shaped, skip=True).rows_with_gradient
    lengths = shaped.response_lengths()
    for group in range(4):
        rows = slice(3 * group, 3 * group + 3)
        spread = lengths[rows].max() > lengths[rows].min()
        # a row is left out only where its whole group got one reward
        assert bool(kept[rows].any()) == bool(shaped.rewards[rows].max() > shaped.rewards[rows].min())
        if group == 0 and spread:
            assert kept[rows].any()  # all right, different lengths: no longer inert
    whole, _, _ = update(algo, scored(algo, shaped, skip=False))
    for size in (0, 2):
        grads, _, _ = update(algo, scored(algo, shaped, skip=True), micro_batch_size=size)
        torch.testing.assert_close(grads, whole, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_overlong_filtered_rows_are_left_out_and_the_update_is_the_full_one(mode):
    """A truncated row's mask is zeroed, so its advantage is 0 and it is skipped; leaving it
    out changes nothing, at every aggregation and micro-batch size."""
    episodes = grouped_batch().episodes
    for i in (3, 10):  # one row of each mixed group was cut off
        episodes[i].finished = False
    batch = RolloutBatch.collate(episodes, pad_id=0)
    algo = make_algorithm("grpo", overlong_filter=True, loss_agg=mode, budget=16)
    skipping = scored(algo, batch, skip=True)
    assert not skipping.rows_with_gradient[[3, 10]].any()
    whole, _, _ = update(algo, scored(algo, batch, skip=False))
    for size in (0, 1, 4):
        grads, _, _ = update(algo, skipping, micro_batch_size=size)
        torch.testing.assert_close(grads, whole, atol=1e-6, rtol=0)


def test_kimi_is_never_skipped_and_its_flat_rows_move_the_weights_once_pi_has_moved():
    algo = make_algorithm("kimi")
    batch = grouped_batch()
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    assert algo.rows_with_gradient(batch) is None
    flat = batch.select(torch.tensor([0, 1, 2]))  # group 0: all right, advantage 0
    assert flat.advantages.abs().sum() == 0
    stale = dataclasses.replace(flat, old_logp=flat.old_logp - 0.3 * flat.response_mask)  # π moved since sampling
    grads, _, _ = update(algo, stale)
    assert grads.abs().max() > 1e-5
