"""The torch engine against the vllm engine (--rl.sampling.engine), sampling side by side.

    .venv-vllm/bin/python benchmarks/vllm_sampling.py gpt_mini 4
    .venv-vllm/bin/python benchmarks/vllm_sampling.py smollm2 3
    .venv-vllm/bin/python benchmarks/vllm_sampling.py sync 3

Needs vllm: run it with .venv-vllm's Python (`make vllm-test` creates it). One process, one
policy, both engines built on it; each repeat samples the same 8 prompts × 8 completions
(up to 48 tokens, temperature 1, stopping at EOS) with the torch engine, then with vllm, so
the load of other jobs on a shared machine falls on both alike; one warm-up call each first.
One torch thread (vLLM's own default on the CPU), as other jobs here run. gpt_mini is the
default shape, untrained (random weights: its speed is representative, its answers are not);
SmolLM2-135M-Instruct is the converted one (models/smollm2.py). Prints each repeat, the
medians, and the largest |log π_vllm − log π_trainer| over every token vllm drew, the
trainer's from its own float32 forward: what the update's mismatch correction sees.

`sync`: what a weight sync into the vllm engine costs for SmolLM2-135M, every weight trained
against LoRA rank 16 (adapter-only: the base goes once, at the engine's first load), each
after a small change to a trained weight: `vllm/load_weights_seconds` and `_mb`.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from posttrain.config import SamplingParams
from posttrain.models import CharTokenizer, GPTMini, GPTMiniConfig
from posttrain.roles.engines import make_engine
from posttrain.types import Example

PROMPTS, SAMPLES, NEW_TOKENS = 8, 8, 48


def load(name: str):
    if name == "gpt_mini":
        tokenizer = CharTokenizer()
        return GPTMini(GPTMiniConfig(vocab_size=tokenizer.vocab_size)).eval(), tokenizer  # dim 128, 4 layers
    from posttrain.models.hf import HFPolicy

    policy, tokenizer = HFPolicy.load("smollm2-135m")
    return policy.eval(), tokenizer


@torch.no_grad()
def largest_gap(policy, episodes) -> float:
    gaps = []
    for e in episodes:
        logits = policy(torch.tensor([e.prompt_ids + e.response_ids]))[0, len(e.prompt_ids) - 1 : -1].float()
        trainer = torch.log_softmax(logits, -1).gather(-1, torch.tensor(e.response_ids)[:, None]).squeeze(-1)
        gaps.append((trainer - torch.tensor(e.response_logp)).abs().max().item())
    return max(gaps)


def main(name: str, repeats: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    policy, tokenizer = load(name)
    examples = [Example(id=str(i), prompt=f"{i}+{2 * i + 1}=", expected_answer="") for i in range(PROMPTS)]
    engines = {engine: make_engine(policy, tokenizer, SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS,
                                                                     engine=engine), shares_weights=True)
               for engine in ("torch", "vllm")}
    for engine in engines.values():  # warm-up: vLLM's first call builds its kernels
        engine.generate(examples[:2], 2, torch.Generator().manual_seed(99))
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, list[int]] = {name: [] for name in engines}
    gap = 0.0
    for r in range(repeats):
        for engine_name, engine in engines.items():
            start = time.perf_counter()
            episodes = engine.generate(examples, SAMPLES, torch.Generator().manual_seed(r))
            seconds[engine_name].append(time.perf_counter() - start)
            tokens[engine_name].append(sum(len(e.response_ids) for e in episodes))
            if engine_name == "vllm":
                gap = max(gap, largest_gap(policy, episodes))
        print(r, {n: round(s[-1], 2) for n, s in seconds.items()}, {n: t[-1] for n, t in tokens.items()}, flush=True)
    for engine_name in engines:
        print(engine_name, "median s", round(statistics.median(seconds[engine_name]), 2), "tokens/s",
              round(statistics.median(t / s for t, s in zip(tokens[engine_name], seconds[engine_name])), 1))
    print("max |logp_vllm - logp_trainer|", gap)


def sync_cost(repeats: int) -> None:
    from posttrain.models.hf import HFPolicy

    torch.set_num_threads(1)
    for rank in (0, 16):
        policy, tokenizer = HFPolicy.load("smollm2-135m")
        if rank:
            policy.add_lora(rank)
        engine = make_engine(policy, tokenizer, SamplingParams(max_new_tokens=8, engine="vllm"))
        print(f"lora_r {rank} first load", engine.metrics(), flush=True)
        trained = next(p for p in policy.parameters() if p.requires_grad)  # an update moves a trained weight
        for r in range(repeats):
            with torch.no_grad():
                trained.add_(torch.randn_like(trained) * 1e-3)
            engine.load_weights(policy.state_dict())
            print(f"lora_r {rank} sync {r}", engine.metrics(), flush=True)
        del engine


if __name__ == "__main__":
    what, repeats = (sys.argv[1] if len(sys.argv) > 1 else "gpt_mini"), int(sys.argv[2]) if len(sys.argv) > 2 else 3
    if what == "sync":
        sync_cost(repeats)
    else:
        main(what, repeats)
