"""What computing each prompt once per group saves (rl.update.share_prompt, posttrain/models/shared_prefix.py):
one GRPO update, one reference pass and one sampler prefill with every row's prompt, and with
each distinct prompt once, side by side.

    cd benchmarks && ../.venv/bin/python shared_prefix.py [--threads 2] [--repeats 3]

The batch is sampled once per model with every group half right, so every row trains. The
plain and shared forms alternate, so load on a shared machine hits both alike; each reports
its median. The bound is the token count: sharing leaves out every prompt but one per group,
so at best it divides the time by (all real tokens) / (real tokens left), which overstates
what it can do where attention or the per-call overhead, not the token count, is the cost.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch
from ceilings import describe, machine
from skip_inert_rows import sampled_batch


def alternate(repeats: int, **runs) -> dict[str, float]:
    """Median seconds of each zero-argument callable, run in turn `repeats` times after one warm-up."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def prefill(policy, batch, group: int, share: bool) -> None:
    """The sampler's first forward: every row's prompt, or each distinct prompt once and its
    cache copied out to the group (as roles/rollout.py does)."""
    prompt_lengths = (batch.attention_mask.sum(1) - batch.response_mask.sum(1)).long()
    P = int(prompt_lengths.max())
    rows = range(0, batch.batch_size, group) if share else range(batch.batch_size)
    ids = torch.zeros(len(rows), P, dtype=torch.long)
    mask = torch.zeros(len(rows), P)
    for i, b in enumerate(rows):
        n = int(prompt_lengths[b])
        ids[i, P - n:], mask[i, P - n:] = batch.tokens[b, :n], 1.0
    with torch.no_grad():
        cache = policy.new_cache(len(rows), P + 1)
        policy.lm_head(policy.hidden_states(ids, attention_mask=mask, kv_cache=cache)[:, -1])
        if share:
            cache.batch_select_indices(torch.arange(len(rows)).repeat_interleave(group))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="gpt_mini,smollm2-135m", help="comma-separated: which setups to time")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "shared_prefix.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from posttrain.algorithms import make_algorithm
    from posttrain.config import ModelConfig
    from posttrain.models import make_policy
    from posttrain.models.logprobs import response_logp
    from posttrain.models.shared_prefix import prompt_groups, saved_fraction
    from posttrain.roles.trainer import Trainer

    m = machine()
    print(describe(m))
    # (model, prompts, group, new tokens, micro-batch): make run's shape, and issue #18's SmolLM2 shape
    setups = [("gpt_mini", 32, 8, 48, 0), ("smollm2-135m", 8, 8, 64, 8)]
    results = []
    chosen = args.models.split(",")
    for name, prompts, group, new_tokens, micro_batch in [s for s in setups if s[0] in chosen]:
        policy, tokenizer = make_policy(ModelConfig(name=name))
        batch = sampled_batch(policy, tokenizer, prompts, group, new_tokens)
        batch = dataclasses.replace(batch, rewards=torch.tensor([float(i % 2) for i in range(batch.batch_size)]))
        algo = make_algorithm("grpo", max_len=new_tokens)
        batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
        prompt_lengths = (batch.attention_mask.sum(1) - batch.response_mask.sum(1)).long()
        first_rows, _ = prompt_groups(batch.tokens, prompt_lengths, batch.group_ids)
        saved = saved_fraction(prompt_lengths, first_rows, int(batch.attention_mask.sum()))
        print(f"\n{name}: {prompts} prompts x {group} samples, <= {new_tokens} new tokens, mean prompt "
              f"{prompt_lengths.float().mean():.0f} tokens, {batch.tokens.shape[1]} columns, micro-batch "
              f"{micro_batch or 'all'}; sharing leaves out {saved:.0%} of the real tokens (bound {1 / (1 - saved):.2f}x)")
        plain_trainer = Trainer(policy, lr=1e-9, total_steps=100, micro_batch_size=micro_batch, share_prompt=False)
        shared_trainer = Trainer(policy, lr=1e-9, total_steps=100, micro_batch_size=micro_batch, share_prompt=True)
        timings = {
            "update": alternate(args.repeats, plain=lambda: plain_trainer.update(batch, algo),
                                shared=lambda: shared_trainer.update(batch, algo)),
            "reference": alternate(args.repeats, plain=lambda: response_logp(policy.eval(), batch, False),
                                   shared=lambda: response_logp(policy.eval(), batch, True)),
            "prefill": alternate(args.repeats, plain=lambda: prefill(policy, batch, group, False),
                                 shared=lambda: prefill(policy, batch, group, True)),
        }
        print(f"  {'':>10} {'plain':>8} {'shared':>8} {'speed-up':>9}")
        for part, t in timings.items():
            print(f"  {part:>10} {t['plain']:>7.2f}s {t['shared']:>7.2f}s {t['plain'] / t['shared']:>8.2f}x")
            results.append({"model": name, "part": part, "plain_seconds": t["plain"], "shared_seconds": t["shared"],
                            "speedup": t["plain"] / t["shared"], "saved_token_fraction": saved,
                            "bound": 1 / (1 - saved)})
    print("\nreproduce: cd benchmarks && ../.venv/bin/python shared_prefix.py")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": m, "args": vars(args), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
