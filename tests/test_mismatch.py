"""The one correction wherever the sampler is not the trainer (roles/mismatch.py), on fixed
tensors: every mode's weights and every diagnostic worked by hand, then the same numbers from
TRL's and verl's definitions, transcribed below from their source; where it applies and where
it does not (the default run is untouched); the setting's move from dist.tis_cap; the alert;
and the float32 LM head under autocast."""

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from posttrain.algorithms.grpo import GRPO
from posttrain.cli.training import train_config
from posttrain.config import ConfigError, DistConfig, MismatchConfig, RLConfig, SamplingParams, TrainConfig
from posttrain.config.files import from_dict, upgraded
from posttrain.models.device import place
from posttrain.models.logprobs import lm_head_float32, response_logp_and_entropy
from posttrain.pipelines.build import make_rollout, mismatch_correction
from posttrain.roles.mismatch import MismatchCorrection, SamplerIsTrainer, diagnostics, importance_weights
from posttrain.roles.off_policy import truncated_is_weights
from posttrain.roles.rollout import ColocatedRollout, RolloutRequest
from posttrain.roles.trainer import Trainer
from posttrain.runs.monitors import check_all
from posttrain.systems.stragglers import logprob_mismatch
from posttrain.types import RolloutBatch
from tests.test_rollout import TOK, examples, tiny_model

e = math.exp

# Three responses of 3, 2 and 3 tokens after a prompt token (column 0). The per-token log-ratios
# log ρ_t = log π_trainer − log π_sampler are chosen to be exact in binary:
#   row 0   0.5  −0.25   1.5       sum  1.75    mean  0.5833
#   row 1  −1.0   0.125   (pad)    sum −0.875   mean −0.4375
#   row 2   0.0   2.0   −3.0       sum −1.0     mean −0.3333
SAMPLER = torch.tensor([[0.0, -1.0, -0.5, -2.0], [0.0, -0.25, -1.5, 0.0], [0.0, -0.5, -2.5, -0.125]])
LOG_RATIO = torch.tensor([[0.0, 0.5, -0.25, 1.5], [0.0, -1.0, 0.125, 0.0], [0.0, 0.0, 2.0, -3.0]])
TRAINER = SAMPLER + LOG_RATIO  # exact: every sum above is a short binary fraction
MASK = torch.tensor([[0.0, 1, 1, 1], [0, 1, 1, 0], [0, 1, 1, 1]])
TOKEN_RATIOS = [[e(0.5), e(-0.25), e(1.5)], [e(-1.0), e(0.125)], [1.0, e(2.0), e(-3.0)]]
SEQUENCE_RATIOS = [e(1.75), e(-0.875), e(-1.0)]
GEOMETRIC_RATIOS = [e(1.75 / 3), e(-0.875 / 2), e(-1.0 / 3)]
LENGTHS = [3, 2, 3]
CAP, LOWER = 2.0, 0.5


def on_response(rows: list[list[float]]) -> torch.Tensor:
    """Per-response-token values back in the (3, 4) layout, 0 off the response."""
    out = torch.zeros(3, 4)
    for i, values in enumerate(rows):
        out[i, 1: 1 + len(values)] = torch.tensor(values)
    return out


def per_row(values: list[float]) -> torch.Tensor:
    return on_response([[v] * n for v, n in zip(values, LENGTHS)])


# --- every mode's weights, by hand -----------------------------------------------------------

EXPECTED_WEIGHTS = {
    # clamped into [0.5, 2]: e^1.5 and e^2 down to 2, e^-1 and e^-3 up to 0.5
    "token_truncate": on_response([[e(0.5), e(-0.25), 2.0], [0.5, e(0.125)], [1.0, 2.0, 0.5]]),
    # outside [0.5, 2] is 0: e^1.5, e^-1, e^2 and e^-3 lose their weight, the others keep ρ
    "token_mask": on_response([[e(0.5), e(-0.25), 0.0], [0.0, e(0.125)], [1.0, 0.0, 0.0]]),
    # each response's Π ρ_t, clamped: e^1.75 = 5.75 down to 2, e^-0.875 = 0.42 and e^-1 up to 0.5
    "sequence_truncate": per_row([2.0, 0.5, 0.5]),
    # all three products fall outside [0.5, 2]: every response masked
    "sequence_mask": per_row([0.0, 0.0, 0.0]),
    # geometric means e^0.583 = 1.79, e^-0.4375 = 0.65, e^-0.333 = 0.72: all inside the bounds
    "geometric_truncate": per_row(GEOMETRIC_RATIOS),
    "geometric_mask": per_row(GEOMETRIC_RATIOS),
}


@pytest.mark.parametrize("mode", list(EXPECTED_WEIGHTS))
def test_every_mode_weights_by_hand(mode):
    w = importance_weights(TRAINER, SAMPLER, MASK, mode, CAP, LOWER)
    torch.testing.assert_close(w, EXPECTED_WEIGHTS[mode], atol=1e-6, rtol=1e-6)


def test_wider_bounds_keep_what_the_narrow_ones_masked():
    # sequence_mask with [0.4, 6]: e^1.75 = 5.75 and e^-0.875 = 0.417 kept, e^-1 = 0.368 masked
    w = importance_weights(TRAINER, SAMPLER, MASK, "sequence_mask", 6.0, 0.4)
    torch.testing.assert_close(w, per_row([e(1.75), e(-0.875), 0.0]))
    # one-sided (lower 0): token_truncate is the textbook min(ρ, C), off_policy.truncated_is_weights
    one_sided = importance_weights(TRAINER, SAMPLER, MASK, "token_truncate", CAP)
    assert torch.equal(one_sided, truncated_is_weights(TRAINER, SAMPLER, MASK, CAP))
    torch.testing.assert_close(one_sided, on_response([[e(0.5), e(-0.25), 2.0], [e(-1.0), e(0.125)],
                                                      [1.0, 2.0, e(-3.0)]]))


def test_a_long_response_cannot_overflow():
    """Σ log ρ_t of 200 tokens at 0.5 each is 100: e^100 is past float32, clamped at e^20 first."""
    mask, log_ratio = torch.ones(1, 200), torch.full((1, 200), 0.5)
    for mode in ("sequence_truncate", "sequence_mask"):
        w = importance_weights(log_ratio, torch.zeros(1, 200), mask, mode, 3.0)
        assert torch.isfinite(w).all() and w.max() == (3.0 if mode == "sequence_truncate" else 0.0)
    stats = diagnostics(log_ratio, torch.zeros(1, 200), mask, w, "sequence_mask", 3.0)
    assert stats["mismatch/ratio_max"] == pytest.approx(e(20.0), rel=1e-5)
    assert math.isfinite(stats["mismatch/chi2_seq"])


# --- every diagnostic, by hand -----------------------------------------------------------------

FLAT = [x for row in [[0.5, -0.25, 1.5], [-1.0, 0.125], [0.0, 2.0, -3.0]] for x in row]  # the 8 log ρ_t


def test_every_diagnostic_by_hand_token_truncate():
    w = importance_weights(TRAINER, SAMPLER, MASK, "token_truncate", CAP, LOWER)
    stats = diagnostics(TRAINER, SAMPLER, MASK, w, "token_truncate", CAP, LOWER)
    applied = [e(0.5), e(-0.25), 2.0, 0.5, e(0.125), 1.0, 2.0, 0.5]
    expected = {
        "kl": 0.125 / 8,  # mean(−log ρ_t): the log-ratios sum to −0.125
        "k3_kl": sum(e(x) - 1 - x for x in FLAT) / 8,
        "chi2_token": sum(e(2 * x) for x in FLAT) / 8 - 1,
        "chi2_seq": (e(3.5) + e(-1.75) + e(-2.0)) / 3 - 1,  # E[(Π ρ_t)²] − 1 over the 3 responses
        "ess": sum(applied) ** 2 / (8 * sum(w * w for w in applied)),
        "ratio_max": e(2.0),
        "ratio_min": e(-3.0),
        "weight_mean": sum(applied) / 8,
        "logp_diff_mean": 8.375 / 8,  # Σ|log ρ_t| = 0.5 + 0.25 + 1.5 + 1 + 0.125 + 0 + 2 + 3
        "logp_diff_max": 3.0,
        # exp(−mean log π) per response: trainer rows average −7/12, −1.3125, −1.375; sampler −7/6, −0.875, −25/24
        "trainer_ppl": (e(7 / 12) + e(1.3125) + e(1.375)) / 3,
        "sampler_ppl": (e(7 / 6) + e(0.875) + e(25 / 24)) / 3,
        "truncated_fraction": 4 / 8,  # e^1.5, e^-1, e^2 and e^-3 are outside [0.5, 2]
    }
    assert stats.keys() == {f"mismatch/{k}" for k in expected}
    for name, value in expected.items():
        assert stats[f"mismatch/{name}"] == pytest.approx(value, rel=1e-5), name
    assert stats["mismatch/ess"] == pytest.approx(0.809833, abs=1e-6)  # the formula's value, written out


def test_mask_modes_count_what_they_masked():
    w = importance_weights(TRAINER, SAMPLER, MASK, "token_mask", CAP, LOWER)
    stats = diagnostics(TRAINER, SAMPLER, MASK, w, "token_mask", CAP, LOWER)
    kept = [e(0.5), e(-0.25), e(0.125), 1.0]  # the 4 of 8 tokens inside the bounds
    assert stats["mismatch/masked_fraction"] == 0.5
    assert stats["mismatch/seq_masked_fraction"] == 1.0  # every response lost at least one token
    assert "mismatch/truncated_fraction" not in stats
    assert stats["mismatch/ess"] == pytest.approx(sum(kept) ** 2 / (8 * sum(k * k for k in kept)), rel=1e-6)
    # the ratios are reported before the bounds; the level's own ones in a sequence mode
    seq = diagnostics(TRAINER, SAMPLER, MASK, importance_weights(TRAINER, SAMPLER, MASK, "sequence_mask", 6.0, 0.4),
                      "sequence_mask", 6.0, 0.4)
    assert (seq["mismatch/ratio_max"], seq["mismatch/ratio_min"]) == pytest.approx((e(1.75), e(-1.0)))
    assert seq["mismatch/masked_fraction"] == pytest.approx(3 / 8)  # the 3 tokens of row 2
    assert seq["mismatch/seq_masked_fraction"] == pytest.approx(1 / 3)
    # everything masked: an effective sample size of 0, not a division by zero
    none = diagnostics(TRAINER, SAMPLER, MASK, torch.zeros(3, 4), "sequence_mask", CAP, LOWER)
    assert none["mismatch/ess"] == 0.0 and none["mismatch/masked_fraction"] == 1.0


def test_sampler_equal_to_trainer_measures_nothing_and_changes_nothing():
    for mode in EXPECTED_WEIGHTS:
        w = importance_weights(TRAINER, TRAINER, MASK, mode, CAP, LOWER)
        assert torch.equal(w, MASK)
        stats = diagnostics(TRAINER, TRAINER, MASK, w, mode, CAP, LOWER)
        for name in ("kl", "k3_kl", "chi2_token", "chi2_seq", "logp_diff_max"):
            assert stats[f"mismatch/{name}"] == 0.0
        assert stats["mismatch/ess"] == 1.0 and stats["mismatch/weight_mean"] == 1.0
    assert diagnostics(TRAINER, SAMPLER, torch.zeros(3, 4), MASK, "token_mask", CAP) == {}  # no token: nothing


def test_the_statistics_lesson_calculator_agrees():
    """systems/stragglers.py::logprob_mismatch (lists, the lessons' calculator) on the same 8
    tokens: mean |Δ|, KL (k3), the share above the cap, and the ESS of untruncated weights."""
    tokens = MASK.bool()
    calc = logprob_mismatch(SAMPLER[tokens].tolist(), TRAINER[tokens].tolist(), cap=30.0)
    w = importance_weights(TRAINER, SAMPLER, MASK, "token_truncate", 30.0)  # e^2 = 7.4 < 30: nothing truncated
    stats = diagnostics(TRAINER, SAMPLER, MASK, w, "token_truncate", 30.0)
    assert stats["mismatch/logp_diff_mean"] == pytest.approx(calc.mean_abs_logp_diff, rel=1e-6)
    assert stats["mismatch/k3_kl"] == pytest.approx(calc.kl_k3, rel=1e-6)
    assert stats["mismatch/truncated_fraction"] == calc.clipped_fraction == 0.0
    assert stats["mismatch/ess"] == pytest.approx(calc.effective_sample_fraction, rel=1e-6)


# --- TRL's definitions --------------------------------------------------------------------------
# Transcribed from huggingface/trl, trl/trainer/grpo_trainer.py (1.10.0.dev0, commit f2cd577,
# `_generate_and_score_completions`): `old_per_token_logps` is the trainer's, `sampling_per_token_logps`
# vLLM's; the ratio multiplies each token's policy-gradient loss (per_token_loss * ratio). TRL 1.16.0's
# lines are these plus a nan_to_num (a token vLLM could not score gets ratio 1); tests/test_peer_oracles.py
# runs 1.16.0's own lines on these tensors (`make peers-test`).


def trl_importance_sampling_ratio(old_per_token_logps, sampling_per_token_logps, mask, mode, clip_min, clip_max):
    per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask
    sequence_level_is = mode in ["sequence_mask", "sequence_truncate"]
    logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True) if sequence_level_is else per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        ratio = ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)
    return ratio  # (B, T) token modes, (B, 1) sequence modes


TRL_MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


@pytest.mark.parametrize("mode", TRL_MODES)
@pytest.mark.parametrize("clip_min, clip_max", [(None, 3.0), (0.5, 2.0), (0.4, 6.0)])  # TRL's default is (None, 3)
def test_trl_modes_give_trls_weights(mode, clip_min, clip_max):
    trl = trl_importance_sampling_ratio(TRAINER, SAMPLER, MASK, mode, clip_min, clip_max) * MASK  # what the loss sees
    ours = importance_weights(TRAINER, SAMPLER, MASK, mode, clip_max, clip_min or 0.0)
    torch.testing.assert_close(ours, trl, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask"])
def test_trls_logged_numbers(mode):
    """TRL logs sampling/sampling_logp_difference/{mean,max} (|Δ log π| over the mask) and
    sampling/importance_sampling_ratio/{min,mean,max} (over the mask, token modes)."""
    ratio = trl_importance_sampling_ratio(TRAINER, SAMPLER, MASK, mode, None, 3.0)
    delta = torch.abs(TRAINER - SAMPLER)[MASK.bool()]
    stats = diagnostics(TRAINER, SAMPLER, MASK, importance_weights(TRAINER, SAMPLER, MASK, mode, 3.0), mode, 3.0)
    assert stats["mismatch/logp_diff_mean"] == pytest.approx(delta.mean().item())
    assert stats["mismatch/logp_diff_max"] == pytest.approx(delta.max().item())
    assert stats["mismatch/weight_mean"] == pytest.approx(ratio[MASK.bool()].mean().item())


# --- verl's definitions -------------------------------------------------------------------------
# Transcribed from volcengine/verl, verl/trainer/ppo/rollout_corr_helper.py (0.8.0.dev, b178a3c; checked
# against 0.9.1, whose own functions tests/test_peer_oracles.py runs on these tensors): rollout_is
# (compute_rollout_correction_weights, truncated at a threshold; 0.9.1 adds IcePop's two-sided mask for
# a "lower_upper" threshold), rollout_rs (compute_rollout_rejection_mask's token_k1, seq_sum_k1 and
# seq_mean_k1: k1 = −log ρ, its sum or its mean, kept inside [log a, log b] for the threshold "a_b",
# i.e. ρ inside [1/b, 1/a]; verl's k2, k3 and seq_max options have no counterpart here),
# compute_offpolicy_metrics and compute_is_metrics's ESS (0.9.1: of the applied weights clamped into
# [0, C]; 0.8 raised them to 1/C first). `old_log_prob` is the trainer's, `rollout_log_prob` the sampler's.

SAFETY_BOUND = 20.0


def verl_masked_mean(x, mask, axis=None):
    return (x * mask).sum() / mask.sum() if axis is None else (x * mask).sum(axis) / mask.sum(axis)


def verl_log_ratio_at(level, log_ratio, response_mask):
    if level == "token":
        return log_ratio
    if level == "sequence":
        return (log_ratio * response_mask).sum(-1).unsqueeze(-1)
    return verl_masked_mean(log_ratio, response_mask, axis=-1).unsqueeze(-1)  # geometric


def verl_rollout_is_weights(old_log_prob, rollout_log_prob, response_mask, rollout_is, threshold):
    log_ratio = verl_log_ratio_at(rollout_is, old_log_prob - rollout_log_prob, response_mask)
    weights = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(response_mask)
    return (weights * response_mask).clamp(max=threshold)


def verl_rollout_rs(old_log_prob, rollout_log_prob, response_mask, rollout_rs, a, b):
    """The *_k1 rejection with the threshold "a_b": k1 = −log ρ at the level kept in [log a, log b]."""
    k1 = -verl_log_ratio_at(rollout_rs, old_log_prob - rollout_log_prob, response_mask).expand_as(response_mask)
    mask = ((k1 >= math.log(a)) & (k1 <= math.log(b))).float()
    masked_fraction = verl_masked_mean(1 - mask, response_mask).item()
    if rollout_rs == "token":
        seq_masked_fraction = (((1 - mask) * response_mask).sum(-1) > 0).float().mean().item()
    else:
        seq_masked_fraction = (1 - mask[:, 0]).mean().item()
    return response_mask * mask, masked_fraction, seq_masked_fraction


def verl_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask):
    log_ratio = old_log_prob - rollout_log_prob
    log_ratio_sum = (log_ratio * response_mask).sum(-1)
    return {
        "kl": verl_masked_mean(rollout_log_prob - old_log_prob, response_mask).item(),
        "k3_kl": verl_masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask).item(),
        "training_ppl": torch.exp(-verl_masked_mean(old_log_prob, response_mask, axis=-1)).mean().item(),
        "rollout_ppl": torch.exp(-verl_masked_mean(rollout_log_prob, response_mask, axis=-1)).mean().item(),
        "chi2_token": (verl_masked_mean(torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).square(),
                                        response_mask) - 1.0).item(),
        "chi2_seq": (torch.exp(2.0 * log_ratio_sum.clamp(-SAFETY_BOUND, SAFETY_BOUND)).mean() - 1.0).item(),
    }


def verl_ess(rollout_is_weights, response_mask, threshold):
    weights_for_ess = rollout_is_weights.clamp(min=0.0, max=threshold)  # 0.8: min=1/threshold, on the raw ratios
    normalized = weights_for_ess / (verl_masked_mean(weights_for_ess, response_mask) + 1e-8)
    return 1.0 / verl_masked_mean(normalized.square(), response_mask).item()


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [2.0, 5.0])  # verl's default rollout_is_threshold is 2
def test_verl_rollout_is_is_our_truncate_mode(level, threshold):
    verl = verl_rollout_is_weights(TRAINER, SAMPLER, MASK, level, threshold)
    ours = importance_weights(TRAINER, SAMPLER, MASK, f"{level}_truncate", threshold)
    torch.testing.assert_close(ours, verl, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("a, b", [(0.5, 2.0), (1 / 1.5, 1.5), (0.4, 6.0)])
def test_verl_rollout_rs_masks_what_our_mask_mode_masks(level, a, b):
    """k1 in [log a, log b] is ρ in [1/b, 1/a]: our mask mode with lower 1/b and cap 1/a (for the
    symmetric a = 1/b, the same bounds as verl's string; for "0.4_6" ρ in [1/6, 2.5])."""
    kept, masked_fraction, seq_masked_fraction = verl_rollout_rs(TRAINER, SAMPLER, MASK, level, a, b)
    upper, lower = 1 / a, 1 / b
    w = importance_weights(TRAINER, SAMPLER, MASK, f"{level}_mask", upper, lower)
    assert torch.equal((w > 0).float(), kept)
    stats = diagnostics(TRAINER, SAMPLER, MASK, w, f"{level}_mask", upper, lower)
    assert stats["mismatch/masked_fraction"] == pytest.approx(masked_fraction)
    assert stats["mismatch/seq_masked_fraction"] == pytest.approx(seq_masked_fraction)


def test_verls_off_policy_metrics():
    stats = diagnostics(TRAINER, SAMPLER, MASK, importance_weights(TRAINER, SAMPLER, MASK, "token_truncate", CAP),
                        "token_truncate", CAP)
    verl = verl_offpolicy_metrics(TRAINER, SAMPLER, MASK)
    names = {"kl": "kl", "k3_kl": "k3_kl", "training_ppl": "trainer_ppl", "rollout_ppl": "sampler_ppl",
             "chi2_token": "chi2_token", "chi2_seq": "chi2_seq"}
    for theirs, ours in names.items():
        assert stats[f"mismatch/{ours}"] == pytest.approx(verl[theirs], rel=1e-6), theirs


@pytest.mark.parametrize("mode, cap, lower", [("token_truncate", 2.0, 0.0), ("token_truncate", 25.0, 0.0),
                                               ("sequence_truncate", 2.0, 0.0), ("token_mask", 2.0, 0.5)])
def test_verls_effective_sample_size(mode, cap, lower):
    """verl 0.9.1 takes its ESS over the weights the update applies, as ours does (0.8 raised
    them to 1/C first, and agreed with ours only where no ratio was below 1/C)."""
    w = importance_weights(TRAINER, SAMPLER, MASK, mode, cap, lower)
    stats = diagnostics(TRAINER, SAMPLER, MASK, w, mode, cap, lower)
    assert stats["mismatch/ess"] == pytest.approx(verl_ess(w, MASK, cap), rel=1e-6)


# --- on a batch: the advantages the update sees -------------------------------------------------


def fixed_batch(**changes) -> RolloutBatch:
    return dataclasses.replace(RolloutBatch(
        tokens=torch.zeros(3, 4, dtype=torch.long), attention_mask=torch.ones(3, 4), response_mask=MASK,
        old_logp=SAMPLER, rewards=torch.tensor([1.0, 0.0, 1.0]), group_ids=torch.zeros(3, dtype=torch.long),
        advantages=torch.tensor([[0.5], [-1.0], [0.5]]) * MASK), **changes)


def test_apply_sets_pi_old_and_weighs_the_advantages():
    corrected, stats = MismatchCorrection("sequence_mask", 6.0, 0.4).apply(fixed_batch(), TRAINER)
    assert torch.equal(corrected.old_logp, TRAINER)  # the ratio's denominator is the trainer's π_old now
    torch.testing.assert_close(corrected.advantages, fixed_batch().advantages * per_row([e(1.75), e(-0.875), 0.0]))
    assert stats["mismatch/seq_masked_fraction"] == pytest.approx(1 / 3)
    # the rows the update leaves out are not measured (nothing reads their π_old)
    _, trained_only = MismatchCorrection("sequence_mask", 6.0, 0.4).apply(
        fixed_batch(rows_with_gradient=torch.tensor([True, True, False])), TRAINER)
    assert trained_only["mismatch/seq_masked_fraction"] == 0.0 and trained_only["mismatch/kl"] == pytest.approx(
        -(1.75 - 0.875) / 5)
    with pytest.raises(ValueError, match="compute them first"):
        MismatchCorrection().apply(fixed_batch(advantages=None), TRAINER)


def test_correct_recomputes_pi_old_with_the_trainer():
    """A sampler 0.3 nats/token off the trainer on every token: π_old is the trainer's forward,
    and with token_mask and cap 1.2 (e^0.3 = 1.35 > 1.2) every token is masked."""
    model = tiny_model()
    trainer = Trainer(model, lr=1e-3, total_steps=1)
    request = lambda step, round: RolloutRequest(examples(), 4, 0)  # noqa: E731
    episodes = ColocatedRollout(model, TOK, SamplingParams(max_new_tokens=8), request).sample(0)
    for i, episode in enumerate(episodes):
        episode.reward = float(i % 2)
    batch = RolloutBatch.collate(episodes, TOK.pad_id)
    batch = dataclasses.replace(batch, **GRPO().compute_advantages(batch))
    trainer_logp = trainer.forward(batch).logp.detach() * batch.response_mask
    shifted = dataclasses.replace(batch, old_logp=trainer_logp - 0.3 * batch.response_mask)
    corrected, stats = MismatchCorrection("token_mask", 1.2).correct(shifted, trainer)
    torch.testing.assert_close(corrected.old_logp, trainer_logp, atol=1e-6, rtol=0)
    assert not corrected.advantages.any() and stats["mismatch/masked_fraction"] == 1.0
    assert stats["mismatch/kl"] == pytest.approx(-0.3, abs=1e-5)
    assert stats["mismatch/ratio_min"] == pytest.approx(e(0.3), rel=1e-4)


# --- where it applies ---------------------------------------------------------------------------


def test_build_corrects_wherever_the_sampler_is_not_the_trainer():
    f32, bf16 = torch.float32, torch.bfloat16
    plain, mismatch = SamplingParams(), MismatchConfig(mode="sequence_mask", cap=3.0, lower=0.5)
    expected = MismatchCorrection("sequence_mask", 3.0, 0.5)
    assert isinstance(mismatch_correction(mismatch, plain, f32, "colocated"), SamplerIsTrainer)
    assert isinstance(mismatch_correction(mismatch, plain, f32, "sync"), SamplerIsTrainer)
    assert mismatch_correction(mismatch, dataclasses.replace(plain, weights="int8"), f32, "colocated") == expected
    assert mismatch_correction(mismatch, plain, bf16, "colocated") == expected
    assert mismatch_correction(mismatch, plain, f32, "async") == expected
    # an engine other than posttrain's own (the seam a vLLM engine plugs into) is another policy
    assert mismatch_correction(mismatch, dataclasses.replace(plain, engine="vllm"), f32, "colocated") == expected
    assert mismatch_correction(dataclasses.replace(mismatch, always=True), plain, f32, "colocated") == expected


def test_the_default_run_is_not_corrected_and_its_batch_is_untouched():
    """make run's settings (torch engine, float32, one process): the correction is never entered,
    so old_logp stays the sampler's and the advantages and metrics are what they were."""
    request = lambda step, round: RolloutRequest(examples(), 2, 0)  # noqa: E731
    rollout = make_rollout(DistConfig(), tiny_model(), TOK, SamplingParams(max_new_tokens=8), request,
                           mismatch=TrainConfig().rl.mismatch)
    assert isinstance(rollout.correction, SamplerIsTrainer)
    batch = fixed_batch()
    trainer = Trainer(tiny_model(), lr=1e-3, total_steps=1)
    trainer.forward = lambda b: pytest.fail("the default run ran a forward pass to correct a mismatch")
    corrected, metrics = rollout.off_policy_correction(batch, trainer)
    assert corrected is batch and metrics == {}
    # bf16 on the same settings is corrected
    bf16 = make_rollout(DistConfig(), place(tiny_model(), "cpu", "bfloat16"), TOK, SamplingParams(), request)
    assert bf16.correction == MismatchCorrection()


# --- the setting, moved from dist.tis_cap ---------------------------------------------------------


def test_settings_are_checked():
    for changes, message in [({"mode": "sequence"}, "rl.mismatch.mode='sequence' is not allowed: expected one of "
                                                    "token_truncate, token_mask"),
                             ({"cap": 0.5}, "rl.mismatch.cap=0.5 is not allowed: expected a number >= 1"),
                             ({"lower": 1.5}, r"rl.mismatch.lower=1.5 is not allowed: expected a number in \[0, 1\]")]:
        with pytest.raises(ConfigError, match=message):
            RLConfig(mismatch=MismatchConfig(**changes)).validate()
    cfg = train_config(["--rl.mismatch.mode", "geometric_mask", "--rl.mismatch.cap", "3", "--rl.mismatch.lower",
                        "0.5", "--sft.steps", "0"])
    assert cfg.rl.mismatch == MismatchConfig("geometric_mask", 3.0, 0.5)


def test_the_old_flag_names_the_new_one_and_old_runs_still_load(tmp_path):
    with pytest.raises(ConfigError, match=r"--dist.tis_cap moved: use --rl.mismatch.cap"):
        train_config(["--dist.tis_cap", "3"])
    old = json.loads((Path(__file__).parent / "fixtures" / "run_before_sections" / "config.json").read_text())
    old["dist"]["tis_cap"] = 1.5
    cfg = from_dict(TrainConfig, old)
    assert cfg.rl.mismatch == MismatchConfig(cap=1.5) and not hasattr(cfg.dist, "tis_cap")
    assert upgraded(old)["rl"]["mismatch"]["cap"] == 1.5 and "tis_cap" not in upgraded(old)["dist"]
    assert old["dist"]["tis_cap"] == 1.5  # the caller's dict is read, not changed
    both = {"dist": {"tis_cap": 1.5}, "rl": {"mismatch": {"cap": 3.0}}}
    with pytest.raises(ConfigError, match="dist.tis_cap and rl.mismatch.cap are one setting.*keep rl.mismatch.cap"):
        from_dict(TrainConfig, both)
    # lesson 28's run directories, written before the move, load as a resume reads them
    shutil.copytree(Path(__file__).parent.parent / "lessons" / "data" / "28_runs" / "async", tmp_path / "async")
    assert from_dict(TrainConfig, json.loads((tmp_path / "async" / "config.json").read_text())).rl.mismatch.cap == 2.0


# --- the alert --------------------------------------------------------------------------------


def test_the_monitor_warns_when_the_mismatch_grows():
    rows = [{"step": 0, "mismatch/logp_diff_mean": 0.001, "mismatch/masked_fraction": 0.0},
            {"step": 1, "mismatch/logp_diff_mean": 0.2, "mismatch/masked_fraction": 0.02},
            {"step": 2, "mismatch/logp_diff_mean": 0.3, "mismatch/masked_fraction": 0.25},
            {"step": 3, "mismatch/logp_diff_mean": 0.01, "mismatch/masked_fraction": 0.3}]
    alerts = [a for a in check_all(rows) if a["monitor"] == "sampler_mismatch"]
    assert [(a["step"], a["value"], a["threshold"]) for a in alerts] == [(1, 0.2, 0.05), (2, 0.25, 0.1)]
    assert alerts[0]["message"].startswith("mismatch/logp_diff_mean = 0.2 exceeds 0.05 nats/token")
    assert alerts[1]["message"].startswith("mismatch/masked_fraction = 0.25 exceeds 0.1 of the trained tokens")
    assert all("--rl.sampling.weights float32" in a["message"] and "rl.mismatch" in a["message"] for a in alerts)
    # a run directory from before the correction had a name of its own (the int8 sampler's)
    legacy = [a for a in check_all([{"step": 4, "int8/logp_mismatch": 0.8}]) if a["monitor"] == "sampler_mismatch"]
    assert [(a["step"], a["value"]) for a in legacy] == [(4, 0.8)]


# --- the LM head in float32 ---------------------------------------------------------------------


def test_lm_head_runs_in_float32_under_autocast_and_unchanged_without():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(6, 16) * 4  # logits of a few units, as a trained model's are
    assert torch.equal(lm_head_float32(head, hidden), head(hidden))  # no autocast: the very same operation
    exact = torch.log_softmax(hidden.double() @ head.weight.double().T, dim=-1)  # float64: the reference
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert head(hidden).dtype == torch.bfloat16  # what autocast would have computed
        in_bf16 = torch.log_softmax(head(hidden).float(), dim=-1)
        in_fp32 = torch.log_softmax(lm_head_float32(head, hidden), dim=-1)
    assert in_fp32.dtype == torch.float32
    assert (in_fp32.double() - exact).abs().max() < 1e-5
    assert (in_bf16.double() - exact).abs().max() > 1e-2  # bf16's rounding of the logits alone


def test_the_trainers_log_probs_under_bf16_read_a_float32_head():
    """response_logp_and_entropy on the same hidden states: in float32 bit for bit what it
    computed before the head was pinned to float32 (`lm_head(h).float()`, the same batched
    matmul), and inside bf16 autocast within float32 rounding of it."""
    torch.manual_seed(1)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden, tokens = torch.randn(2, 5, 16) * 4, torch.randint(0, 50, (2, 5))
    mask = torch.tensor([[0.0, 0, 1, 1, 1], [0, 1, 1, 1, 0]])
    logp, _ = response_logp_and_entropy(hidden, head, tokens, mask)
    rows, cols = mask[:, 1:].nonzero(as_tuple=True)
    z = head(hidden[rows, cols]).float()  # (n, V): the computation before this change
    before = torch.zeros(2, 5).index_put((rows, cols + 1), z.gather(-1, tokens[rows, cols + 1, None]).squeeze(-1)
                                         - torch.logsumexp(z, dim=-1))
    assert torch.equal(logp, before)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp_bf16, _ = response_logp_and_entropy(hidden, head, tokens, mask)
    assert (logp_bf16 - logp).abs().max() < 1e-5


def test_a_mismatch_setting_the_run_would_not_read_is_said_before_it_starts():
    from posttrain.pipelines.data_checks import unread_mismatch

    plain = TrainConfig(rl=RLConfig(mismatch=MismatchConfig(mode="sequence_mask")))
    assert unread_mismatch(plain) == (
        "rl.mismatch.mode='sequence_mask' is not read: the sampler is the trainer here (the torch engine, float32, "
        "no batch sampled ahead), so its log-probs are the trainer's and there is nothing to correct; "
        "--rl.mismatch.always true corrects and measures anyway")
    assert unread_mismatch(TrainConfig()) is None  # the defaults: nothing changed, nothing to say
    always = dataclasses.replace(plain, rl=RLConfig(mismatch=MismatchConfig(mode="sequence_mask", always=True)))
    int8 = dataclasses.replace(plain, rl=dataclasses.replace(plain.rl, sampling=SamplingParams(weights="int8")))
    # read: asked for always, an int8 sampler, bf16 activations
    assert unread_mismatch(always) is unread_mismatch(int8) is unread_mismatch(
        dataclasses.replace(plain, dtype="bfloat16")) is None
