"""A GRPO step: posttrain vs TRL's GRPOTrainer, same model, prompts, group size,
completion length, learning rate, optimizer (TRL's: AdamW β2 0.999, constant learning
rate), loss and threads; seconds per step, peak memory, and the reward curve over the
same steps (so speed is never bought by doing less).

    make bench            (creates .venv-bench with TRL; TRL is never a posttrain dependency)
    cd benchmarks && ../.venv-bench/bin/python grpo_vs_trl.py [--steps 6] [--model sft|smollm2-135m|DIR]

The default starting point, `--model sft`, is SmolLM2-135M-Instruct after docs/guides/real-models.md's
short SFT on the chain-of-thought arithmetic format (40 steps, run once by posttrain and
cached under results/): out of the box SmolLM2 never writes the `Final:` line, every
reward is 0 and the reward curves could not differ. Each side runs in its own process,
one after the other, so peak RSS is its own. Shape: 8 prompts × 8 completions × at most
64 new tokens, float32, no reference model (β = 0), loss = mean over sequences of the
per-token mean (TRL's loss_type="grpo").

Time to accuracy (`--eval-every E`): each side stops its clock every E steps (and before the
first) and scores its own current weights on the same held-out problems with one evaluator,
posttrain's greedy pass@1 (`--eval-size` problems), so the evaluation is the same code on
both sides and is never counted as training time. The summary gives, for the highest
pass@1 both sides reach, the training seconds each took to first reach it.

    ../.venv-bench/bin/python grpo_vs_trl.py --steps 60 --eval-every 10 --eval-size 200 --lr 1e-5
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

SFT_SYSTEM = "Add the numbers step by step. End with one line: Final: <sum>"


def sft_checkpoint(threads: int) -> str:
    """SmolLM2 after docs/guides/real-models.md's short SFT (level 3, chain of thought), made once."""
    out = Path(__file__).parent / "results" / "smollm2-sft"
    found = sorted(out.glob("*/checkpoints/sft/step_000039"))
    if found:
        return str(found[-1])
    print("making the SFT starting point once (about 8 minutes): posttrain train --rl.steps 0 ...", flush=True)
    subprocess.run([str(Path(sys.executable).parent / "posttrain"), "train", "--name", "bench-sft",
                    "--out_dir", str(out), "--model", "smollm2-135m", "--model.system_prompt", SFT_SYSTEM,
                    "--model.max_seq_len", "160", "--env.arithmetic.level", "3", "--env.cot", "true",
                    "--sft.num_examples", "200", "--sft.steps", "40", "--sft.batch_size", "8", "--sft.lr", "3e-5",
                    "--sft.warmup_steps", "4", "--rl.steps", "0", "--heldout_size", "50",
                    "--threads", str(threads)], check=True)
    return str(sorted(out.glob("*/checkpoints/sft/step_000039"))[-1])


def arithmetic_batches(args):
    from posttrain.envs import make_env

    env = make_env("arithmetic", level=args.level, cot=args.cot)
    return env, [env.sample("train", args.prompts, seed=step) for step in range(args.steps)]


def heldout_pass_at_1(hf_model, tokenizer, env, args) -> float:
    """Greedy pass@1 of `hf_model` (a transformers causal LM, either side's) on the held-out
    problems, by posttrain's evaluator: the same decoding and verifier for both sides."""
    import torch

    from posttrain.config import SamplingParams
    from posttrain.eval.evaluate import evaluate_pass_at_1
    from posttrain.models.hf import HFPolicy, HFTokenizer
    from posttrain.roles.engines import RolloutEngine

    was_training = hf_model.training
    with torch.no_grad():
        engine = RolloutEngine(HFPolicy(hf_model), HFTokenizer(tokenizer, system_prompt=args.system),
                               SamplingParams(temperature=0.0, max_new_tokens=args.max_new), shares_weights=True)
        examples = env.fixed_set("heldout", args.eval_size, seed=0)
        passed = evaluate_pass_at_1(engine, env, examples, batch_size=64)["pass@1"]
    hf_model.train(was_training)
    return passed


def useful_flops(batch, n_matmul_params: int) -> dict:
    """The FLOPs a GRPO step cannot avoid (issue #18's bound): sampling prefills each
    distinct prompt once and decodes every response token (2·N per token); the update runs
    forward and backward (6·N per token) over the rows with a gradient and each of their
    prompts once. N counts the matmul weights; attention's own FLOPs are left out (at ≤ 128
    tokens they are ~1% of SmolLM2's)."""
    import torch

    prompt_len = (batch.attention_mask - batch.response_mask).sum(dim=1)  # (B,)
    response_len = batch.response_mask.sum(dim=1)  # (B,)
    trained = (batch.rows_with_gradient if batch.rows_with_gradient is not None
               else torch.ones(batch.batch_size, dtype=torch.bool))
    first_of_group = {int(g): b for b, g in reversed(list(enumerate(batch.group_ids.tolist())))}
    prompts = sum(prompt_len[b].item() for b in first_of_group.values())
    trained_prompts = sum(prompt_len[b].item() for g, b in first_of_group.items()
                          if trained[batch.group_ids == g].any())
    return {"rollout": 2 * n_matmul_params * (prompts + response_len.sum().item()),
            "update": 6 * n_matmul_params * (trained_prompts + response_len[trained].sum().item())}


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def run_posttrain(args) -> dict:
    import dataclasses

    import torch

    from posttrain.algorithms import make_algorithm
    from posttrain.models.hf import HFPolicy
    from posttrain.roles.environment import score_episodes
    from posttrain.roles.engines import RolloutEngine
    from posttrain.config import SamplingParams
    from posttrain.roles.trainer import Trainer
    from posttrain.roles.weight_sync import SharedWeights
    from posttrain.types import RolloutBatch

    from ceilings import matmul_params

    torch.set_num_threads(args.threads)
    env, batches = arithmetic_batches(args)
    policy, tokenizer = HFPolicy.load(args.model, system_prompt=args.system)
    n_matmul = matmul_params(policy)
    # colocated, as `posttrain train` runs: the engine samples from the trainer's own weights
    engine = RolloutEngine(policy, tokenizer, SamplingParams(temperature=1.0, max_new_tokens=args.max_new),
                           shares_weights=True)
    sync = SharedWeights(policy, engine)
    algo = make_algorithm("grpo", max_len=args.max_new)
    # TRL's optimizer (transformers' defaults): AdamW β2 0.999, a constant learning rate; posttrain's own
    # defaults (β2 0.95, cosine decay to 0.1×) would make a 30-step time-to-accuracy race a race of schedules
    trainer = Trainer(policy, lr=args.lr, total_steps=args.steps, grad_clip=1.0, micro_batch_size=args.micro_batch,
                      adam_beta2=0.999, final_lr_fraction=1.0)
    steps, evals, trained_seconds = [], [], 0.0
    for step, examples in enumerate(batches):
        if args.eval_every and step % args.eval_every == 0:  # the clock is stopped: steps' seconds only
            evals.append({"step": step, "train_seconds": trained_seconds,
                          "pass@1": heldout_pass_at_1(policy.hf, tokenizer.hf, env, args)})
        start = time.perf_counter()
        episodes = score_episodes(env.score, engine.generate(examples, args.group, torch.Generator().manual_seed(step)))
        sampled = time.perf_counter()
        batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
        batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
        if not args.no_skip:  # as `posttrain train` does by default (rl.update.skip_inert_rows): the same update
            batch.rows_with_gradient = algo.rows_with_gradient(batch)
        trainer.update(batch, algo)
        sync.push()
        end = time.perf_counter()
        trained_seconds += end - start
        steps.append({"seconds": end - start, "generate_seconds": sampled - start,
                      "reward": batch.rewards.mean().item(), "completion_tokens": batch.response_mask.sum().item(),
                      "useful_flops": useful_flops(batch, n_matmul),
                      "trained_rows": (batch.batch_size if batch.rows_with_gradient is None
                                       else int(batch.rows_with_gradient.sum()))})
        print(f"posttrain step {step}: {steps[-1]}", file=sys.stderr, flush=True)
    if args.eval_every:
        evals.append({"step": len(batches), "train_seconds": trained_seconds,
                      "pass@1": heldout_pass_at_1(policy.hf, tokenizer.hf, env, args)})
    return {"steps": steps, "evals": evals, "peak_rss_gb": peak_rss_gb()}


def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.models.smollm2 import convert_smollm2
    from posttrain.types import Example

    torch.set_num_threads(args.threads)
    env, batches = arithmetic_batches(args)
    rows = [{"prompt": [{"role": "system", "content": args.system}, {"role": "user", "content": e.prompt}],
             "expected_answer": e.expected_answer} for examples in batches for e in examples]
    directory = convert_smollm2() if args.model == "smollm2-135m" else args.model
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)

    def reward(completions, expected_answer, **_):
        return [env.score(Example("", answer), c[0]["content"])["reward"] for c, answer in zip(completions, expected_answer)]

    steps, evals = [], []

    def evaluate(hf_model, step: int) -> None:
        evals.append({"step": step, "train_seconds": sum(s["seconds"] for s in steps),
                      "pass@1": heldout_pass_at_1(hf_model, tokenizer, env, args)})

    class StepTimer(TrainerCallback):
        def on_train_begin(self, _args, _state, _control, model=None, **k):
            if args.eval_every:
                evaluate(model, 0)

        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, _args, state, _control, model=None, **k):
            steps.append({"seconds": time.perf_counter() - self.start})  # before the evaluation: not timed
            if args.eval_every and (state.global_step % args.eval_every == 0 or state.global_step == args.steps):
                evaluate(model, state.global_step)

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
    return {"steps": steps, "evals": evals, "peak_rss_gb": peak_rss_gb(),
            "settings": {"gradient_checkpointing": config.gradient_checkpointing}}


def summarise(name: str, result: dict) -> dict:
    times = [s["seconds"] for s in result["steps"]]
    later = times[1:] or times  # the first step pays for warm-up on both sides
    rewards = [s.get("reward", float("nan")) for s in result["steps"]]
    return {"side": name, "seconds_per_step": statistics.mean(later), "first_step_seconds": times[0],
            "rewards": [round(r, 3) for r in rewards], "reward_mean": statistics.mean(rewards),
            # per-step means of 64 samples each: their spread is the sampling noise of one step
            "reward_sem": statistics.stdev(rewards) / len(rewards) ** 0.5 if len(rewards) > 1 else float("nan"),
            "peak_rss_gb": result["peak_rss_gb"], "evals": result.get("evals", []),
            # posttrain only: rows the update trained, of 64 (the rest had no gradient and were left out)
            **({"trained_rows": [s["trained_rows"] for s in result["steps"]]} if "trained_rows" in result["steps"][0]
               else {}),
            **({"useful_gflop_per_step": statistics.mean(sum(s["useful_flops"].values()) for s in result["steps"][1:]
                                                          or result["steps"]) / 1e9}
               if "useful_flops" in result["steps"][0] else {})}


def time_to_accuracy(ours: list[dict], theirs: list[dict]) -> dict | None:
    """For the highest held-out pass@1 both sides reach at an evaluation point, the training
    seconds each took to first reach it, and their ratio (TRL's over posttrain's). None when
    either side never rises above its start (a level reached at step 0 costs nothing and
    says nothing about speed)."""
    def first_reaching(evals, level):
        return next(e for e in evals if e["pass@1"] >= level)

    start = max(ours[0]["pass@1"], theirs[0]["pass@1"])
    level = min(max(e["pass@1"] for e in ours), max(e["pass@1"] for e in theirs))
    if level <= start:
        return None
    a, b = first_reaching(ours, level), first_reaching(theirs, level)
    return {"level": level, "posttrain_seconds": a["train_seconds"], "posttrain_step": a["step"],
            "trl_seconds": b["train_seconds"], "trl_step": b["step"], "ratio": b["train_seconds"] / a["train_seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--side", choices=["posttrain", "trl"], help="(internal) run one side and print JSON")
    parser.add_argument("--model", default="sft", help="sft (SmolLM2 after a short SFT, made once), "
                        "smollm2-135m (untrained: every reward is 0), or a local directory")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--no-skip", action="store_true",
                        help="train every row, as before rows with no gradient were left out (rl.update.skip_inert_rows false)")
    parser.add_argument("--level", type=int, default=3, help="arithmetic level (match the SFT checkpoint's)")
    parser.add_argument("--cot", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--system", default=SFT_SYSTEM,
                        help="system prompt, the same on both sides (match the SFT checkpoint's)")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=0,
                        help="time to accuracy: score held-out pass@1 every E steps (clock stopped); 0 = off")
    parser.add_argument("--eval-size", type=int, default=200, help="held-out problems per evaluation")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "grpo_vs_trl.json"))
    parser.add_argument("--reuse-trl", default="", metavar="JSON",
                        help="take TRL's side from an earlier --out file of the same settings instead of running it "
                             "again (TRL's side does not depend on posttrain's code)")
    args = parser.parse_args()
    if args.side:
        result = run_posttrain(args) if args.side == "posttrain" else run_trl(args)
        print(json.dumps(result))
        return

    from ceilings import describe, machine

    m = machine()
    print(describe(m))
    if args.model == "sft":
        args.model = sft_checkpoint(args.threads)
    passthrough = [f"--{name.replace('_', '-')}={value}" for name, value in vars(args).items()
                   if name not in ("side", "out", "cot", "no_skip")] + ["--cot" if args.cot else "--no-cot"]
    passthrough += ["--no-skip"] if args.no_skip else []
    summary = {"machine": m, "args": vars(args)}
    if args.reuse_trl:
        earlier = json.loads(Path(args.reuse_trl).read_text())
        ignored = {"out", "reuse_trl", "no_skip"}
        differ = {k: (v, earlier["args"].get(k)) for k, v in vars(args).items()
                  if k not in ignored and earlier["args"].get(k) != v}
        if differ:
            raise SystemExit(f"--reuse-trl {args.reuse_trl} was measured with other settings (now, then): {differ}")
        summary["trl"] = earlier["trl"]
        summary["trl_measured_on"] = earlier["machine"]
    for side in ("posttrain", "trl"):
        if side in summary:
            continue
        # each side's per-step lines go to stderr as they happen (a long comparison shows progress); its JSON to stdout
        done = subprocess.run([sys.executable, __file__, "--side", side, *passthrough], stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the {side} side failed (its error is printed above)")
        summary[side] = summarise(side, json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(summary[side]), flush=True)
    ratio = summary["trl"]["seconds_per_step"] / summary["posttrain"]["seconds_per_step"]
    summary["speedup"] = ratio
    ours, theirs = summary["posttrain"], summary["trl"]
    difference = ours["reward_mean"] - theirs["reward_mean"]
    noise = (ours["reward_sem"] ** 2 + theirs["reward_sem"] ** 2) ** 0.5
    summary["reward_difference"] = {"mean": difference, "standard_error": noise}
    print(f"mean reward over the {args.steps} steps: posttrain {ours['reward_mean']:.3f}, TRL {theirs['reward_mean']:.3f}; "
          f"difference {difference:+.3f} ± {noise:.3f} (one standard error: "
          f"{'within' if abs(difference) <= 2 * noise else 'outside'} 2 standard errors)")
    m = summary["machine"] = machine(m)  # the higher reading: a low one only means something else ran
    bound = ours["useful_gflop_per_step"] / m["matmul_gflops"]
    summary["useful_flop_bound_seconds"] = bound
    print(f"useful-FLOP bound: {ours['useful_gflop_per_step']:.0f} GFLOP a step (each prompt once, rows with a "
          f"gradient only) at {m['matmul_gflops']:.0f} GFLOP/s = {bound:.1f} s; posttrain at "
          f"{bound / ours['seconds_per_step']:.0%} of it, TRL at {bound / theirs['seconds_per_step']:.0%}")
    print(f"posttrain {summary['posttrain']['seconds_per_step']:.1f} s/step, TRL {summary['trl']['seconds_per_step']:.1f} "
          f"s/step: {ratio:.2f}x; peak RSS {summary['posttrain']['peak_rss_gb']:.1f} GB vs "
          f"{summary['trl']['peak_rss_gb']:.1f} GB")
    if args.eval_every:
        for side in ("posttrain", "trl"):
            print(f"{side} held-out pass@1 by step: " + ", ".join(
                f"{e['step']}: {e['pass@1']:.1%} ({e['train_seconds']:.0f} s)" for e in summary[side]["evals"]))
        reached = summary["time_to_accuracy"] = time_to_accuracy(ours["evals"], theirs["evals"])
        print("time to accuracy: neither side rose above its start" if reached is None else
              f"time to {reached['level']:.1%} held-out pass@1: posttrain {reached['posttrain_seconds']:.0f} s "
              f"(step {reached['posttrain_step']}), TRL {reached['trl_seconds']:.0f} s (step {reached['trl_step']}): "
              f"{reached['ratio']:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
