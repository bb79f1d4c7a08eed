"""Tests for PPO: token rewards and GAE by hand and against a plain loop, γ = λ = 1 GAE =
reward-to-go − V, tokens masked in the middle (tool output) pass through, the clipped
value loss by hand and its zero gradient, explained variance, and the one-epoch ratio-1
reduction to the policy-gradient loss."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algorithms.core import masked_mean, masked_var, policy_gradient_loss
from posttrain.algorithms.ppo import (
    PPO,
    clipped_value_loss,
    explained_variance,
    gae,
    last_token_mask,
    token_level_rewards,
)
from posttrain.types import PolicyOutputs, RolloutBatch


def test_last_token_and_token_rewards_by_hand():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1.0]])
    assert last_token_mask(mask).tolist() == [[0, 0, 0, 0, 1, 0], [0] * 6, [0, 0, 0, 0, 0, 1]]
    kl = torch.full((3, 6), 0.5)
    r = token_level_rewards(torch.tensor([2.0, 3.0, 1.0]), mask, kl, kl_coef=0.1)
    # −0.1 · 0.5 = −0.05 on response tokens, + the reward on the last one; 0 elsewhere
    assert torch.allclose(r[0], torch.tensor([0, -0.05, -0.05, 0, 1.95, 0]))
    assert torch.equal(r[1], torch.zeros(6))


def test_gae_by_hand():
    # 3 response tokens, r = [0, 0, 1], V = [.5, .6, .7], γ = 1, λ = .5
    # δ2 = 1 + 0 − .7 = .3  (terminal: V after the last token is 0)   A2 = .3
    # δ1 = 0 + .7 − .6 = .1                                           A1 = .1 + .5 · .3 = .25
    # δ0 = 0 + .6 − .5 = .1                                           A0 = .1 + .5 · .25 = .225
    mask = torch.tensor([[0, 1, 1, 1, 0.0]])
    rewards = torch.tensor([[0, 0, 0, 1, 0.0]])
    values = torch.tensor([[9, 0.5, 0.6, 0.7, 9.0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0, 0.225, 0.25, 0.3, 0]]))
    assert torch.allclose(ret, torch.tensor([[0, 0.725, 0.85, 1.0, 0]]))


def _loop_gae(rewards, values, mask, gamma, lam):
    """Textbook GAE on each row's response positions taken out in order (gaps skipped)."""
    adv = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        idx = [t for t in range(rewards.shape[1]) if mask[b, t] > 0]
        running = 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            next_v = values[b, idx[k + 1]].item() if k + 1 < len(idx) else 0.0
            delta = rewards[b, t].item() + gamma * next_v - values[b, t].item()
            running = delta + gamma * lam * running
            adv[b, t] = running
    return adv


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), gamma=st.sampled_from([1.0, 0.9]), lam=st.sampled_from([1.0, 0.95, 0.0]))
def test_gae_matches_a_loop_with_gaps_in_the_mask(seed, gamma, lam):
    gen = torch.Generator().manual_seed(seed)
    B, T = 3, 8
    mask = (torch.rand(B, T, generator=gen) > 0.4).double()  # gaps anywhere, like tool tokens
    rewards = torch.randn(B, T, generator=gen, dtype=torch.float64)
    values = torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv, ret = gae(rewards, values, mask, gamma, lam)
    expected = _loop_gae(rewards, values, mask, gamma, lam)
    assert torch.allclose(adv, expected, atol=1e-12)
    assert torch.allclose(ret, torch.where(mask > 0, expected + values, 0.0), atol=1e-12)


def test_gamma_lambda_one_is_reward_to_go_minus_value():
    torch.manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0.0]], dtype=torch.float64)
    rewards = torch.randn(2, 6, dtype=torch.float64) * mask
    values = torch.randn(2, 6, dtype=torch.float64)
    adv, ret = gae(rewards, values, mask, 1.0, 1.0)
    reward_to_go = rewards.flip(-1).cumsum(-1).flip(-1)  # Σ_{s ≥ t} r_s (rewards are 0 off the mask)
    assert torch.allclose(adv, torch.where(mask > 0, reward_to_go - values, 0.0))
    assert torch.allclose(ret, torch.where(mask > 0, reward_to_go, 0.0))


def test_tool_tokens_in_the_middle_pass_the_running_advantage_through_unchanged():
    # the same 3-token response, once contiguous and once with 2 tool tokens (mask 0) inside;
    # whatever the tool positions hold (even inf) cannot change the advantages
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    adv, _ = gae(r, v, torch.ones(1, 3), 1.0, 0.9)
    mask = torch.tensor([[1, 0, 0, 1, 1.0]])
    r_gap = torch.tensor([[0.0, torch.inf, 5.0, 0.0, 1.0]])
    v_gap = torch.tensor([[0.5, -torch.inf, 3.0, 0.6, 0.7]])
    adv_gap, ret_gap = gae(r_gap, v_gap, mask, 1.0, 0.9)
    assert torch.allclose(adv_gap[0, [0, 3, 4]], adv[0])
    assert (adv_gap[0, 1:3] == 0).all() and (ret_gap[0, 1:3] == 0).all()


def test_clipped_value_loss_by_hand_and_its_zero_gradient():
    # V_old = 0, R = 1, c = 0.2. token 0: V = 0.5 -> clipped 0.2; errors .25 vs .64 -> max .64,
    # the clipped branch: gradient 0. token 1: V = 0.1 (inside) -> error .81 both; gradient V − R.
    values = torch.tensor([[0.5, 0.1]], requires_grad=True)
    old, ret, mask = torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)
    loss, clipfrac = clipped_value_loss(values, old, ret, mask, value_clip=0.2)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81) / 2)
    assert clipfrac == 0.5
    loss.backward()
    assert values.grad[0, 0].item() == 0.0
    assert values.grad[0, 1].item() == pytest.approx((0.1 - 1.0) / 2)  # ½ · 2(V − R) / 2 tokens
    plain, _ = clipped_value_loss(values.detach(), old, ret, mask, value_clip=None)
    assert plain.item() == pytest.approx(0.5 * (0.25 + 0.81) / 2)


def test_explained_variance_by_hand():
    mask = torch.tensor([[1, 1, 1, 0.0]])
    ret = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    assert explained_variance(ret, ret.clone(), mask) == pytest.approx(1.0)
    # V = mean(R) = 2: Var(R − V) = Var(R) -> 0
    assert explained_variance(ret, torch.full((1, 4), 2.0), mask) == pytest.approx(0.0)
    # V = [1, 1, 1]: R − V = [0, 1, 2], same variance -> 0; V = [3, 2, 1]: R − V = [−2, 0, 2], var 4 vs 1 -> −3
    assert explained_variance(ret, torch.tensor([[3.0, 2.0, 1.0, 0.0]]), mask) == pytest.approx(-3.0)


def _batch(seed=0, B=4, T=7):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T)
    for b in range(B):
        mask[b, 2 : 3 + (b * 2) % 5] = 1
    old = torch.where(mask > 0, -torch.rand(B, T, generator=gen) * 2, 0.0)
    return RolloutBatch(tokens=torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T),
                        response_mask=mask, old_logp=old, rewards=torch.tensor([1.0, 0.0, 0.5, 1.0])[:B],
                        group_ids=torch.arange(B), ref_logp=old - 0.1 * torch.rand(B, T, generator=gen) * mask,
                        values=torch.rand(B, T, generator=gen) * mask)


def test_compute_advantages_whitens_and_places_the_kl_penalty():
    batch = _batch()
    out = PPO(kl_coef=0.05, lam=0.9).compute_advantages(batch)
    m = batch.response_mask
    assert masked_mean(out["advantages"], m).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(out["advantages"], m).item() == pytest.approx(1.0, abs=1e-5)
    kl = batch.old_logp - batch.ref_logp
    r = token_level_rewards(batch.rewards, m, kl, 0.05)
    raw, ret = gae(r, batch.values, m, 1.0, 0.9)
    assert torch.allclose(out["returns"], ret)
    assert torch.allclose(PPO(kl_coef=0.05, lam=0.9, whiten_advantages=False).compute_advantages(batch)["advantages"], raw)
    with pytest.raises(ValueError, match="values"):
        PPO().compute_advantages(dataclasses.replace(batch, values=None))
    with pytest.raises(ValueError, match="ref_logp"):
        PPO(kl_coef=0.1).compute_advantages(dataclasses.replace(batch, ref_logp=None))


def test_one_epoch_at_ratio_one_the_policy_loss_is_the_policy_gradient_loss():
    algo = PPO()
    batch = _batch()
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    logp = batch.old_logp.clone().requires_grad_(True)
    values = batch.values.clone().requires_grad_(True)
    loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros(4, 7), values=values), batch)
    (grad,) = torch.autograd.grad(loss, logp)
    logp_pg = batch.old_logp.clone().requires_grad_(True)
    pg = policy_gradient_loss(logp_pg, batch.advantages, batch.response_mask, "token-mean")
    (grad_pg,) = torch.autograd.grad(pg, logp_pg)
    assert torch.allclose(grad, grad_pg, atol=1e-7)
    assert metrics["pg_loss"] == pytest.approx(masked_mean(-batch.advantages, batch.response_mask).item(), abs=1e-6)
    assert metrics["clipfrac"] == 0.0 and metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["vf_clipfrac"] == 0.0  # V = V_old: nothing to clip
    # the total is pg + vf_coef · value loss
    assert loss.item() == pytest.approx(metrics["pg_loss"] + 0.5 * metrics["value_loss"], abs=1e-6)


def test_masked_positions_cannot_change_the_loss():
    algo = PPO(entropy_coef=0.01)
    batch = _batch(1)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    off = batch.response_mask == 0
    logp = batch.old_logp + 0.1 * batch.response_mask
    values = batch.values + 0.3 * batch.response_mask

    def run(logp, values, batch):
        logp, values = logp.clone().requires_grad_(True), values.clone().requires_grad_(True)
        loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.ones(4, 7), values=values), batch)
        loss.backward()
        return loss, metrics, logp.grad, values.grad

    a = run(logp, values, batch)
    noisy = dataclasses.replace(batch, values=torch.where(off, 1e9, batch.values),
                                returns=torch.where(off, torch.inf, batch.returns),
                                advantages=torch.where(off, torch.inf, batch.advantages))
    b = run(torch.where(off, -torch.inf, logp), torch.where(off, torch.nan, values), noisy)
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2]) and torch.equal(a[3], b[3])
    assert {k: v for k, v in a[1].items()} == {k: v for k, v in b[1].items()}
    # and in compute_advantages: garbage in rewards/values off the response does not reach GAE
    clean = algo.compute_advantages(_batch(1))
    dirty = algo.compute_advantages(dataclasses.replace(_batch(1), values=torch.where(off, 1e9, _batch(1).values)))
    assert torch.equal(clean["advantages"], dirty["advantages"]) and torch.equal(clean["returns"], dirty["returns"])


@pytest.mark.parametrize("params, field", [({"gamma": 1.5}, "gamma"), ({"lam": -0.1}, "lam"), ({"vf_coef": 0.0}, "vf_coef"),
                                           ({"value_clip": 0.0}, "value_clip"), ({"kl_coef": -1.0}, "kl_coef")])
def test_bad_values_name_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        PPO(**params)
    assert PPO().uses_critic and not PPO().uses_reference and PPO(kl_coef=0.1).uses_reference
