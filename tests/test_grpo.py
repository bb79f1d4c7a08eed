"""Tests for GRPO: group advantages by hand and against a plain loop, their invariances,
masked positions, the direction of one SGD step, and the registry's error messages."""

import dataclasses
import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algorithms import ALGORITHMS, make_algorithm
from posttrain.algorithms.core import agg_loss, kl_k3
from posttrain.algorithms.grpo import ADV_NORMS, GRPO, group_advantages
from posttrain.types import PolicyOutputs, RolloutBatch

# ---------------------------------------------------------------- group advantages


def test_group_advantages_one_group_by_hand():
    # mean 0.5; deviations ±0.5; unbiased var = 4 · 0.25 / 3 = 1/3; std = 0.5774
    # advantages ±0.5 / 0.5774 = ±0.8660
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long), "group", 0.0)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]) * 0.5 / math.sqrt(1 / 3))
    assert adv[0].item() == pytest.approx(0.8660, abs=1e-4)


def test_group_advantages_each_norm_by_hand():
    # groups {1, 0} and {1, 1}: group means 0.5 and 1 -> centred [.5, −.5, 0, 0]
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    ids = torch.tensor([0, 0, 1, 1])
    norms = ("none", "group-mean-batch-std", "group-mean-pooled-std", "batch-mean-batch-std")
    adv = {norm: group_advantages(rewards, ids, norm, 0.0) for norm in norms}
    assert torch.allclose(adv["none"], torch.tensor([0.5, -0.5, 0.0, 0.0]))
    # group: std{1, 0} = √(0.5 / 1) = 0.7071 -> ±0.7071; std{1, 1} = 0 -> 0 / 0 would be
    # NaN, so this one case needs eps > 0
    adv_group = group_advantages(rewards, ids, "group", 1e-6)
    assert torch.allclose(adv_group, torch.tensor([math.sqrt(0.5), -math.sqrt(0.5), 0.0, 0.0]), atol=1e-5)
    # group mean, batch std (Lite PPO): std of raw rewards [1, 0, 1, 1]: mean .75, squares
    # .0625·3 + .5625 = .75, /3 = .25 -> 0.5
    assert torch.allclose(adv["group-mean-batch-std"], torch.tensor([1.0, -1.0, 0.0, 0.0]))
    # group mean, pooled std: std of centred [.5, −.5, 0, 0]: mean 0, squares .5, /3 -> √(1/6) = 0.4082
    assert torch.allclose(adv["group-mean-pooled-std"], torch.tensor([0.5, -0.5, 0.0, 0.0]) / math.sqrt(1 / 6))
    # batch mean .75, batch std .5: [.25, −.75, .25, .25] / .5 -- the flat group {1, 1} is not 0
    assert torch.allclose(adv["batch-mean-batch-std"], torch.tensor([0.5, -1.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match="group-mean-batch-std"):
        group_advantages(rewards, ids, "global", 1e-6)


@pytest.mark.parametrize("old, new", [("hybrid", "group-mean-pooled-std"), ("batch", "group-mean-batch-std")])
def test_the_old_ambiguous_names_are_refused_with_what_each_became(old, new):
    """"hybrid" meant a pooled std here and group mean / batch std in the seed's notes; "batch"
    meant Lite PPO's normalisation. Neither may silently mean something else now."""
    with pytest.raises(ValueError) as err:
        GRPO(adv_norm=old)
    message = str(err.value)
    assert f"'{old}' was renamed" in message and f"'{new}'" in message and "'group-mean-batch-std'" in message
    with pytest.raises(ValueError, match="was renamed"):
        make_algorithm("cispo", adv_norm=old)


def _loop_group_advantages(rewards, group_ids, norm, eps):
    """The obvious implementation: a Python loop over groups with the statistics module."""
    r = rewards.tolist()
    ids = group_ids.tolist()
    members = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    centred = [0.0] * len(r)
    group_std = [0.0] * len(r)
    for rows in members.values():
        vals = [r[i] for i in rows]
        mean = statistics.fmean(vals)
        std = statistics.stdev(vals) if len(vals) > 1 else 0.0
        for i in rows:
            centred[i] = r[i] - mean
            group_std[i] = std
    stdev = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0  # noqa: E731
    if norm == "no-baseline":
        return torch.tensor(r)
    if norm == "none":
        return torch.tensor(centred)
    if norm == "group":
        return torch.tensor([c / (s + eps) for c, s in zip(centred, group_std)])
    if norm == "batch-mean-batch-std":
        mean = statistics.fmean(r)
        return torch.tensor([(x - mean) / (stdev(r) + eps) for x in r])
    scale = stdev(r) if norm == "group-mean-batch-std" else stdev(centred)
    return torch.tensor([c / (scale + eps) for c in centred])


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    B=st.integers(1, 24),
    n_groups=st.integers(1, 6),
    norm=st.sampled_from(ADV_NORMS),
    binary=st.booleans(),
)
def test_group_advantages_match_a_loop(seed, B, n_groups, norm, binary):
    gen = torch.Generator().manual_seed(seed)
    # sparse, unsorted ids (prompt indices need not be 0..G-1 or contiguous)
    ids = torch.randint(0, n_groups, (B,), generator=gen) * 37 + 5
    rewards = (torch.rand(B, generator=gen) > 0.5).float() if binary else torch.randn(B, generator=gen) * 3
    rewards, ids = rewards.double(), ids
    vec = group_advantages(rewards, ids, norm, 1e-6)
    loop = _loop_group_advantages(rewards, ids, norm, 1e-6).double()
    assert vec.shape == (B,)
    assert torch.allclose(vec, loop, atol=1e-9)


@pytest.mark.parametrize("norm", ["group", "group-mean-pooled-std", "none"])
def test_shifting_rewards_within_a_group_changes_nothing(norm):
    # adding c_g to every reward of group g: the group mean absorbs it. (The batch-std norms
    # are the exception by design: the batch std sees the spread between group means; next test.)
    torch.manual_seed(0)
    ids = torch.arange(5).repeat_interleave(4)  # 5 groups of 4
    rewards = torch.randn(20, dtype=torch.float64)
    shift = torch.randn(5, dtype=torch.float64)[ids] * 10
    a = group_advantages(rewards, ids, norm, 1e-6)
    b = group_advantages(rewards + shift, ids, norm, 1e-6)
    assert torch.allclose(a, b, atol=1e-9)


def test_batch_norm_does_see_between_group_offsets():
    ids = torch.tensor([0, 0, 1, 1])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    for norm in ("group-mean-batch-std", "batch-mean-batch-std"):
        a = group_advantages(rewards, ids, norm, 1e-6)
        b = group_advantages(rewards + torch.tensor([0.0, 0.0, 10.0, 10.0]), ids, norm, 1e-6)
        assert not torch.allclose(a, b)


@pytest.mark.parametrize("norm", ADV_NORMS)
def test_scaling_rewards(norm):
    # r -> c·r with c > 0: the std scales by c too, so normalised advantages are unchanged
    # (up to eps); with no std division ("none", Dr. GRPO; "no-baseline") they scale by c.
    torch.manual_seed(1)
    ids = torch.arange(4).repeat_interleave(3)
    rewards = torch.randn(12, dtype=torch.float64)
    c = 7.5
    a = group_advantages(rewards, ids, norm, 1e-9)
    b = group_advantages(c * rewards, ids, norm, 1e-9)
    assert torch.allclose(b, c * a if norm in ("none", "no-baseline") else a, atol=1e-7)


@pytest.mark.parametrize("norm", [n for n in ADV_NORMS if n not in ("batch-mean-batch-std", "no-baseline")])
def test_singleton_and_all_equal_groups_get_zero_advantage(norm):
    # (batch-mean-batch-std has no group baseline: a flat group keeps its offset from the batch
    # mean; no-baseline none at all: every right answer is pushed up, in a flat group too)
    # group 9 has one sample (its own baseline); group 2 is all 1s (no signal)
    rewards = torch.tensor([0.3, 1.0, 1.0, 1.0, 0.0, 1.0])
    ids = torch.tensor([9, 2, 2, 2, 4, 4])
    adv = group_advantages(rewards, ids, norm, 1e-6)
    assert torch.equal(adv[:4], torch.zeros(4))
    assert (adv[4:] != 0).all()


# ---------------------------------------------------------------- the GRPO dataclass


def _batch(seed=0, B=4, T=7, with_ref=True):
    """Two groups of two, prompts of 2-3 tokens, responses of 2-4, right padding."""
    gen = torch.Generator().manual_seed(seed)
    response_mask = torch.tensor(
        [[0, 0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0.0]]
    )[:B, :T]
    attention_mask = torch.tensor(
        [[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0.0]]
    )[:B, :T]
    old_logp = torch.where(response_mask > 0, -torch.rand(B, T, generator=gen) * 2, 0.0)
    ref_logp = torch.where(response_mask > 0, old_logp + 0.2 * torch.randn(B, T, generator=gen), 0.0)
    return RolloutBatch(
        tokens=torch.randint(0, 10, (B, T), generator=gen),
        attention_mask=attention_mask,
        response_mask=response_mask,
        old_logp=old_logp,
        rewards=torch.tensor([1.0, 0.0, 0.0, 0.5])[:B],
        group_ids=torch.tensor([0, 0, 1, 1])[:B],
        ref_logp=ref_logp if with_ref else None,
    )


def test_compute_advantages_broadcasts_over_response_tokens_only():
    batch = _batch()
    rewards = batch.rewards.clone().requires_grad_(True)  # must not leak a graph
    batch = dataclasses.replace(batch, rewards=rewards)
    out = GRPO().compute_advantages(batch)
    adv = out["advantages"]
    assert adv.shape == batch.tokens.shape and not adv.requires_grad
    per_seq = group_advantages(batch.rewards.detach(), batch.group_ids, "group", 1e-6)  # (B,)
    assert torch.equal(adv, per_seq[:, None] * batch.response_mask)
    assert (adv[batch.response_mask == 0] == 0).all()
    # group {1, 0}: ±0.7071 on rows 0, 1 (std √0.5); group {0, .5}: ∓0.7071 on rows 2, 3
    assert adv[0, 2].item() == pytest.approx(math.sqrt(0.5), abs=1e-5)
    assert adv[3, 4].item() == pytest.approx(math.sqrt(0.5), abs=1e-5)


def test_compute_loss_is_surrogate_plus_kl_minus_entropy_by_construction():
    torch.manual_seed(0)
    algo = GRPO(kl_coef=0.04, entropy_coef=0.01)
    batch = _batch()
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    logp = batch.old_logp.clone()  # ratio 1: the surrogate is agg(−adv)
    entropy = torch.rand_like(logp)
    loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=entropy), batch)
    m = batch.response_mask
    expected = (
        agg_loss(-batch.advantages, m, "seq-mean-token-mean")
        + 0.04 * agg_loss(kl_k3(logp, batch.ref_logp), m, "seq-mean-token-mean")
        - 0.01 * agg_loss(entropy, m, "seq-mean-token-mean")
    )
    assert loss.item() == pytest.approx(expected.item(), abs=1e-7)
    for key in ("pg_loss", "kl", "entropy", "clipfrac", "approx_kl", "ratio_mean", "ratio_max", "adv_mean", "adv_std"):
        assert isinstance(metrics[key], float), key
    assert metrics["clipfrac"] == 0.0
    assert "kl" not in GRPO().compute_loss(PolicyOutputs(logp=logp, entropy=entropy), batch)[1]


def test_kl_needs_the_reference_and_the_flag_says_so():
    assert GRPO().uses_reference is False
    assert GRPO(kl_coef=0.04).uses_reference is True
    assert GRPO().uses_critic is False
    batch = _batch(with_ref=False)
    batch = dataclasses.replace(batch, **GRPO().compute_advantages(batch))
    outputs = PolicyOutputs(logp=batch.old_logp.clone(), entropy=torch.zeros(4, 7))
    GRPO().compute_loss(outputs, batch)  # fine without a reference
    with pytest.raises(ValueError, match="ref_logp"):
        GRPO(kl_coef=0.04).compute_loss(outputs, batch)
    with pytest.raises(ValueError, match="compute_advantages"):
        GRPO().compute_loss(outputs, _batch())


@pytest.mark.parametrize("loss_agg", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_masked_positions_cannot_change_the_grpo_loss(loss_agg):
    algo = GRPO(kl_coef=0.1, entropy_coef=0.01, loss_agg=loss_agg, max_len=5)
    batch = _batch()
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    off = batch.response_mask == 0
    gen = torch.Generator().manual_seed(3)
    logp = torch.where(off, 0.0, batch.old_logp + 0.3 * torch.randn(4, 7, generator=gen))
    entropy = torch.rand(4, 7, generator=gen)

    def run(logp, entropy, batch):
        logp = logp.clone().requires_grad_(True)
        entropy = entropy.clone().requires_grad_(True)
        loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=entropy), batch)
        loss.backward()
        return loss, metrics, logp.grad, entropy.grad

    a = run(logp, entropy, batch)
    noise = lambda: 50 * torch.randn(4, 7, generator=gen)  # noqa: E731
    perturbed = dataclasses.replace(
        batch,
        old_logp=torch.where(off, noise(), batch.old_logp),
        ref_logp=torch.where(off, noise(), batch.ref_logp),
        advantages=torch.where(off, noise(), batch.advantages),
    )
    b = run(torch.where(off, -torch.inf, logp), torch.where(off, noise(), entropy), perturbed)
    assert torch.equal(a[0], b[0])
    assert a[1] == b[1]
    assert torch.equal(a[2], b[2]) and torch.equal(a[3], b[3])
    assert (a[2][off] == 0).all() and (a[3][off] == 0).all()


def _sgd_step_on_categorical(rewards, group_ids, tokens_sampled, **grpo_params):
    """A policy that is just a logits vector over V = 5 tokens (no context). Each row is
    [prompt token, one sampled response token]. Returns log π(token) before and after one
    SGD step on GRPO's loss, for every vocabulary token."""
    torch.manual_seed(0)
    logits = torch.nn.Parameter(torch.randn(5))
    B = len(rewards)
    tokens = torch.stack([torch.zeros(B, dtype=torch.long), torch.tensor(tokens_sampled)], dim=1)  # (B, 2)
    with torch.no_grad():
        old = torch.log_softmax(logits, -1)[tokens[:, 1]]  # (B,)
    batch = RolloutBatch(
        tokens=tokens,
        attention_mask=torch.ones(B, 2),
        response_mask=torch.tensor([[0.0, 1.0]] * B),
        old_logp=torch.stack([torch.zeros(B), old], dim=1),
        rewards=torch.tensor(rewards),
        group_ids=torch.tensor(group_ids),
    )
    algo = GRPO(**grpo_params)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    log_probs = torch.log_softmax(logits, -1)  # (V,)
    logp = torch.stack([torch.zeros(B), log_probs[tokens[:, 1]]], dim=1)  # (B, 2)
    entropy = torch.zeros(B, 2)
    loss, _ = algo.compute_loss(PolicyOutputs(logp=logp, entropy=entropy), batch)
    loss.backward()
    with torch.no_grad():
        before = torch.log_softmax(logits, -1).clone()
        logits -= 0.1 * logits.grad  # one SGD step
        after = torch.log_softmax(logits, -1)
    return before, after


@pytest.mark.parametrize("adv_norm", [n for n in ADV_NORMS if n != "no-baseline"])
def test_one_sgd_step_raises_the_rewarded_token_and_lowers_the_other(adv_norm):
    # one group: token 3 got reward 1 (advantage > 0), token 1 got reward 0 (advantage < 0)
    before, after = _sgd_step_on_categorical([1.0, 0.0], [0, 0], [3, 1], adv_norm=adv_norm)
    assert after[3] > before[3]
    assert after[1] < before[1]
    # swap the rewards: the signs swap
    before, after = _sgd_step_on_categorical([0.0, 1.0], [0, 0], [3, 1], adv_norm=adv_norm)
    assert after[3] < before[3]
    assert after[1] > before[1]


def test_without_a_baseline_a_wrong_answer_is_not_pushed_down():
    # vanilla REINFORCE: A = r, so the reward-0 sample has advantage 0 and no gradient of its
    # own; only the rewarded token is pushed (a baseline makes the wrong one's advantage < 0)
    rewards = torch.tensor([1.0, 0.0])
    assert torch.equal(group_advantages(rewards, torch.tensor([0, 0]), "no-baseline", 1e-6), rewards)
    before, after = _sgd_step_on_categorical([1.0, 0.0], [0, 0], [3, 1], adv_norm="no-baseline")
    assert after[3] > before[3]


def test_a_zero_variance_group_produces_no_update():
    before, after = _sgd_step_on_categorical([1.0, 1.0], [0, 0], [3, 1])
    assert torch.equal(before, after)


# ---------------------------------------------------------------- validation and registry


@pytest.mark.parametrize(
    "params, field",
    [
        ({"clip_eps_low": 1.5}, "clip_eps_low"),
        ({"clip_eps_high": -0.1}, "clip_eps_high"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"kl_estimator": "k9"}, "kl_estimator"),
        ({"adv_norm": "std"}, "adv_norm"),
        ({"adv_eps": 0.0}, "adv_eps"),
        ({"loss_agg": "sum"}, "loss_agg"),
        ({"entropy_coef": float("nan")}, "entropy_coef"),
        ({"loss_agg": "seq-mean-token-sum-norm"}, "max_len"),
    ],
)
def test_bad_values_name_the_field_and_value(params, field):
    with pytest.raises(ValueError) as err:
        GRPO(**params)
    message = str(err.value)
    assert field in message and "allowed" in message
    assert repr(list(params.values())[0]) in message or field == "max_len"


def test_dr_grpo_is_grpo_with_two_divisors_deleted():
    algo = GRPO(adv_norm="none", loss_agg="seq-mean-token-sum-norm", max_len=64)
    batch = _batch()
    adv = algo.compute_advantages(batch)["advantages"]
    assert adv[0, 2].item() == pytest.approx(0.5)  # reward 1 minus group mean 0.5, no std


def test_registry_and_make_algorithm_errors_are_actionable():
    assert ALGORITHMS["grpo"] is GRPO
    assert make_algorithm("grpo", kl_coef=0.04) == GRPO(kl_coef=0.04)
    with pytest.raises(ValueError, match=r"unknown algorithm 'gpro'.*'grpo'"):
        make_algorithm("gpro")
    with pytest.raises(ValueError) as err:
        make_algorithm("grpo", clip_eps=0.2)
    assert "clip_eps" in str(err.value) and "clip_eps_low=0.2" in str(err.value) and "kl_coef=0.0" in str(err.value)
    with pytest.raises(ValueError) as err:
        make_algorithm("grpo", adv_norm="zscore")
    assert "'zscore'" in str(err.value) and "adv_norm='group'" in str(err.value)


def _one_row(logp_old, logp_ref, rows=1, length=1):
    """`rows` rows of `length` response tokens after one prompt token, each its own group of
    one (advantage 0: the loss is the KL and entropy terms alone)."""
    T = 1 + length
    mask = torch.zeros(rows, T)
    mask[:, 1:] = 1.0
    return RolloutBatch(tokens=torch.zeros(rows, T, dtype=torch.long), attention_mask=torch.ones(rows, T),
                        response_mask=mask, old_logp=torch.full((rows, T), logp_old) * mask,
                        rewards=torch.ones(rows), group_ids=torch.arange(rows),
                        ref_logp=torch.full((rows, T), logp_ref) * mask)


def test_importance_weighted_kl_by_hand():
    # log π_θ = −1.0, log π_old = −1.2, log π_ref = −1.5 on one token:
    # k3 = e^(−0.5) + 0.5 − 1 = 0.106531; weight π_θ/π_old = e^0.2 = 1.221403 -> 0.130117
    # d/d log π_θ: unweighted 1 − e^(−0.5) = 0.393469; weighted w·(k3 + 0.393469) = w·0.5 = 0.610701
    for weighted, value, grad in ((False, 0.106531, 0.393469), (True, 0.130117, 0.610701)):
        algo = GRPO(kl_coef=1.0, kl_importance_weight=weighted)
        batch = _one_row(-1.2, -1.5)
        batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
        logp = torch.tensor([[0.0, -1.0]], requires_grad=True)
        loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros(1, 2)), batch)
        loss.backward()
        assert loss.item() == pytest.approx(value, abs=1e-6)
        assert logp.grad[0, 1].item() == pytest.approx(grad, abs=1e-6)
    # on-policy (π_θ = π_old) the weight is 1 in value but not in gradient: k3 + 0.393469 = 0.5
    algo = GRPO(kl_coef=1.0, kl_importance_weight=True)
    batch = _one_row(-1.0, -1.5)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    logp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    loss, _ = algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros(1, 2)), batch)
    loss.backward()
    assert loss.item() == pytest.approx(0.106531, abs=1e-6) and logp.grad[0, 1].item() == pytest.approx(0.5, abs=1e-6)


def test_entropy_agg_token_mean_ignores_the_loss_aggregation():
    # rows of 1 and 3 response tokens, entropy 1.0 on the first and 0.5 on each of the others:
    # token-mean (1 + 1.5) / 4 = 0.625; the loss's seq-mean-token-sum (1 + 1.5) / 2 = 1.25
    batch = dataclasses.replace(_one_row(-1.0, -1.0, rows=2, length=3),
                                response_mask=torch.tensor([[0, 1, 0, 0], [0, 1, 1, 1.0]]))
    entropy = torch.tensor([[0, 1.0, 0, 0], [0, 0.5, 0.5, 0.5]])
    for entropy_agg, bonus in (("loss_agg", 1.25), ("token-mean", 0.625)):
        algo = GRPO(loss_agg="seq-mean-token-sum", entropy_coef=1.0, entropy_agg=entropy_agg)
        ready = dataclasses.replace(batch, **algo.compute_advantages(batch))
        loss, _ = algo.compute_loss(PolicyOutputs(logp=ready.old_logp.clone(), entropy=entropy), ready)
        assert loss.item() == pytest.approx(-bonus)
    with pytest.raises(ValueError, match="entropy_agg"):
        GRPO(entropy_agg="sum")
    with pytest.raises(ValueError, match="kl_importance_weight"):
        GRPO(kl_importance_weight=1)
