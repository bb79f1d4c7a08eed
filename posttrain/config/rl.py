"""The RL stage's settings (`rl`): what the stage is, at its top, and one section per concern
below it, so that a reader holds one idea at a time and `--help` can show the sections a run
reads (cli/train_flags.py):

    rl             what the stage is: the algorithm, its length, how many prompts and samples
                   a step draws, and how often the dev split measures it
    rl.optim       the optimizer and its learning-rate schedule: what turns a gradient into
                   a step (the numbers that collapse a run when wrong)
    rl.update      how one rollout batch becomes optimizer steps (epochs, minibatches) and
                   how much each costs (micro-batches, inert rows, shared prompts); the last
                   three change speed and memory, never the update
    rl.sampling    how the rollout samples the policy (config/sections.py: evaluation and
                   search read the same dataclass)
    rl.reward      the training reward: its terms, a user function's time limit, and the
                   length shaping paid on top (config/reward.py)
    rl.kl          the distance to the reference: the adaptive controller of kl_coef and the
                   per-step drift log; the KL term itself is an algorithm's (its kl_coef)
    rl.entropy     entropy control: the adaptive controller of entropy_coef, and which tokens
                   carry policy gradient (Clip-Cov, KL-Cov, the high-entropy tokens)
    rl.preference  a preference loss's data: a file of pairs, or pairs built from the policy's
                   own samples, offline or in online rounds (config/prompts.py)
    rl.mismatch    the correction wherever the sampler is not the trainer (int8 or bf16
                   sampling, another engine, async staleness): its importance weights
    rl.alerts      what a hacking monitor's alert does to the run
    rl.rm          the learned reward model (config/reward.py)
    rl.curation    which training prompts a step draws (config/prompts.py)

The algorithm's own hyperparameters are not a section here: each algorithm's dataclass holds
them (posttrain/algorithms/), with its reasons; rl.algo_params records the ones a run
changed, and pipelines/algorithm_settings.py reads them back into that dataclass, typed,
whenever a config is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posttrain.config.checks import check, check_non_negative, check_positive
from posttrain.config.prompts import CurationConfig, PreferenceConfig
from posttrain.config.reward import RewardConfig, RewardModelConfig
from posttrain.config.sections import SamplingParams


@dataclass
class OptimConfig:
    """AdamW and its schedule: linear warmup, then cosine decay to a fraction of the rate."""

    lr: float = 1e-4  # 3e-4 collapsed the prototype (pass@1 56% -> 6%); see ARCHITECTURE.md
    warmup_steps: int = 10  # linear warmup before the cosine decay: Adam's first steps are noisy
    # the cosine decays the rate to this fraction of rl.optim.lr by the last step; 1 = constant,
    # which online DPO wants: its last rounds bring the freshest pairs (docs/algorithms/dpo.md)
    final_lr_fraction: float = 0.1
    # AdamW's second-moment decay: 0.95 is the shorter memory LLM training uses, so the step
    # size adapts quickly when the reward signal shifts; 0.999 is PyTorch's (and TRL's DPO) default
    adam_beta2: float = 0.95
    weight_decay: float = 0.0  # no decay: it would pull the policy away from the SFT start
    grad_clip: float = 1.0  # global-norm clipping; guards against a rare huge-advantage batch; 0 = off

    def validate(self, prefix: str = "rl.optim") -> None:
        check(self.lr > 0, f"{prefix}.lr", self.lr, "a positive number")
        check(0 <= self.final_lr_fraction <= 1, f"{prefix}.final_lr_fraction", self.final_lr_fraction,
              "a number in [0, 1] (1 = constant after warmup)")
        check(0 <= self.adam_beta2 < 1, f"{prefix}.adam_beta2", self.adam_beta2, "a number in [0, 1)")
        check_non_negative(self, prefix, "warmup_steps", "weight_decay", "grad_clip")


@dataclass
class UpdateConfig:
    """How a step's rollout batch becomes optimizer steps, and what each one computes."""

    epochs: int = 1  # passes over each rollout batch; 1 = purely on-policy
    minibatches: int = 1  # optimizer steps per epoch; 1 = one step on the whole batch
    micro_batch_size: int = 0  # rows per forward/backward (gradient accumulation); 0 = all at once
    # leave out of the update the rows whose loss has no gradient (advantage 0 and no KL or
    # entropy term: Algorithm.rows_with_gradient): the same update for less work
    skip_inert_rows: bool = True
    # compute each prompt once per group of samples, in the update and the reference, and run the
    # K responses on top of its KV cache (posttrain/models/shared_prefix.py): the same log-probs and
    # gradients to float rounding, for less work when prompts are long. false = the plain forward
    share_prompt: bool = True

    def validate(self, prefix: str = "rl.update") -> None:
        check_positive(self, prefix, "epochs", "minibatches")
        check_non_negative(self, prefix, "micro_batch_size")


@dataclass
class KLConfig:
    """The policy's distance to the reference, steered and logged. The penalty itself is the
    algorithm's kl_coef (--grpo.kl_coef): these settings steer it and measure the drift."""

    # adaptive KL (Ziegler et al. 2019): steer the algorithm's kl_coef so that KL to the
    # reference (k3, per token) tracks this target; 0 keeps kl_coef fixed
    target: float = 0.0
    horizon: int = 100  # steps over which the controller closes most of the gap to rl.kl.target
    # run the reference every step to log KL(π ‖ π_ref) even when the loss has no KL term:
    # drift from the starting policy is the first thing to look at when a run goes wrong
    track: bool = True
    # when only that log reads the reference (no KL term in the loss), it scores this many rows
    # of each step, evenly spaced, not all of them: the log is a mean over tokens, and in make
    # run the full pass was 28% of the step. Every row when something acts on the number
    # (rl.kl.target; rl.alerts.action stop/rollback on kl_explosion). 0 = every row
    track_rows: int = 64

    def validate(self, prefix: str = "rl.kl") -> None:
        check_positive(self, prefix, "horizon")
        check_non_negative(self, prefix, "target", "track_rows")


@dataclass
class EntropyConfig:
    """Entropy control (posttrain/algorithms/entropy_control.py): the entropy bonus steered
    toward a target, and which tokens carry policy gradient. The bonus itself is the
    algorithm's entropy_coef (--grpo.entropy_coef), the controller's starting value."""

    # adaptive entropy control (Skywork-OR1, arXiv:2505.22312): the bonus is paid only while the
    # mean per-token entropy (the "entropy" metric, nats) is at or below this target, and its
    # coefficient steps up while it is, down while it is not; 0 keeps entropy_coef fixed
    target: float = 0.0
    delta: float = 0.005  # the coefficient's step per RL step (TRL's entropy_coef_delta default)
    coef_max: float = 1.0  # the ceiling on the coefficient (TRL's entropy_coef_max)
    # train only the tokens in this top share of entropy, the forks of a reasoning path (Wang et al.,
    # arXiv:2506.01939, "Beyond the 80/20 Rule", keep 0.2; TRL's top_entropy_quantile); 1 = every token
    top_quantile: float = 1.0
    # the covariance-based controls (arXiv:2505.22617): "clip_cov" detaches the gradient of a random
    # cov_ratio of the tokens whose cov(log π, A) lies in (clip_cov_low, clip_cov_high); "kl_cov" adds
    # kl_cov_coef · |log π − log π_old| to the top cov_ratio by cov and drops PPO's clip; "none"
    cov: str = "none"
    cov_ratio: float = 2e-4  # the share of response tokens either selects: verl's default for both
    clip_cov_low: float = 1.0  # the bottom of Clip-Cov's candidate band of cov values: verl's default
    clip_cov_high: float = 5.0  # the top of that band: verl's default
    kl_cov_coef: float = 0.1  # KL-Cov's penalty weight: verl's configured ppo_kl_coef

    def validate(self, prefix: str = "rl.entropy") -> None:
        check_non_negative(self, prefix, "target", "clip_cov_low", "kl_cov_coef")
        check(self.delta > 0, f"{prefix}.delta", self.delta, "a number > 0")
        check(self.coef_max > 0, f"{prefix}.coef_max", self.coef_max, "a number > 0")
        check(0 <= self.top_quantile <= 1, f"{prefix}.top_quantile", self.top_quantile,
              "a number in [0, 1] (1 = every token; 0.2 keeps the top fifth by entropy)")
        check(self.cov in ("none", "clip_cov", "kl_cov"), f"{prefix}.cov", self.cov, "'none', 'clip_cov' or 'kl_cov'")
        check(0 < self.cov_ratio <= 1, f"{prefix}.cov_ratio", self.cov_ratio, "a number in (0, 1]")
        check(self.clip_cov_high > self.clip_cov_low, f"{prefix}.clip_cov_high", self.clip_cov_high,
              f"a number above rl.entropy.clip_cov_low={self.clip_cov_low} (the band's top)")

    def selects_tokens(self) -> bool:
        """Whether a token setting is on: the loss then trains only some tokens, or adds KL-Cov's penalty."""
        return self.top_quantile < 1 or self.cov != "none"


# how the importance weight w is built from ρ = π_trainer / π_sampler (roles/mismatch.py): the
# level ρ is taken at × what happens to a ρ outside [rl.mismatch.lower, rl.mismatch.cap]
MISMATCH_MODES = tuple(f"{level}_{bound}" for level in ("token", "sequence", "geometric") for bound in ("truncate", "mask"))


@dataclass
class MismatchConfig:
    """The correction wherever the sampler is not the trainer: an int8 or bf16 sampler, an
    engine other than posttrain's own, the async topology's stale batches (roles/mismatch.py).
    Each response token's advantage is weighted by w, built from ρ = π_trainer / π_sampler."""

    # the level of ρ: token (each token's own ρ_t), sequence (the product Π_t ρ_t over the
    # response) or geometric (its geometric mean (Π_t ρ_t)^(1/|y|), GSPO's sequence ratio);
    # and what becomes of a ρ outside [lower, cap]: truncate (clamped into it) or mask (w = 0:
    # the token, or the whole response, carries no policy gradient). TRL's modes are the
    # token_ and sequence_ four. token_truncate because every int8 and async number in
    # BENCHMARKS.md was measured with it (TRL's default is sequence_mask, with cap 3)
    mode: str = "token_truncate"
    # the upper bound C on ρ: larger is less biased and noisier (Ionides 2008, "Truncated
    # importance sampling"); 2, what the int8 and async runs were measured with
    cap: float = 2.0
    # the lower bound on ρ; 0 = none. With a *_mask mode a ρ below it is masked too, both
    # sides at once as IcePop does; with *_truncate it is raised to it (TRL's clip_min)
    lower: float = 0.0
    # correct and measure even when the sampler is the trainer's own float32 forward (the torch
    # engine, colocated or sync), where ρ is 1 up to float rounding: the diagnostics of a run that
    # needs none, for one more forward pass over the trained rows per step
    always: bool = False

    def validate(self, prefix: str = "rl.mismatch") -> None:
        check(self.mode in MISMATCH_MODES, f"{prefix}.mode", self.mode, f"one of {', '.join(MISMATCH_MODES)}")
        check(self.cap >= 1, f"{prefix}.cap", self.cap,
              "a number >= 1 (ρ = 1, a token the sampler and the trainer agree on, must keep its weight)")
        check(0 <= self.lower <= 1, f"{prefix}.lower", self.lower,
              "a number in [0, 1] (0 = no lower bound; ρ = 1 must stay inside [lower, cap])")


# the names rl.algo can take: posttrain/algorithms/'s RL algorithms (ALGORITHMS) and preference losses
# (PREFERENCE_LOSSES), in their order; a test keeps them equal. Listed here because the registries import torch,
# and the command line reads the names before it loads torch: each is a section of flags (--grpo.kl_coef 0.04),
# and a typo'd flag or algorithm name is refused at once (cli/train_flags.py)
RL_ALGORITHM_NAMES = ("reinforce", "rloo", "kimi", "ppo", "prime", "reinforce_pp", "grpo", "dr_grpo", "lite_ppo",
                      "dapo", "gspo", "cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl", "opd")
PREFERENCE_LOSS_NAMES = ("dpo", "ipo", "kto", "orpo", "simpo")
ON_ALERT = ("warn", "stop", "rollback")  # what rl.alerts.action can name (posttrain/pipelines/rl.py)
# the monitors rl.alerts.monitors can name: posttrain/runs/monitors.py's, a test keeps the two equal
MONITORS = ("proxy_gold_divergence", "kl_explosion", "length_blowup", "entropy_collapse", "entropy_blowup",
            "truncation", "no_learning_signal", "sampler_mismatch", "chosen_likelihood_collapse", "template_mimicry")


@dataclass
class AlertsConfig:
    """What the hacking monitors' alerts do (posttrain/runs/monitors.py, pipelines/alerts.py)."""

    # what an alert does: "warn" prints it and trains on; "stop" ends the RL stage at that step;
    # "rollback" ends it and puts back the weights of the step where dev pass@1 was best. warn by
    # default: a monitor detects, it does not diagnose, and a stop on a false alarm throws away a
    # good run's remaining steps
    action: str = "warn"
    # the monitors whose alerts rl.alerts.action acts on, comma-separated: the two that mean the
    # reward is being exploited (the others, e.g. length_blowup, are often benign)
    monitors: str = "proxy_gold_divergence,kl_explosion"

    def validate(self, prefix: str = "rl.alerts") -> None:
        check(self.action in ON_ALERT, f"{prefix}.action", self.action, f"one of {', '.join(ON_ALERT)}")
        unknown = [name for name in self.monitors.split(",") if name.strip() not in MONITORS]
        check(not unknown, f"{prefix}.monitors", self.monitors,
              f"monitor names joined by ',', each one of {', '.join(MONITORS)} (unknown: {', '.join(unknown)})")


@dataclass
class RLConfig:
    """Stage 2, RL or a preference loss from the SFT policy: what the stage is, then its
    sections (the module docstring says why each is one)."""

    # an RL algorithm (posttrain/algorithms/) or a preference loss (dpo, ipo, kto, orpo,
    # simpo); grpo, the critic-free group-baseline algorithm the main job was measured with
    algo: str = "grpo"
    # the algorithm's own hyperparameters changed from its defaults ({"kl_coef": 0.04}); on the
    # command line each is a flag of the algorithm's section (--grpo.kl_coef 0.04); {} = the
    # algorithm's defaults, each with its reason in posttrain/algorithms/. Read back into the
    # algorithm's own dataclass, typed, whenever a config is read (pipelines/algorithm_settings.py)
    algo_params: dict[str, Any] = field(default_factory=dict)
    steps: int = 200  # optimizer updates; make run's GRPO has levelled off by then
    prompts_per_step: int = 32  # prompts sampled per step (preference losses: pairs per step)
    samples_per_prompt: int = 8  # K: the group size GRPO's baseline averages over
    # dynamic sampling (DAPO): draw fresh prompts up to this many times per step to refill
    # the groups dropped for having no reward variance; capped, since a policy that solves,
    # or fails, everything would otherwise loop forever
    max_sampling_rounds: int = 4
    eval_every: int = 25  # steps between dev-split pass@1 measurements
    dev_size: int = 200  # dev problems per measurement: cheap, ±7 points at 95%
    optim: OptimConfig = field(default_factory=OptimConfig)  # the optimizer and its learning-rate schedule
    # how a rollout batch becomes optimizer steps (epochs, minibatches) and what each step costs
    update: UpdateConfig = field(default_factory=UpdateConfig)
    # how the rollout samples the policy's completions (also the generation budget the
    # length-aware algorithms read as max_len)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # the training reward: the verifier, presets or your functions, and length shaping on top
    reward: RewardConfig = field(default_factory=RewardConfig)
    # the distance to the reference: an adaptive kl_coef and the per-step KL log
    kl: KLConfig = field(default_factory=KLConfig)
    # entropy control: an adaptive entropy_coef, and which tokens carry policy gradient
    entropy: EntropyConfig = field(default_factory=EntropyConfig)
    # preference losses: where the pairs come from (a file, the verifier, the policy's own
    # judgement), offline or in online rounds
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    # the importance weights wherever the sampler is not the trainer (int8 or bf16 sampling, async)
    mismatch: MismatchConfig = field(default_factory=MismatchConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)  # what a hacking monitor's alert does to the run
    # a learned training reward instead of the verifier's (rm.path), and how `posttrain
    # rlhf` trains one; the verifier's verdict stays in every sample's details as the gold
    # reward, and held-out pass@1 stays the verifier's
    rm: RewardModelConfig = field(default_factory=RewardModelConfig)
    # which training prompts the RL stage samples and how often: a pool filtered by pass rate, a
    # curriculum, dedup and decontamination; off (pool_size 0) by default (posttrain/data/curation.py)
    curation: CurationConfig = field(default_factory=CurationConfig)

    def validate(self, prefix: str = "rl") -> None:
        check(self.algo in RL_ALGORITHM_NAMES + PREFERENCE_LOSS_NAMES, f"{prefix}.algo", self.algo,
              f"one of {sorted(RL_ALGORITHM_NAMES)} (RL) or {sorted(PREFERENCE_LOSS_NAMES)} (preference)")
        check_positive(self, prefix, "prompts_per_step", "samples_per_prompt", "eval_every", "dev_size",
                       "max_sampling_rounds")
        check_non_negative(self, prefix, "steps")
        self.optim.validate(f"{prefix}.optim")
        self.update.validate(f"{prefix}.update")
        self.sampling.validate(f"{prefix}.sampling")
        self.reward.validate(f"{prefix}.reward")
        self.kl.validate(f"{prefix}.kl")
        self.entropy.validate(f"{prefix}.entropy")
        self.preference.validate(f"{prefix}.preference")
        self.mismatch.validate(f"{prefix}.mismatch")
        self.alerts.validate(f"{prefix}.alerts")
        self.rm.validate(f"{prefix}.rm")
        self.curation.validate(f"{prefix}.curation")
        check(not (self.preference.self_reward and self.rm.path), f"{prefix}.preference.self_reward",
              self.preference.self_reward,
              f"false with {prefix}.rm.path={self.rm.path!r}: one ranker builds the pairs, the policy's own verdicts "
              f"(self_reward) or the reward model's scores (rm.path); drop one")
