"""How much of the update is padding, and what sorting rows by length would save: the bound
on bucketing (issue #18 item 5), counted in tokens, no timing needed.

    cd benchmarks && ../.venv/bin/python padding_bound.py [--model DIR] [--micro-batches 4,8]

The trainer already cuts each micro-batch after its longest row (RolloutBatch.
without_trailing_padding), so the padding left is the gap between a micro-batch's rows.
Bucketing would order the rows by length first, inside each prompt group (which keeps the
group's shared prompt computed once) or over the whole batch. Each order's cost is the sum
over micro-batches of rows × width; the update's time moves with it at best.
"""

from __future__ import annotations

import argparse

import torch
from skip_inert_rows import sampled_batch


def tokens_run(widths: torch.Tensor, order: torch.Tensor, micro_batch: int) -> int:
    """Token positions the update computes when the rows go through in `order`."""
    chunks = order.split(micro_batch)
    return sum(len(chunk) * int(widths[chunk].max()) for chunk in chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m or a transformers directory "
                        "(grpo_vs_trl.py's SFT start is under results/smollm2-sft)")
    parser.add_argument("--system", default="Add the numbers step by step. End with one line: Final: <sum>")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--micro-batches", default="4,8")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from posttrain.models.hf import HFPolicy

    policy, tokenizer = HFPolicy.load(args.model, system_prompt=args.system)
    batch = sampled_batch(policy, tokenizer, args.prompts, args.group, args.max_new)
    widths = batch.attention_mask.sum(dim=1).long()
    rows = torch.arange(batch.batch_size)
    within_groups = torch.cat([g[torch.argsort(widths[g], stable=True)] for g in rows.split(args.group)])
    overall = torch.argsort(widths, stable=True)
    real = int(widths.sum())
    print(f"{batch.batch_size} rows, widths {int(widths.min())}-{int(widths.max())} tokens, {real} real tokens")
    for micro_batch in map(int, args.micro_batches.split(",")):
        drawn = tokens_run(widths, rows, micro_batch)
        print(f"micro-batch {micro_batch}: as drawn {drawn} ({drawn / real - 1:.1%} padding); sorted within groups "
              f"{tokens_run(widths, within_groups, micro_batch) / drawn:.3f}x of that, sorted overall "
              f"{tokens_run(widths, overall, micro_batch) / drawn:.3f}x")


if __name__ == "__main__":
    main()
