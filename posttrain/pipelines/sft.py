"""Stage 1: supervised fine-tuning on the environment's worked solutions (teacher-forced
cross-entropy on the response tokens)."""

from __future__ import annotations

import torch

from posttrain.config import TrainConfig
from posttrain.roles.rollout import example_prompt_ids
from posttrain.roles.trainer import Trainer, sft_loss
from posttrain.runs.rundir import RunDir
from posttrain.runs.stage import run_stage
from posttrain.seeds import generator_for
from posttrain.types import Episode, RolloutBatch


def demonstration_episodes(env, tokenizer, examples) -> list[Episode]:
    """Each demonstration as an Episode whose response is the reference solution + EOS."""
    episodes = []
    for i, example in enumerate(examples):
        response = tokenizer.encode(env.solution(example)) + [tokenizer.eos_id]
        episodes.append(Episode(example=example, group_id=i, prompt_ids=example_prompt_ids(tokenizer, example),
                                response_ids=response, response_logp=[0.0] * len(response)))
    return episodes


def sft_stage(cfg: TrainConfig, run: RunDir, env, tokenizer, policy) -> None:
    demos = demonstration_episodes(env, tokenizer, env.fixed_set("train", cfg.sft.num_examples, seed=cfg.seed))
    trainer = Trainer(policy, lr=cfg.sft.lr, total_steps=cfg.sft.steps, warmup_steps=cfg.sft.warmup_steps,
                      weight_decay=cfg.sft.weight_decay, grad_clip=1.0)

    def step_fn(step: int) -> dict[str, float]:
        # drawn on the CPU generator's side (seeds.py); trainer.update moves the batch to the policy's device
        rows = torch.randint(len(demos), (cfg.sft.batch_size,), generator=generator_for(cfg.seed, "sft", step),
                             device="cpu")
        batch = RolloutBatch.collate([demos[i] for i in rows.tolist()], tokenizer.pad_id)
        return trainer.update(batch, sft_loss)

    run_stage(run, "sft", cfg.sft.steps, step_fn, policy, tokenizer, trainer, cfg.checkpoint_every,
              show=lambda m: f"loss {m['loss']:.3f}")
