"""The one adapter from a config to the objects that run: every other module takes objects,
never a config, so a setting is read in exactly one place. (What must hold before any of
this runs is checked by pipelines/checks.py.)

    make_algorithm(rl)        the RL algorithm, its generation budget filled in
    reward_stack(rl, policy)  the terms of the training reward: presets, users' functions
                              (rewards/user_function.py), length terms, weighted and summed; the
                              policy, when given, judges a self_critique term
    make_reward(rl, score)    that stack on top of the environment's verifier
    pair_ranker(rl, ...)      what ranks a preference stage's samples into pairs: the policy
                              judging itself, a reward model, or the verifier
    sampling_params(cfg)      the rollout's sampling settings
    teacher_directory(name)   OPD's teacher: a checkpoint, a run's last one, or a model's directory
    make_rollout(dist, ...)   the rollout role: in this process, or on Ray workers
    build_controller(cfg, ..) the RL step loop with its roles: rollout (in this process or on
                              Ray workers), reference, trainer (one process or data-parallel),
                              reward, and the step hooks some runs add: group reward terms,
                              each reward term's mean beside the sum, each term's values for GDPO, the curated
                              prompt pool, the critic, PRIME's implicit PRM, adaptive KL and entropy
                              coefficients (roles/hooks.py), OPD's teacher (roles/teacher.py)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Sequence

import torch

from posttrain.algorithms import make_algorithm as make_registered_algorithm
from posttrain.algorithms.contract import Algorithm
from posttrain.algorithms.entropy_control import AdaptiveEntropyController, TokenSelection
from posttrain.algorithms.preference import PREFERENCE_LOSSES
from posttrain.config import DistConfig, MismatchConfig, RLConfig, SamplingParams, TrainConfig
from posttrain.data.curation import PromptPool
from posttrain.distributed.async_rollout import AsyncRayRollout
from posttrain.distributed.data_parallel import make_trainer
from posttrain.distributed.rollout_workers import RayRollout
from posttrain.models import is_transformers_policy
from posttrain.models.model_dirs import resolve_model_dir
from posttrain.models.policy import Policy
from posttrain.models.value_head import ValueHead
from posttrain.rewards.agentic import AGENTIC_PRESETS
from posttrain.rewards.implicit_prm import ImplicitPRM
from posttrain.rewards.kl_control import AdaptiveKLController
from posttrain.rewards.language import LanguageConsistency
from posttrain.rewards.ensemble import LearnedReward
from posttrain.rewards.proxy import ProxyReward, load_reward_scorer
from posttrain.rewards.rubric import rule_based_rubric
from posttrain.rewards.length import KimiLength, LinearLength
from posttrain.rewards.meta_verifier import META_VERIFIER_PRESETS, audits
from posttrain.rewards.self_critique import POLICY_JUDGE, SelfCritique
from posttrain.rewards.self_judge import SelfJudgeReward, self_judge
from posttrain.rewards.stack import Accuracy, RewardStack, RewardTerm, Schedule, deepseek_r1_terms
from posttrain.rewards.user_function import StackOnVerdict, parse_reward, stack_scorer
from posttrain.roles.agent import AgentLoop
from posttrain.roles.controller import Controller, Scorer, StepSettings
from posttrain.roles.environment import is_multi_turn
from posttrain.roles.hooks import (AdaptiveEntropy, AdaptiveKL, CriticValues, CuratedPrompts, GroupTerms, ProcessRewards,
                                   RewardTermTable, RewardTerms)
from posttrain.roles.mismatch import Correction, MismatchCorrection, SamplerIsTrainer, sampler_is_trainer
from posttrain.roles.reference import NoReference, make_reference
from posttrain.roles.rollout import ColocatedRollout, Rollout, RolloutRequest, Sampler, StepPrompts, single_turn
from posttrain.roles.teacher import make_teacher
from posttrain.runs.checkpoints import final_checkpoint
from posttrain.runs.console import console
from posttrain.types import Environment, Tokenizer


def is_preference(rl: RLConfig) -> bool:
    """Whether rl.algo is a preference loss (the DPO family) rather than an RL algorithm."""
    return rl.algo in PREFERENCE_LOSSES


def make_algorithm(rl: RLConfig, budget: int | None = None) -> Algorithm:
    """The RL algorithm rl.algo with rl.algo_params; its generation budget (Dr.GRPO's
    divisor, DAPO's L_max) is rl.sampling.max_new_tokens, or `budget` (a multi-turn
    environment's max_total_tokens: an episode's model turns together may go past one turn's).
    rl.entropy's token settings become its token_selection (all tokens by default)."""
    algo = make_registered_algorithm(rl.algo, budget=budget or rl.sampling.max_new_tokens, **rl.algo_params)
    entropy = rl.entropy
    algo.token_selection = TokenSelection(entropy.top_quantile, entropy.cov, entropy.cov_ratio, entropy.clip_cov_low,
                                          entropy.clip_cov_high, entropy.kl_cov_coef)
    return algo


# The named presets of rl.reward.terms: weighted terms on top of the verifier's result. rl.reward.terms
# sums them with users' functions (MODULE:FUNCTION, PATH.py:FUNCTION; rewards/user_function.py).
REWARD_PRESETS: dict[str, Callable[[], Sequence[tuple[float, RewardTerm]]]] = {
    "accuracy": lambda: [(1.0, Accuracy())],  # the verifier's 1/0: nothing stacked on it
    "r1": deepseek_r1_terms,  # accuracy + 0.2 × format (DeepSeek-R1-Zero)
    "language": lambda: [(1.0, LanguageConsistency())],  # R1's language consistency: share of reasoning words in the prompt's language
    "rubric": lambda: [(1.0, rule_based_rubric())],  # answer line, no loops, length budget; in [0, 1]
    # the five production criteria, judged by the policy (reward_terms swaps in rl.reward.judge's judge)
    "self_critique": lambda: [(1.0, SelfCritique(POLICY_JUDGE))],
    **META_VERIFIER_PRESETS,  # a step verifier's verdict, paid when the ground truth confirms it
}


def reward_terms(rl: RLConfig) -> list[tuple[float | Schedule, RewardTerm]]:
    """The (weight, term) pairs rl.reward.terms names, its functions imported; ValueError naming
    the term that cannot be used."""
    # the agentic presets (rewards/agentic.py) read a tool environment's calls: data_checks refuses them elsewhere
    presets = {**REWARD_PRESETS, **AGENTIC_PRESETS, "rm": lambda: [(1.0, learned_reward(rl))],
               "self_critique": lambda: [(1.0, SelfCritique.from_setting(rl.reward.judge))]}
    return parse_reward(rl.reward.terms, presets,
                        timeout=rl.reward.timeout, rows_per_step=rl.prompts_per_step * rl.samples_per_prompt)


def learned_reward(rl: RLConfig) -> LearnedReward:
    """rl.reward.terms's "rm" term: the reward model(s) of rl.rm.path as one layer of the stack."""
    if not rl.rm.path:
        raise ValueError("the term 'rm' is a learned reward and needs its model: set rl.rm.path to a reward-model "
                         "directory (posttrain rlhf writes runs/<id>/reward_model), or several joined by ','")
    return LearnedReward(load_reward_scorer(rl.rm.paths(), rl.rm.ensemble, rl.rm.disagreement_coef))


def reward_stack(rl: RLConfig, policy: Policy | None = None, tokenizer: Tokenizer | None = None) -> RewardStack | None:
    """The terms rl.reward.terms, rl.reward.length_penalty and rl.reward.length_reward ask for, as one stack; None
    when that is the verifier's own 1/0 alone (nothing stacked on it: `make run`'s reward). `policy` and its
    `tokenizer` judge a self_critique term whose rl.reward.judge is "policy"; without them (the checks, before
    any model loads) that term holds the judge's place and refuses to score."""
    terms = reward_terms(rl)
    if policy is not None and tokenizer is not None:
        terms = [(w, term.judged_by(policy, tokenizer) if isinstance(term, SelfCritique) else term) for w, term in terms]
    if rl.reward.length_penalty > 0:
        terms.append((1.0, LinearLength(rl.reward.length_free, rl.reward.length_penalty)))
    group_terms = ([(rl.reward.length_reward, KimiLength(rl.reward.length_reward_start))]
                   if rl.reward.length_reward > 0 else [])
    if not group_terms and len(terms) == 1 and terms[0][0] == 1.0 and isinstance(terms[0][1], Accuracy):
        return None
    return RewardStack(terms, group_terms)


def make_reward(rl: RLConfig, score: Scorer, stack: RewardStack | None = None) -> Scorer:
    """The training reward: the environment's scorer (or, with rl.rm.path and no "rm" term in
    rl.reward.terms, a reward model with the scorer kept as the gold), with `stack` (default:
    reward_stack(rl)) on top. A stack's group terms (rl.reward.length_reward) are added later, by
    its score_groups."""
    stack = reward_stack(rl) if stack is None else stack
    learned_term = stack is not None and any(isinstance(term, LearnedReward) for _, term in stack.terms)
    if rl.rm.path and not learned_term:  # the reward model scores; the verifier's verdict stays in details
        score = ProxyReward(load_reward_scorer(rl.rm.paths(), rl.rm.ensemble, rl.rm.disagreement_coef), score)
    return score if stack is None else stack_scorer(stack, score)


def pair_ranker(rl: RLConfig, score: Scorer, policy: Policy, tokenizer: Tokenizer) -> Scorer | None:
    """What ranks a preference stage's sampled pairs instead of the verifier: the policy as its
    own judge (rl.preference.self_reward), a reward model (rl.rm.path), or None, the verifier itself (every
    right sample against every wrong one). Either ranker keeps the verifier's verdict in each
    sample's details as the gold, to measure the ranker against."""
    if rl.preference.self_reward:
        return SelfJudgeReward(self_judge(policy, tokenizer), score)
    return make_reward(rl, score, reward_stack(rl, policy, tokenizer)) if rl.rm.path else None


def sampling_params(cfg: TrainConfig) -> SamplingParams:
    """rl.sampling, stopping at the first newline when answers are one line (env.cot false)."""
    return dataclasses.replace(cfg.rl.sampling, stop_at_newline=cfg.rl.sampling.stop_at_newline or not cfg.env.cot)


def teacher_directory(name: str) -> Path:
    """The directory of OPD's teacher `name` (its `teacher` field): a checkpoint directory as
    given; a run directory's or a stage folder's last checkpoint (runs/checkpoints.py); else a
    model name (models/model_dirs.py: a known name, or one in the local Hugging Face cache).
    FileNotFoundError or ValueError saying what `name` is when it names no model."""
    if Path(name).is_dir():
        return final_checkpoint(name)[0]
    return resolve_model_dir(name)


def trainer_settings(rl: RLConfig) -> dict:
    """The RL and preference stages' optimisation settings, as Trainer arguments."""
    return dict(lr=rl.optim.lr, total_steps=rl.steps, warmup_steps=rl.optim.warmup_steps,
                final_lr_fraction=rl.optim.final_lr_fraction,
                adam_beta2=rl.optim.adam_beta2, weight_decay=rl.optim.weight_decay, grad_clip=rl.optim.grad_clip,
                micro_batch_size=rl.update.micro_batch_size, share_prompt=rl.update.share_prompt)


def mismatch_correction(mismatch: MismatchConfig, params: SamplingParams, compute_dtype: torch.dtype,
                        topology: str) -> Correction:
    """rl.mismatch's correction wherever the sampler is not the trainer (int8 or bf16 sampling,
    an engine other than torch, async's stale batches), or with rl.mismatch.always; else none,
    and the default run's numbers are those of a run without the correction."""
    if mismatch.always or not sampler_is_trainer(params.engine, params.weights, compute_dtype, topology):
        return MismatchCorrection(mismatch.mode, mismatch.cap, mismatch.lower)
    return SamplerIsTrainer()


def make_rollout(dist: DistConfig, policy: Policy, tokenizer: Tokenizer, params: SamplingParams,
                 request: Callable[[int, int], RolloutRequest], horizon: int | None = None,
                 sampler: Sampler = single_turn, mismatch: MismatchConfig | None = None) -> Rollout:
    """The rollout role `dist` (a DistConfig) asks for: in this process, or on Ray workers
    (Ray itself is imported only when workers start). `horizon` = the run's step count
    (async samples ahead up to it, never past it). `sampler`: single-turn completions, or a
    multi-turn environment's agent loop (each Ray worker runs a pickled copy of it).
    `mismatch`: rl.mismatch (None: its defaults)."""
    topology = dist.resolved_topology()
    shards = dist.rollout_shards or max(1, dist.workers)
    correction = mismatch_correction(mismatch or MismatchConfig(), params, policy.compute_dtype, topology)
    if topology == "colocated":
        return ColocatedRollout(policy, tokenizer, params, request, shards, sampler, correction=correction)
    if topology == "sync":
        return RayRollout(dist, policy, tokenizer, params, request, shards, sampler, correction=correction)
    return AsyncRayRollout(dist, policy, tokenizer, params, request, shards, sampler, horizon=horizon,
                           correction=correction)


def build_controller(cfg: TrainConfig, env: Environment, tokenizer: Tokenizer, policy: Policy, start_weights: Path,
                     pool: PromptPool | None = None) -> Controller:
    """The RL stage's roles around `policy`; the reference is the policy at `start_weights`
    (or, with LoRA, the policy with its adapters off). `pool`: rl.curation's pool of training
    prompts (pipelines/curation.py::build_pool), or None to draw from the whole train split."""
    algo = make_algorithm(cfg.rl, env.max_total_tokens if is_multi_turn(env) else None)
    # the rollout role and its weight sync: in this process, or Ray workers (posttrain/distributed/)
    # a multi-turn environment is sampled by the agent loop (roles/agent.py), every other one turn at a time
    prompts = StepPrompts(env, cfg.rl.prompts_per_step, cfg.rl.samples_per_prompt, cfg.seed, pool)
    stack = reward_stack(cfg.rl, policy, tokenizer)  # the policy judges a self_critique term
    # the agent loop stacks rl.reward.terms on each finished episode's verdict (Kimi K2's joint reward)
    sampler = AgentLoop(env, reward=StackOnVerdict(stack) if stack else None) if is_multi_turn(env) else single_turn
    rollout = make_rollout(cfg.dist, policy, tokenizer, sampling_params(cfg), prompts, horizon=cfg.rl.steps,
                           sampler=sampler, mismatch=cfg.rl.mismatch)
    prm_settings = algo.implicit_prm_settings()  # PRIME's implicit PRM, or None
    # the reference scores every row when something besides the KL log reads ref_logp: a KL term
    # in the loss (which an adaptive KL controller always has) or an implicit PRM
    reference = (make_reference(policy, start_weights, cfg.rl.update.share_prompt, log_rows=kl_log_rows(cfg.rl),
                                every_row=algo.uses_reference or prm_settings is not None)
                 if algo.uses_reference or cfg.rl.kl.track else NoReference())
    critic = ValueHead(policy.config.dim) if algo.uses_critic else None  # the trainer moves it to the policy
    # PRIME's implicit PRM: a trainable copy of the starting policy, stepped once per batch
    process_reward = (ImplicitPRM(policy, **prm_settings, grad_clip=cfg.rl.optim.grad_clip,
                                  micro_batch_size=cfg.rl.update.micro_batch_size, share_prompt=cfg.rl.update.share_prompt)
                      if prm_settings is not None else None)
    # one process, or rank 0 of --dist.trainer_ranks data-parallel processes (distributed/data_parallel.py)
    trainer = make_trainer(cfg.dist.trainer_ranks, policy, critic=critic, **trainer_settings(cfg.rl))
    if cfg.rl.update.micro_batch_size == 0 and is_transformers_policy(cfg.model, cfg.init):
        rows = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
        console.print(f"[yellow]rl.update.micro_batch_size 0: all {rows} rows go through one forward and backward "
                      "pass, and a real model's activations for that take many GB (SmolLM2-135M, 64 rows of ~110 "
                      "tokens: a run was killed for memory at 11.7 GB). With --rl.update.micro_batch_size 8 a "
                      "whole SmolLM2 GRPO step peaked at 3.4 GB; with a per-sequence loss (GRPO's) the "
                      "update is the same")
    hooks = [  # in the order the step calls them (roles/hooks.py)
        # terms that score a sample against its group (rl.reward.length_reward), and weights that depend on
        # the step (rl.reward.terms's START->END@STEPS), apply once a group is scored
        *([GroupTerms(stack.score_groups)] if stack is not None and stack.needs_groups else []),
        # each term's mean per sample beside the sum, once the group terms and the step's weights are in
        *([RewardTerms(stack.term_means)] if stack is not None else []),
        # a meta_verified term's audit: the verifier's false positives against the ground truth, per round
        *(audits(stack.terms) if stack is not None else []),
        # each term's value and weight on the batch, for an advantage that normalises each term apart (GDPO)
        *([RewardTermTable(stack.term_table)] if stack is not None and cfg.rl.reward.normalize == "per_term" else []),
        *([CuratedPrompts(pool)] if pool is not None else []),
        *([CriticValues(trainer)] if algo.uses_critic else []),
        *([ProcessRewards(process_reward)] if process_reward is not None else []),
        # OPD's frozen teacher scores the sampled tokens before the advantages read them
        *([make_teacher(policy, teacher_directory(teacher["teacher"]), teacher["topk"], cfg.rl.update.share_prompt)]
          if (teacher := algo.teacher_settings()) is not None else []),
        *([AdaptiveKL(AdaptiveKLController(algo.kl_coef, cfg.rl.kl.target, cfg.rl.kl.horizon), algo)]
          if cfg.rl.kl.target else []),
        *([AdaptiveEntropy(AdaptiveEntropyController(algo.entropy_coef, cfg.rl.entropy.target, cfg.rl.entropy.delta,
                                                     cfg.rl.entropy.coef_max), algo)] if cfg.rl.entropy.target else []),
    ]
    # the adaptive entropy controller reads the step's `entropy`, a mean over the rows the update
    # trained: skipping the rows with no gradient (the same update) would make it the mixed groups'
    # entropy while the coefficient is 0 and every row's once it is not, two populations apart by
    # 2x on make run's task. With a target every row is trained, so it reads one quantity throughout
    skip_inert_rows = cfg.rl.update.skip_inert_rows and not cfg.rl.entropy.target
    settings = StepSettings(prompts_per_step=cfg.rl.prompts_per_step, seed=cfg.seed, pad_id=tokenizer.pad_id,
                            epochs=cfg.rl.update.epochs, minibatches=cfg.rl.update.minibatches,
                            max_sampling_rounds=cfg.rl.max_sampling_rounds, skip_inert_rows=skip_inert_rows)
    return Controller(rollout, make_reward(cfg.rl, env.score, stack), algo, trainer, settings, reference, hooks)


def kl_log_rows(rl: RLConfig) -> int:
    """Rows the reference scores for a KL that is only logged (rl.kl.track_rows), or 0 for
    every row when an alert acts on the number: a kl_explosion alert that stops or rolls back
    the run must not fire on a sample's spike (in make run, one heavy-tailed row in 64 once
    read 0.65 where all 256 gave 0.19). The controller itself scores every row for the
    readers it holds: a KL term (which the adaptive KL controller needs) and an implicit PRM."""
    stops_on_kl = rl.alerts.action != "warn" and "kl_explosion" in rl.alerts.monitors.split(",")
    return 0 if stops_on_kl else rl.kl.track_rows
