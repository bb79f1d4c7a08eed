"""The RL stage's settings (`rl`): the algorithm and its update, the training reward, the
hacking monitors' alerts, and two sub-sections of their own: the learned reward model
(`rl.rm`) and prompt curation (`rl.curation`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from posttrain.config.checks import check, check_non_negative, check_positive
from posttrain.config.sections import SamplingParams


@dataclass
class RewardModelConfig:
    """The learned reward of `posttrain rlhf`: a Bradley–Terry model trained on pairs of the
    SFT policy's samples that the verifier ranked (posttrain/pipelines/rlhf.py)."""

    # a trained reward-model directory, or several joined by "," (an ensemble, combined by
    # rl.rm.ensemble); "" = the verifier is the training reward. With a preference loss, the
    # reward model ranks the policy's samples into pairs instead of the verifier: one pair per
    # prompt, its best-scored sample against its worst. With an "rm" term in rl.reward it is
    # that term's scorer, on top of the verifier, instead of replacing it
    path: str = ""
    # how an ensemble's scores combine (rewards/ensemble.py): "mean", "min" (worst case) or
    # "mean-minus-std" (disagreement charged); mean, the plain average, changes least
    ensemble: str = "mean"
    disagreement_coef: float = 1.0  # λ of mean-minus-std: one standard deviation of the members' scores
    # reward models `posttrain rlhf` trains, each from its own seed (reward_model_0, _1, ...),
    # then combined by rl.rm.ensemble; 1 trains the single model the README's runs used
    ensemble_size: int = 1
    prompts: int = 1024  # training prompts whose samples make the pairs (held-out pairs: rl.dev_size dev prompts)
    temperature: float = 1.5  # the SFT policy is near-deterministic at T = 1: hotter samples give more distinct pairs
    # ~6 epochs of the ~1,700 pairs 1,024 prompts give; measured with pooling "loglik":
    # pairwise accuracy 0.91 train, 0.77 held out (283 pairs; "last" at 150 steps: 0.68, 0.64)
    steps: int = 300
    lr: float = 1e-4  # the body starts from the SFT policy, so smaller than from-scratch training's 1e-3
    batch_size: int = 32  # pairs per step
    # pairs per forward and backward pass (gradient accumulation: the step's gradient is the whole
    # batch's, to float rounding); 0 = all batch_size pairs at once, as the runs above trained. A
    # transformers body wants a few: measured on SmolLM2-135M ("loglik", 32 pairs of ~60-token
    # arithmetic texts), one step peaked at 7.4 GB of memory with 0 and 3.75 GB with 4
    micro_batch_size: int = 0
    # what the scalar head reads (rewards/reward_model.py): "last" real token's hidden
    # state, "mean" hidden state, or "loglik", the body's own mean token log-likelihood.
    # Measured on the arithmetic task's 1,694 pairs (283 held out): "last" memorises (300
    # steps: 0.79 train, 0.59 held out); "mean" 0.62–0.70 held out, also with 4× the pairs;
    # and "loglik" 0.77 held out at 300 steps, because the SFT body already finds a wrong
    # step unlikely (its likelihood ranks 0.79 of the held-out pairs right before any training)
    pooling: str = "loglik"

    def paths(self) -> list[str]:
        """The reward-model directories `path` names (several joined by ","; [] for "")."""
        return [part.strip() for part in self.path.split(",")] if self.path else []

    def validate(self, prefix: str = "rl.rm") -> None:
        check_positive(self, prefix, "prompts", "steps", "batch_size", "ensemble_size")
        check_non_negative(self, prefix, "micro_batch_size")
        check(self.ensemble in ("mean", "min", "mean-minus-std"), f"{prefix}.ensemble", self.ensemble,
              "'mean', 'min' or 'mean-minus-std'")
        check(self.disagreement_coef >= 0, f"{prefix}.disagreement_coef", self.disagreement_coef, "a number >= 0")
        check(self.pooling in ("last", "mean", "loglik"), f"{prefix}.pooling", self.pooling,
              "'last', 'mean' or 'loglik'")
        check(self.lr > 0, f"{prefix}.lr", self.lr, "a positive number")
        check(self.temperature > 0, f"{prefix}.temperature", self.temperature, "a number > 0")


ON_ALERT = ("warn", "stop", "rollback")  # what rl.on_alert can name (posttrain/pipelines/rl.py)
# the monitors rl.stop_on can name: posttrain/runs/monitors.py's, a test keeps the two equal
MONITORS = ("proxy_gold_divergence", "kl_explosion", "length_blowup", "entropy_collapse", "no_learning_signal",
            "sampler_mismatch", "chosen_likelihood_collapse")


CURATION_WEIGHTS = ("uniform", "failure", "signal")
CURATION_ORDERS = ("none", "easy_to_hard")
CURATION_MATCHES = ("exact", "ngram")


@dataclass
class CurationConfig:
    """Which training prompts RL samples, and how often (posttrain/data/curation.py): a pool of
    distinct training prompts, screened against the held-out and dev sets, measured under the
    current policy, filtered by pass rate, and drawn from by a curriculum."""

    # distinct training prompts in the curated pool (the train split's fixed set at the run's seed);
    # 0 = no pool: every step draws fresh prompts from the whole train split, as without curation
    pool_size: int = 0
    # samples per prompt when the pool's pass rates are measured (at rl.sampling's temperature, what
    # training samples), before the first step and every remeasure_every steps; 8 = a GRPO group, so a
    # measured pass rate is in steps of 1/8
    k: int = 8
    # keep the prompts whose measured pass rate is at least this (inclusive); 0 keeps the hopeless
    min_pass_rate: float = 0.0
    # ... and at most this (inclusive); 1 keeps the solved. 1/8..7/8 (0.125, 0.875) with k = 8 drops
    # both: what 0 or 8 of 8 samples solve gives GRPO advantage 0 in every row
    max_pass_rate: float = 1.0
    # also filter while training: a step's group outside the band is dropped and refilled by the
    # controller's sampling rounds (the loop of DAPO's dynamic sampling, capped by
    # rl.max_sampling_rounds), and its prompt leaves the pool; off = the band is applied to measurements only
    online: bool = False
    # steps between re-measuring the whole pool (k samples a prompt again; prompts the policy has
    # since learnt, or can now learn, move in or out of the band); 0 = measure once, before RL
    remeasure_every: int = 0
    # how a step draws from the pool: "uniform"; "failure", P(prompt) ∝ 1 − its latest pass rate p (the
    # measurement, then every group sampled from it), so what the policy fails comes up most; or "signal",
    # ∝ p(1 − p), the variance of its 0/1 reward, so neither the solved nor the hopeless come up
    weights: str = "uniform"
    # "easy_to_hard": the pool's difficulty labels (meta.difficulty, or arithmetic's level with
    # --env.levels) unlock one at a time over rl.steps, in equal stages; "none" draws every label throughout
    order: str = "none"
    # how a training prompt is matched against the held-out and dev prompts (dropped: decontamination)
    # and the pool's earlier prompts (dropped: dedup): "exact" (normalised text) or "ngram" (also a
    # share of its n-grams in one other prompt; posttrain/data/decontamination.py)
    match: str = "exact"
    # match ngram: tokens per n-gram (words, numbers and single symbols); 13 is GPT-3's benchmark check.
    # A prompt of at most this many tokens is one n-gram, so lower it for short prompts (arithmetic: 11)
    ngram_size: int = 13
    ngram_overlap: float = 0.5  # match ngram: the share of a prompt's n-grams another prompt must hold

    def enabled(self) -> bool:
        return self.pool_size > 0

    def filters(self) -> bool:
        return (self.min_pass_rate, self.max_pass_rate) != (0.0, 1.0)

    def measures(self) -> bool:
        """Whether the pool's pass rates are measured: only when something reads them."""
        return self.enabled() and (self.filters() or self.weights != "uniform")

    def validate(self, prefix: str = "rl.curation") -> None:
        check_non_negative(self, prefix, "pool_size", "remeasure_every")
        check_positive(self, prefix, "k", "ngram_size")
        check(0 <= self.min_pass_rate <= self.max_pass_rate <= 1, f"{prefix}.min_pass_rate", self.min_pass_rate,
              f"0 <= min_pass_rate <= max_pass_rate={self.max_pass_rate} <= 1")
        check(self.weights in CURATION_WEIGHTS, f"{prefix}.weights", self.weights, f"one of {list(CURATION_WEIGHTS)}")
        check(self.order in CURATION_ORDERS, f"{prefix}.order", self.order, f"one of {list(CURATION_ORDERS)}")
        check(self.match in CURATION_MATCHES, f"{prefix}.match", self.match, f"one of {list(CURATION_MATCHES)}")
        check(0 < self.ngram_overlap <= 1, f"{prefix}.ngram_overlap", self.ngram_overlap, "a number in (0, 1]")
        if self.online:
            check(self.filters(), f"{prefix}.online", self.online, f"false unless a band is set: online filtering "
                  f"drops the groups outside [{prefix}.min_pass_rate, {prefix}.max_pass_rate], and [0, 1] drops none")
            # a band of 0 only (or 1 only) keeps groups that all scored alike: advantage 0 in every kept row
            check(self.max_pass_rate > 0 and self.min_pass_rate < 1, f"{prefix}.online", self.online,
                  f"false with the band [{self.min_pass_rate}, {self.max_pass_rate}]: online it keeps only groups whose "
                  "samples all scored alike, which carry no gradient; widen the band or filter before RL only")
        if self.remeasure_every:
            check(self.measures(), f"{prefix}.remeasure_every", self.remeasure_every,
                  f"0 unless pass rates are read (a band, or {prefix}.weights failure or signal)")
        if not self.enabled():
            changed = [f.name for f in dataclasses.fields(self)
                       if f.name != "pool_size" and getattr(self, f.name) != getattr(CurationConfig(), f.name)]
            check(not changed, f"{prefix}.pool_size", self.pool_size,
                  f"a positive number of prompts with {', '.join(f'{prefix}.{name}' for name in changed)} set: "
                  "curation works on a pool of distinct training prompts (e.g. --rl.curation.pool_size 2000)")


@dataclass
class RLConfig:
    # an RL algorithm (posttrain/algorithms/) or a preference loss (dpo, ipo, kto, orpo,
    # simpo); grpo, the critic-free group-baseline algorithm the main job was measured with
    algo: str = "grpo"
    # the algorithm's own hyperparameters changed from its defaults ({"kl_coef": 0.04}); on the
    # command line each is a flag of the algorithm's section (--grpo.kl_coef 0.04); {} = the
    # algorithm's defaults, each with its reason in posttrain/algorithms/
    algo_params: dict[str, Any] = field(default_factory=dict)
    steps: int = 200  # optimizer updates; make run's GRPO has levelled off by then
    prompts_per_step: int = 32  # prompts sampled per step (preference losses: pairs per step)
    samples_per_prompt: int = 8  # K: the group size GRPO's baseline averages over
    lr: float = 1e-4  # 3e-4 collapsed the prototype (pass@1 56% -> 6%); see DESIGN.md
    warmup_steps: int = 10  # linear warmup before the cosine decay: Adam's first steps are noisy
    # the learning rate decays (cosine) to this fraction of rl.lr by the last step; 1 keeps it
    # constant after warmup. Online DPO wants 1: its last rounds bring the freshest pairs, and
    # a decayed rate barely learns from them (docs/algorithms/dpo.md)
    final_lr_fraction: float = 0.1
    # AdamW's second-moment decay: 0.95 is the shorter memory LLM training uses, so the step
    # size adapts quickly when the reward signal shifts; 0.999 is PyTorch's (and TRL's DPO) default
    adam_beta2: float = 0.95
    weight_decay: float = 0.0  # no decay: it would pull the policy away from the SFT start
    grad_clip: float = 1.0  # global-norm clipping; guards against a rare huge-advantage batch; 0 = off
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
    # dynamic sampling (DAPO): draw fresh prompts up to this many times per step to refill
    # the groups dropped for having no reward variance; capped, since a policy that solves,
    # or fails, everything would otherwise loop forever
    max_sampling_rounds: int = 4
    # preference losses train on pairs: a file (JSONL, JSON, Parquet, a saved dataset; chosen/rejected
    # or KTO's completion/label, posttrain/data/preference.py), or (when "") pairs built by the
    # verifier from samples of the starting policy: pair_prompts training prompts ×
    # samples_per_prompt completions, every correct one paired with every incorrect one
    pairs: str = ""
    # your column names for the pairs' (chosen, rejected, prompt, completion, label), when they
    # differ: "chosen=good,rejected=bad" (ours = yours; posttrain/envs/dataset_files.py)
    pairs_columns: str = ""
    pair_prompts: int = 256  # training prompts whose samples the verifier turns into pairs (no rl.pairs file)
    # online (iterative) preference optimisation: the same budget in this many rounds, each
    # building fresh pairs from the current policy's samples; 1 = offline. On arithmetic, 20
    # rounds of 5 steps beat offline, 4 rounds of 25 did not (docs/algorithms/dpo.md)
    online_rounds: int = 1
    # iterative DPO's reference (Pang et al. 2024; Xiong et al. 2024): at the start of each
    # online round, π_ref becomes the current policy, so each round is one DPO problem
    # anchored where that round's pairs were sampled. False keeps the starting policy as the
    # reference for every round (the KL logged at evaluation is always to the starting policy)
    refresh_reference: bool = False
    # self-rewarding (Yuan et al. 2024, arXiv:2401.10020): the policy judges its own samples in
    # the compact judge prompt (Y/N, its P(Y) the score; posttrain/rewards/self_judge.py) and each
    # prompt's best against its worst by that score is a pair (ties none). The verifier scores the
    # same samples only to report the judge's agreement with it per round (ranker_auroc,
    # ranker_pair_agreement). On gpt_mini it needs sft.judge_demos (or an --init that had them).
    # false: the verifier ranks (or the reward model of rl.rm.path)
    self_reward: bool = False
    # how the rollout samples the policy's completions (also the generation budget the
    # length-aware algorithms read as max_len)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # a learned training reward instead of the verifier's (rm.path), and how `posttrain
    # rlhf` trains one; the verifier's verdict stays in every sample's details as the gold
    # reward, and held-out pass@1 stays the verifier's
    rm: RewardModelConfig = field(default_factory=RewardModelConfig)
    # which training prompts the RL stage samples and how often: a pool filtered by pass rate, a
    # curriculum, dedup and decontamination; off (pool_size 0) by default (posttrain/data/curation.py)
    curation: CurationConfig = field(default_factory=CurationConfig)
    # the training reward, a sum of [WEIGHT*]TERM joined by "+" (posttrain/rewards/): TERM is
    # "accuracy" (the verifier's 1/0), "r1" (accuracy + 0.2 × format, DeepSeek-R1-Zero-style),
    # "rubric" (rule-based criteria in [0, 1]: a Final: line, no loops, <= 512 chars), or
    # your function, MODULE:FUNCTION or PATH.py:FUNCTION, with a TRL (prompts, completions,
    # **columns), verl (data_source, solution_str, ground_truth, extra_info) or posttrain
    # (example, completion) signature, called once per completion; e.g. "accuracy +
    # 0.1*my_rewards:brevity". Held-out pass@1 is always the verifier's alone.
    reward: str = "accuracy"
    # seconds a user's reward function may take on one completion before the run stops with
    # its name and the sample (a hung function must not hang training); rule-based rewards
    # take milliseconds. 0 = no limit, called in the training thread (signal-based timeouts
    # such as math_verify's default work only there)
    reward_timeout: float = 5.0
    length_penalty: float = 0.0  # c of −c·max(0, L − length_free), L in characters; 0 = off
    length_free: int = 0  # characters a completion may use before the length penalty starts
    # weight of Kimi k1.5's length reward (arXiv:2501.12599, Sec. 2.3.3), relative to the
    # prompt's other samples: from +0.5 for the group's shortest right answer to −0.5 for its
    # longest, wrong answers only charged (rewards/length.py::kimi_length_reward). 0 = off: on
    # this task the chain of thought has one right length, and the reward can only shorten it
    length_reward: float = 0.0
    # the RL step from which the length reward is paid (Kimi k1.5 trained without it first:
    # from the start it slowed early learning). 0 = from the first step
    length_reward_start: int = 0
    # adaptive KL (Ziegler et al. 2019): steer the algorithm's kl_coef so that KL to the
    # reference (k3, per token) tracks this target; 0 keeps kl_coef fixed
    kl_target: float = 0.0
    kl_horizon: int = 100  # steps over which the controller closes most of the gap to kl_target
    # run the reference every step to log KL(π ‖ π_ref) even when the loss has no KL term:
    # drift from the starting policy is the first thing to look at when a run goes wrong
    track_kl: bool = True
    # when only that log reads the reference (no KL term in the loss), it scores this many rows
    # of each step, evenly spaced, not all of them: the log is a mean over tokens, and in make
    # run the full pass was 28% of the step. Every row when something acts on the number
    # (rl.kl_target; rl.on_alert stop/rollback on kl_explosion). 0 = every row
    track_kl_rows: int = 64
    eval_every: int = 25  # steps between dev-split pass@1 measurements
    dev_size: int = 200  # dev problems per measurement: cheap, ±7 points at 95%
    # what a hacking monitor's alert does (posttrain/runs/monitors.py): "warn" prints it and
    # trains on; "stop" ends the RL stage at that step; "rollback" ends it and puts back the
    # weights of the step where dev pass@1 was best. warn by default: a monitor detects, it
    # does not diagnose, and a stop on a false alarm throws away a good run's remaining steps
    on_alert: str = "warn"
    # the monitors whose alerts rl.on_alert acts on, comma-separated: the two that mean the
    # reward is being exploited (the others, e.g. length_blowup, are often benign)
    stop_on: str = "proxy_gold_divergence,kl_explosion"

    def validate(self, prefix: str = "rl") -> None:
        check_positive(self, prefix, "prompts_per_step", "samples_per_prompt", "epochs", "minibatches", "eval_every",
                       "dev_size", "max_sampling_rounds", "pair_prompts", "kl_horizon", "online_rounds")
        check(self.lr > 0, f"{prefix}.lr", self.lr, "a positive number")
        check(0 <= self.final_lr_fraction <= 1, f"{prefix}.final_lr_fraction", self.final_lr_fraction,
              "a number in [0, 1] (1 = constant after warmup)")
        check(0 <= self.adam_beta2 < 1, f"{prefix}.adam_beta2", self.adam_beta2, "a number in [0, 1)")
        check_non_negative(self, prefix, "steps", "grad_clip", "micro_batch_size", "warmup_steps", "weight_decay",
                           "length_penalty", "length_free", "length_reward", "length_reward_start", "kl_target",
                           "reward_timeout", "track_kl_rows")
        check(self.on_alert in ON_ALERT, f"{prefix}.on_alert", self.on_alert, f"one of {', '.join(ON_ALERT)}")
        unknown = [name for name in self.stop_on.split(",") if name.strip() not in MONITORS]
        check(not unknown, f"{prefix}.stop_on", self.stop_on,
              f"monitor names joined by ',', each one of {', '.join(MONITORS)} (unknown: {', '.join(unknown)})")
        self.sampling.validate(f"{prefix}.sampling")
        self.rm.validate(f"{prefix}.rm")
        self.curation.validate(f"{prefix}.curation")
        check(not (self.self_reward and self.rm.path), f"{prefix}.self_reward", self.self_reward,
              f"false with {prefix}.rm.path={self.rm.path!r}: one ranker builds the pairs, the policy's own verdicts "
              f"(self_reward) or the reward model's scores (rm.path); drop one")
