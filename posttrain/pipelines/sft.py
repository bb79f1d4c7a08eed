"""Stage 1: supervised fine-tuning on the environment's worked solutions (teacher-forced
cross-entropy on the response tokens)."""

from __future__ import annotations

import torch

from posttrain.config import SFTConfig, TrainConfig
from posttrain.models.policy import SavablePolicy
from posttrain.data.judge_demos import judge_demonstrations
from posttrain.roles.agent import observation_ids
from posttrain.roles.environment import is_multi_turn
from posttrain.roles.engines.contract import example_prompt_ids
from posttrain.roles.trainer import Trainer, sft_loss
from posttrain.runs.rundir import RunDir
from posttrain.runs.stage import run_stage
from posttrain.seeds import derive_seed, generator_for
from posttrain.types import ENVIRONMENT_TURN, MODEL_TURN, Environment, Episode, Example, RolloutBatch, Tokenizer, Turn


def demonstration_episodes(env: Environment, tokenizer: Tokenizer, examples: list[Example]) -> list[Episode]:
    """Each demonstration as an Episode whose response is the reference solution + EOS; a
    multi-turn environment's as the turns of its `demonstration`, laid out token for token
    as the agent loop lays out a sampled episode (each model turn ends with EOS, each
    observation tokenised by `observation_ids`), the observations masked out of the loss."""
    episodes = []
    for i, example in enumerate(examples):
        turns: list[Turn] | None = None
        if is_multi_turn(env):
            turns = demonstration_turns(env.demonstration(example), tokenizer)
            response = [t for turn in turns for t in turn.token_ids]
        else:
            response = tokenizer.encode(env.solution(example)) + [tokenizer.eos_id]
        episodes.append(Episode(example=example, group_id=i, prompt_ids=example_prompt_ids(tokenizer, example),
                                response_ids=response, response_logp=[0.0] * len(response), turns=turns))
    return episodes


def demonstration_turns(segments: list[tuple[str, str]], tokenizer: Tokenizer) -> list[Turn]:
    """(source, text) segments as Turns: a model turn's text + EOS, an observation's ids as
    the agent loop appends them after a turn that ended with EOS."""
    turns = []
    for source, text in segments:
        if source == MODEL_TURN:
            ids = tokenizer.encode(text) + [tokenizer.eos_id]
            turns.append(Turn(MODEL_TURN, ids, [0.0] * len(ids), text))
        elif source == ENVIRONMENT_TURN:
            turns.append(Turn(ENVIRONMENT_TURN, observation_ids(tokenizer, text, after_end_of_turn=True), None, text))
        else:
            raise ValueError(f"a demonstration segment's source is {source!r}: use {MODEL_TURN!r} or "
                             f"{ENVIRONMENT_TURN!r} (posttrain.types)")
    if not turns or turns[-1].source != MODEL_TURN:
        raise ValueError("a demonstration must end with a model turn (the answer), got "
                         f"{[source for source, _ in segments]}")
    return turns


def sft_demonstrations(cfg: TrainConfig, env: Environment, tokenizer: Tokenizer) -> list[Episode]:
    """SFT's rows: sft.num_examples of the environment's worked solutions."""
    return demonstration_episodes(env, tokenizer, env.fixed_set("train", cfg.sft.num_examples, seed=cfg.seed))


def sft_judge_rows(cfg: TrainConfig, env: Environment, tokenizer: Tokenizer) -> list[Episode]:
    """Two judge demonstrations for each of sft.judge_demos draws of training problems (a
    solution judged Y, a wrong twin judged N: data/judge_demos.py); [] when not asked for."""
    if not cfg.sft.judge_demos:
        return []
    examples = env.sample("train", cfg.sft.judge_demos, seed=derive_seed(cfg.seed, "judge-demos"))
    return judge_demonstrations(env, tokenizer, examples, derive_seed(cfg.seed, "judge-demo-errors"))


def sft_stage(cfg: TrainConfig, run: RunDir, env: Environment, tokenizer: Tokenizer, policy: SavablePolicy,
              stage: str = "sft") -> None:
    """SFT on sft_demonstrations (the environment's worked solutions), with sft.judge_demos'
    judge rows drawn on top of each batch, checkpointed as `stage`."""
    fine_tune(run, stage, sft_demonstrations(cfg, env, tokenizer), tokenizer, policy, cfg.sft, cfg.seed,
              cfg.checkpoint_every, extra=sft_judge_rows(cfg, env, tokenizer))


def fine_tune(run: RunDir, stage: str, demos: list[Episode], tokenizer: Tokenizer, policy: SavablePolicy,
              sft: SFTConfig, seed: int, checkpoint_every: int, extra: list[Episode] | None = None) -> None:
    """sft.steps steps of teacher-forced cross-entropy on batches of sft.batch_size episodes
    drawn with replacement from `demos`, checkpointed as stage `stage` (resumable). The
    demonstrations may be the environment's solutions (SFT) or the policy's own verified
    samples (STaR / rejection-sampling fine-tuning, pipelines/star.py).

    `extra` (judge demonstrations): another sft.batch_size rows drawn from it each step, on
    top of the batch, from a generator of their own, so the demonstrations' draws are exactly
    plain SFT's. Mixed into one pool instead, 600 judge rows beside 150 solutions left the
    solutions a fifth of each batch, and held-out pass@1 after SFT fell from 69.8% to 36.2%
    (docs/guides/preference.md, "DPO's extras")."""
    trainer = Trainer(policy, lr=sft.lr, total_steps=sft.steps, warmup_steps=sft.warmup_steps,
                      weight_decay=sft.weight_decay, grad_clip=1.0)

    def step_fn(step: int) -> dict[str, float]:
        # drawn on the CPU generator's side (seeds.py); trainer.update moves the batch to the policy's device
        rows = torch.randint(len(demos), (sft.batch_size,), generator=generator_for(seed, stage, step), device="cpu")
        episodes = [demos[i] for i in rows.tolist()]
        if extra:
            more = torch.randint(len(extra), (sft.batch_size,), generator=generator_for(seed, stage, "extra", step))
            episodes += [extra[i] for i in more.tolist()]
        batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
        return trainer.update(batch, sft_loss)

    run_stage(run, stage, sft.steps, step_fn, policy, tokenizer, trainer, checkpoint_every,
              show=lambda m: f"loss {m['loss']:.3f}")
