"""Generation throughput: posttrain's sampler vs transformers' `generate`, same model, same
prompts, same number of new tokens, same threads, in one process; and each as a
fraction of the machine's roofline bound for that exact workload.

    python benchmarks/generation.py [--model smollm2-135m] [--threads 2] [--new-tokens 64]

Both sides sample at temperature 1 from the full distribution (generate's default top_k=50
is switched off) and generate exactly --new-tokens tokens per row (end-of-turn is ignored
on both sides), so they do the same arithmetic. A third line lets posttrain stop rows at
end-of-turn, as it does in RL, and counts only the tokens it keeps.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch

from ceilings import best_time, describe, machine, matmul_params
from posttrain.envs import make_env
from posttrain.models.hf import HFPolicy
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.engines.contract import encode_prompt
from posttrain.config import SamplingParams


def roofline_seconds(hf_config, n_matmul: int, rows: int, prompt_len: int, new_tokens: int,
                     flops: float, bandwidth: float) -> float:
    """Lower bound on the time to prefill `rows` prompts and decode `new_tokens` each:
    prefill is compute-bound; each decode step costs max(compute, reading every weight
    and the KV cache once)."""
    L, d_kv = hf_config.num_hidden_layers, hf_config.num_key_value_heads * hf_config.head_dim
    d_q = hf_config.num_attention_heads * hf_config.head_dim
    attention = lambda ctx: 4 * L * d_q * ctx  # QK^T and AV, per token, per row
    seconds = rows * prompt_len * (2 * n_matmul + attention(prompt_len / 2)) / flops
    for t in range(new_tokens):
        ctx = prompt_len + t
        step_flops = rows * (2 * n_matmul + attention(ctx))
        step_bytes = 4 * n_matmul + rows * ctx * L * 2 * d_kv * 4
        seconds += max(step_flops / flops, step_bytes / bandwidth)
    return seconds


class NeverStop:
    """The policy's tokenizer with an end-of-turn id no token has: every row runs to the
    length limit, as `generate` does with min_new_tokens = max_new_tokens."""

    def __init__(self, tokenizer):
        self.inner = tokenizer

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def eos_id(self):
        return -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", default="8,64", help="rows per call; 8 prompts × 8 samples = 64")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "generation.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    policy, tokenizer = HFPolicy.load(args.model, system_prompt="Add the numbers.")
    hf = policy.hf
    env = make_env("arithmetic", level=3, cot=True)
    m = machine()
    print(describe(m))
    n_matmul = matmul_params(hf)
    runs = []
    for rows in [int(b) for b in args.batches.split(",")]:
        samples = 8 if rows >= 8 else rows
        examples = env.fixed_set("dev", rows // samples, seed=0)
        params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
        fixed = RolloutEngine(copy.deepcopy(policy), NeverStop(tokenizer), params)
        natural = RolloutEngine(copy.deepcopy(policy), tokenizer, params)

        prompts = [encode_prompt(tokenizer, e.prompt) for e in examples for _ in range(samples)]
        P = max(map(len, prompts))
        input_ids = torch.full((rows, P), tokenizer.pad_id)
        mask = torch.zeros(rows, P, dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, P - len(p):], mask[i, P - len(p):] = torch.tensor(p), 1

        def hf_generate():
            with torch.no_grad():
                out = hf.generate(input_ids=input_ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=args.new_tokens,
                                  min_new_tokens=args.new_tokens, pad_token_id=tokenizer.pad_id)
            assert out.shape[1] == P + args.new_tokens

        generator = torch.Generator().manual_seed(0)
        kept = []

        def ours_natural():
            kept.append(sum(len(e.response_ids) for e in natural.generate(examples, samples, generator)))

        timings = {
            "generate": best_time(hf_generate, args.repeats),
            "posttrain": best_time(lambda: fixed.generate(examples, samples, generator), args.repeats),
            "posttrain_rl": best_time(ours_natural, args.repeats),
        }
        runs.append((rows, P, kept[-1], timings))
        print(f"batch {rows:3d}: generate {timings['generate']:.1f} s, posttrain {timings['posttrain']:.1f} s "
              f"for {rows * args.new_tokens} tokens", flush=True)

    m = machine(earlier=m)  # the ceilings again, after the work: the higher reading counts
    print(describe(m))
    rows_out = []
    for rows, P, kept_tokens, timings in runs:
        bound = roofline_seconds(hf.config, n_matmul, rows, P, args.new_tokens,
                                 m["matmul_gflops"] * 1e9, m["copy_gbps"] * 1e9)
        tokens = rows * args.new_tokens
        row = {"rows": rows, "prompt_tokens": P, "new_tokens": args.new_tokens,
               "generate_tok_s": tokens / timings["generate"], "posttrain_tok_s": tokens / timings["posttrain"],
               "roofline_tok_s": tokens / bound,
               "rl_kept_tokens": kept_tokens, "posttrain_rl_tok_s": kept_tokens / timings["posttrain_rl"],
               "posttrain_rl_seconds": timings["posttrain_rl"], "generate_seconds": timings["generate"]}
        row["ratio"] = row["posttrain_tok_s"] / row["generate_tok_s"]
        row["fraction_of_roofline"] = row["posttrain_tok_s"] / row["roofline_tok_s"]
        rows_out.append(row)
        print(f"batch {rows:3d}: generate {row['generate_tok_s']:6.1f} tok/s | posttrain {row['posttrain_tok_s']:6.1f} "
              f"tok/s ({row['ratio']:.2f}x, {row['fraction_of_roofline']:.0%} of the {row['roofline_tok_s']:.0f} "
              f"tok/s roofline) | RL-style early stop: {timings['posttrain_rl']:.1f} s for {kept_tokens} kept tokens "
              f"vs generate's {timings['generate']:.1f} s", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": m, "model": args.model, "rows": rows_out}, indent=2) + "\n")


if __name__ == "__main__":
    main()
