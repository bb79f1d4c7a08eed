"""Configuration: one dataclass per command, the only source of truth for a setting.

`TrainConfig` drives `posttrain run`, `train`, `compare` and `rlhf`; `EvalConfig` drives
`posttrain eval`; `BonConfig` drives `posttrain bon`. Every field carries the reason for
its default in a comment, and that comment is the field's `--help` text. `validate()`
checks values (ranges, combinations) and names the field, its value and what is allowed.

Data only: it imports nothing else from posttrain. `pipelines/checks.py::check_config` runs
every check before anything starts: types (config_checks.py), `validate()`, then names,
files and data only the library can judge.

Values come from the dataclass defaults < a JSON/TOML file (`--config`, config_file.py) <
command-line flags (`--rl.lr 3e-4`, cli/), addressed with a dot as in a run's config.json.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A setting has a value the program cannot use. The message names the field."""


def check(ok: bool, name: str, value: Any, allowed: str) -> None:
    """Raise ConfigError naming the setting, its value and what is allowed, unless `ok`."""
    if not ok:
        raise ConfigError(f"{name}={value!r} is not allowed: expected {allowed}")


def check_positive(section: Any, prefix: str, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        check(isinstance(value, int) and value > 0, f"{prefix}.{name}".lstrip("."), value, "a positive integer")


def check_non_negative(section: Any, prefix: str, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        check(value >= 0, f"{prefix}.{name}", value, f"{'an integer' if isinstance(value, int) else 'a number'} >= 0")


@dataclass
class ModelConfig:
    # "gpt_mini": the readable from-scratch decoder (the fields below shape it);
    # "smollm2-135m": SmolLM2-135M-Instruct, converted once from a PyPI package, no download;
    # or the path of any local transformers causal-LM directory
    name: str = "gpt_mini"
    dim: int = 128  # gpt_mini width: ~0.8M parameters with 4 layers, trains from scratch in a minute on 2 cores
    n_layer: int = 4  # gpt_mini depth: four blocks are enough for five-term running sums
    n_head: int = 4  # gpt_mini attention heads: 32-dimensional heads at dim 128
    hidden_dim: int = 352  # gpt_mini SwiGLU width ≈ 8/3·dim (LLaMA's ratio), rounded to a multiple of 32
    max_seq_len: int = 96  # gpt_mini context: prompt (~15 chars) + chain of thought (~40) with room to spare
    # transformers models: >0 trains rank-r LoRA adapters in the RL and preference stages,
    # and the reference is the policy with its adapters off; 0 trains every weight
    lora_r: int = 0
    lora_alpha: int = 0  # the adapters' scale α (α/r multiplies B·A); 0 = 2·r, the common choice
    system_prompt: str = ""  # instruct models: replaces the chat template's default system turn; "" keeps it

    def validate(self, prefix: str = "model") -> None:
        check_positive(self, prefix, "dim", "n_layer", "n_head", "hidden_dim", "max_seq_len")
        check_non_negative(self, prefix, "lora_r", "lora_alpha")
        check(self.dim % (2 * self.n_head) == 0, f"{prefix}.n_head", self.n_head, f"a divisor of {prefix}.dim="
              f"{self.dim} into even heads: a gpt_mini head gets dim / n_head channels, RoPE turns them in pairs")


@dataclass
class EnvConfig:
    # the task: "arithmetic" (generated, no data needed), or your --env.path file scored by
    # final_int ("jsonl"), math-verify ("math") or its tests in the sandbox ("code"), or an external
    # one (pip install 'posttrain[tasks]'): "reasoning_gym:NAME" (any reasoning-gym task, its own
    # grader) or "humaneval" (164 problems, all held out); posttrain/envs/__init__.py
    name: str = "arithmetic"
    level: int = 3  # arithmetic difficulty, 1..5; 3 = five single-digit terms (posttrain/envs/arithmetic.py)
    # arithmetic only: a mixed task, each problem's level drawn uniformly from this list, e.g. "2,3,5", every
    # example labelled with its level (what rl.curation.order easy_to_hard orders by); "" = env.level alone
    levels: str = ""
    cot: bool = True  # worked steps before `Final: <int>` (spec final_int/cot-v1); false: one line only
    # the verifier, any name in posttrain/verifiers VERIFIERS for jsonl, math and code (a hackable
    # final_int spec for red-teaming); "" = the environment's own (final_int, math/..., code/...)
    spec_version: str = ""
    # the problems of env "jsonl", "math" or "code": a .jsonl, .json or .parquet file, or a directory
    # (save_to_disk's, or of data files), rows {"prompt", "expected_answer"} or TRL's prompt/completion
    # and messages; other columns go to reward functions (posttrain/envs/problem_rows.py)
    path: str = ""
    # your column names for ours, when they differ: "prompt=question,expected_answer=answer" (ours
    # = yours); "" reads the names as they are (posttrain/envs/dataset_files.py)
    columns: str = ""
    # a held-out set of your own (same formats): every row of it is held out, env.path's rows train
    # (and give dev); "" splits env.path itself by a hash of each prompt, or by its own test split
    heldout_path: str = ""
    # env "code" and "humaneval" only: where no namespace sandbox exists (not root, most containers) run the tests
    # in the weak prelude-only one, which can leak files and network; off (posttrain/sandbox.py)
    allow_weak_sandbox: bool = False
    # reasoning_gym:NAME only: items generated (indices 0..pool_size-1, seed 0), split ~80/10/10 by a
    # hash of each question; 10,000 leaves ~1,000 held out for a task with that many distinct questions
    pool_size: int = 10_000
    # reasoning_gym:NAME only: the task's own settings as a JSON object, e.g. '{"max_terms": 3}';
    # "" = reasoning-gym's defaults (an unknown setting is refused with the task's list)
    task_config: str = ""
    # reasoning_gym:NAME only: SFT demonstrations that show their work, one step per line before the
    # <answer> line, for the tasks with a step writer (leg_counting, chain_sum, aiw: posttrain/envs/
    # reasoning_gym_tasks.py); false = the item's answer alone, all reasoning-gym gives
    worked_steps: bool = False
    # tool_arithmetic only: the share of SFT demonstrations that call the calculator; the rest state
    # the product at once, so below 1 the SFT policy mostly guesses and RL must find the tool
    tool_demos: float = 1.0
    # tool_arithmetic only: subtracted from the answer's score per tool call and per malformed call
    # (posttrain/rewards/agentic.py): costs only, so a wrong answer never earns more than 0
    step_cost: float = 0.0
    malformed_penalty: float = 0.0
    # multi-turn environments only: which earlier <think>…</think> the model reads before its next
    # turn, keep_all | keep_last | drop (posttrain/roles/thinking.py); the last two train one row per turn
    thinking: str = "keep_all"
    # arithmetic_think only: the switch in the prompts, fused (each problem /think or /no_think, half
    # each: SFT on both modes) | think | no_think (every prompt one mode: measure it); envs/thinking_modes.py
    think_mode: str = "fused"
    # arithmetic_think only: the share of /think demonstrations cut at a random point and closed as a
    # thinking budget closes them (early-stop text, </think>, answer); 0 = Qwen3's recipe, never seen
    budget_demos: float = 0.0

    def kwargs(self) -> dict[str, Any]:
        """The settings changed from their defaults, as keyword arguments of the
        environment: one that does not take a setting rejects it by name."""
        defaults = EnvConfig()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "name" and getattr(self, f.name) != getattr(defaults, f.name)}


SAMPLER_WEIGHTS = ("float32", "int8")


@dataclass
class SamplingParams:
    temperature: float = 1.0  # sample from the policy itself: RL needs its exploration; 0 = greedy
    top_p: float = 1.0  # 1.0 keeps old_logp an exact log-prob of the sampling distribution
    max_new_tokens: int = 48  # the generation budget: the longest level-3 chain of thought is ~40 characters
    # end a completion at its first newline; always on for one-line answers (env.cot false)
    stop_at_newline: bool = False
    # torch.compile the sampler's decode step; measured on gpt_mini (make run's batch): 17%
    # faster decoding after a compile of ~2 minutes on 2 busy cores (BENCHMARKS.md)
    compile: bool = False
    # the weights the sampler decodes with: "int8" quantises every Linear (CPU, torch's int8
    # kernels; models/int8.py) while the trainer stays float32, and the update corrects the
    # mismatch with importance weights capped at dist.tis_cap; evaluation always decodes in
    # float32. float32 is the default because int8 only pays for large matrices (SmolLM2,
    # not gpt_mini: BENCHMARKS.md)
    weights: str = "float32"

    def validate(self, prefix: str = "sampling") -> None:
        check(self.temperature >= 0, f"{prefix}.temperature", self.temperature, "a number >= 0 (0 = greedy)")
        check(0 < self.top_p <= 1, f"{prefix}.top_p", self.top_p, "a number in (0, 1]")
        check_positive(self, prefix, "max_new_tokens")
        check(self.weights in SAMPLER_WEIGHTS, f"{prefix}.weights", self.weights,
              f"one of {list(SAMPLER_WEIGHTS)} (int8: decode with int8 Linear weights on the CPU)")
        check(not (self.compile and self.weights == "int8"), f"{prefix}.compile", self.compile,
              f"false with {prefix}.weights='int8' (torch.compile does not take torch's int8 Linear modules); "
              "choose one of the two")


@dataclass
class SFTConfig:
    # Few demonstrations on purpose: SFT teaches the format, RL has to earn the accuracy.
    # Measured at seed 0 (held-out pass@1 after SFT): 120 demos 29%, 150 demos 69%, and 300
    # demos 92% (little left for RL to show).
    num_examples: int = 150
    steps: int = 600  # 128 epochs of 150 demos: the loss is ~0, what SFT can learn is learnt; 0 skips SFT
    batch_size: int = 32  # demonstrations per step: enough to average out one odd example
    lr: float = 1e-3  # from-scratch training of a 0.8M model tolerates a large step
    warmup_steps: int = 30  # linear warmup: Adam's first second-moment estimates are poor
    weight_decay: float = 0.1  # the usual AdamW decay for training from scratch
    # judge demonstrations for SFT: this many training problems, each its solution judged "Y"
    # and a wrong twin (a step's slip carried through) judged "N", in the self-judge's compact
    # prompt (posttrain/data/judge_demos.py; the self-rewarding paper's evaluation fine-tuning
    # data), sft.batch_size of them drawn on top of each batch of solutions. What rl.self_reward
    # needs on gpt_mini, which cannot read a judge prompt untaught; 1,000 took its judge from
    # chance to AUROC ~0.7 against the verifier (README). 0 = none: plain SFT
    judge_demos: int = 0

    def validate(self, prefix: str = "sft") -> None:
        check_positive(self, prefix, "num_examples", "batch_size")
        check_non_negative(self, prefix, "judge_demos")
        check(self.steps >= 0, f"{prefix}.steps", self.steps, "an integer >= 0 (0 skips SFT)")
        check(self.lr > 0, f"{prefix}.lr", self.lr, "a positive number")
        check_non_negative(self, prefix, "warmup_steps", "weight_decay")


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


TOPOLOGIES = ("auto", "colocated", "sync", "async")


@dataclass
class DistConfig:
    """Where the rollout and trainer roles run (posttrain/distributed/). The default is
    today's single process; `--workers N` moves sampling into N Ray actors, and the flag
    `--dist.trainer_ranks N` makes the trainer data-parallel over N processes."""

    workers: int = 0  # Ray rollout actors holding a policy copy; 0 = sample in this process
    # colocated: one process; sync: workers sample, then the trainer updates, then weights are
    # pushed; async: workers sample the next batch while the trainer updates (off-policy by up
    # to max_staleness versions, corrected with truncated importance sampling). auto = colocated
    # without workers, sync with them.
    topology: str = "auto"
    # the batch's prompts are split into this many shards of whole groups, each sampled with
    # its own seed (seed, step, shard): the shard, not the worker, is the unit of
    # reproducibility, so runs with equal shard counts draw the same samples whatever the
    # worker count. 0 = one shard per worker (1 when colocated: today's single-stream draws)
    rollout_shards: int = 0
    max_staleness: int = 1  # async: a batch is sampled by weights at most this many updates old
    # cap C of the importance weight min(π_old / π_behaviour, C) per token, for the async
    # topology's stale episodes and for rl.sampling.weights int8's sampler/trainer mismatch
    tis_cap: float = 2.0
    ray_address: str = ""  # "" = start a local Ray cluster; else connect (e.g. "auto", "ray://head:10001")
    num_cpus: int = 0  # CPUs of the local cluster Ray starts; 0 = this machine's count
    # the RL trainer role data-parallel over this many processes on this machine (gloo): the
    # controller is rank 0 and starts the others; each takes a slice of every minibatch and
    # the gradients are all-reduced. 1 = one process. Same results up to float rounding;
    # faster only when every rank has cores of its own
    trainer_ranks: int = 1

    def resolved_topology(self) -> str:
        if self.topology == "auto":
            return "sync" if self.workers > 0 else "colocated"
        return self.topology

    def validate(self, prefix: str = "dist") -> None:
        check(self.topology in TOPOLOGIES, f"{prefix}.topology", self.topology, f"one of {list(TOPOLOGIES)}")
        check_non_negative(self, prefix, "workers", "rollout_shards", "num_cpus")
        if self.topology in ("sync", "async"):
            check(self.workers > 0, f"{prefix}.workers", self.workers,
                  f"at least 1 with {prefix}.topology={self.topology!r} (try --workers 2)")
        if self.topology == "colocated":
            check(self.workers == 0, f"{prefix}.workers", self.workers,
                  f"0 with {prefix}.topology='colocated' (or choose topology sync or async)")
        check(self.max_staleness >= 1, f"{prefix}.max_staleness", self.max_staleness,
              "an integer >= 1 (topology sync is the on-policy case)")
        check(self.tis_cap >= 1, f"{prefix}.tis_cap", self.tis_cap, "a number >= 1")
        check(isinstance(self.trainer_ranks, int) and self.trainer_ranks >= 1, f"{prefix}.trainer_ranks",
              self.trainer_ranks, "an integer >= 1 (1 = train in this process; N > 1 starts N-1 more trainer processes)")
        if self.ray_address and self.workers > 0:
            # fail now, not after SFT and Ray's own connection timeout (many minutes)
            check(_listening(self.ray_address), f"{prefix}.ray_address", self.ray_address,
                  "the address of a running Ray cluster (nothing answers there; start one with `ray start --head`)")


def _listening(address: str) -> bool:
    """Whether something accepts connections at HOST:PORT (or ray://HOST:PORT); other
    forms ("auto") are left for Ray to resolve."""
    host, _, port = address.split("://")[-1].rpartition(":")
    if not port.isdigit():
        return True
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        return True
    except OSError:
        return False


DEVICES = ("auto", "cpu", "cuda", "mps")  # posttrain/models/device.py resolves them
DTYPES = ("float32", "bfloat16")


def check_device(section: Any) -> None:
    """The names of section.device and section.dtype; whether that device exists here is
    pipelines/checks.py's check (it needs torch)."""
    check(section.device in DEVICES, "device", section.device, f"one of {list(DEVICES)} (auto = cuda, mps, then cpu)")
    check(section.dtype in DTYPES, "dtype", section.dtype, f"one of {list(DTYPES)}")


TRACKERS = ("tensorboard", "trackio", "wandb", "mlflow")  # what report_to can name (posttrain/runs/trackers.py)


@dataclass
class TrainConfig:
    """`posttrain run` / `posttrain train`: SFT from scratch, then RL, with held-out
    evaluation before and after RL."""

    name: str = ""  # the run directory's suffix; "" = "<env>-<algo>"
    seed: int = 0  # every random draw of the run derives from it (posttrain/seeds.py)
    out_dir: str = "runs"  # where run directories are created
    # where the policy starts: a run's checkpoint, any transformers model directory or a model name as
    # model.name takes; SFT is skipped. "" = model.name (gpt_mini from scratch) with SFT first
    init: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy: gpt_mini from scratch, or a local pretrained model
    env: EnvConfig = field(default_factory=EnvConfig)  # the task the policy learns and is scored on
    sft: SFTConfig = field(default_factory=SFTConfig)  # stage 1: teach the answer format from a few demonstrations
    rl: RLConfig = field(default_factory=RLConfig)  # stage 2: RL (or a preference loss) from the SFT policy
    heldout_size: int = 500  # held-out problems scored before and after RL: a 95% CI of about ±4 points near 70%
    checkpoint_every: int = 25  # steps between checkpoints (a killed run loses at most this many)
    threads: int = 0  # torch intra-op threads; 0 = leave torch's default (all cores)
    dist: DistConfig = field(default_factory=DistConfig)  # where rollout and training run; the default is one process
    # experiment trackers that get a copy of every metrics line, a few samples per RL step and the held-out
    # results: none, or one or more of tensorboard, trackio, wandb, mlflow, comma-separated; each writes
    # offline or locally unless its own variables (WANDB_MODE, MLFLOW_TRACKING_URI) say otherwise. "none"
    # because the run directory is the record and the trackers are optional installs (posttrain[trackers])
    report_to: str = "none"
    # where the policy and every tensor it reads live: auto = cuda if visible, else mps, else cpu.
    # cpu by default: the tests' device, and the one every number in this repository was measured on
    device: str = "cpu"
    # bfloat16: float32 weights and optimizer state, forward passes autocast to bf16 (log-probs and
    # losses stay float32); for GPUs. float32 by default: a CPU without native bf16 runs it slower
    dtype: str = "float32"
    # several stages in one run, each starting from the last checkpoint of the one before, with a held-out
    # evaluation after each and one table: "sft,dpo,grpo" (sft, any RL algorithm or preference loss; the
    # start is --init or the model as built). A stage's own settings go in brackets, as config.json keys
    # of its section and its algorithm's: "sft,dpo[rl.lr=3e-5,rl.steps=100,dpo.nll_coef=1],grpo"; the
    # rest come from the run's settings (pipelines/stages.py). "" = the two-stage job: SFT, then rl.algo
    stages: str = ""

    def trackers(self) -> list[str]:
        """The tracker names report_to lists; [] for "none"."""
        names = [name.strip() for name in self.report_to.split(",")]
        return [] if names == ["none"] else names

    def validate(self) -> None:
        check_device(self)
        parse_stages(self.stages)
        self.model.validate()
        self.sft.validate()
        self.rl.validate()
        self.dist.validate()
        if self.dist.rollout_shards:
            check(self.dist.rollout_shards <= self.rl.prompts_per_step, "dist.rollout_shards",
                  self.dist.rollout_shards, f"at most rl.prompts_per_step={self.rl.prompts_per_step} (a shard holds whole groups)")
        rows = self.rl.prompts_per_step * self.rl.samples_per_prompt // self.rl.minibatches
        check(self.dist.trainer_ranks <= rows, "dist.trainer_ranks", self.dist.trainer_ranks,
              f"at most the {rows} rows of a minibatch (rl.prompts_per_step × rl.samples_per_prompt / "
              "rl.minibatches): every rank needs a row")
        check_positive(self, "", "heldout_size", "checkpoint_every")
        # an OS thread each: past a few per core they only contend, and 99999 hit the thread limit: a segfault
        cores = os.cpu_count() or 1
        check(0 <= self.threads <= 4 * cores, "threads", self.threads,
              f"an integer in [0, {4 * cores}] (0 = torch's default; at most 4 per core, and this machine has {cores})")
        names = self.trackers()
        check(all(name in TRACKERS for name in names) and len(set(names)) == len(names), "report_to", self.report_to,
              f"'none', or one or more of {', '.join(TRACKERS)}, comma-separated, each once (e.g. 'tensorboard,wandb')")


def parse_stages(text: str) -> list[tuple[str, str, dict[str, str]]]:
    """The stages of TrainConfig.stages, in order: (name, kind, settings as written). The
    name is the kind, with _2, _3, ... on a kind's later stages (it names the stage's
    checkpoints and metrics); the settings map config.json keys to their text, typed later
    against their section. "" gives []. ConfigError names what cannot be read."""
    items, depth, current = [], 0, ""
    for char in text + ",":
        if char == "," and depth == 0:
            items.append(current.strip())
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        check(depth in (0, 1), "stages", text, "stage names with at most one [KEY=VALUE,...] each, e.g. "
              "'sft,dpo[rl.lr=3e-5],grpo' (no brackets inside brackets)")
        current += char
    check(depth == 0, "stages", text, "every '[' closed by a ']', e.g. 'sft,dpo[rl.lr=3e-5],grpo'")
    if items == [""]:
        return []
    stages, seen = [], {}
    for item in items:
        kind, bracket, rest = item.partition("[")
        kind = kind.strip()
        check(bool(kind) and kind.replace("_", "").isalnum() and (not bracket or rest.endswith("]")), "stages", text,
              f"comma-separated stage names, each optionally followed by [KEY=VALUE,...] (could not read {item!r})")
        settings: dict[str, str] = {}
        for pair in filter(None, (p.strip() for p in rest[:-1].split(","))) if bracket else []:
            key, equals, value = (part.strip() for part in pair.partition("="))
            check(bool(equals and key and value), "stages", text, f"KEY=VALUE pairs in {kind}'s brackets, e.g. "
                  f"{kind}[rl.lr=3e-5] (could not read {pair!r})")
            check(key not in settings, "stages", text, f"each setting once per stage ({kind} sets {key} twice)")
            settings[key] = value
        seen[kind] = seen.get(kind, 0) + 1
        stages.append((kind if seen[kind] == 1 else f"{kind}_{seen[kind]}", kind, settings))
    return stages


def rlhf_config() -> TrainConfig:
    """Where `posttrain rlhf` starts (flags and --config change it as they change `train`'s):
    PPO with its value head and a KL penalty in the reward, InstructGPT's setting."""
    return TrainConfig(name="rlhf", rl=RLConfig(algo="ppo", algo_params={"kl_coef": 0.05}))
