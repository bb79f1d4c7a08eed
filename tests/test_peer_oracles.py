"""posttrain against the peers' own code, run, not transcribed: verl 0.9.1 and TRL 1.16.0, as
`make peers-test` installs them into .venv-peers. Everywhere else (no verl, no TRL) every test
here skips with the reason; tests/test_loss_variants_oracle.py, test_gdpo_entropy_oracle.py and
test_mismatch.py keep the transcribed references that run in every venv.

The inputs are those modules' fixed tensors, handed unchanged to posttrain and to the peer.

How each peer is called:
  verl  its free functions: core_algos.get_policy_loss_fn(name) for sapo, geo_mean (GMPO),
        dppo_tv, dppo_kl, clip_cov and kl_cov, each given a real ActorConfig;
        compute_gdpo_outcome_advantage; rollout_corr_helper's compute_rollout_correction_weights
        (rollout_is: truncated, and IcePop's two-sided mask), compute_rollout_rejection_mask
        (rollout_rs token_k1, seq_sum_k1, seq_mean_k1) and compute_offpolicy_metrics.
  TRL   GRPOTrainer._compute_loss (loss_type "sapo" and "bnpo", the high-entropy mask, the
        adaptive entropy coefficient), GMPOTrainer._compute_loss and get_high_entropy_mask are
        methods of a trainer that needs a model and a dataset to build, so they are called
        unbound on `TrlStub`, which holds only the fields they read and returns our log-probs as
        the model's. The importance-sampling ratio (vllm_importance_sampling_mode) and GDPO's
        multi_objective_aggregation="normalize_then_sum" are not functions at all but lines inside
        GRPOTrainer._generate_and_score_completions: `trl_lines` cuts them out of the installed
        source, from the statement they start with to the one after them, and runs them on our
        tensors. If a later TRL rewrites those statements, the cut fails loudly (ValueError,
        SyntaxError or NameError) instead of testing something else.

Tolerances: float64 losses and gradients within 1e-7 relative (verl's 1e-8 guards are the only
difference) except TRL's SAPO, whose temperatures torch.where makes float32 (1.05 becomes
1.04999995): 1e-6. float32 tensors (entropy control, mismatch): 1e-6 relative, 1e-7 absolute.

Where the real code differs from the transcription (reported in each test's docstring):
  - verl 0.9.1 has a `gdpo` estimator; it whitens over response tokens, not sequences.
  - verl 0.9.1's rollout_rs bounds are on k1 = −log ρ: "a_b" keeps ρ in [1/b, 1/a], the mirror
    of the transcription's [a, b] (the same set only when a = 1/b).
  - verl 0.9.1's ESS reads the applied weights (clamped into [0, C]), not [1/C, C]: it is ours.
  - verl 0.9.1's rollout_is takes "lower_upper" for IcePop, a two-sided mask: our *_mask modes.
  - verl's DPPO cap is `clip_ratio_c`, 3.0 in a real ActorConfig; 20 only when the key is absent.
  - TRL's importance_sampling_ratio/mean in a sequence mode is over responses, ours over tokens.
  - verl 0.9.1's IcePop ESS divides by zero when every response is masked (ours reports 0).
"""

import dataclasses
import inspect
import math
import os
import sys
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posttrain.algorithms import make_algorithm
from posttrain.algorithms.entropy_control import AdaptiveEntropyController, TokenSelection, high_entropy_mask
from posttrain.algorithms.grpo import per_term_advantages
from posttrain.roles.mismatch import MismatchCorrection, diagnostics, importance_weights
from tests import test_gdpo_entropy_oracle as ent
from tests import test_loss_variants_oracle as var
from tests import test_mismatch as mis

VERL_REASON = "verl is not installed here: `make peers-test` runs this module with verl 0.9.1"
TRL_REASON = "TRL is not installed here: `make peers-test` runs this module with TRL 1.16.0"
verl = pytest.importorskip("verl", reason=VERL_REASON)
trl = pytest.importorskip("trl", reason=TRL_REASON)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # GMPO lives in trl.experimental: we know, and pin the version
from trl import GRPOConfig  # noqa: E402  (after the skips: these exist only in the peers' venv)
from trl.experimental.gmpo import GMPOConfig, GMPOTrainer  # noqa: E402
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos, rollout_corr_helper  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402


def test_the_versions_the_issues_name():
    assert (verl.__version__, trl.__version__) == ("0.9.1", "1.16.0")


# --- the harnesses ------------------------------------------------------------------------------


def verl_actor(**fields) -> ActorConfig:
    """verl's ActorConfig with its defaults; strategy, rollout_n and a micro-batch size are the
    fields it refuses to build without, and none of them reaches a loss."""
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **fields)


def verl_loss(name, old_logp, logp, adv, mask, loss_agg="token-mean", **fields):
    """(loss, d loss / d logp, metrics) from verl's registered policy loss `name`."""
    logp = logp.clone().requires_grad_(True)
    loss, metrics = core_algos.get_policy_loss_fn(name)(old_logp, logp, adv, mask, loss_agg, verl_actor(**fields))
    loss.backward()
    return loss.detach(), logp.grad, metrics


GRPO_CONFIG = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}  # TRL's defaults, no trainer built
ACCELERATOR = SimpleNamespace(reduce=lambda t, reduction: t, gather=lambda t: t, sync_gradients=True,
                              pad_across_processes=lambda t, dim, pad_index: t, num_processes=1)


class TrlStub:
    """What TRL's loss methods read from `self`: one process, no gradient accumulation, no KL
    term, TRL's defaults for the rest unless `fields` (GRPOConfig's names) say otherwise. The model's forward is replaced by `logp` (B, T) and `entropies` (B, T): TRL's tensors are
    the completion's only, so column 0 (the prompt token of our layout) is cut off on the way in."""

    get_high_entropy_mask = GRPOTrainer.get_high_entropy_mask

    def __init__(self, logp, entropies=None, **fields):
        self.logp, self.entropies = logp, torch.zeros_like(logp) if entropies is None else entropies
        self.args = SimpleNamespace(**{**GRPO_CONFIG, **fields})
        self.accelerator, self.model = ACCELERATOR, SimpleNamespace(training=True)
        self._metrics = defaultdict(lambda: defaultdict(list))
        self.current_gradient_accumulation_steps = 1
        self.beta, self.off_policy_mask_threshold, self.aux_loss_enabled = 0.0, None, False
        for name in ("loss_type", "importance_sampling_level", "top_entropy_quantile", "use_vllm",
                     "vllm_importance_sampling_correction", "use_adaptive_entropy", "entropy_coef"):
            setattr(self, name, getattr(self.args, name))
        self.epsilon_low = self.args.epsilon
        self.epsilon_high = self.args.epsilon_high if self.args.epsilon_high is not None else self.args.epsilon
        self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy
        self._last_world_entropy, self._entropy_window_stats = float("inf"), None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        return self.logp[:, 1:], self.entropies[:, 1:], None


def trl_loss(trainer, logp, old_logp, row_adv, mask, entropies=None, is_ratio=None, **fields):
    """(loss, d loss / d logp, metrics) from `trainer`._compute_loss run on a TrlStub; with
    `is_ratio` (B, T) or (B, 1), as TRL's vLLM importance sampling hands it over."""
    logp = logp.clone().requires_grad_(True)
    stub = TrlStub(logp, entropies, **fields, use_vllm=is_ratio is not None)
    completion_mask = mask[:, 1:]
    inputs = {"prompt_ids": torch.zeros(len(mask), 1, dtype=torch.long), "prompt_mask": torch.ones(len(mask), 1),
              "completion_ids": torch.zeros(completion_mask.shape, dtype=torch.long),
              "completion_mask": completion_mask, "advantages": row_adv, "old_per_token_logps": old_logp[:, 1:]}
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio if is_ratio.shape[1] == 1 else is_ratio[:, 1:]
    loss = trainer._compute_loss(stub, None, inputs)
    loss.backward()
    return loss.detach(), logp.grad, {k: v[-1] for k, v in stub._metrics["train"].items()}


def trl_lines(first: str, until: str, **names) -> dict:
    """Run the lines of TRL's GRPOTrainer._generate_and_score_completions from the one holding
    `first` up to (not including) the next one holding `until`, with `names` bound; returns the
    names they leave behind."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    start = source.rindex("\n", 0, source.index(first)) + 1
    stop = source.rindex("\n", 0, source.index(until, start)) + 1
    scope = dict(vars(sys.modules[GRPOTrainer.__module__]), **names)  # the module's imports: torch, nanstd, ...
    exec(compile(textwrap.dedent(source[start:stop]), f"<trl {trl.__version__} GRPOTrainer>", "exec"), scope)
    return scope


def assert_same(a, b, rtol=1e-7, atol=1e-9):
    torch.testing.assert_close(a[0], b[0], rtol=rtol, atol=atol)
    torch.testing.assert_close(a[1], b[1], rtol=rtol, atol=atol)


# --- SAPO, GMPO, DPPO: verl's core_algos and TRL's trainers -------------------------------------

V = (var.OLD_LOGP, var.NEW_LOGP, var.ADV_TOKENS, var.MASK)  # float64, 4 responses of 3, 2, 4 and 3 tokens


def test_the_defaults_are_the_peers():
    actor, gmpo = verl_actor(), {f.name: f.default for f in dataclasses.fields(GMPOConfig)}
    sapo = make_algorithm("sapo")
    assert (sapo.tau_pos, sapo.tau_neg) == (actor.tau_pos, actor.tau_neg) == (
        GRPO_CONFIG["sapo_temperature_pos"], GRPO_CONFIG["sapo_temperature_neg"]) == (1.0, 1.05)
    assert make_algorithm("gmpo").log_clip_low == make_algorithm("gmpo").log_clip_high == gmpo["epsilon"] == 0.4
    # verl's actor clip_ratio is 0.2: its GMPO example sets 0.4; its DPPO examples set δ (0.15 TV, 0.05 KL)
    assert (actor.clip_ratio, actor.clip_ratio_c) == (0.2, 3.0)
    # DPPO truncates at clip_ratio_c, read with config.get(..., 20.0): a real ActorConfig always has the
    # key, so a verl run truncates at 3 unless it sets clip_ratio_c; ours is the 20 of the fallback
    assert 1 + make_algorithm("dppo_tv").clip_eps_high == 20.0 != actor.clip_ratio_c


def test_sapo_is_verls_and_trls():
    theirs = verl_loss("sapo", *V)  # verl aggregates SAPO seq-mean-token-mean whatever it is passed
    assert theirs[0].item() == pytest.approx(var.EXPECTED_LOSS["sapo"], abs=1e-9)  # the transcription's number
    assert_same(var.ours("sapo"), theirs)
    assert_same(var.ours("sapo", tau_pos=0.5, tau_neg=2.0), verl_loss("sapo", *V, tau_pos=0.5, tau_neg=2.0))
    trl_sapo = trl_loss(GRPOTrainer, var.NEW_LOGP, var.OLD_LOGP, var.ROW_ADV, var.MASK, loss_type="sapo")
    assert_same(var.ours("sapo"), trl_sapo, rtol=1e-6)


def test_gmpo_is_verls_geo_mean_and_trls():
    theirs = verl_loss("geo_mean", *V, clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4)
    assert theirs[0].item() == pytest.approx(var.EXPECTED_LOSS["gmpo"], abs=1e-9)
    assert_same(var.ours("gmpo"), theirs)
    # verl's pg_clipfrac counts a token outside the range on either side under A > 0 (row 2's fall)
    assert (theirs[2]["actor/pg_clipfrac"], theirs[2]["actor/pg_clipfrac_lower"]) == pytest.approx((3 / 12, 1 / 12))
    assert_same(var.ours("gmpo", log_clip_low=0.1, log_clip_high=0.7),
                verl_loss("geo_mean", *V, clip_ratio_low=0.1, clip_ratio_high=0.7))
    trl_gmpo = trl_loss(GMPOTrainer, var.NEW_LOGP, var.OLD_LOGP, var.ROW_ADV, var.MASK, epsilon=0.4)
    assert_same(var.ours("gmpo"), trl_gmpo)
    # our clipfrac is TRL's clip_ratio/region_mean: tokens whose clip is active
    assert var.ours("gmpo")[2]["clipfrac"] == trl_gmpo[2]["clip_ratio/region_mean"] == pytest.approx(3 / 12)
    assert_same(var.ours("gmpo", log_clip_low=0.1, log_clip_high=0.7),
                trl_loss(GMPOTrainer, var.NEW_LOGP, var.OLD_LOGP, var.ROW_ADV, var.MASK, epsilon=0.1, epsilon_high=0.7))


def test_an_empty_response_counts_for_trl_and_us_not_for_verl():
    """verl's seq-mean leaves a response with no tokens out of its count, TRL and we count it (as 0)."""
    empty = torch.zeros(1, var.T, dtype=var.F64)
    old, new, adv, mask = (torch.cat([x, empty]) for x in V)
    ours = var.ours("sapo", logp=new, old_logp=old, adv=adv, mask=mask)[0].item()
    assert ours == pytest.approx(var.EXPECTED_LOSS["sapo"] * 4 / 5)
    assert verl_loss("sapo", old, new, adv, mask)[0].item() == pytest.approx(var.EXPECTED_LOSS["sapo"])
    row_adv = torch.cat([var.ROW_ADV, torch.zeros(1, dtype=var.F64)])
    assert trl_loss(GRPOTrainer, new, old, row_adv, mask, loss_type="sapo")[0].item() == pytest.approx(ours)


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_is_verls(name):
    """TRL 1.16 has no DPPO. verl reads δ from clip_ratio_low/high and the cap C from clip_ratio_c."""
    delta = make_algorithm(name).delta_high
    theirs = verl_loss(name, *V, clip_ratio=delta, clip_ratio_low=delta, clip_ratio_high=delta, clip_ratio_c=20.0)
    assert theirs[0].item() == pytest.approx(var.EXPECTED_LOSS[name], abs=1e-9)
    loss, grad, metrics = var.ours(name)
    assert_same((loss, grad), theirs)
    assert metrics["trust_region_maskfrac"] == pytest.approx(theirs[2]["actor/pg_clipfrac"])
    for low, high, cap, mode in ((0.1, 0.25, 20.0, "token-mean"), (0.3, 0.02, 3.0, "seq-mean-token-mean"),
                                 (0.15, 0.15, 20.0, "seq-mean-token-sum")):
        assert_same(var.ours(name, delta_low=low, delta_high=high, clip_eps_high=cap - 1, loss_agg=mode),
                    verl_loss(name, *V, mode, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=cap))
    # verl's own default cap, 3: the rare token's weight 100 truncated at 3, not 20
    assert_same(var.ours(name, clip_eps_high=2.0), verl_loss(name, *V, clip_ratio_low=delta, clip_ratio_high=delta))


# --- GDPO: verl's gdpo estimator and TRL's normalize_then_sum -----------------------------------


def trl_normalize_then_sum(terms: torch.Tensor, weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """TRL's multi_objective_aggregation="normalize_then_sum" lines on (B, K) reward terms."""
    stub = SimpleNamespace(reward_funcs=[None] * terms.shape[1], reward_weights=weights)
    return trl_lines("grouped = rewards_per_func.view(-1, num_generations",
                     "is_std_zero = torch.isclose(", self=stub, rewards_per_func=terms,
                     num_generations=num_generations, device=terms.device,
                     unscorable_mask=torch.isnan(terms).all(dim=1))["advantages"]


def verl_gdpo(terms: torch.Tensor, weights: torch.Tensor, groups: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """verl's compute_gdpo_outcome_advantage, each term a reward key of the batch, as its trainer
    hands them over: the score on each response's last token. Returns (B, T)."""
    T = max(lengths)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()  # (B, T)
    keys = [f"term_{k}" for k in range(terms.shape[1])]
    prompts = torch.zeros(len(lengths), 1, dtype=torch.long)
    advantages, _ = core_algos.compute_gdpo_outcome_advantage(
        token_level_rewards=torch.zeros(mask.shape), response_mask=mask, index=groups.numpy(), epsilon=1e-6,
        config=AlgoConfig(gdpo_reward_keys=keys, gdpo_reward_weights=weights.tolist()),
        non_tensor_batch={key: terms[:, k].numpy() for k, key in enumerate(keys)},
        batch={"prompts": prompts, "attention_mask": torch.cat([torch.ones_like(prompts), mask.long()], dim=1)})
    return advantages


def test_gdpo_is_trls_normalize_then_sum():
    ours = per_term_advantages(ent.TERMS, ent.TERM_WEIGHTS.expand(12, 3), ent.GROUPS, "group", 1e-4)
    torch.testing.assert_close(ours, trl_normalize_then_sum(ent.TERMS, ent.TERM_WEIGHTS, 4), rtol=1e-6, atol=1e-6)


def test_gdpo_is_verls_up_to_where_each_whitens():
    """verl 0.9.1 has a `gdpo` estimator (the transcription's mirror had none): each term through
    its GRPO estimator (group mean, Bessel std, +1e-6), weighted and summed as ours, then whitened
    over the batch's response *tokens* (masked_whiten) where ours and TRL's whiten over responses.
    With equal lengths that is one constant factor, (B·L − 1) / (L·(B − 1)) under the root;
    with unequal lengths a long response counts more in verl's mean, and verl's advantages are
    ours moved and scaled (an affine map, the same for every row), no longer centred per response."""
    ours = per_term_advantages(ent.TERMS, ent.TERM_WEIGHTS.expand(12, 3), ent.GROUPS, "group", 1e-6)
    equal = verl_gdpo(ent.TERMS, ent.TERM_WEIGHTS, ent.GROUPS, [5] * 12)
    torch.testing.assert_close(equal, (ours * math.sqrt((12 * 5 - 1) / (5 * (12 - 1))))[:, None].expand(12, 5),
                               rtol=1e-5, atol=1e-5)
    lengths = [3, 5, 2, 4] * 3
    unequal = verl_gdpo(ent.TERMS, ent.TERM_WEIGHTS, ent.GROUPS, lengths)
    per_row = unequal[torch.arange(12), 0]  # every token of a row carries the row's advantage
    n = torch.tensor(lengths, dtype=torch.float32)
    assert (per_row * n).sum().abs() < 1e-5 and per_row.mean().abs() > 1e-2  # centred over tokens, not rows
    scale, shift = np.polyfit(ours.numpy(), per_row.numpy(), 1)
    torch.testing.assert_close(per_row, ours * float(scale) + float(shift), rtol=1e-5, atol=1e-5)


# --- entropy control: verl's Clip-Cov and KL-Cov, TRL's high-entropy tokens and coefficient -----


def verl_cov_loss(name: str, **policy_loss):
    return verl_loss(name, ent.OLD_LOGP, ent.LOGP, ent.ADV, ent.MASK, "token-mean",
                     policy_loss=PolicyLossConfig(loss_mode=name, **policy_loss))


def test_entropy_control_defaults_are_the_peers():
    ours, verls = TokenSelection(), PolicyLossConfig()
    assert (ours.cov_ratio, ours.clip_cov_low, ours.clip_cov_high, ours.kl_cov_coef) == (
        verls.clip_cov_ratio, verls.clip_cov_lb, verls.clip_cov_ub, verls.ppo_kl_coef) == (2e-4, 1.0, 5.0, 0.1)
    assert verls.kl_cov_ratio == ours.cov_ratio
    assert (GRPO_CONFIG["entropy_coef_delta"], GRPO_CONFIG["entropy_coef_max"], GRPO_CONFIG["entropy_coef_min"]) == (
        0.005, 1.0, 0.0)  # ours: delta 0.005, c_max 1 and a floor of 0 (docs/algorithms/entropy_control.md)


def test_clip_cov_is_verls():
    """verl draws its share of the band's tokens with torch.randperm; a ratio of 0.5 makes it
    take every candidate (the transcription asserts so on these tensors), so the draw cannot differ."""
    value, grad, metrics = ent.posttrain_loss(TokenSelection(cov="clip_cov", cov_ratio=0.5, clip_cov_low=0.3,
                                                             clip_cov_high=2.5))
    theirs = verl_cov_loss("clip_cov", clip_cov_ratio=0.5, clip_cov_lb=0.3, clip_cov_ub=2.5)
    assert value == pytest.approx(theirs[0].item(), rel=1e-6)
    torch.testing.assert_close(grad, theirs[1], rtol=1e-6, atol=1e-7)
    assert metrics["clip_cov_frac"] == pytest.approx(theirs[2]["actor/pg_clipfrac"])


def test_kl_cov_is_verls():
    value, grad, metrics = ent.posttrain_loss(TokenSelection(cov="kl_cov", cov_ratio=0.2, kl_cov_coef=0.7))
    theirs = verl_cov_loss("kl_cov", kl_cov_ratio=0.2, ppo_kl_coef=0.7)
    assert value == pytest.approx(theirs[0].item(), rel=1e-6)
    torch.testing.assert_close(grad, theirs[1], rtol=1e-6, atol=1e-7)
    assert metrics["kl_cov_frac"] == pytest.approx(int(0.2 * 21) / 21)


@pytest.mark.parametrize("top", [0.0, 0.2, 0.5, 1.0])
def test_high_entropy_mask_is_trls(top):
    theirs = TrlStub(ent.LOGP).get_high_entropy_mask(ent.ENTROPY, ent.MASK, 1 - top)
    assert torch.equal(high_entropy_mask(ent.ENTROPY, ent.MASK, top), theirs)


def test_training_the_top_fifth_is_trls_loss():
    """TRL's bnpo loss (a token mean, GRPO's clip) with top_entropy_quantile 0.2: our GRPO at
    token-mean with the same selection."""
    value, grad, _ = ent.posttrain_loss(TokenSelection(top_quantile=0.2))
    theirs = trl_loss(GRPOTrainer, ent.LOGP, ent.OLD_LOGP, ent.ADV[:, 1], ent.MASK, ent.ENTROPY,
                      loss_type="bnpo", top_entropy_quantile=0.2)
    assert value == pytest.approx(theirs[0].item(), rel=1e-6)
    torch.testing.assert_close(grad, theirs[1], rtol=1e-6, atol=1e-7)


def test_adaptive_entropy_coefficient_is_trls():
    """TRL's _compute_loss run once per optimizer step, on a batch whose advantages are 0 and
    whose every token has the step's entropy H: its loss is −c·H, so it gives the coefficient c
    the step applied, and the stub's entropy_coef the one it sets for the next."""
    entropies = [0.5, 0.3, 0.25, 0.1, 0.15, 0.4, 0.35, 0.1, 0.05, 0.05, 0.05, 0.3]
    stub = TrlStub(ent.LOGP, use_adaptive_entropy=True, entropy_coef=0.002, entropy_target=0.2,
                   entropy_coef_delta=0.005, entropy_coef_max=0.012, loss_type="bnpo")
    completion = {"prompt_ids": torch.zeros(4, 1, dtype=torch.long), "prompt_mask": torch.ones(4, 1),
                  "completion_ids": torch.zeros(4, 6, dtype=torch.long), "completion_mask": ent.MASK[:, 1:],
                  "advantages": torch.zeros(4), "old_per_token_logps": ent.LOGP[:, 1:]}
    theirs = []
    for entropy in entropies:
        stub.entropies = entropy * ent.MASK
        theirs.append(-GRPOTrainer._compute_loss(stub, None, completion).item() / entropy)
    controller = AdaptiveEntropyController(0.002, target=0.2, delta=0.005, coef_max=0.012)
    ours = [controller.applied()] + [controller.update(entropy) for entropy in entropies[:-1]]
    assert ours == pytest.approx(theirs, abs=1e-7)
    assert max(theirs) == pytest.approx(0.012) and theirs[0] == 0.0  # capped; nothing before a measurement


# --- the mismatch correction: TRL's vllm_importance_sampling_mode, verl's rollout_corr_helper ------
# tests/test_mismatch.py's tensors: 3 responses of 3, 2, 3 tokens, log ρ_t exact in binary

LOG_RATIO = mis.TRAINER - mis.SAMPLER  # (B, T) log π_trainer − log π_sampler, 0 off the response


def trl_importance_sampling(mode: str, clip_min: float | None, clip_max: float) -> dict:
    """TRL's ratio lines, then its sampling/* metrics lines, on our tensors ((B, T) or (B, 1))."""
    stub = SimpleNamespace(vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip_min,
                           vllm_importance_sampling_clip_max=clip_max, accelerator=ACCELERATOR,
                           _metrics=defaultdict(lambda: defaultdict(list)))
    tensors = dict(self=stub, old_per_token_logps=mis.TRAINER, sampling_per_token_logps=mis.SAMPLER,
                   completion_mask=mis.MASK, tool_mask=None, device="cpu", mode="train")
    ratio = trl_lines("per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask",
                      "# Compute the per-token log probabilities for the reference model", mask=mis.MASK, **tensors)
    trl_lines("delta = torch.abs(old_per_token_logps - sampling_per_token_logps)", "output = {", **tensors,
              sequence_level_is=ratio["sequence_level_is"], vllm_importance_sampling_ratio=ratio["vllm_importance_sampling_ratio"])
    return {"ratio": ratio["vllm_importance_sampling_ratio"], **{k: v[-1] for k, v in stub._metrics["train"].items()}}


def ours(mode: str, cap: float, lower: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    weights = importance_weights(mis.TRAINER, mis.SAMPLER, mis.MASK, mode, cap, lower)
    return weights, diagnostics(mis.TRAINER, mis.SAMPLER, mis.MASK, weights, mode, cap, lower)


def test_trls_default_is_sequence_mask_capped_at_3():
    assert (GRPO_CONFIG["vllm_importance_sampling_mode"], GRPO_CONFIG["vllm_importance_sampling_clip_max"],
            GRPO_CONFIG["vllm_importance_sampling_clip_min"]) == ("sequence_mask", 3.0, None)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min, clip_max", [(None, 3.0), (0.5, 2.0), (0.4, 6.0)])
def test_every_trl_mode_is_ours(mode, clip_min, clip_max):
    """The weight each response token's loss is multiplied by, and TRL's logged numbers. TRL's
    importance_sampling_ratio/mean is over its ratios as shaped: one per token in a token mode,
    one per *response* in a sequence mode, where ours (weight_mean) is over tokens; so there the
    same name is a different number unless every response has the same length."""
    theirs = trl_importance_sampling(mode, clip_min, clip_max)
    weights, stats = ours(mode, clip_max, clip_min or 0.0)
    torch.testing.assert_close(weights, theirs["ratio"] * mis.MASK, rtol=1e-6, atol=1e-7)
    assert stats["mismatch/logp_diff_mean"] == pytest.approx(theirs["sampling/sampling_logp_difference/mean"])
    assert stats["mismatch/logp_diff_max"] == pytest.approx(theirs["sampling/sampling_logp_difference/max"])
    if mode.startswith("token"):
        assert stats["mismatch/weight_mean"] == pytest.approx(theirs["sampling/importance_sampling_ratio/mean"])
    else:
        per_response = weights[:, 1]  # (B,) a response's weight sits on each of its tokens
        assert theirs["sampling/importance_sampling_ratio/mean"] == pytest.approx(per_response.mean().item())
        assert stats["mismatch/weight_mean"] == pytest.approx(
            (per_response * torch.tensor(mis.LENGTHS)).sum().item() / sum(mis.LENGTHS))


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [2.0, 5.0])  # RolloutCorrectionConfig's default rollout_is_threshold is 2
def test_verls_rollout_is_truncated_is_our_truncate_mode(level, threshold):
    theirs, metrics = rollout_corr_helper.compute_rollout_correction_weights(LOG_RATIO, mis.MASK, level, threshold)
    weights, stats = ours(f"{level}_truncate", threshold)
    torch.testing.assert_close(weights, theirs, rtol=1e-6, atol=1e-7)
    assert stats["mismatch/weight_mean"] == pytest.approx(metrics["rollout_is_mean"], rel=1e-6)
    # verl 0.9.1's ESS reads the weights applied (clamped into [0, C]); 0.8's raised them to 1/C first
    assert stats["mismatch/ess"] == pytest.approx(metrics["rollout_is_eff_sample_size"], rel=1e-6)
    if level == "token":
        assert stats["mismatch/truncated_fraction"] == pytest.approx(metrics["rollout_is_ratio_fraction_high"])


@pytest.mark.parametrize("level, lower, upper", [("token", 0.5, 2.0), ("token", 0.4, 6.0), ("sequence", 0.4, 6.0)])
def test_verls_rollout_is_icepop_is_our_mask_mode(level, lower, upper):
    """verl 0.9.1's rollout_is_threshold "lower_upper" (IcePop): a weight outside [lower, upper]
    is 0, one inside is ρ. verl 0.8 had only the truncated form."""
    theirs, metrics = rollout_corr_helper.compute_rollout_correction_weights(LOG_RATIO, mis.MASK, level,
                                                                             f"{lower}_{upper}")
    weights, stats = ours(f"{level}_mask", upper, lower)
    torch.testing.assert_close(weights, theirs, rtol=1e-6, atol=1e-7)
    assert stats["mismatch/masked_fraction"] == pytest.approx(metrics["rollout_is_oob_ratio"])
    assert stats["mismatch/ess"] == pytest.approx(metrics["rollout_is_eff_sample_size"], rel=1e-6)


def test_where_icepop_masks_every_response_verls_ess_divides_by_zero():
    """sequence level within [0.5, 2]: all three products (e^1.75, e^-0.875, e^-1) are outside.
    verl 0.9.1's compute_is_metrics then takes 1 / 0 and raises; ours reports an ESS of 0."""
    with pytest.raises(ZeroDivisionError):
        rollout_corr_helper.compute_rollout_correction_weights(LOG_RATIO, mis.MASK, "sequence", "0.5_2.0")
    weights, stats = ours("sequence_mask", 2.0, 0.5)
    assert not weights.any() and stats["mismatch/ess"] == 0.0 and stats["mismatch/masked_fraction"] == 1.0


@pytest.mark.parametrize("option, level", [("token_k1", "token"), ("seq_sum_k1", "sequence"),
                                           ("seq_mean_k1", "geometric")])
@pytest.mark.parametrize("a, b", [(0.5, 2.0), (1 / 1.5, 1.5), (0.4, 6.0)])
def test_verls_k1_rejection_is_our_mask_mode_with_the_bounds_inverted(option, level, a, b):
    """verl 0.9.1's rollout_rs "<option>" with threshold "a_b" keeps k1 = −log ρ (summed or
    averaged over a response) inside [log a, log b]: ρ inside [1/b, 1/a], our mask mode with
    lower = 1/b and cap = 1/a. For the symmetric a = 1/b that is [a, b]; the transcription read
    "a_b" as ρ in [a, b], which for (0.4, 6) is another set. verl's k2, k3 and seq_max options have
    no counterpart here."""
    kept, metrics = rollout_corr_helper.compute_rollout_rejection_mask(LOG_RATIO, mis.MASK, option, f"{a}_{b}")
    weights, stats = ours(f"{level}_mask", 1 / a, 1 / b)
    assert torch.equal((weights > 0).float(), kept)
    assert stats["mismatch/masked_fraction"] == pytest.approx(metrics["rollout_rs_masked_fraction"])
    assert stats["mismatch/seq_masked_fraction"] == pytest.approx(metrics["rollout_rs_seq_masked_fraction"])
    if (a, b) == (0.4, 6.0) and level == "token":  # the inversion matters: e^1.5 = 4.5 is kept by [0.4, 6]
        assert not torch.equal((ours("token_mask", 6.0, 0.4)[0] > 0).float(), kept)


def test_verls_off_policy_metrics():
    theirs = rollout_corr_helper.compute_offpolicy_metrics(mis.TRAINER, mis.SAMPLER, mis.MASK)
    _, stats = ours("token_truncate", 2.0)
    names = {"kl": "kl", "k3_kl": "k3_kl", "training_ppl": "trainer_ppl", "rollout_ppl": "sampler_ppl",
             "chi2_token": "chi2_token", "chi2_seq": "chi2_seq"}
    for their_name, our_name in names.items():
        assert stats[f"mismatch/{our_name}"] == pytest.approx(theirs[their_name], rel=1e-6), their_name


@pytest.mark.parametrize("mode", ["token_mask", "sequence_truncate"])
def test_the_corrected_grpo_loss_is_trls_with_vllm_importance_sampling(mode):
    """End to end: TRL multiplies each token's clipped loss by the ratio; we multiply the
    advantage by it (MismatchCorrection.apply), the same for any weight >= 0. A policy a little
    past the trainer's, so that PPO's clip acts too; TRL's GRPO loss is seq-mean-token-mean, ours."""
    logp = mis.TRAINER + 0.3 * torch.tensor([[0.0, 1, -1, 1], [0, -1, 1, 0], [0, 1, 1, -1]])  # (B, T)
    row_adv = torch.tensor([0.5, -1.0, 0.5])
    corrected, _ = MismatchCorrection(mode, 2.0, 0.5).apply(mis.fixed_batch(advantages=row_adv[:, None] * mis.MASK),
                                                             mis.TRAINER)
    value, grad, _ = var.ours("grpo", logp=logp, old_logp=corrected.old_logp, adv=corrected.advantages, mask=mis.MASK)
    theirs = trl_loss(GRPOTrainer, logp, mis.TRAINER, row_adv, mis.MASK, loss_type="grpo",
                      is_ratio=trl_importance_sampling(mode, 0.5, 2.0)["ratio"])
    assert value.item() == pytest.approx(theirs[0].item(), rel=1e-6) and value.item() != 0.0
    torch.testing.assert_close(grad, theirs[1], rtol=1e-6, atol=1e-7)
