"""GDPO and entropy control against independent definitions, on fixed tensors: each reference's
formula is transcribed below from its source and run beside posttrain's code, and the numbers
(loss, gradient, advantages, selected tokens, coefficients) must agree.

    GDPO                 TRL 1.10.0.dev0 (huggingface/trl f2cd577, 2026-07-24), grpo_trainer.py,
                         multi_objective_aggregation="normalize_then_sum". The volcengine/verl
                         mirror (b178a3c, 2026-01-29, 0.8.0.dev) has no gdpo estimator; the
                         paper's own verl fork (NVlabs/GDPO, verl-GDPO/verl/trainer/ppo/ray_trainer.py)
                         whitens over tokens instead of sequences: equal-length rows make the two agree
    Clip-Cov, KL-Cov     verl b178a3c, verl/trainer/ppo/core_algos.py::compute_policy_loss_clip_cov,
                         compute_policy_loss_kl_cov
    high-entropy mask    TRL f2cd577, GRPOTrainer.get_high_entropy_mask and its "dapo" token-mean loss
    adaptive entropy     TRL f2cd577, GRPOTrainer's use_adaptive_entropy update (Skywork-OR1)

The versions the issue names, verl 0.9.1 and TRL 1.16.0, are run as code on these tensors by
tests/test_peer_oracles.py (`make peers-test`), and agree with everything transcribed here. What
they add: verl 0.9.1 has its own `gdpo` estimator, weighted like ours and TRL's but whitened over
response tokens like the paper's fork (the same constant factor at equal lengths; a token-weighted
centre otherwise); TRL 1.16's adaptive coefficient has a floor, entropy_coef_min (default 0, ours),
and measures the entropy over the whole accumulation window.
"""

import math

import pytest
import torch

from posttrain.algorithms.entropy_control import (
    AdaptiveEntropyController,
    TokenSelection,
    clip_cov_selection,
    draw_generator,
    high_entropy_mask,
    ppo_clipped,
    token_covariance,
)
from posttrain.algorithms.grpo import GRPO, per_term_advantages
from posttrain.types import PolicyOutputs, RolloutBatch

# --- fixed tensors: 4 rows of 7 positions, a prompt token first, responses of 6, 4, 5 and 6 -----
B, T = 4, 7
LENGTHS = [6, 4, 5, 6]
MASK = torch.tensor([[0.0] + [1.0] * n + [0.0] * (T - 1 - n) for n in LENGTHS])
_draw = torch.Generator().manual_seed(20260529)
OLD_LOGP = (-3.0 * torch.rand(B, T, generator=_draw)) * MASK
LOGP = (OLD_LOGP + 0.4 * torch.randn(B, T, generator=_draw)) * MASK  # ratios e^±0.4: some leave [0.8, 1.2]
ADV = torch.tensor([2.0, -1.5, 0.5, -0.7])[:, None] * MASK  # one advantage a row, as GRPO gives
ENTROPY = (4.0 * torch.rand(B, T, generator=_draw)) * MASK
TOKENS = torch.randint(0, 50, (B, T), generator=_draw)


def batch(adv: torch.Tensor = ADV) -> RolloutBatch:
    return RolloutBatch(tokens=TOKENS, attention_mask=(TOKENS >= 0).float(), response_mask=MASK,
                        old_logp=OLD_LOGP, rewards=torch.zeros(B), group_ids=torch.zeros(B, dtype=torch.long),
                        advantages=adv)


def posttrain_loss(selection: TokenSelection, eps: float = 0.2) -> tuple[float, torch.Tensor, dict]:
    """GRPO's loss (token-mean, no KL, no bonus) under `selection`: (value, d loss / d logp, metrics)."""
    algo = GRPO(loss_agg="token-mean", clip_eps_low=eps, clip_eps_high=eps)
    algo.token_selection = selection
    logp = LOGP.clone().requires_grad_(True)
    loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=ENTROPY), batch())
    loss.backward()
    assert logp.grad is not None
    return loss.item(), logp.grad, metrics


def reference_loss(per_token, logp: torch.Tensor) -> tuple[float, torch.Tensor]:
    """A reference's token-mean loss of `per_token(logp)` and its gradient."""
    logp = logp.clone().requires_grad_(True)
    loss = (per_token(logp) * MASK).sum() / MASK.sum()
    loss.backward()
    assert logp.grad is not None
    return loss.item(), logp.grad


def verl_masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / (mask.sum() + 1e-8)  # verl/utils/torch_functional.py


# --- GDPO ------------------------------------------------------------------------------------------

# 3 prompts × 4 samples; accuracy is sparse (0/1), format dense (varies in every group), length small
TERMS = torch.tensor([[1.0, 1.0, -0.10], [0.0, 1.0, -0.30], [0.0, 0.0, -0.05], [0.0, 1.0, -0.20],
                      [1.0, 1.0, -0.40], [1.0, 0.0, -0.10], [0.0, 1.0, -0.25], [0.0, 0.0, -0.15],
                      [0.0, 0.0, -0.05], [0.0, 1.0, -0.35], [0.0, 1.0, -0.10], [0.0, 0.0, -0.20]])
TERM_WEIGHTS = torch.tensor([1.0, 0.2, 0.5])
GROUPS = torch.arange(3).repeat_interleave(4)


def trl_normalize_then_sum(rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """TRL's GDPO branch: each function's rewards centred and scaled by its group's mean and
    Bessel std (+1e-4), weighted and summed, then the sum centred and scaled over the batch."""
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
    per_function = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-4)
    summed = (per_function.view(-1, rewards_per_func.shape[1]) * weights[None, :]).sum(dim=1)
    return (summed - summed.mean()) / (summed.std() + 1e-4)


def test_gdpo_advantages_match_trls_normalize_then_sum():
    rewards = (TERMS * TERM_WEIGHTS).sum(1)
    lengths = torch.tensor([3, 5, 2, 4] * 3)
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    gdpo = RolloutBatch(tokens=torch.zeros(12, 6, dtype=torch.long), attention_mask=mask, response_mask=mask,
                        old_logp=torch.zeros(12, 6), rewards=rewards, group_ids=GROUPS, reward_terms=TERMS,
                        reward_term_weights=TERM_WEIGHTS.expand(12, 3))
    adv = GRPO(adv_eps=1e-4).compute_advantages(gdpo)["advantages"]  # (12, 6)
    expected = trl_normalize_then_sum(TERMS, TERM_WEIGHTS, num_generations=4)
    assert torch.allclose(adv, expected[:, None] * mask, atol=1e-6)
    # and it is not GRPO's advantage of the summed reward: the decoupling changes the numbers
    summed = GRPO(adv_eps=1e-4).compute_advantages(RolloutBatch(**{**gdpo.__dict__, "reward_terms": None}))
    assert not torch.allclose(summed["advantages"], adv, atol=1e-2)


def nvlabs_verl_gdpo(terms: torch.Tensor, groups: torch.Tensor, length: int) -> torch.Tensor:
    """The paper's verl fork: each term through verl's GRPO estimator (group mean, torch.std,
    +1e-6), the unweighted sum copied onto the tokens, whitened over all response tokens
    ((x − mean) · rsqrt(unbiased var + 1e-8))."""
    per_term = []
    for k in range(terms.shape[1]):
        column = terms[:, k].clone()
        for g in groups.unique():
            members = groups == g
            column[members] = (terms[members, k] - terms[members, k].mean()) / (terms[members, k].std() + 1e-6)
        per_term.append(column)
    tokens = sum(per_term)[:, None].expand(-1, length).flatten()  # every row `length` tokens
    return ((tokens - tokens.mean()) * torch.rsqrt(tokens.var() + 1e-8)).view(-1, length)[:, 0]


def test_with_equal_lengths_and_weights_the_papers_verl_fork_differs_only_by_the_token_count_in_its_std():
    # its whitening counts B·L tokens (Bessel: B·L − 1) where ours counts B sequences (B − 1)
    ours = per_term_advantages(TERMS, torch.ones(12, 3), GROUPS, "group", 1e-6)
    theirs = nvlabs_verl_gdpo(TERMS, GROUPS, length=5)
    assert torch.allclose(theirs, ours * math.sqrt((12 * 5 - 1) / (5 * (12 - 1))), atol=1e-5)


def test_a_terms_scale_is_normalised_away_and_its_weight_is_not():
    base = per_term_advantages(TERMS, TERM_WEIGHTS.expand(12, 3), GROUPS, "group", 1e-6)
    rescaled = TERMS * torch.tensor([1.0, 10.0, 3.0])  # format worth 10 a sample, length 3× longer
    assert torch.allclose(per_term_advantages(rescaled, TERM_WEIGHTS.expand(12, 3), GROUPS, "group", 1e-6),
                          base, atol=1e-4)
    reweighted = per_term_advantages(TERMS, torch.tensor([1.0, 2.0, 0.5]).expand(12, 3), GROUPS, "group", 1e-6)
    assert not torch.allclose(reweighted, base, atol=1e-2)
    assert base.mean().abs() < 1e-6 and base.std() == pytest.approx(1.0, abs=1e-5)  # whitened over the batch


# --- Clip-Cov ---------------------------------------------------------------------------------------


def verl_clip_cov(logp: torch.Tensor, eps: float, ratio: float, lb: float, ub: float) -> torch.Tensor:
    """compute_policy_loss_clip_cov's per-token loss. Its draw is random; the callers' settings
    make every candidate drawn (the test asserts so), which makes it deterministic."""
    prob_ratio = torch.exp(logp - OLD_LOGP)
    unclipped = -ADV * prob_ratio
    clipped_loss = -ADV * torch.clamp(prob_ratio, 1 - eps, 1 + eps)
    clipped_by_ppo = (clipped_loss > unclipped) & (MASK > 0)
    cov = (ADV - verl_masked_mean(ADV, MASK)) * (logp - verl_masked_mean(logp.detach(), MASK))
    cov = cov.detach().masked_fill(MASK == 0, -torch.inf).masked_fill(clipped_by_ppo, -torch.inf)
    to_clip = max(int(ratio * MASK.sum().item()), 1)
    candidates = torch.nonzero((cov < ub) & (cov > lb) & (MASK > 0))
    assert 0 < len(candidates) <= to_clip, "the fixed tensors must make verl's random draw take every candidate"
    keep = torch.ones_like(ADV)
    keep[candidates[:, 0], candidates[:, 1]] = 0
    return torch.maximum(unclipped, clipped_loss) * keep


def test_clip_cov_matches_verl():
    settings = dict(ratio=0.5, lb=0.3, ub=2.5)  # a band the fixed tensors populate
    selection = TokenSelection(cov="clip_cov", cov_ratio=settings["ratio"], clip_cov_low=settings["lb"],
                               clip_cov_high=settings["ub"])
    value, grad, metrics = posttrain_loss(selection)
    expected, expected_grad = reference_loss(lambda logp: verl_clip_cov(logp, 0.2, **settings), LOGP)
    assert value == pytest.approx(expected, rel=1e-6)
    assert torch.allclose(grad, expected_grad, atol=1e-7)
    # the tokens verl detaches are the ones whose gradient is 0 here though PPO's clip left them alone
    prob_ratio = torch.exp(LOGP - OLD_LOGP)
    cov = token_covariance(LOGP, ADV, MASK)
    band = (cov > 0.3) & (cov < 2.5) & (MASK > 0) & ~ppo_clipped(prob_ratio, ADV, MASK, 0.2, 0.2)
    assert ppo_clipped(prob_ratio, ADV, MASK, 0.2, 0.2)[(cov > 0.3) & (cov < 2.5)].any(), "a clipped token in the band"
    assert (grad[band] == 0).all() and metrics["clip_cov_frac"] == pytest.approx(band.sum().item() / MASK.sum().item())


def test_clip_cov_draws_its_share_of_the_candidates_the_same_way_for_the_same_batch():
    cov = token_covariance(LOGP, ADV, MASK)
    clipped = ppo_clipped(torch.exp(LOGP - OLD_LOGP), ADV, MASK, 0.2, 0.2)
    candidates = (cov > 0.0) & (cov < 10.0) & (MASK > 0) & ~clipped
    picks = [clip_cov_selection(cov, clipped, MASK, 0.1, 0.0, 10.0, draw_generator(TOKENS)) for _ in range(2)]
    assert int(0.1 * MASK.sum().item()) == 2 < candidates.sum().item()  # fewer drawn than there are candidates
    assert picks[0].sum().item() == 2 and (picks[0] <= candidates).all() and torch.equal(picks[0], picks[1])


# --- KL-Cov -----------------------------------------------------------------------------------------


def verl_kl_cov(logp: torch.Tensor, ratio: float, coef: float) -> torch.Tensor:
    """compute_policy_loss_kl_cov's per-token loss: −A · r everywhere (no clip), plus
    coef · |log r| on the top ratio share of the response tokens by cov."""
    log_ratio = logp - OLD_LOGP
    loss = -ADV * torch.exp(log_ratio)
    penalised = loss + coef * log_ratio.abs()
    valid = MASK > 0
    flat_positions = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    adv_valid, logp_valid = ADV[valid].detach(), logp[valid].detach()
    cov = (adv_valid - adv_valid.mean()) * (logp_valid - logp_valid.mean())
    top = flat_positions[torch.topk(cov, max(1, int(len(cov) * ratio)), largest=True).indices]
    rows, cols = top // T, top % T
    loss = loss.clone()
    loss[rows, cols] = penalised[rows, cols]
    return loss


def test_kl_cov_matches_verl():
    value, grad, metrics = posttrain_loss(TokenSelection(cov="kl_cov", cov_ratio=0.2, kl_cov_coef=0.7))
    expected, expected_grad = reference_loss(lambda logp: verl_kl_cov(logp, 0.2, 0.7), LOGP)
    assert value == pytest.approx(expected, rel=1e-6)
    assert torch.allclose(grad, expected_grad, atol=1e-7)
    assert metrics["kl_cov_frac"] == pytest.approx(int(0.2 * 21) / 21) and metrics["clipfrac"] == 0.0  # no clip


# --- high-entropy tokens ----------------------------------------------------------------------------


def trl_high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """get_high_entropy_mask on one process: the threshold quantile of the valid entropies."""
    local = entropies[mask.bool()].float()
    entropy_threshold = torch.quantile(local, threshold)
    return ((entropies * mask.float()) >= entropy_threshold) & mask.bool()


@pytest.mark.parametrize("top", [0.0, 0.2, 0.5, 1.0])
def test_high_entropy_mask_matches_trl(top):
    ours = high_entropy_mask(ENTROPY, MASK, top)
    assert torch.equal(ours, trl_high_entropy_mask(ENTROPY, MASK, 1 - top))
    assert ours.sum().item() == {0.0: 1, 0.2: 5, 0.5: 11, 1.0: 21}[top]  # of the 21 response tokens


def test_training_the_top_fifth_matches_trls_token_mean_loss():
    value, grad, metrics = posttrain_loss(TokenSelection(top_quantile=0.2))

    def trl_loss(logp: torch.Tensor) -> torch.Tensor:  # its per-token loss, times the entropy mask
        ratio = torch.exp(logp - OLD_LOGP)
        per_token = -torch.min(ratio * ADV, torch.clamp(ratio, 0.8, 1.2) * ADV)
        return per_token * trl_high_entropy_mask(ENTROPY, MASK, 0.8)

    expected, expected_grad = reference_loss(trl_loss, LOGP)
    assert value == pytest.approx(expected, rel=1e-6) and torch.allclose(grad, expected_grad, atol=1e-7)
    assert metrics["entropy_kept_frac"] == pytest.approx(5 / 21)


# --- the adaptive coefficient -----------------------------------------------------------------------


def trl_adaptive_entropy(entropies: list[float], coef: float, target: float, delta: float, coef_max: float) -> list[float]:
    """The coefficient each optimizer step applies under TRL's use_adaptive_entropy (one
    accumulation window a step): gated on the last measured entropy, which starts at +inf."""
    last, applied = float("inf"), []
    for entropy in entropies:
        applied.append(coef if last <= target else 0.0)
        coef = min(coef + delta, coef_max) if entropy <= target else max(coef - delta, 0.0)
        last = entropy
    return applied


def test_adaptive_entropy_coefficient_matches_trl():
    entropies = [0.5, 0.3, 0.25, 0.1, 0.15, 0.4, 0.35, 0.1, 0.05, 0.05, 0.05, 0.3]
    controller = AdaptiveEntropyController(0.002, target=0.2, delta=0.005, coef_max=0.012)
    ours = [controller.applied()] + [controller.update(entropy) for entropy in entropies[:-1]]
    assert ours == pytest.approx(trl_adaptive_entropy(entropies, 0.002, 0.2, 0.005, 0.012))
    assert max(ours) == pytest.approx(0.012)  # the ceiling was reached and held
