"""Configuration: one dataclass per entry point, the only source of truth for a setting.

`TrainConfig` drives `posttrain run` and `posttrain train`; `EvalConfig` drives
`posttrain eval`. Every field carries a comment with the reason for its default, and
`validate()` says which field is wrong, with its value and what is allowed.

Values come from three places, later ones winning: the dataclass defaults, a JSON/TOML
file (`--config`), and command-line flags (`--rl.lr 3e-4`). Nested sections are addressed
with a dot, exactly as they appear in the resolved `config.json` of a run directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A setting has a value the program cannot use. The message names the field."""


def _check(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r} is not allowed: expected {allowed}")


@dataclass
class ModelConfig:
    # "gpt_mini": the readable from-scratch decoder (the fields below shape it);
    # "smollm2-135m": SmolLM2-135M-Instruct, converted once from a PyPI package, no download;
    # or the path of any local transformers causal-LM directory
    name: str = "gpt_mini"
    dim: int = 128  # ~0.8M parameters with 4 layers: trains from scratch in a minute on 2 cores
    n_layer: int = 4
    n_head: int = 4
    hidden_dim: int = 352  # SwiGLU width ≈ 8/3·dim (LLaMA's ratio), rounded to a multiple of 32
    max_seq_len: int = 96  # prompt (~15 chars) + chain of thought (~40) with room to spare
    # transformers models: >0 trains rank-r LoRA adapters in the RL and preference stages
    # (the reference is the policy with its adapters off)
    lora_r: int = 0
    lora_alpha: int = 0  # the adapters' scale α (α/r multiplies B·A); 0 = 2·r
    system_prompt: str = ""  # instruct models: replaces the chat template's default system turn

    def validate(self, prefix: str = "model") -> None:
        from posttrain.models import MODELS
        from posttrain.models.hf import KNOWN_MODELS

        known = sorted(MODELS) + sorted(KNOWN_MODELS)
        _check(self.name in known or Path(self.name).is_dir(), f"{prefix}.name", self.name,
               f"one of {known} or an existing local transformers directory (nothing is downloaded)")
        for name in ("dim", "n_layer", "n_head", "hidden_dim", "max_seq_len"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, f"{prefix}.{name}", value, "a positive integer")
        for name in ("lora_r", "lora_alpha"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 0, f"{prefix}.{name}", value, "an integer >= 0")
        _check(not self.lora_r or self.name not in MODELS, f"{prefix}.lora_r", self.lora_r,
               "0 for gpt_mini (LoRA is for pretrained transformers models; gpt_mini trains every weight)")


@dataclass
class EnvConfig:
    name: str = "arithmetic"  # add five single-digit numbers with a running-sum chain of thought
    level: int = 3  # 3 = five single-digit terms; see posttrain/envs/arithmetic.py for all levels
    cot: bool = True  # worked steps before `Final: <int>` (spec final_int/cot-v1)
    spec_version: str = ""  # "" = the environment's own strict spec; hackable variants for red-teaming
    path: str = ""  # the problems file of env "jsonl"

    def kwargs(self) -> dict[str, Any]:
        """The settings changed from their defaults, as keyword arguments of the
        environment: one that does not take a setting rejects it by name."""
        defaults = EnvConfig()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "name" and getattr(self, f.name) != getattr(defaults, f.name)}

    def validate(self, prefix: str = "env") -> None:
        from posttrain.envs import ENVIRONMENTS, make_env

        _check(self.name in ENVIRONMENTS, f"{prefix}.name", self.name, f"one of {sorted(ENVIRONMENTS)}")
        make_env(self.name, **self.kwargs())  # a bad setting or an unreadable file fails now, not mid-run


@dataclass
class SamplingConfig:
    temperature: float = 1.0  # sample from the policy itself: RL needs its exploration
    top_p: float = 1.0  # 1.0 keeps old_logp an exact log-prob of the sampling distribution
    max_new_tokens: int = 48  # the longest level-3 chain of thought is ~40 characters
    # torch.compile the sampler's decode step; measured on gpt_mini (make run's batch): 17%
    # faster decoding after a compile of ~2 minutes on 2 busy cores (BENCHMARKS.md)
    compile: bool = False

    def validate(self, prefix: str = "sampling") -> None:
        _check(self.temperature >= 0, f"{prefix}.temperature", self.temperature, "a number >= 0 (0 = greedy)")
        _check(0 < self.top_p <= 1, f"{prefix}.top_p", self.top_p, "a number in (0, 1]")
        _check(self.max_new_tokens > 0, f"{prefix}.max_new_tokens", self.max_new_tokens, "a positive integer")
        _check(isinstance(self.compile, bool), f"{prefix}.compile", self.compile, "true or false")


@dataclass
class SFTConfig:
    # Few demonstrations on purpose: SFT teaches the format, RL has to earn the accuracy.
    # Measured at seed 0 (held-out pass@1 after SFT): 120 demos 29%, 150 demos 69%,
    # 300 demos 92% (little left for RL to show).
    num_examples: int = 150
    steps: int = 600  # 128 epochs of 150 demos: the loss is ~0, what SFT can learn is learnt
    batch_size: int = 32
    lr: float = 1e-3  # from-scratch training of a 0.8M model tolerates a large step
    warmup_steps: int = 30
    weight_decay: float = 0.1

    def validate(self, prefix: str = "sft") -> None:
        for name in ("num_examples", "batch_size"):
            _check(getattr(self, name) > 0, f"{prefix}.{name}", getattr(self, name), "a positive integer")
        _check(self.steps >= 0, f"{prefix}.steps", self.steps, "an integer >= 0 (0 skips SFT)")
        _check(self.lr > 0, f"{prefix}.lr", self.lr, "a positive number")


@dataclass
class RewardModelConfig:
    """The learned reward of `posttrain rlhf`: a Bradley–Terry model trained on pairs of the
    SFT policy's samples that the verifier ranked (posttrain/rlhf.py)."""

    # a trained reward-model directory; "" = the verifier is the training reward. With a
    # preference loss, the reward model ranks the policy's samples into pairs instead of the
    # verifier: one pair per prompt, its best-scored sample against its worst
    path: str = ""
    prompts: int = 1024  # training prompts whose samples make the pairs (held-out pairs: eval_size dev prompts)
    temperature: float = 1.5  # the SFT policy is near-deterministic at T = 1: hotter samples give more distinct pairs
    # ~6 epochs of the ~1,700 pairs 1,024 prompts give; measured with pooling "loglik":
    # pairwise accuracy 0.91 train, 0.77 held out (283 pairs; "last" at 150 steps: 0.68, 0.64)
    steps: int = 300
    lr: float = 1e-4  # the body starts from the SFT policy, so smaller than from-scratch training's 1e-3
    batch_size: int = 32
    # what the scalar head reads (models/reward_model.py): "last" real token's hidden state,
    # "mean" hidden state, or "loglik", the body's own mean token log-likelihood. Measured on
    # the arithmetic task's 1,694 pairs (283 held out): "last" memorises (300 steps: 0.79
    # train, 0.59 held out); "mean" 0.62–0.70 held out, also with 4× the pairs; "loglik" 0.77
    # held out at 300 steps, because the SFT body already finds a wrong step unlikely (its
    # likelihood ranks 0.79 of the held-out pairs right before any training)
    pooling: str = "loglik"

    def validate(self, prefix: str = "rl.rm") -> None:
        for name in ("prompts", "steps", "batch_size"):
            _check(getattr(self, name) > 0, f"{prefix}.{name}", getattr(self, name), "a positive integer")
        _check(self.pooling in ("last", "mean", "loglik"), f"{prefix}.pooling", self.pooling,
               "'last', 'mean' or 'loglik'")
        _check(self.lr > 0, f"{prefix}.lr", self.lr, "a positive number")
        _check(self.temperature > 0, f"{prefix}.temperature", self.temperature, "a number > 0")
        if self.path:
            from posttrain.models.reward_model import check_reward_model_dir

            try:
                check_reward_model_dir(self.path)
            except ValueError as error:
                raise ConfigError(f"{prefix}.path={self.path!r} is not allowed: {error}") from None


@dataclass
class RLConfig:
    algo: str = "grpo"  # an RL algorithm (posttrain.algorithms) or a preference loss (dpo, ipo, kto, orpo, simpo)
    algo_params: dict[str, Any] = field(default_factory=dict)  # overrides of the algorithm's own defaults
    steps: int = 200
    prompts_per_step: int = 32
    samples_per_prompt: int = 8  # K: the group size GRPO's baseline averages over
    lr: float = 1e-4  # 3e-4 collapsed the prototype (pass@1 56% -> 6%); see DESIGN.md
    warmup_steps: int = 10
    weight_decay: float = 0.0  # no decay: it would pull the policy away from the SFT start
    grad_clip: float = 1.0  # global-norm clipping; guards against a rare huge-advantage batch
    epochs: int = 1  # passes over each rollout batch; 1 = purely on-policy
    minibatches: int = 1  # optimizer steps per epoch
    micro_batch_size: int = 0  # rows per forward/backward (gradient accumulation); 0 = all at once
    # dynamic sampling (DAPO): draw fresh prompts up to this many times per step to refill
    # the groups dropped for having no reward variance; capped, since a policy that solves
    # (or fails) everything would otherwise loop forever
    max_sampling_rounds: int = 4
    # preference losses train offline on pairs: a JSONL file, or (when "") pairs built by
    # the verifier from samples of the starting policy: pair_prompts training prompts ×
    # samples_per_prompt completions, every correct one paired with every incorrect one
    pairs: str = ""
    pair_prompts: int = 256
    # online (iterative) preference optimisation: the same budget (pair_prompts prompts,
    # steps gradient steps) in this many rounds, each building fresh pairs from the current
    # policy's samples; 1 = offline, every pair from the starting policy. Short rounds with
    # a batch of pairs each: on arithmetic, 20 rounds of 160 prompts and 5 steps beat
    # offline by 3.6–5.2 points on three seeds, 4 rounds of 800 and 25 did not
    # (docs/algorithms/dpo.md)
    online_rounds: int = 1
    # iterative DPO's reference (Pang et al. 2024; Xiong et al. 2024): at the start of each
    # online round, π_ref becomes the current policy, so each round is one DPO problem
    # anchored where that round's pairs were sampled. False keeps the starting policy as
    # π_ref for every round (the KL logged at evaluation is always to the starting policy)
    refresh_reference: bool = False
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    # a learned training reward instead of the verifier's (rm.path), and how `posttrain
    # rlhf` trains one; the verifier's verdict stays in every sample's details as the gold
    # reward, and held-out pass@1 stays the verifier's
    rm: RewardModelConfig = field(default_factory=RewardModelConfig)
    # the training reward (posttrain/rewards.py): "accuracy" is the verifier's 1/0;
    # "r1" adds 0.2 × format (DeepSeek-R1-Zero-style accuracy + format reward). Held-out
    # pass@1 is always the verifier's alone, whatever the training reward.
    reward: str = "accuracy"
    length_penalty: float = 0.0  # c of −c·max(0, L − length_free), L in characters; 0 = off
    length_free: int = 0  # characters a completion may use before the length penalty starts
    # adaptive KL (Ziegler et al. 2019): steer the algorithm's kl_coef so that KL to the
    # reference (k3, per token) tracks this target; 0 keeps kl_coef fixed
    kl_target: float = 0.0
    kl_horizon: int = 100  # steps over which the controller closes most of the gap
    # run the reference every step to log KL(π ‖ π_ref) even when the loss has no KL term:
    # drift from the starting policy is the first thing to look at when a run goes wrong
    track_kl: bool = True
    eval_every: int = 25  # steps between dev-split pass@1 measurements
    eval_size: int = 200  # dev problems per measurement: cheap, ±7 points at 95%

    def validate(self, prefix: str = "rl") -> None:
        from posttrain.algorithms import ALGORITHMS
        from posttrain.algorithms.preference import PREFERENCE_LOSSES, make_preference_loss

        _check(self.algo in ALGORITHMS or self.algo in PREFERENCE_LOSSES, f"{prefix}.algo", self.algo,
               f"one of {sorted(ALGORITHMS)} (RL) or {sorted(PREFERENCE_LOSSES)} (preference)")
        if self.is_preference:
            make_preference_loss(self.algo, **self.algo_params)  # raises, listing the valid fields
            if self.pairs:
                from posttrain.preference_data import load_preference_jsonl

                load_preference_jsonl(self.pairs)  # an unreadable file fails now, not after SFT
        else:
            self.make_algorithm()
        for name in ("prompts_per_step", "samples_per_prompt", "epochs", "minibatches", "eval_every", "eval_size",
                     "max_sampling_rounds"):
            _check(getattr(self, name) > 0, f"{prefix}.{name}", getattr(self, name), "a positive integer")
        _check(self.steps >= 0, f"{prefix}.steps", self.steps, "an integer >= 0")
        _check(self.lr > 0, f"{prefix}.lr", self.lr, "a positive number")
        _check(self.grad_clip >= 0, f"{prefix}.grad_clip", self.grad_clip, "a number >= 0 (0 = off)")
        _check(self.micro_batch_size >= 0, f"{prefix}.micro_batch_size", self.micro_batch_size, "an integer >= 0")
        self.sampling.validate(f"{prefix}.sampling")
        _check(self.reward in REWARD_PRESETS, f"{prefix}.reward", self.reward, f"one of {sorted(REWARD_PRESETS)}")
        _check(self.length_penalty >= 0, f"{prefix}.length_penalty", self.length_penalty, "a number >= 0")
        _check(self.length_free >= 0, f"{prefix}.length_free", self.length_free, "an integer >= 0")
        _check(self.kl_target >= 0, f"{prefix}.kl_target", self.kl_target, "a number >= 0 (0 = fixed kl_coef)")
        _check(self.kl_horizon > 0, f"{prefix}.kl_horizon", self.kl_horizon, "a positive integer")
        _check(self.pair_prompts > 0, f"{prefix}.pair_prompts", self.pair_prompts, "a positive integer")
        _check(isinstance(self.online_rounds, int) and self.online_rounds > 0, f"{prefix}.online_rounds",
               self.online_rounds, "a positive integer (1 = offline)")
        if self.online_rounds > 1:
            _check(self.is_preference and not self.pairs, f"{prefix}.online_rounds", self.online_rounds,
                   "1 unless rl.algo is a preference loss whose pairs the verifier builds (no rl.pairs file: "
                   "a fixed file cannot be resampled from the current policy)")
            _check(self.online_rounds <= min(self.steps, self.pair_prompts), f"{prefix}.online_rounds",
                   self.online_rounds, f"at most rl.steps={self.steps} and rl.pair_prompts={self.pair_prompts} "
                   "(every round needs a step and a prompt)")
        _check(isinstance(self.refresh_reference, bool), f"{prefix}.refresh_reference", self.refresh_reference,
               "true or false")
        if self.refresh_reference:
            _check(self.online_rounds > 1 and self.is_preference
                   and make_preference_loss(self.algo, **self.algo_params).uses_reference,
                   f"{prefix}.refresh_reference", self.refresh_reference,
                   "false unless rl.online_rounds > 1 and rl.algo is a preference loss with a reference "
                   "(dpo, ipo, kto): there is no next round, or no reference, to refresh")
        self.rm.validate(f"{prefix}.rm")
        if self.rm.path and self.is_preference:
            _check(not self.pairs, f"{prefix}.rm.path", self.rm.path,
                   "'' with rl.pairs: a pairs file is already ranked; the reward model ranks the policy's own "
                   "samples when there is no file")
        if self.kl_target > 0:
            _check(not self.is_preference, f"{prefix}.kl_target", self.kl_target,
                   "0 for a preference loss (its beta already sets how close to the reference it stays)")
            algo = self.make_algorithm()
            _check(getattr(algo, "kl_coef", 0) > 0, f"{prefix}.kl_target", self.kl_target,
                   f"0 unless the algorithm has a KL term: set rl.algo_params {{\"kl_coef\": 0.04}} "
                   f"({self.algo} has kl_coef={getattr(algo, 'kl_coef', None)!r}; the controller multiplies it)")


    @property
    def is_preference(self) -> bool:
        from posttrain.algorithms.preference import PREFERENCE_LOSSES

        return self.algo in PREFERENCE_LOSSES

    def make_reward(self, score):
        """The training reward: the environment's scorer, plus the terms this config asks for."""
        from posttrain.rewards import LinearLength, RewardStack

        if self.rm.path:  # the reward model scores; the verifier's verdict stays in details
            from posttrain.rlhf import ProxyReward

            score = ProxyReward.load(self.rm.path, score)
        terms = REWARD_PRESETS[self.reward]()
        if self.length_penalty > 0:
            terms.append((1.0, LinearLength(self.length_free, self.length_penalty)))
        if len(terms) == 1 and self.reward == "accuracy":
            return score  # the verifier's own 1/0: nothing stacked on it
        return RewardStack(terms).wrap(score)

    def make_algorithm(self):
        """The one adapter from config to algorithm. An algorithm that measures lengths
        against the generation budget (`max_len`: Dr.GRPO's divisor, DAPO's L_max) gets
        `sampling.max_new_tokens`, so the budget is set in one place, unless algo_params
        sets max_len on purpose."""
        from posttrain.algorithms import ALGORITHMS, make_algorithm

        params = dict(self.algo_params)
        if "max_len" in {f.name for f in dataclasses.fields(ALGORITHMS[self.algo])}:
            params.setdefault("max_len", self.sampling.max_new_tokens)
        return make_algorithm(self.algo, **params)


def _accuracy_only() -> list:
    from posttrain.rewards import Accuracy

    return [(1.0, Accuracy())]


def _r1() -> list:
    from posttrain.rewards import RewardStack

    return list(RewardStack.deepseek_r1().terms)


REWARD_PRESETS = {"accuracy": _accuracy_only, "r1": _r1}


TOPOLOGIES = ("auto", "colocated", "sync", "async")


@dataclass
class DistConfig:
    """Where the rollout and trainer roles run (posttrain/distributed/). The default is
    today's single process; `--workers N` moves sampling into N Ray actors, and
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
    tis_cap: float = 2.0  # async: cap C of the importance weight min(π_old / π_behaviour, C) per token
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
        _check(self.topology in TOPOLOGIES, f"{prefix}.topology", self.topology, f"one of {list(TOPOLOGIES)}")
        _check(self.workers >= 0, f"{prefix}.workers", self.workers, "an integer >= 0 (0 = no Ray workers)")
        if self.topology in ("sync", "async"):
            _check(self.workers > 0, f"{prefix}.workers", self.workers,
                   f"at least 1 with {prefix}.topology={self.topology!r} (try --workers 2)")
        if self.topology == "colocated":
            _check(self.workers == 0, f"{prefix}.workers", self.workers,
                   f"0 with {prefix}.topology='colocated' (or choose topology sync or async)")
        _check(self.rollout_shards >= 0, f"{prefix}.rollout_shards", self.rollout_shards,
               "an integer >= 0 (0 = one per worker)")
        _check(self.max_staleness >= 1, f"{prefix}.max_staleness", self.max_staleness,
               "an integer >= 1 (topology sync is the on-policy case)")
        _check(self.tis_cap >= 1, f"{prefix}.tis_cap", self.tis_cap, "a number >= 1")
        _check(isinstance(self.trainer_ranks, int) and self.trainer_ranks >= 1, f"{prefix}.trainer_ranks",
               self.trainer_ranks, "an integer >= 1 (1 = train in this process; N > 1 starts N-1 more trainer processes)")
        _check(self.num_cpus >= 0, f"{prefix}.num_cpus", self.num_cpus, "an integer >= 0 (0 = all of this machine's)")
        if self.ray_address and self.workers > 0:
            # fail now, not after SFT and Ray's own connection timeout (many minutes)
            _check(_listening(self.ray_address), f"{prefix}.ray_address", self.ray_address,
                   "the address of a running Ray cluster (nothing answers there; start one with `ray start --head`)")


def _listening(address: str) -> bool:
    """Whether something accepts connections at HOST:PORT (or ray://HOST:PORT); other
    forms ("auto") are left for Ray to resolve."""
    import socket

    host, _, port = address.split("://")[-1].rpartition(":")
    if not port.isdigit():
        return True
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        return True
    except OSError:
        return False


@dataclass
class TrainConfig:
    """`posttrain run` / `posttrain train`: SFT from scratch, then RL, with held-out
    evaluation before and after RL."""

    name: str = ""  # the run directory's suffix; "" = "<env>-<algo>"
    seed: int = 0
    out_dir: str = "runs"
    init: str = ""  # a checkpoint directory to start from; "" = train from scratch with SFT first
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    eval_size: int = 500  # held-out problems: a 95% CI of about ±4 points near 70%
    checkpoint_every: int = 25  # steps between checkpoints (a killed run loses at most this many)
    threads: int = 0  # torch intra-op threads; 0 = leave torch's default (all cores)
    dist: DistConfig = field(default_factory=DistConfig)

    def validate(self) -> None:
        self.model.validate()
        self.env.validate()
        self.sft.validate()
        self.rl.validate()
        self.dist.validate()
        if self.dist.rollout_shards:
            _check(self.dist.rollout_shards <= self.rl.prompts_per_step, "dist.rollout_shards",
                   self.dist.rollout_shards, f"at most rl.prompts_per_step={self.rl.prompts_per_step} (a shard holds whole groups)")
        rows = self.rl.prompts_per_step * self.rl.samples_per_prompt // self.rl.minibatches
        _check(self.dist.trainer_ranks <= rows, "dist.trainer_ranks", self.dist.trainer_ranks,
               f"at most the {rows} rows of a minibatch (rl.prompts_per_step × rl.samples_per_prompt / "
               "rl.minibatches): every rank needs a row")
        if self.rl.is_preference:
            _check(self.dist.trainer_ranks == 1, "dist.trainer_ranks", self.dist.trainer_ranks,
                   f"1 with a preference loss (rl.algo={self.rl.algo!r} trains in one process; only RL "
                   "algorithms run data-parallel)")
        _check(self.eval_size > 0, "eval_size", self.eval_size, "a positive integer")
        _check(self.checkpoint_every > 0, "checkpoint_every", self.checkpoint_every, "a positive integer")
        _check(self.threads >= 0, "threads", self.threads, "an integer >= 0")
        if self.init:
            from posttrain.models import check_checkpoint_shape

            if not Path(self.init).is_dir():
                raise ConfigError(f"init={self.init!r}: no such checkpoint directory")
            check_checkpoint_shape(Path(self.init), self.model)


@dataclass
class EvalConfig:
    """`posttrain eval` (Loop A): score a checkpoint's held-out completions, or a file of
    completions someone else produced, and save every one with its score details."""

    checkpoint: str = ""  # a checkpoint directory written by `posttrain run/train`
    completions: str = ""  # or: a JSONL of {prompt, expected_answer, completion}, or a pack name ("frozen")
    spec_version: str = "final_int/cot-v1"  # the scorer for --completions (checkpoints use env's spec)
    env: EnvConfig = field(default_factory=EnvConfig)
    split: str = "heldout"
    size: int = 500
    out_dir: str = "runs"
    name: str = "eval"
    seed: int = 0

    def validate(self) -> None:
        from posttrain.envs.final_int import SPECS

        if bool(self.checkpoint) == bool(self.completions):
            raise ConfigError("give exactly one of --checkpoint DIR (evaluate a model) or --completions FILE "
                              "(score existing completions)")
        if self.checkpoint and not Path(self.checkpoint).is_dir():
            raise ConfigError(f"checkpoint={self.checkpoint!r}: no such directory")
        _check(self.spec_version in SPECS, "spec_version", self.spec_version, f"one of {sorted(SPECS)}")
        self.env.validate()
        _check(self.split in ("train", "dev", "heldout"), "split", self.split, "train, dev or heldout")
        _check(self.size > 0, "size", self.size, "a positive integer")


@dataclass
class BonConfig:
    """`posttrain bon` (Loop B): best-of-N selection over a pack of candidates."""

    pack: str = "bon"  # a pack name or a JSONL path (format: posttrain/data/packs/README.md)
    n: int = 8  # candidates considered per prompt (the first n of each prompt's list)
    spec_version: str = "final_int/cot-v1"  # the verifier that grades
    select_spec_version: str = ""  # the verifier that selects; "" = the grader (an oracle upper bound)
    out_dir: str = "runs"
    name: str = "bon"

    def validate(self) -> None:
        from posttrain.envs.final_int import SPECS

        _check(self.n > 0, "n", self.n, "a positive integer")
        for name in ("spec_version", "select_spec_version"):
            value = getattr(self, name)
            if value or name == "spec_version":
                _check(value in SPECS, name, value, f"one of {sorted(SPECS)}")


# ---------------------------------------------------------------------------------------
# plumbing: dataclass <-> dict <-> command line
# ---------------------------------------------------------------------------------------


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build `cls` from a (possibly partial) dict; unknown keys are an error, not ignored."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown setting(s) {[prefix + k for k in unknown]}; valid ones: {sorted(prefix + n for n in names)}")
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{prefix}{key} must be a section (a mapping), got {value!r}")
            kwargs[key] = from_dict(hint, value, f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, hint, prefix + key)
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Convert a JSON or command-line value to the field's type, or say why not."""
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{name}={value!r} is not allowed: expected true or false")
    if hint in (int, float):
        try:
            number = hint(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}={value!r} is not allowed: expected {'an integer' if hint is int else 'a number'}") from None
        if hint is int and isinstance(value, float) and number != value:
            raise ConfigError(f"{name}={value!r} is not allowed: expected an integer")
        return number
    if hint is str:
        return str(value)
    if typing.get_origin(hint) is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ConfigError(f"{name}={value!r} is not allowed: expected a JSON object, e.g. '{{\"kl_coef\": 0.04}}'") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{name}={value!r} is not allowed: expected a mapping")
        return value
    return value


def load_file(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        if p.suffix == ".toml":
            return tomllib.loads(p.read_text())
        return json.loads(p.read_text())
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"config file {path!r} is not valid {p.suffix.lstrip('.').upper() or 'JSON'}: {error}") from None


def _flat_fields(cls: type, prefix: str = "") -> dict[str, Any]:
    """{'rl.sampling.temperature': float, ...} for every leaf field of a config class."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out.update(_flat_fields(hint, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = hint
    return out


def add_config_flags(parser: argparse.ArgumentParser, cls: type, shortcuts: dict[str, str] | None = None) -> None:
    """One `--a.b.c VALUE` flag per leaf field, plus short aliases such as `--algo`."""
    defaults = to_dict(cls())
    for dotted, hint in _flat_fields(cls).items():
        value = defaults
        for part in dotted.split("."):
            value = value[part]
        type_name = getattr(hint, "__name__", str(hint))
        flags = [f"--{dotted}"] + [f"--{s}" for s, target in (shortcuts or {}).items() if target == dotted]
        parser.add_argument(*flags, dest=dotted, default=None, metavar=type_name.upper(), help=f"(default: {value!r})")


def resolve(cls: type, args: argparse.Namespace, base: dict[str, Any] | None = None) -> Any:
    """Defaults < file < flags, then validate."""
    data = json.loads(json.dumps(base or {}))
    for dotted in _flat_fields(cls):
        value = getattr(args, dotted, None)
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    config = from_dict(cls, data)
    config.validate()
    return config
