"""torch.compile of the RL update (issue #18 item 5): the trainer's forward (hidden states,
response log-probs and entropy) and its backward, eager against compiled, side by side in
one process, on one fixed-shape micro-batch.

    python benchmarks/compile_step.py [--model smollm2-135m] [--rows 8] [--tokens 110] [--repeats 5]

Reports the steady-state time of one forward+backward each way (median of --repeats, the
two sides alternating after a warm-up), the ratio, the one-time compile cost (the compiled side's first call minus its
steady state), and the number of updates after which compiling has paid for itself. The
shape is fixed: a run whose micro-batches change width recompiles (or compiles dynamic
shapes, slower to build), so this is the most favourable case for compile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from posttrain.config import TrainConfig
from posttrain.models import make_policy
from posttrain.roles.trainer import Trainer
from posttrain.types import RolloutBatch


def micro_batch(vocab: int, rows: int, tokens: int, prompt: int) -> RolloutBatch:
    """Random ids, the first `prompt` of each row a prompt and the rest the response."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, tokens), generator=generator)
    response = torch.zeros(rows, tokens)
    response[:, prompt:] = 1.0
    return RolloutBatch(tokens=ids, attention_mask=torch.ones(rows, tokens), response_mask=response,
                        old_logp=torch.zeros(rows, tokens), rewards=torch.zeros(rows),
                        group_ids=torch.zeros(rows, dtype=torch.long))


def one_update(step, batch: RolloutBatch, model: torch.nn.Module) -> float:
    """Seconds of one forward+backward."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    step(batch).backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=8)  # rl.update.micro_batch_size 8, as BENCHMARKS' SmolLM2 step
    parser.add_argument("--tokens", type=int, default=110)  # chat-templated prompt + ≤64 new tokens
    parser.add_argument("--prompt", type=int, default=46)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = TrainConfig()
    cfg.model.name = args.model
    policy, tokenizer = make_policy(cfg.model)
    policy.train()
    trainer = Trainer(policy, lr=1e-6, total_steps=1, share_prompt=False)
    batch = micro_batch(tokenizer.vocab_size, args.rows, args.tokens, args.prompt)

    def loss(b: RolloutBatch) -> torch.Tensor:
        return -(trainer.forward(b).logp * b.response_mask).sum() / b.response_mask.sum()

    load_before = os.getloadavg()[0]
    compiled_loss = torch.compile(loss)
    one_update(loss, batch, policy)  # warm-up
    compiled_first = one_update(compiled_loss, batch, policy)  # the compile happens here
    eager, compiled = [], []
    for _ in range(args.repeats):  # alternating, so a change of load hits both sides alike
        eager.append(one_update(loss, batch, policy))
        compiled.append(one_update(compiled_loss, batch, policy))
    eager_s, compiled_s = statistics.median(eager), statistics.median(compiled)
    compile_cost = compiled_first - compiled_s
    saved = eager_s - compiled_s
    print(f"{args.model}, {args.rows} rows x {args.tokens} tokens, {args.threads} threads: forward+backward eager "
          f"{eager_s:.3f} s (min {min(eager):.3f}), compiled {compiled_s:.3f} s (min {min(compiled):.3f}): "
          f"{eager_s / compiled_s:.2f}x; compiling took {compile_cost:.1f} s, paid back after "
          + (f"{compile_cost / saved:.0f} micro-batch updates" if saved > 0 else "never (not faster)")
          + f"; 1-minute load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
