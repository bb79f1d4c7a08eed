"""SAPO, GMPO and DPPO (Binary-TV, Binary-KL) on fixed tensors: numbers worked by hand, then the
same losses, gradients and clip counts from verl's and TRL's definitions, transcribed below in our
own words from their source, with their defaults.

Sources transcribed (the versions the source mirrors held when this was written). The issue names
verl 0.9.1 and TRL 1.16.0: tests/test_peer_oracles.py runs those versions' own functions on these
tensors (`make peers-test`) and they give the numbers below, so the transcription still holds for
them; the one thing 0.9.1 makes plain is that DPPO's cap is clip_ratio_c, 3.0 in a real ActorConfig
(the 20 below is the code's fallback for a config without the key; ours is 20):
  verl  volcengine/verl verl/trainer/ppo/core_algos.py at b178a3cd5 (verl/version/version 0.8.0.dev,
        Jan 2026): compute_policy_loss_sapo, compute_policy_loss_geo_mean, agg_loss, and
        verl/trainer/config/actor/actor.yaml (tau_pos 1.0, tau_neg 1.05, clip_ratio 0.2,
        clip_ratio_c 3.0). compute_policy_loss_dppo_tv / _dppo_kl were added upstream after that
        snapshot (docs/algo/dppo.md, 02/25/2026); read from a public verl fork carrying them
        unchanged, with examples/dppo_trainer/run_qwen30b_dppo.sh (δ 0.15 TV, 0.05 KL).
  TRL   huggingface/trl at f2cd57710 (VERSION 1.10.0.dev0): trl/trainer/grpo_trainer.py's
        loss_type="sapo" branch and its "grpo"/"sapo" aggregation, trl/trainer/grpo_config.py
        (sapo_temperature_pos 1.0, sapo_temperature_neg 1.05), trl/experimental/gmpo/ (GMPOTrainer
        ._compute_loss; GMPOConfig epsilon 0.4, log space). TRL has no DPPO.
Everything runs in float64 so that verl's +1e-8 guards are the only difference, far below the
tolerances."""

import dataclasses
import json
import math

import pytest
import torch

from posttrain.algorithms import ALGORITHMS, make_algorithm
from posttrain.algorithms.cispo import CISPO
from posttrain.algorithms.dppo import DPPOBinaryKL, DPPOBinaryTV
from posttrain.cli import main
from posttrain.types import PolicyOutputs, RolloutBatch
from tests.test_pipeline import TINY

F64 = torch.float64

# Four responses after one prompt token (column 0), of 3, 2, 4 and 3 tokens. Each token's
# probability under π_old and under π_θ, chosen to hit every case:
#   row 0, A = +1.0   a likely token up a little; a very likely one down (against the push);
#                     a rare one from 0.001 to 0.1 (ratio 100, yet p moved only 0.099)
#   row 1, A = −0.5   0.8 → 0.6, a fall of 0.2 under a negative advantage; 0.3 → 0.35
#   row 2, A = +0.8   0.2 → 0.4, a rise of 0.2 under a positive advantage (ratio only 2); ...
#   row 3, A = −1.2   0.6 → 0.3, a fall of 0.3 (log-ratio −0.69); two small rises
OLD_P = [[0.5, 0.9, 0.001], [0.8, 0.3], [0.2, 0.95, 0.4, 0.05], [0.6, 0.01, 0.5]]
NEW_P = [[0.6, 0.7, 0.1], [0.6, 0.35], [0.4, 0.97, 0.2, 0.05], [0.3, 0.012, 0.55]]
ADV = [1.0, -0.5, 0.8, -1.2]
B, T = 4, 5


def layout(rows: list[list[float]], fill: float = 0.0) -> torch.Tensor:
    """Per-response-token values in the (B, T) layout, `fill` off the response."""
    out = torch.full((len(rows), T), fill, dtype=F64)
    for i, values in enumerate(rows):
        out[i, 1: 1 + len(values)] = torch.tensor(values, dtype=F64)
    return out


MASK = layout([[1.0] * len(r) for r in OLD_P])
OLD_LOGP = torch.log(layout(OLD_P, fill=1.0))  # (B, T), 0 off the response
NEW_LOGP = torch.log(layout(NEW_P, fill=1.0))
ADV_TOKENS = torch.tensor(ADV, dtype=F64)[:, None] * MASK  # (B, T) GRPO's: A_i on every response token


def ours(name: str, logp=NEW_LOGP, old_logp=OLD_LOGP, adv=ADV_TOKENS, mask=MASK, **params):
    """(loss, d loss / d logp, metrics) from the registered algorithm, its defaults unless `params`."""
    logp = logp.clone().requires_grad_(True)
    batch = RolloutBatch(tokens=torch.zeros(mask.shape, dtype=torch.long), attention_mask=torch.ones_like(mask),
                         response_mask=mask, old_logp=old_logp, rewards=torch.zeros(mask.shape[0], dtype=F64),
                         group_ids=torch.zeros(mask.shape[0], dtype=torch.long), advantages=adv)
    loss, metrics = make_algorithm(name, **params).compute_loss(
        PolicyOutputs(logp=logp, entropy=torch.zeros_like(mask)), batch)
    loss.backward()
    return loss.detach(), logp.grad, metrics


def theirs(fn, *args, **kwargs):
    """(loss, d loss / d logp, metrics) from a transcribed reference `fn(logp, ...)`."""
    logp = NEW_LOGP.clone().requires_grad_(True)
    loss, metrics = fn(logp, *args, **kwargs)
    loss.backward()
    return loss.detach(), logp.grad, metrics


def assert_same(a, b):
    (loss_a, grad_a, _), (loss_b, grad_b, _) = a, b
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(grad_a, grad_b, rtol=1e-7, atol=1e-9)


# --- verl's definitions -----------------------------------------------------------------------

VERL_TAU_POS, VERL_TAU_NEG = 1.0, 1.05  # actor.yaml
VERL_DPPO_CAP = 20.0  # the dppo losses' config.get("clip_ratio_c", 20.0) fallback (ActorConfig and actor.yaml: 3.0)


def verl_masked_mean(x, mask):
    return (x * mask).sum() / (mask.sum() + 1e-8)


def verl_agg(loss_mat, mask, mode):
    """verl's agg_loss on one batch (dp_size 1, its own token and sequence counts)."""
    if mode == "token-mean":
        return (loss_mat * mask).sum() / mask.sum()
    seq_len = mask.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = (loss_mat * mask).sum(-1) / (seq_len + 1e-8)
    elif mode == "seq-mean-token-sum":
        per_seq = (loss_mat * mask).sum(-1)
    else:
        raise NotImplementedError(mode)
    non_empty = (seq_len > 0).to(loss_mat.dtype)  # a response with no tokens is not counted
    return (per_seq * non_empty).sum() / non_empty.sum()


def verl_sapo(logp, old_logp, adv, mask, tau_pos=VERL_TAU_POS, tau_neg=VERL_TAU_NEG):
    """The token ratio (log clamped to ±20), a temperature by the advantage's sign (> 0: tau_pos),
    gate σ(τ (r − 1)) · 4/τ, loss −gate · A, always seq-mean-token-mean."""
    ratio = torch.exp(torch.clamp(logp - old_logp, -20.0, 20.0))
    tau = torch.where(adv > 0, torch.tensor(tau_pos, dtype=F64), torch.tensor(tau_neg, dtype=F64))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return verl_agg(-gate * adv, mask, "seq-mean-token-mean"), {}


def verl_geo_mean(logp, old_logp, adv, mask, clip_low=0.4, clip_high=0.4):
    """Log-ratio x (unclamped); with s = sign(A), s · min(s x, s · clamp(x, −low, high)); the
    row's ratio exp(Σ x' / (n + 1e-8)) and advantage Σ A / (n + 1e-8); loss mean_rows(−A · ratio).
    Its metrics: tokens with x outside the range, split by the advantage's sign."""
    x = logp - old_logp
    sign = torch.sign(adv)
    held = torch.clamp(x, -clip_low, clip_high)
    kept = sign * torch.minimum(sign * x, sign * held)
    n = mask.sum(-1)
    ratio = torch.exp((kept * mask).sum(-1) / (n + 1e-8))
    row_adv = (adv * mask).sum(-1) / (n + 1e-8)
    outside = (x != held).to(F64)
    return torch.mean(-row_adv * ratio), {
        "pg_clipfrac": verl_masked_mean(outside * (adv > 0), mask).item(),
        "pg_clipfrac_lower": verl_masked_mean(outside * (adv < 0), mask).item()}


def verl_dppo(logp, old_logp, adv, mask, divergence, low, high, cap=VERL_DPPO_CAP, mode="token-mean"):
    """ratio (log clamped to ±20) truncated at `cap` and detached; a detached 0/1 mask of the
    tokens inside the trust region; loss −A · min(r, cap) · log π · mask, aggregated by `mode`."""
    ratio = torch.exp(torch.clamp(logp - old_logp, -20.0, 20.0))
    weight = torch.clamp(ratio, max=cap).detach()
    p, p_old = torch.exp(logp), torch.exp(old_logp)
    if divergence == "tv":
        valid = torch.where(adv > 0, (p - p_old) <= high, (p - p_old) >= -low)
    else:
        kl = p_old * (old_logp - logp) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
        valid = torch.where(adv > 0, (kl <= high) | (p <= p_old), (kl <= low) | (p >= p_old))
    valid = valid.detach().to(F64)
    loss = verl_agg(-adv * weight * logp * valid, mask, mode)
    return loss, {"pg_clipfrac": verl_masked_mean(1.0 - valid, mask).item(),
                  "pg_clipfrac_lower": verl_masked_mean((ratio > cap).to(F64) * valid, mask).item()}


# --- TRL's definitions ------------------------------------------------------------------------

TRL_SAPO_TEMPERATURE_POS, TRL_SAPO_TEMPERATURE_NEG = 1.0, 1.05  # GRPOConfig
TRL_GMPO_EPSILON = 0.4  # GMPOConfig, log space; epsilon_high defaults to it


def trl_sapo(logp, old_logp, row_adv, mask):
    """Token-level coef = exp(log-ratio) (no clamp), temperature by sign (> 0: pos), soft coef
    σ(t (coef − 1)) · 4/t, per-token loss −soft · A; mean over rows of each row's token mean,
    the row's count clamped at 1."""
    adv = row_adv[:, None]
    coef = torch.exp(logp - old_logp)
    # (as tensors of the batch's dtype: torch.where on two Python floats would round them to float32)
    t = torch.where(adv > 0, torch.tensor(TRL_SAPO_TEMPERATURE_POS, dtype=F64), torch.tensor(TRL_SAPO_TEMPERATURE_NEG, dtype=F64))
    per_token = -torch.sigmoid(t * (coef - 1)) * 4 / t * adv
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean(), {}


def trl_gmpo(logp, old_logp, row_adv, mask, eps_low=TRL_GMPO_EPSILON, eps_high=TRL_GMPO_EPSILON):
    """Log-ratio clamped into [−eps_low, eps_high]; min with the raw one where A > 0, max
    otherwise; the row's mean over its tokens (count clamped at 1), exp; loss mean(−coef · A).
    region_mean: tokens below −eps_low with A < 0 or above eps_high with A > 0."""
    adv = row_adv[:, None]
    log_ratio = logp - old_logp
    held = torch.clamp(log_ratio, min=-eps_low, max=eps_high)
    clipped = torch.where(adv > 0, torch.minimum(log_ratio, held), torch.maximum(log_ratio, held))
    coef = torch.exp((clipped * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))
    region = ((log_ratio < -eps_low) & (adv < 0)) | ((log_ratio > eps_high) & (adv > 0))
    return (-coef * row_adv).mean(), {"region_mean": ((region * mask).sum() / mask.sum()).item()}


ROW_ADV = torch.tensor(ADV, dtype=F64)


# --- by hand ----------------------------------------------------------------------------------


def one_row(log_ratios: list[float], adv: float, old_p: float = 0.5):
    """One response whose tokens all had probability old_p under π_old, and the given log-ratios."""
    n = len(log_ratios)
    old = torch.full((1, n), math.log(old_p), dtype=F64)
    return dict(logp=old + torch.tensor([log_ratios], dtype=F64), old_logp=old,
                adv=torch.full((1, n), adv, dtype=F64), mask=torch.ones(1, n, dtype=F64))


def test_sapo_by_hand():
    # at r = 1 the gate is σ(0) · 4/τ = 2/τ and its slope is 1: the plain policy gradient
    loss, grad, _ = ours("sapo", **one_row([0.0], +1.0))
    assert loss.item() == pytest.approx(-2.0) and grad.item() == pytest.approx(-1.0)
    loss, grad, _ = ours("sapo", **one_row([0.0], -1.0))
    assert loss.item() == pytest.approx(2.0 / 1.05) and grad.item() == pytest.approx(1.0)  # τ_neg = 1.05
    # r = e: gate σ(e − 1) · 4 = 4 / (1 + e^−(e−1)); its slope in r, 4 σ (1 − σ) = 0.516, is the share
    # of the unclipped surrogate's gradient (r · ∇ log π = e · ∇ log π) the token keeps
    sigma = 1 / (1 + math.exp(-(math.e - 1)))
    loss, grad, metrics = ours("sapo", **one_row([1.0], +1.0))
    assert loss.item() == pytest.approx(-4 * sigma)
    assert metrics["gate_slope_mean"] == pytest.approx(4 * sigma * (1 - sigma)) == pytest.approx(0.5158, abs=1e-4)
    assert grad.item() == pytest.approx(-4 * sigma * (1 - sigma) * math.e)


def test_gmpo_by_hand():
    # A > 0, log-ratios 0.2 and 0.6: the second is held at 0.4, so the row's ratio is e^0.3 and
    # only the first token's log-prob gets gradient, −e^0.3 / 2
    loss, grad, metrics = ours("gmpo", **one_row([0.2, 0.6], +1.0))
    assert loss.item() == pytest.approx(-math.exp(0.3))
    torch.testing.assert_close(grad, torch.tensor([[-math.exp(0.3) / 2, 0.0]], dtype=F64))
    assert metrics["clipfrac"] == 0.5 and metrics["geo_ratio_mean"] == pytest.approx(math.exp(0.3))
    # A < 0: a rise is never held (the pessimistic side), a fall below −0.4 is
    loss, grad, metrics = ours("gmpo", **one_row([0.6, -0.8], -1.0))
    assert loss.item() == pytest.approx(math.exp((0.6 - 0.4) / 2))
    torch.testing.assert_close(grad, torch.tensor([[math.exp(0.1) / 2, 0.0]], dtype=F64))
    # the outlier's pull is its log over the length: ten tokens, one at ratio e^5, clip off
    loss, _, _ = ours("gmpo", **one_row([5.0] + [0.0] * 9, +1.0), log_clip_high=10.0)
    assert loss.item() == pytest.approx(-math.exp(0.5))  # GRPO's arithmetic mean would be (e^5 + 9) / 10 = 15.7


def test_dppo_tv_by_hand():
    # A > 0; token 0: 0.5 → 0.6 (a rise of 0.1, inside 0.15), ratio 1.2; token 1: 0.2 → 0.4 (a rise
    # of 0.2: masked). token-mean over both: −(1.2 · log 0.6 + 0) / 2, gradient −1.2 / 2 on token 0 only
    old = torch.log(torch.tensor([[0.5, 0.2]], dtype=F64))
    new = torch.log(torch.tensor([[0.6, 0.4]], dtype=F64))
    row = dict(logp=new, old_logp=old, adv=torch.ones(1, 2, dtype=F64), mask=torch.ones(1, 2, dtype=F64))
    loss, grad, metrics = ours("dppo_tv", **row)
    assert loss.item() == pytest.approx(-1.2 * math.log(0.6) / 2) == pytest.approx(0.306495, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.6, 0.0]], dtype=F64))
    assert metrics["trust_region_maskfrac"] == 0.5
    # the rare token 0.001 → 0.1 (ratio 100) stays inside the TV region (it moved 0.099), its weight
    # truncated at 20; the binary KL of that move, 0.0997, is past δ = 0.05: dppo_kl masks it
    rare = dict(logp=torch.log(torch.tensor([[0.1]], dtype=F64)), old_logp=torch.log(torch.tensor([[0.001]], dtype=F64)),
                adv=torch.ones(1, 1, dtype=F64), mask=torch.ones(1, 1, dtype=F64))
    loss, grad, metrics = ours("dppo_tv", **rare)
    assert loss.item() == pytest.approx(-20 * math.log(0.1)) and grad.item() == pytest.approx(-20.0)
    assert metrics["is_clipfrac"] == 1.0 and metrics["trust_region_maskfrac"] == 0.0
    kl = 0.001 * math.log(0.001 / 0.1) + 0.999 * math.log(0.999 / 0.9)
    assert kl == pytest.approx(0.0997, abs=1e-4)
    loss, grad, metrics = ours("dppo_kl", **rare)
    assert loss.item() == 0.0 and grad.item() == 0.0 and metrics["trust_region_maskfrac"] == 1.0


# --- the references' numbers ------------------------------------------------------------------
# Each expected number below was printed from the transcribed reference on the tensors above;
# the test checks that the reference still gives it and that ours gives it too.

EXPECTED_LOSS = {
    "sapo": -0.302194387,
    "gmpo": -0.061064515,
    "dppo_tv": 3.519742058,  # row 0's rare token, weight 20 on log 0.1 over 12 tokens, is most of it
    "dppo_kl": -0.317899764,  # that token masked
}


def test_defaults_are_the_references():
    assert (make_algorithm("sapo").tau_pos, make_algorithm("sapo").tau_neg) == (VERL_TAU_POS, VERL_TAU_NEG)
    assert (TRL_SAPO_TEMPERATURE_POS, TRL_SAPO_TEMPERATURE_NEG) == (VERL_TAU_POS, VERL_TAU_NEG)
    gmpo = make_algorithm("gmpo")
    assert gmpo.log_clip_low == gmpo.log_clip_high == TRL_GMPO_EPSILON  # and verl's GMPO example's clip_ratio
    assert make_algorithm("sapo").loss_agg == make_algorithm("gmpo").loss_agg == "seq-mean-token-mean"
    for name, delta in (("dppo_tv", 0.15), ("dppo_kl", 0.05)):
        algo = make_algorithm(name)
        assert (algo.delta_low, algo.delta_high, algo.loss_agg) == (delta, delta, "token-mean")
        assert 1 + algo.clip_eps_high == VERL_DPPO_CAP and 1 - algo.clip_eps_low == 0.0


def test_sapo_is_verls_and_trls():
    reference = theirs(verl_sapo, OLD_LOGP, ADV_TOKENS, MASK)
    assert reference[0].item() == pytest.approx(EXPECTED_LOSS["sapo"], abs=1e-9)
    assert_same(ours("sapo"), reference)
    assert_same(ours("sapo"), theirs(trl_sapo, OLD_LOGP, ROW_ADV, MASK))
    # other temperatures, and TRL's and verl's agreement at them
    assert_same(ours("sapo", tau_pos=0.5, tau_neg=2.0),
                theirs(verl_sapo, OLD_LOGP, ADV_TOKENS, MASK, tau_pos=0.5, tau_neg=2.0))


def test_gmpo_is_verls_geo_mean_and_trls():
    reference = theirs(verl_geo_mean, OLD_LOGP, ADV_TOKENS, MASK)
    assert reference[0].item() == pytest.approx(EXPECTED_LOSS["gmpo"], abs=1e-9)
    assert_same(ours("gmpo"), reference)
    trl = theirs(trl_gmpo, OLD_LOGP, ROW_ADV, MASK)
    assert_same(ours("gmpo"), trl)
    # two tokens have their clip active: row 0's ratio 100 (A > 0) and row 3's 0.5 (A < 0)
    _, _, metrics = ours("gmpo")
    assert metrics["clipfrac"] == trl[2]["region_mean"] == pytest.approx(3 / 12)
    # verl counts a token outside the range whichever side it left by: row 2's 0.4 → 0.2 (log-ratio
    # −0.69 under A > 0) is in its pg_clipfrac, though the clip is not active there
    verl_metrics = reference[2]
    assert verl_metrics["pg_clipfrac"] == pytest.approx(3 / 12) and verl_metrics["pg_clipfrac_lower"] == pytest.approx(1 / 12)
    # asymmetric range, both references
    assert_same(ours("gmpo", log_clip_low=0.1, log_clip_high=0.7),
                theirs(verl_geo_mean, OLD_LOGP, ADV_TOKENS, MASK, clip_low=0.1, clip_high=0.7))
    assert_same(ours("gmpo", log_clip_low=0.1, log_clip_high=0.7),
                theirs(trl_gmpo, OLD_LOGP, ROW_ADV, MASK, eps_low=0.1, eps_high=0.7))


@pytest.mark.parametrize("name, divergence", [("dppo_tv", "tv"), ("dppo_kl", "kl")])
def test_dppo_is_verls(name, divergence):
    delta = make_algorithm(name).delta_high
    reference = theirs(verl_dppo, OLD_LOGP, ADV_TOKENS, MASK, divergence, delta, delta)
    assert reference[0].item() == pytest.approx(EXPECTED_LOSS[name], abs=1e-9)
    loss, grad, metrics = ours(name)
    assert_same((loss, grad, metrics), reference)
    assert metrics["trust_region_maskfrac"] == pytest.approx(reference[2]["pg_clipfrac"])
    # verl's pg_clipfrac_lower counts the truncated weights inside the region, our is_clipfrac all of
    # them: the rare token (ratio 100) is both under TV, and masked under KL
    assert metrics["is_clipfrac"] == pytest.approx(1 / 12)
    assert reference[2]["pg_clipfrac_lower"] == pytest.approx(1 / 12 if divergence == "tv" else 0.0)
    # other thresholds, an asymmetric pair, a lower cap, and the other aggregations
    for low, high, cap, mode in ((0.1, 0.25, 20.0, "token-mean"), (0.3, 0.02, 3.0, "seq-mean-token-mean"),
                                 (0.15, 0.15, 20.0, "seq-mean-token-sum")):
        assert_same(ours(name, delta_low=low, delta_high=high, clip_eps_high=cap - 1, loss_agg=mode),
                    theirs(verl_dppo, OLD_LOGP, ADV_TOKENS, MASK, divergence, low, high, cap, mode))


def test_the_two_trust_regions_mask_different_tokens():
    """TV masks row 1's 0.8 → 0.6, row 2's 0.2 → 0.4 and row 3's 0.6 → 0.3 (each moved 0.2 or more
    the way its advantage pushes); KL at 0.05 masks those and row 0's rare 0.001 → 0.1 too."""
    _, _, tv = ours("dppo_tv")
    _, _, kl = ours("dppo_kl")
    assert tv["trust_region_maskfrac"] == pytest.approx(3 / 12)
    assert kl["trust_region_maskfrac"] == pytest.approx(4 / 12)


def test_where_verl_and_trl_part_an_empty_response():
    """A row with no response tokens: verl's seq-mean leaves it out of the count, TRL's and ours
    count it (as a 0). The two agree on every batch with no such row, which a sampled batch never
    has (its EOS is a response token); GRPO's overlong_filter is where one could appear."""
    mask = torch.cat([MASK, torch.zeros(1, T, dtype=F64)])
    logp, old = torch.cat([NEW_LOGP, torch.zeros(1, T, dtype=F64)]), torch.cat([OLD_LOGP, torch.zeros(1, T, dtype=F64)])
    adv = torch.cat([ADV_TOKENS, torch.zeros(1, T, dtype=F64)])
    loss, _, _ = ours("sapo", logp=logp, old_logp=old, adv=adv, mask=mask)
    assert loss.item() == pytest.approx(EXPECTED_LOSS["sapo"] * 4 / 5)  # TRL's mean over 5 rows
    assert trl_sapo(logp, old, torch.cat([ROW_ADV, torch.zeros(1, dtype=F64)]), mask)[0].item() == pytest.approx(loss.item())
    assert verl_sapo(logp, old, adv, mask)[0].item() == pytest.approx(EXPECTED_LOSS["sapo"])  # verl's mean over 4


@pytest.mark.parametrize("name, loss_agg", [("sapo", "seq-mean-token-mean"), ("sapo", "token-mean"),
                                             ("gmpo", "seq-mean-token-mean"), ("dppo_tv", "token-mean"),
                                             ("dppo_kl", "seq-mean-token-mean")])
def test_on_policy_each_takes_grpos_step(name, loss_agg):
    """At θ = θ_old (r = 1 everywhere: one update per batch) every gate is open, every token is
    inside every trust region and the geometric mean is 1, so the gradient is GRPO's with the same
    aggregation: the four differ from GRPO only once the policy has moved within a batch."""
    _, grad, _ = ours(name, logp=OLD_LOGP, loss_agg=loss_agg)
    _, grpo_grad, _ = ours("grpo", logp=OLD_LOGP, loss_agg=loss_agg)
    torch.testing.assert_close(grad, grpo_grad, rtol=1e-12, atol=1e-12)
    _, moved, _ = ours(name, loss_agg=loss_agg)  # off-policy they differ...
    _, grpo_moved, _ = ours("grpo", loss_agg=loss_agg)
    if name != "dppo_kl":
        assert (moved - grpo_moved).abs().max() > 1e-3
    else:  # ...but on these tensors the KL region masks exactly the four tokens GRPO's clip stops (ratios
        # 100, 0.75, 2 and 0.5) and no kept ratio reaches 20, so the two gradients agree; TV keeps the rare one
        torch.testing.assert_close(moved, grpo_moved, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["sapo", "gmpo", "dppo_tv", "dppo_kl"])
def test_padding_cannot_reach_the_loss_or_the_gradient(name):
    """inf and NaN off the response change nothing."""
    off = MASK == 0
    loss, grad, _ = ours(name)
    dirty = ours(name, logp=NEW_LOGP.masked_fill(off, float("nan")), old_logp=OLD_LOGP.masked_fill(off, -float("inf")),
                 adv=ADV_TOKENS.masked_fill(off, float("inf")))
    assert dirty[0].item() == loss.item()
    assert torch.equal(dirty[1], grad) and (grad[off] == 0).all()


def test_registered_where_the_family_tree_says():
    assert issubclass(DPPOBinaryTV, CISPO) and issubclass(DPPOBinaryKL, DPPOBinaryTV)
    assert [ALGORITHMS[n].name for n in ("sapo", "gmpo", "dppo_tv", "dppo_kl")] == ["sapo", "gmpo", "dppo_tv", "dppo_kl"]
    # one field is the whole difference between the two DPPO variants' settings: their thresholds
    tv, kl = (dataclasses.fields(ALGORITHMS[n]) for n in ("dppo_tv", "dppo_kl"))
    assert [f.name for f in tv] == [f.name for f in kl]


# --- end to end -------------------------------------------------------------------------------

OWN_METRIC = {"sapo": "gate_slope_mean", "gmpo": "geo_ratio_mean", "dppo_tv": "trust_region_maskfrac",
              "dppo_kl": "trust_region_maskfrac"}


def test_the_four_train_from_one_sft_start_in_posttrain_compare(tmp_path):
    """`posttrain compare` over the four (a tiny model, 2 RL steps each): each run ends, logs its
    loss and its own metric at every RL step, and lands in the table."""
    algos = list(OWN_METRIC)
    assert main(["compare", "--algos", ",".join(algos), *TINY, "--rl.steps", "2", "--out_dir", str(tmp_path)]) == 0
    (root,) = tmp_path.iterdir()
    rows = json.loads((root / "compare.json").read_text())
    assert [r["algo"] for r in rows] == algos
    for row in rows:
        logged = [json.loads(line) for line in (root / row["run"] / "metrics.jsonl").read_text().splitlines()]
        rl = [r for r in logged if r["stage"] == "rl"]
        assert [r["step"] for r in rl] == [0, 1], row["algo"]
        assert all(math.isfinite(r["pg_loss"]) and math.isfinite(r[OWN_METRIC[row["algo"]]]) for r in rl), row["algo"]
    assert all(f"| {a} |" in (root / "compare.md").read_text() for a in algos)
