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
        source by their first and last statements and runs them on our tensors. If a later TRL
        moves or rewrites those lines, the cut fails loudly instead of testing something else.

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
from posttrain.algorithms.entropy_control import AdaptiveEntropyController, TokenSelection
from posttrain.algorithms.grpo import per_term_advantages
from posttrain.roles.mismatch import diagnostics, importance_weights
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
    """What TRL's loss methods read from `self`, one process, no accumulation, no KL, no vLLM.
    The model's forward is replaced by `logp` (B, T) and `entropies` (B, T): TRL's tensors are
    the completion's only, so column 0 (the prompt token of our layout) is cut off on the way in."""

    get_high_entropy_mask = GRPOTrainer.get_high_entropy_mask

    def __init__(self, logp, entropies=None, **fields):
        self.logp, self.entropies = logp, torch.zeros_like(logp) if entropies is None else entropies
        self.args = SimpleNamespace(**{**GRPO_CONFIG, **fields})
        self.accelerator, self.model = ACCELERATOR, SimpleNamespace(training=True)
        self._metrics = defaultdict(lambda: defaultdict(list))
        self.current_gradient_accumulation_steps = 1
        self.beta, self.use_vllm, self.vllm_importance_sampling_correction = 0.0, False, False
        self.off_policy_mask_threshold, self.aux_loss_enabled = None, False
        for name in ("loss_type", "importance_sampling_level", "epsilon", "top_entropy_quantile",
                     "use_adaptive_entropy", "entropy_coef", "reward_weights", "scale_rewards"):
            setattr(self, name, getattr(self.args, name))
        self.epsilon_low = self.args.epsilon
        self.epsilon_high = self.args.epsilon_high if self.args.epsilon_high is not None else self.args.epsilon
        self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy
        self._last_world_entropy, self._entropy_window_stats = float("inf"), None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        return self.logp[:, 1:], self.entropies[:, 1:], None


def trl_loss(trainer, logp, old_logp, row_adv, mask, entropies=None, **fields):
    """(loss, d loss / d logp, metrics) from `trainer`._compute_loss run on a TrlStub."""
    logp = logp.clone().requires_grad_(True)
    stub = TrlStub(logp, entropies, **fields)
    completion_mask = mask[:, 1:]
    inputs = {"prompt_ids": torch.zeros(len(mask), 1, dtype=torch.long), "prompt_mask": torch.ones(len(mask), 1),
              "completion_ids": torch.zeros(completion_mask.shape, dtype=torch.long),
              "completion_mask": completion_mask, "advantages": row_adv, "old_per_token_logps": old_logp[:, 1:]}
    loss = trainer._compute_loss(stub, None, inputs)
    loss.backward()
    return loss.detach(), logp.grad, {k: v[-1] for k, v in stub._metrics["train"].items()}


def trl_lines(first: str, last: str, **names) -> dict:
    """Run the lines of TRL's GRPOTrainer._generate_and_score_completions from the one holding
    `first` through the one holding `last` (the first such after `first`), with `names` bound;
    returns the names they leave behind."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    start = source.rindex("\n", 0, source.index(first)) + 1
    stop = source.index("\n", source.index(last, start))
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
