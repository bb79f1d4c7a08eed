"""gpt_mini training throughput as a fraction of the machine's measured matmul FLOP/s
(model FLOPs utilisation, MFU), at the shapes `make run` trains on.

    python benchmarks/train_mfu.py [--threads 2]

FLOPs per trained token = 6 × (weights in matmuls) + 12 × layers × dim × context / 2
(forward 2, backward 4; attention's QK^T and AV at the average causal context). The
update is Trainer.update with the SFT loss, on right-padded rows, as in the RL stage.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ceilings import best_time, describe, machine, matmul_params
from posttrain.config import ModelConfig
from posttrain.models import CharTokenizer, build_model
from posttrain.roles.trainer import Trainer, sft_loss
from posttrain.types import RolloutBatch


def synthetic_batch(rows: int, length: int, vocab: int, prompt: int = 16) -> RolloutBatch:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, vocab, (rows, length), generator=generator)
    mask = torch.ones(rows, length)
    response = torch.zeros(rows, length)
    response[:, prompt:] = 1
    zeros = torch.zeros(rows, length)
    return RolloutBatch(tokens=tokens, attention_mask=mask, response_mask=response, old_logp=zeros,
                        rewards=torch.zeros(rows), group_ids=torch.arange(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "train_mfu.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    m = machine()
    print(describe(m))
    peak = m["matmul_gflops"] * 1e9
    results = []
    # (name, model shape, rows, tokens per row): the default model at the RL stage's batch
    # (32 prompts × 8 samples, ~60 tokens) and SFT's, then wider models to show what
    # limits a 128-wide model
    cases = [("gpt_mini default, RL batch", ModelConfig(), 256, 60),
             ("gpt_mini default, SFT batch", ModelConfig(), 32, 60),
             ("gpt_mini dim 256", ModelConfig(dim=256, hidden_dim=704), 256, 60),
             ("gpt_mini dim 512", ModelConfig(dim=512, hidden_dim=1376, n_head=8), 256, 60)]
    for name, model_cfg, rows, length in cases:
        torch.manual_seed(0)
        model = build_model(model_cfg, CharTokenizer())
        trainer = Trainer(model, lr=1e-4, total_steps=100)
        batch = synthetic_batch(rows, length, model.config.vocab_size)
        seconds = best_time(lambda: trainer.update(batch, sft_loss), 3)
        tokens = rows * length
        flops = tokens * (6 * matmul_params(model) + 12 * model_cfg.n_layer * model_cfg.dim * length / 2)
        row = {"case": name, "params": model.num_params(), "tokens": tokens, "seconds": seconds,
               "gflops": flops / seconds / 1e9, "mfu": flops / seconds / peak}
        results.append(row)
        print(f"{name:28s} {row['params'] / 1e6:5.2f}M params: {row['seconds'] * 1e3:7.1f} ms/update, "
              f"{row['gflops']:5.1f} GFLOP/s = {row['mfu']:.0%} of the matmul ceiling", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": m, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
