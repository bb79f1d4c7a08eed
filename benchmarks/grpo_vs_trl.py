"""A GRPO step: posttrain vs TRL's GRPOTrainer, same model, prompts, group size,
completion length, learning rate, loss and threads; seconds per step, peak memory, and
the reward curve over the same steps (so speed is never bought by doing less).

    make bench-trl        (creates .venv-bench with TRL; TRL is never a posttrain dependency)
    .venv-bench/bin/python benchmarks/grpo_vs_trl.py [--steps 4] [--model DIR]

Each side runs in its own process, one after the other, so peak RSS is its own. Shape:
8 prompts × 8 completions × at most 64 new tokens, float32, no reference model (β = 0),
loss = mean over sequences of the per-token mean (TRL's loss_type="grpo").
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SYSTEM = "Add the numbers. End with the line: Final: <answer>"


def arithmetic_batches(steps: int, prompts: int):
    from posttrain.envs import make_env

    env = make_env("arithmetic", level=2, cot=False)
    return env, [env.sample("train", prompts, seed=step) for step in range(steps)]


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def run_posttrain(args) -> dict:
    import copy
    import dataclasses

    import torch

    from posttrain.algorithms import make_algorithm
    from posttrain.models.hf import HFPolicy
    from posttrain.roles.environment import score_episodes
    from posttrain.roles.rollout import RolloutEngine, SamplingParams
    from posttrain.roles.trainer import Trainer
    from posttrain.roles.weight_sync import InProcessWeightSync
    from posttrain.types import RolloutBatch

    torch.set_num_threads(args.threads)
    env, batches = arithmetic_batches(args.steps, args.prompts)
    policy, tokenizer = HFPolicy.load(args.model, system_prompt=SYSTEM)
    engine = RolloutEngine(copy.deepcopy(policy), tokenizer, SamplingParams(temperature=1.0, max_new_tokens=args.max_new))
    sync = InProcessWeightSync(policy, engine)
    algo = make_algorithm("grpo", max_len=args.max_new)
    trainer = Trainer(policy, lr=args.lr, total_steps=args.steps, grad_clip=1.0, micro_batch_size=args.micro_batch)
    steps = []
    for step, examples in enumerate(batches):
        start = time.perf_counter()
        episodes = score_episodes(env.score, engine.generate(examples, args.group, torch.Generator().manual_seed(step)))
        sampled = time.perf_counter()
        batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
        batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
        trainer.update(batch, algo.compute_loss)
        sync.push()
        end = time.perf_counter()
        steps.append({"seconds": end - start, "generate_seconds": sampled - start,
                      "reward": batch.rewards.mean().item(), "completion_tokens": batch.response_mask.sum().item()})
        print(f"posttrain step {step}: {steps[-1]}", file=sys.stderr, flush=True)
    return {"steps": steps, "peak_rss_gb": peak_rss_gb()}


def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.models.hf import convert_smollm2
    from posttrain.types import Example

    torch.set_num_threads(args.threads)
    env, batches = arithmetic_batches(args.steps, args.prompts)
    rows = [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": e.prompt}],
             "expected_answer": e.expected_answer} for examples in batches for e in examples]
    directory = convert_smollm2() if args.model == "smollm2-135m" else args.model
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)

    def reward(completions, expected_answer, **_):
        return [env.score(Example("", answer), c[0]["content"])["reward"] for c, answer in zip(completions, expected_answer)]

    steps = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            steps.append({"seconds": time.perf_counter() - self.start})

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "reward" in logs and steps:
                steps[-1]["reward"] = float(logs["reward"])
                print(f"trl step {len(steps) - 1}: {steps[-1]}", file=sys.stderr, flush=True)

    config = GRPOConfig(
        output_dir="/tmp/posttrain-bench-trl", use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=args.prompts * args.group // args.micro_batch,
        num_generations=args.group, max_completion_length=args.max_new, temperature=1.0, top_k=0, top_p=1.0,
        learning_rate=args.lr, lr_scheduler_type="constant", max_grad_norm=1.0, beta=0.0, loss_type="grpo",
        max_steps=args.steps, logging_steps=1, shuffle_dataset=False, dataloader_num_workers=0, seed=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[StepTimer()])
    trainer.train()
    return {"steps": steps, "peak_rss_gb": peak_rss_gb(),
            "settings": {"gradient_checkpointing": config.gradient_checkpointing}}


def summarise(name: str, result: dict) -> dict:
    times = [s["seconds"] for s in result["steps"]]
    later = times[1:] or times  # the first step pays for warm-up on both sides
    return {"side": name, "seconds_per_step": statistics.mean(later), "first_step_seconds": times[0],
            "rewards": [round(s.get("reward", float("nan")), 3) for s in result["steps"]],
            "peak_rss_gb": result["peak_rss_gb"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--side", choices=["posttrain", "trl"], help="(internal) run one side and print JSON")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "grpo_vs_trl.json"))
    args = parser.parse_args()
    if args.side:
        result = run_posttrain(args) if args.side == "posttrain" else run_trl(args)
        print(json.dumps(result))
        return

    from ceilings import describe, machine

    m = machine()
    print(describe(m))
    passthrough = [a for a in sys.argv[1:] if not a.startswith("--out")]
    summary = {"machine": m, "args": vars(args)}
    for side in ("posttrain", "trl"):
        done = subprocess.run([sys.executable, __file__, "--side", side, *passthrough], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the {side} side failed:\n{done.stderr[-4000:]}")
        summary[side] = summarise(side, json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(summary[side]), flush=True)
    ratio = summary["trl"]["seconds_per_step"] / summary["posttrain"]["seconds_per_step"]
    summary["speedup"] = ratio
    print(f"posttrain {summary['posttrain']['seconds_per_step']:.1f} s/step, TRL {summary['trl']['seconds_per_step']:.1f} "
          f"s/step: {ratio:.2f}x; peak RSS {summary['posttrain']['peak_rss_gb']:.1f} GB vs "
          f"{summary['trl']['peak_rss_gb']:.1f} GB")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
