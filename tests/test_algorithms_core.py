"""Tests for posttrain.algorithms.core: hand-worked numbers, loop vs vectorised,
invariances (masked tokens do not matter) and exact gradient facts about clipping."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algorithms.core import (
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    agg_loss,
    clipped_surrogate,
    group_mean_std,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    zero_variance_group_fraction,
)
from posttrain.models.logprobs import entropy_from_logits, token_entropy, token_logp

# ---------------------------------------------------------------- masked reductions


def test_masked_mean_all_zero_mask_is_zero_not_nan_and_so_is_its_gradient():
    x = torch.randn(2, 3, requires_grad=True)
    mask = torch.zeros(2, 3)
    out = masked_mean(x, mask)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(x.grad, torch.zeros(2, 3))
    per_row = masked_mean(x.detach(), torch.tensor([[1.0, 1, 0], [0, 0, 0]]), dim=-1)
    assert torch.allclose(per_row, torch.stack([x[0, :2].mean(), torch.tensor(0.0)]))


def test_masked_sum_ignores_inf_and_nan_under_the_mask():
    # inf * 0 is NaN, so a plain x * mask would poison the sum
    x = torch.tensor([[1.0, 2.0, float("inf")], [3.0, float("nan"), -float("inf")]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_sum(x, mask).item() == 6.0  # 1 + 2 + 3
    assert masked_mean(x, mask).item() == 2.0  # 6 / 3


def test_masked_var_and_whiten_by_hand():
    # masked entries 1, 2, 3, 6: mean 3, squared deviations 4 + 1 + 0 + 9 = 14
    x = torch.tensor([[1.0, 2.0, 99.0], [3.0, 6.0, -99.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    assert masked_var(x, mask).item() == pytest.approx(14 / 3)  # Bessel: n − 1 = 3
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(14 / 4)
    w = masked_whiten(x, mask, eps=0.0)
    assert w[0, 2] == 0 and w[1, 2] == 0  # masked positions come back as 0
    assert masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(w, mask).item() == pytest.approx(1.0)
    assert w[1, 1].item() == pytest.approx(3 / math.sqrt(14 / 3))  # (6 − 3) / std
    # one entry: no spread to estimate -> 0, not NaN
    assert masked_var(x, torch.tensor([[1.0, 0, 0], [0, 0, 0]])).item() == 0.0


# ---------------------------------------------------------------- loss aggregation

LOSS_2x3 = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK_2x3 = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
# row 0 keeps 1, 2 (sum 3, 2 tokens); row 1 keeps 4 (sum 4, 1 token)


@pytest.mark.parametrize(
    "mode, max_len, expected",
    [
        ("token-mean", None, 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-mean", None, 2.75),  # (3/2 + 4/1) / 2 rows
        ("seq-mean-token-sum", None, 3.5),  # (3 + 4) / 2 rows
        ("seq-mean-token-sum-norm", 4, 0.875),  # (3/4 + 4/4) / 2 rows
    ],
)
def test_agg_loss_hand_worked(mode, max_len, expected):
    assert agg_loss(LOSS_2x3, MASK_2x3, mode, max_len).item() == pytest.approx(expected)


def test_agg_loss_modes_are_all_covered_and_errors_are_actionable():
    assert set(LOSS_AGG_MODES) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        agg_loss(LOSS_2x3, MASK_2x3, "token-sum")
    with pytest.raises(ValueError, match="max_len"):
        agg_loss(LOSS_2x3, MASK_2x3, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_empty_mask_is_zero(mode):
    assert agg_loss(LOSS_2x3, torch.zeros(2, 3), mode, max_len=4).item() == 0.0


# ---------------------------------------------------------------- KL estimators


def test_kl_estimators_by_hand():
    logp = torch.tensor([math.log(0.5)])
    ref_logp = torch.tensor([math.log(0.25)])
    # log π − log π_ref = log 2
    assert kl_k1(logp, ref_logp).item() == pytest.approx(math.log(2))
    assert kl_k2(logp, ref_logp).item() == pytest.approx(0.5 * math.log(2) ** 2)
    # r = π_ref / π = 0.5: r − log r − 1 = 0.5 + log 2 − 1 ≈ 0.1931
    assert kl_k3(logp, ref_logp).item() == pytest.approx(0.5 + math.log(2) - 1)
    for kind, fn in KL_ESTIMATORS.items():
        assert torch.equal(kl_estimate(logp, ref_logp, kind), fn(logp, ref_logp))
    with pytest.raises(ValueError, match="k3"):
        kl_estimate(logp, ref_logp, "k4")


def test_kl_estimators_zero_when_policies_agree_and_k2_k3_nonnegative():
    logp = torch.randn(4, 7) - 2
    for kind in KL_ESTIMATORS:
        assert torch.equal(kl_estimate(logp, logp.clone(), kind), torch.zeros(4, 7))
    ref_logp = torch.randn(4, 7) * 5 - 2
    assert (kl_k2(logp, ref_logp) >= 0).all()
    assert (kl_k3(logp, ref_logp) >= 0).all()


def test_kl_k3_stays_finite_for_extreme_log_ratios():
    # ref_logp − logp = 200 would be exp(200) = inf in float32 without the clamp
    out = kl_k3(torch.tensor([-200.0]), torch.tensor([0.0]))
    assert torch.isfinite(out).all()


def test_k3_and_k1_are_unbiased_for_kl_when_sampling_from_the_policy():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])  # π
    q = torch.tensor([0.25, 0.25, 0.25, 0.25])  # π_ref
    true_kl = (p * (p / q).log()).sum().item()  # KL(π ‖ π_ref) ≈ 0.2109
    idx = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp, ref_logp = p.log()[idx], q.log()[idx]
    assert kl_k3(logp, ref_logp).mean().item() == pytest.approx(true_kl, rel=0.03)
    assert kl_k1(logp, ref_logp).mean().item() == pytest.approx(true_kl, rel=0.03)


# ---------------------------------------------------------------- logits -> per-token log-probs


def _naive_token_logp_and_entropy(logits, tokens, temperature):
    B, T, _ = logits.shape
    logp = torch.zeros(B, T)
    ent = torch.zeros(B, T)
    for b in range(B):
        for t in range(1, T):
            probs = torch.softmax(logits[b, t - 1] / temperature, dim=-1)
            logp[b, t] = probs[tokens[b, t]].log()
            ent[b, t] = -(probs * probs.log()).sum()
    return logp, ent


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logp_and_entropy_match_a_naive_loop(temperature):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11) * 3
    tokens = torch.randint(0, 11, (3, 5))
    ref_logp, ref_ent = _naive_token_logp_and_entropy(logits, tokens, temperature)
    logp = token_logp(logits, tokens, temperature)
    ent = token_entropy(logits, temperature)
    assert logp.shape == ent.shape == (3, 5)
    assert torch.allclose(logp, ref_logp, atol=1e-5)
    assert torch.allclose(ent, ref_ent, atol=1e-5)
    assert (logp[:, 0] == 0).all() and (ent[:, 0] == 0).all()


def test_temperature_is_applied():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 6)
    tokens = torch.randint(0, 6, (2, 4))
    assert torch.allclose(token_logp(logits, tokens, 0.5), token_logp(logits * 2, tokens, 1.0), atol=1e-6)
    assert not torch.allclose(token_logp(logits, tokens, 0.5), token_logp(logits, tokens, 1.0))
    with pytest.raises(ValueError, match="temperature"):
        token_logp(logits, tokens, 0.0)


def test_entropy_from_logits_matches_torch_categorical():
    logits = torch.randn(2, 3, 9)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(entropy_from_logits(logits), expected, atol=1e-5)


# ---------------------------------------------------------------- clipped surrogate

EPS = 0.2
# One row of six tokens, old_logp = 0, chosen so each clipping case appears once:
#   token  adv  ratio  clipped?   why
#   0      +1   1.5    yes        adv > 0 and ratio > 1 + eps_high: no more credit
#   1      −1   0.5    yes        adv < 0 and ratio < 1 − eps_low: no more blame
#   2      +1   0.5    no         min picks the unclipped −adv·ratio (pessimistic)
#   3      −1   1.5    no         same on the other side
#   4      +1   1.1    no         inside the trust region
#   5      −1   0.9    no         inside the trust region
ADV = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0, -1.0]])
RATIO = torch.tensor([[1.5, 0.5, 0.5, 1.5, 1.1, 0.9]])
CLIPPED = torch.tensor([True, True, False, False, False, False])


def _surrogate_grad(ratio, adv, mask=None, **kwargs):
    logp = ratio.log().clone().requires_grad_(True)
    mask = torch.ones_like(adv) if mask is None else mask
    loss, metrics = clipped_surrogate(logp, torch.zeros_like(adv), adv, mask, **kwargs)
    loss.backward()
    return loss, metrics, logp.grad


def test_gradient_is_exactly_zero_where_the_clip_is_active_and_nonzero_elsewhere():
    loss, metrics, grad = _surrogate_grad(RATIO, ADV, eps_low=EPS, eps_high=EPS)
    assert (grad[0, CLIPPED] == 0).all()
    # unclipped tokens: d(−adv·ratio)/d logp = −adv·ratio, divided by 6 tokens (token-mean)
    expected = (-ADV * RATIO / 6)[0, ~CLIPPED]
    assert torch.allclose(grad[0, ~CLIPPED], expected)
    assert (grad[0, ~CLIPPED] != 0).all()
    assert metrics["clipfrac"] == pytest.approx(2 / 6)
    # loss by hand: tokens 0..5 give −1.2, +0.8, −0.5, +1.5, −1.1, +0.9; sum 0.4; /6
    assert loss.item() == pytest.approx(0.4 / 6)
    assert metrics["ratio_max"] == pytest.approx(1.5)
    assert metrics["ratio_mean"] == pytest.approx(1.0)  # (1.5 + .5 + .5 + 1.5 + 1.1 + .9) / 6


def test_clip_higher_widens_only_the_upper_bound():
    # adv > 0 and ratio 1.25: clipped with eps_high 0.2, free with eps_high 0.28 (DAPO)
    ratio, adv = torch.tensor([[1.25]]), torch.tensor([[1.0]])
    assert _surrogate_grad(ratio, adv, eps_low=0.2, eps_high=0.2)[2].item() == 0
    assert _surrogate_grad(ratio, adv, eps_low=0.2, eps_high=0.28)[2].item() != 0
    # the lower bound still uses eps_low: adv < 0 and ratio 0.75 < 0.8 is clipped
    assert _surrogate_grad(torch.tensor([[0.75]]), -adv, eps_low=0.2, eps_high=0.28)[2].item() == 0


def test_approx_kl_is_k3_of_the_ratio():
    loss, metrics, _ = _surrogate_grad(RATIO, ADV, eps_low=EPS, eps_high=EPS)
    expected = ((RATIO - 1) - RATIO.log()).mean().item()  # (r − 1) − log r, averaged
    assert metrics["approx_kl"] == pytest.approx(expected, rel=1e-5)
    assert metrics["approx_kl"] > 0


def test_dual_clip_caps_the_loss_for_negative_advantages():
    # adv −1, ratio 5: PPO's loss is −adv·ratio = 5; the dual clip with c = 3 caps it at 3
    # and stops the gradient. ratio 2 < c is untouched; positive advantages are untouched.
    ratio = torch.tensor([[5.0, 2.0, 5.0]])
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    plain, _, _ = _surrogate_grad(ratio, adv, mask, eps_low=EPS, eps_high=EPS)
    capped, metrics, grad = _surrogate_grad(ratio, adv, mask, eps_low=EPS, eps_high=EPS, dual_clip=3.0)
    assert plain.item() == pytest.approx(5.0)
    assert capped.item() == pytest.approx(3.0)
    assert grad[0, 0] == 0
    assert metrics["dual_clipfrac"] == 1.0
    # the other two tokens: identical with and without the dual clip
    for col in (1, 2):
        m = torch.zeros(1, 3)
        m[0, col] = 1
        a = _surrogate_grad(ratio, adv, m, eps_low=EPS, eps_high=EPS)
        b = _surrogate_grad(ratio, adv, m, eps_low=EPS, eps_high=EPS, dual_clip=3.0)
        assert a[0].item() == b[0].item() and torch.equal(a[2], b[2])
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate(ratio.log(), torch.zeros(1, 3), adv, mask, EPS, EPS, dual_clip=0.5)


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_at_ratio_one_the_surrogate_is_the_plain_policy_gradient(agg):
    # At θ = θ_old, ∇ exp(logp − old_logp) = ∇ logp, so the surrogate's gradient is the
    # REINFORCE gradient of −adv·logp. Its value is agg(−adv) because the ratio is 1.
    torch.manual_seed(0)
    logp = (torch.randn(3, 5) - 2).requires_grad_(True)
    adv = torch.randn(3, 5)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1.0]])
    loss, metrics = clipped_surrogate(logp, logp.detach(), adv, mask, EPS, EPS, agg=agg, max_len=5)
    (grad,) = torch.autograd.grad(loss, logp)
    pg_loss = agg_loss(-adv * logp, mask, agg, max_len=5)
    (pg_grad,) = torch.autograd.grad(pg_loss, logp)
    assert torch.allclose(grad, pg_grad, atol=1e-7)
    assert loss.item() == pytest.approx(agg_loss(-adv, mask, agg, max_len=5).item(), abs=1e-6)
    assert metrics["clipfrac"] == 0 and metrics["approx_kl"] == pytest.approx(0, abs=1e-7)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), agg=st.sampled_from(LOSS_AGG_MODES))
def test_masked_positions_cannot_change_the_surrogate(seed, agg):
    gen = torch.Generator().manual_seed(seed)
    B, T = 3, 6
    logp = -torch.rand(B, T, generator=gen) * 3
    old_logp = logp + 0.3 * torch.randn(B, T, generator=gen)
    adv = torch.randn(B, T, generator=gen)
    mask = (torch.rand(B, T, generator=gen) > 0.4).float()
    off = mask == 0

    def run(logp, old_logp, adv):
        logp = logp.clone().requires_grad_(True)
        loss, metrics = clipped_surrogate(logp, old_logp, adv, mask, 0.2, 0.28, dual_clip=3.0, agg=agg, max_len=T)
        loss.backward()
        return loss, metrics, logp.grad

    noise = lambda: 100 * torch.randn(B, T, generator=gen)  # noqa: E731
    loss_a, metrics_a, grad_a = run(logp, old_logp, adv)
    loss_b, metrics_b, grad_b = run(
        torch.where(off, noise(), logp), torch.where(off, noise(), old_logp), torch.where(off, noise(), adv)
    )
    # even infinities in padding (a pad token can get log-prob -inf) must not leak in:
    # inf · 0 is NaN in the forward pass, and in the backward pass too
    inf = torch.full((B, T), torch.inf)
    loss_c, _, grad_c = run(torch.where(off, -inf, logp), torch.where(off, -inf, old_logp), adv)
    loss_d, _, grad_d = run(logp, old_logp, torch.where(off, inf, adv))
    assert torch.equal(loss_a, loss_b) and torch.equal(loss_a, loss_c) and torch.equal(loss_a, loss_d)
    assert metrics_a == metrics_b
    assert torch.equal(grad_a, grad_b) and torch.equal(grad_a, grad_c) and torch.equal(grad_a, grad_d)
    assert (grad_a[off] == 0).all()


# ---------------------------------------------------------------- group helpers


def test_group_mean_std_by_hand():
    # groups (ids 7 and 3, interleaved): {1, 3} and {0, 4, 8}
    rewards = torch.tensor([1.0, 0.0, 3.0, 4.0, 8.0])
    ids = torch.tensor([7, 3, 7, 3, 3])
    mean, std, count = group_mean_std(rewards, ids)
    assert torch.allclose(mean, torch.tensor([2.0, 4.0, 2.0, 4.0, 4.0]))
    # {1, 3}: squared deviations 1 + 1 = 2, / (2 − 1) -> std √2
    # {0, 4, 8}: 16 + 0 + 16 = 32, / (3 − 1) = 16 -> std 4
    assert torch.allclose(std, torch.tensor([math.sqrt(2), 4.0, math.sqrt(2), 4.0, 4.0]))
    assert torch.equal(count, torch.tensor([2.0, 3.0, 2.0, 3.0, 3.0]))
    _, std1, _ = group_mean_std(torch.tensor([5.0]), torch.tensor([0]))
    assert std1.item() == 0.0  # a group of one has no spread


def test_zero_variance_group_fraction():
    # groups: {1, 1} all equal, {0, 1} has signal, {2, 2, 2} all equal -> 2 of 3
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0])
    ids = torch.tensor([0, 0, 1, 1, 5, 5, 5])
    assert zero_variance_group_fraction(rewards, ids) == pytest.approx(2 / 3)
    assert zero_variance_group_fraction(torch.tensor([0.0, 1.0]), torch.tensor([4, 4])) == 0.0


def test_response_logp_and_entropy_equal_the_full_logits_path_chunked_or_not():
    """Logits computed only at response positions, in chunks under checkpointing, give
    the same log-probs, entropies and gradients as the full (B, T, V) computation."""
    from posttrain.models.logprobs import response_logp_and_entropy, token_entropy, token_logp

    torch.manual_seed(0)
    B, T, D, V = 3, 7, 8, 11
    head = torch.nn.Linear(D, V, bias=False)
    tokens = torch.randint(V, (B, T))
    mask = torch.zeros(B, T)
    mask[0, 2:5], mask[1, 1:7], mask[2, 4:6] = 1, 1, 1
    results = []
    for budget in (None, 2 * V):  # one chunk, and 2 positions per chunk (checkpointed)
        hidden = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1), requires_grad=True)
        if budget is None:
            logits = head(hidden)
            logp, entropy = token_logp(logits, tokens, 0.7) * mask, token_entropy(logits, 0.7) * mask
        else:
            logp, entropy = response_logp_and_entropy(hidden, head, tokens, mask, 0.7, logits_budget=budget)
        (logp.sum() + 0.5 * entropy.sum()).backward()
        results.append((logp.detach(), entropy.detach(), hidden.grad, head.weight.grad.clone()))
        head.weight.grad = None
    for full, chunked in zip(*results):
        torch.testing.assert_close(chunked, full, atol=1e-6, rtol=1e-5)
    assert (results[1][0][mask == 0] == 0).all() and (results[1][0][mask == 1] < 0).all()
