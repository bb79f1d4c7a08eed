"""Pieces several lessons share, so that each notebook shows the library call rather than
ten lines of set-up: a tiny trained policy, one algorithm's push on a batch, and the GRPO
family side by side on the same batch (lessons 11-14).
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain.algorithms import make_algorithm
from posttrain.config import SamplingParams
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.sft import demonstration_episodes
from posttrain.roles.trainer import Trainer, sft_loss
from posttrain.teach.tables import markdown_table
from posttrain.types import Episode, Example, PolicyOutputs, RolloutBatch

# the generation budget the lessons' batches are measured against (Dr.GRPO's L_max, DAPO's):
# make run's, so a lesson's numbers are the ones its run would compute
BUDGET = SamplingParams().max_new_tokens


def tiny_policy(sft_steps: int = 100, seed: int = 0, level: int = 1, cot: bool = False, demos: int = 90):
    """A tiny gpt_mini (dim 32, two layers, ~33k parameters) taught arithmetic by
    `sft_steps` steps of the real SFT path (Trainer + sft_loss on demonstration_episodes)
    on `demos` training problems of `level`, about 3 s per 100 steps on one thread.

    The default is level 1 without a chain of thought ("Q: 3+4\n" -> "Final: 7"), which 100
    steps teach to ~70% greedy pass@1. `level=2, cot=True` writes running sums
    ("Q: 9+5+2\n" -> "9+5=14,14+2=16\nFinal: 16"), steps a search can check (lesson 17);
    that needs ~250 steps for ~45-60%.

    Returns (model, tokenizer, env, sft_losses). The model is in eval mode."""
    torch.manual_seed(seed)
    tok = CharTokenizer()
    env = ArithmeticEnv(level=level, cot=cot)
    model = GPTMini(GPTMiniConfig(vocab_size=tok.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=96,
                                  max_seq_len=48))
    examples = demonstration_episodes(env, tok, env.fixed_set("train", demos))
    # lr 1e-2: a tiny model and a format to learn fast; warmup keeps Adam's first steps sane
    trainer = Trainer(model, lr=1e-2, total_steps=sft_steps, warmup_steps=5)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(sft_steps):
        rows = torch.randint(len(examples), (16,), generator=gen)
        losses.append(trainer.update(RolloutBatch.collate([examples[i] for i in rows.tolist()], tok.pad_id),
                                     sft_loss)["loss"])
    return model.eval(), tok, env, losses


def algorithm_pushes(batch, name: str, **params):
    """Run one registered algorithm on `batch` exactly as the controller and trainer do, at
    θ = θ_old (ratio 1). Returns (advantage of each row's first response token (B,),
    push on each row (B,), loss metrics); push = −Σ_t ∂loss/∂log π over the row's response:
    > 0 means the step makes that completion more likely. Rows the algorithm drops before
    training (DAPO's dynamic sampling) get NaN in both."""
    algo = make_algorithm(name, budget=BUDGET, **params)
    kept = {id(e) for e in algo.filter_batch(batch).episodes}  # DAPO's dynamic sampling drops whole groups
    rows = torch.tensor([b for b, e in enumerate(batch.episodes) if id(e) in kept], dtype=torch.long)  # (b,)
    # rows the algorithm dropped (dynamic sampling) are NaN: "not in the batch", unlike a 0
    adv = torch.full((batch.batch_size,), float("nan"))
    push = torch.full((batch.batch_size,), float("nan"))
    if rows.numel() == 0:  # nothing informative: nothing to train on
        return adv, push, {"kept_rows": 0.0}
    sub = batch.select(rows)
    scored = dataclasses.replace(sub, **algo.compute_advantages(sub))
    logp = sub.old_logp.clone().requires_grad_(True)  # (b, T) θ = θ_old
    values = torch.zeros_like(logp) if algo.uses_critic else None
    outputs = PolicyOutputs(logp=logp, entropy=torch.zeros_like(logp), values=values)
    loss, metrics = algo.compute_loss(outputs, scored)
    loss.backward()
    first = sub.response_mask.argmax(dim=1)  # (b,) first response column of each row
    adv[rows] = scored.advantages.gather(1, first[:, None])[:, 0]
    push[rows] = -(logp.grad * sub.response_mask).sum(dim=1)
    metrics["kept_rows"] = float(rows.numel())
    return adv, push, metrics


FAMILY = ("grpo", "rloo", "dr_grpo", "dapo")  # lessons 11–14: the same batch through each


def synthetic_batch(groups: list[list[tuple[float, int]]], prompt_len: int = 4):
    """A RolloutBatch with known rewards and response lengths and nothing else random:
    `groups[g]` lists (reward, response length) of the samples of prompt g. Every token
    has old_logp −1 (any constant would do: at θ = θ_old only the ratio, 1, matters)."""
    episodes = []
    for g, samples in enumerate(groups):
        example = Example(prompt=f"prompt {g}", expected_answer="")
        for reward, length in samples:
            if length < 1:
                raise ValueError(f"a response needs at least 1 token (its EOS), got length {length}")
            episodes.append(Episode(example=example, group_id=g, prompt_ids=[1] * prompt_len,
                                    response_ids=[5] * (length - 1) + [2], response_logp=[-1.0] * length,
                                    reward=float(reward)))
    return RolloutBatch.collate(episodes, pad_id=0)


def family_comparison(batch, params: dict[str, dict] | None = None, names=FAMILY) -> dict:
    """{name: (adv (B,), push (B,), metrics)} for each algorithm on the same batch, via
    `algorithm_pushes`; `params[name]` overrides that algorithm's defaults."""
    params = params or {}
    return {name: algorithm_pushes(batch, name, **params.get(name, {})) for name in names}


def family_markdown(batch, results: dict, focus: str, base: str = "grpo") -> str:
    """Two markdown tables (advantage, push) of `family_comparison` results: one row per
    completion, one column per entry of `results`, `focus` marked ▶, and every cell that
    differs from column `base` in **bold** — the diff the lesson is about (with a base other
    than GRPO, only the focus column is compared). Dropped rows read "dropped"."""
    names = list(results)
    lengths = batch.response_lengths().int().tolist()
    # against GRPO every other column is a diff worth seeing; against another base (DAPO and
    # its ablation) GRPO is only a reference column, and only the focus is compared
    compared = {n for n in names if n != base and (base == "grpo" or n == focus)}

    def table(k: int, fmt: str) -> str:
        header = ["row", "group", "reward", "tokens"] + [f"▶ {n}" if n == focus else n for n in names]
        rows = []
        for b in range(batch.batch_size):
            cells = []
            for n in names:
                value = results[n][k][b].item()
                reference = results[base][k][b].item() if base in results else value
                if value != value:  # NaN: dropped before training
                    cells.append("**dropped**" if n in compared and reference == reference else "dropped")
                    continue
                text = fmt.format(value if abs(value) > 5e-5 else 0.0)  # no "-0.0000"
                differs = n in compared and (reference != reference
                                             or abs(value - reference) > 1e-4 * max(1.0, abs(reference)))
                cells.append(f"**{text}**" if differs else text)
            rows.append([str(b), str(int(batch.group_ids[b])), f"{batch.rewards[b]:g}", str(lengths[b])] + cells)
        return markdown_table(header, rows, align="r" * len(header))  # every column a number ("dropped" too)

    return ("**Advantage** (first response token):\n\n" + table(0, "{:+.3f}")
            + "\n**Push** on the whole completion, −Σ_t ∂loss/∂log π (> 0: made more likely):\n\n"
            + table(1, "{:+.4f}"))
