"""`posttrain prm`, steps 1 and 2: the policy, and its own samples with a label for every step.

    the task      --init's, when its checkpoint records one (posttrain_task.json), else the
                  --env.* settings; without --init, arithmetic only, after `posttrain run`'s SFT
    the samples   samples_per_prompt completions of `prompts` distinct train problems (to train
                  on) and of `heldout_prompts` dev problems (held out: the search jobs keep the
                  heldout split for themselves), each scored by the task's verifier (its outcome)
    step labels   --labels checker: the arithmetic step checker (verifiers/steps.py), first-error
                  labels, free; --labels mc: Monte-Carlo (rewards/monte_carlo_labels.py), for
                  tasks with no step checker: mc_rollouts continuations from every step's
                  prefix, the label Math-Shepherd's hard estimate (some continuation ended right)
                  or its soft one (the fraction that did), at a cost in tokens that is counted

The completion is cut into steps by the task's step format (rewards/process_reward_model.py:
the arithmetic chain, or one line per step ended by reasoning-gym's answer line).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from posttrain.config.commands import PrmConfig
from posttrain.config import EnvConfig, SFTConfig, SamplingParams, TrainConfig
from posttrain.config.files import to_dict
from posttrain.models import load_checkpoint_model, load_tokenizer, make_policy
from posttrain.models.model_dirs import resolve_model_dir
from posttrain.models.policy import Policy, SavablePolicy
from posttrain.pipelines.sft import sft_stage
from posttrain.rewards.monte_carlo_labels import monte_carlo_step_labels
from posttrain.rewards.process_reward_model import StepRecord, get_step_format
from posttrain.roles.engines import make_engine
from posttrain.runs.checkpoints import latest_checkpoint, read_task
from posttrain.runs.rundir import RunDir
from posttrain.seeds import derive_seed
from posttrain.types import Environment, Tokenizer
from posttrain.verifiers.steps import check_arithmetic_steps, problem_of

DEFAULT_MAX_NEW_TOKENS = 48  # without a recorded run: the longest level-3 chain of thought is ~40 characters


def prm_task(cfg: PrmConfig) -> tuple[EnvConfig, int]:
    """(the task, a completion's token cap): --init's recorded task and generation budget
    when it records them, else cfg.env and DEFAULT_MAX_NEW_TOKENS; cfg.max_new_tokens > 0
    replaces the budget either way."""
    recorded = read_task(resolve_model_dir(cfg.init)) if cfg.init else None
    env = recorded.env if recorded else cfg.env
    return env, cfg.max_new_tokens or (recorded.max_new_tokens if recorded else DEFAULT_MAX_NEW_TOKENS)


def load_policy(cfg: PrmConfig, run: RunDir, env: Environment,
                env_cfg: EnvConfig) -> tuple[SavablePolicy, Tokenizer, float]:
    """(policy, tokenizer, seconds of SFT): --init's model, or gpt_mini after `posttrain run`'s
    SFT (150 demonstrations, sft_steps steps) on the arithmetic task env_cfg names."""
    if cfg.init:
        start = resolve_model_dir(cfg.init)
        return load_checkpoint_model(start), load_tokenizer(start), 0.0
    train_cfg = TrainConfig(seed=cfg.seed, env=env_cfg, sft=dataclasses.replace(SFTConfig(), steps=cfg.sft_steps))
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    policy, tokenizer = make_policy(train_cfg.model)
    started = time.perf_counter()
    if cfg.sft_steps:
        # the SFT is a run of its own inside this one (runs/<id>/sft_policy/): its checkpoints
        # record its TrainConfig, as every policy checkpoint does, and `posttrain eval` reads it
        sft_run = RunDir(run.path / "sft_policy")
        sft_run.path.mkdir(exist_ok=True)
        sft_run.write_json("config.json", to_dict(train_cfg))
        sft_run.write_meta({"seed": cfg.seed, "made_by": "posttrain prm"})
        sft_stage(train_cfg, sft_run, env, tokenizer, policy)
        policy.load_state_dict(load_checkpoint_model(latest_checkpoint(sft_run, "sft"), policy.config).state_dict())
    return policy, tokenizer, time.perf_counter() - started


def labelled_samples(cfg: PrmConfig, env: Environment, step_format: str, max_new_tokens: int, policy: Policy,
                     tokenizer: Tokenizer, split: str, n_prompts: int) -> tuple[list[StepRecord], dict]:
    """(records, stats): samples_per_prompt samples of n_prompts distinct problems of
    `split`, every step labelled (cfg.labels), every outcome by the verifier; stats say how
    many mistakes they hold (sample_stats). A completion with no step gets no record; it
    still counts in the stats."""
    fmt = get_step_format(step_format)
    params = SamplingParams(temperature=cfg.temperature, max_new_tokens=max_new_tokens)
    # shares_weights: sample with the policy as it is, without the engine freezing it (its copy trains next)
    engine = make_engine(policy, tokenizer, params, shares_weights=True)
    # not fixed_set(seed=cfg.seed): with the seed the SFT used, the first 150 train problems
    # would be its demonstrations, which the policy has memorised (measured: 85% of train-split
    # samples right against 76% on dev), and the reward model would see too few mistakes
    examples = env.fixed_set(split, n_prompts, seed=derive_seed(cfg.seed, f"prm-prompts-{split}"))
    generator = torch.Generator().manual_seed(derive_seed(cfg.seed, f"prm-samples-{split}"))
    episodes = engine.generate(examples, cfg.samples_per_prompt, generator=generator)
    outcomes = [float(env.score(e.example, e.completion)["reward"]) for e in episodes]
    steps = [fmt.split(e.completion) for e in episodes]
    kept = [k for k, s in enumerate(steps) if s]  # an empty completion has no step to label
    # the step checker's verdicts wherever the task has one: the labels (checker), or the truth beside them (mc)
    verdicts = ({k: check_arithmetic_steps(episodes[k].example, steps[k]) for k in kept}
                if all(problem_of(e) for e in examples) else None)
    stats: dict = {}
    if cfg.labels == "checker":
        assert verdicts is not None  # check_prm allows checker labels only on tasks with a step checker
        labels = {k: [float(v.label) for v in verdicts[k]] for k in kept}
    else:
        started = time.perf_counter()
        mc = monte_carlo_step_labels(engine, [episodes[k].example for k in kept], [steps[k] for k in kept],
                                     env.score, n_rollouts=cfg.mc_rollouts, max_new_tokens=max_new_tokens,
                                     separators=fmt.separators, generator=torch.Generator().manual_seed(
                                         derive_seed(cfg.seed, f"prm-mc-{split}")))
        labels = {k: (m.soft if cfg.mc_label == "soft" else [float(h) for h in m.hard]) for k, m in zip(kept, mc)}
        stats["mc_tokens"] = sum(m.tokens for m in mc)
        stats["mc_seconds"] = time.perf_counter() - started
    records = [StepRecord(episodes[k].example.prompt, steps[k], labels[k], outcomes[k]) for k in kept]
    stats.update(sample_stats(records, [e.completion for e in episodes], outcomes, verdicts))
    return records, stats


def sample_stats(records: list[StepRecord], completions: list[str], outcomes: list[float],
                 verdicts: dict | None = None) -> dict:
    """How many mistakes the samples hold (the reward model's material): a step counts as
    labelled wrong at label <= 0.5, as the held-out report thresholds it. With the step
    checker's verdicts: the steps whose arithmetic fails, and (for Monte-Carlo labels) how
    often the labels agree with the checker's, which is the truth there."""
    n, labels = len(completions), [y for r in records for y in r.labels]
    empty = n - len(records)  # no step at all: counted as a completion with a wrong step
    stats = {
        "completions": n,
        "outcome_correct": sum(o >= 1.0 for o in outcomes) / max(n, 1),
        "completions_with_a_wrong_step": (sum(any(y <= 0.5 for y in r.labels) for r in records) + empty) / max(n, 1),
        "steps": len(labels),
        "steps_labelled_wrong": sum(y <= 0.5 for y in labels) / max(len(labels), 1),
        "distinct_completions": len(set(completions)),
    }
    if verdicts is not None:
        truth = [v for k in sorted(verdicts) for v in verdicts[k]]  # the records' steps, in the same order
        stats["steps_whose_arithmetic_fails"] = sum(not v.arithmetic_holds for v in truth) / max(len(truth), 1)
        agree = [(y > 0.5) == v.label for y, v in zip(labels, truth)]
        stats["labels_agree_with_the_step_checker"] = sum(agree) / max(len(agree), 1)
        stats["labelled_right_but_wrong_by_the_checker"] = sum(y > 0.5 and not v.label for y, v in zip(labels, truth))
        stats["labelled_wrong_but_right_by_the_checker"] = sum(y <= 0.5 and v.label for y, v in zip(labels, truth))
    return stats
