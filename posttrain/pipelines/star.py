"""`posttrain star`: expert iteration (STaR / rejection-sampling fine-tuning) from one checkpoint.

Each iteration, as in Zelikman et al. 2022, "STaR: Bootstrapping Reasoning With Reasoning"
(Algorithm 1), and Yuan et al. 2023, "Scaling Relationship on Learning Mathematical
Reasoning with LLMs" (RFT):

    1. sample K completions for each of P fresh training prompts from the current policy
       (the RL rollout engine, the RL sampling settings)
    2. keep the completions the verifier passes (reward 1), each distinct one once per prompt;
       with star.step_check, only those whose every step checks too (verifiers/steps.py)
    3. rationalise (optional): for each prompt with no passing sample, sample K more with the
       answer given as a hint in the prompt (`with_answer_hint`), and keep the passing ones,
       stored under the ORIGINAL prompt: the model is trained to produce the rationale
       without the hint it was found with
    4. fine-tune on the kept (prompt, rationale) pairs with the SFT loss (pipelines/sft.py),
       either from the starting checkpoint (star.restart true, STaR's choice) or from the
       current policy (false: RFT / ReST-style continued training)
    5. held-out pass@1 (greedy, bootstrap CI)

There is no reward model, no advantage and no KL: the verifier acts as a filter, and SFT on
the survivors is the update. Against GRPO at the same number of sampled completions this
asks whether RL's gain is "more verified data" or something only the policy gradient gives.

Resuming: each iteration's kept rationales are saved (star_data_<i>.jsonl) before training
on them, each iteration's fine-tuning is a checkpointed stage (`star<i>`) and each finished
iteration is a line of star_iterations.json, so calling `star` again on a killed run
directory redoes only what was not finished.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from posttrain.config.commands import StarConfig
from posttrain.config import SFTConfig, TrainConfig
from posttrain.envs import make_env
from posttrain.pipelines.build import sampling_params
from posttrain.pipelines.run import evaluate_and_log, starting_policy
from posttrain.pipelines.sft import fine_tune
# the verified samples themselves, shared with R1's distillation stage (pipelines/distill.py); HINT and
# with_answer_hint are named here too, as the rationalisation step of this module's docstring
from posttrain.pipelines.verified_samples import (HINT, rationale_episode, rationale_row, verified_rationales,
                                                  with_answer_hint)
from posttrain.roles.environment import is_multi_turn
from posttrain.roles.engines import make_engine
from posttrain.runs.checkpoints import latest_checkpoint, load_checkpoint_weights
from posttrain.runs.console import console
from posttrain.runs.rundir import RunDir
from posttrain.seeds import derive_seed, generator_for
from posttrain.types import Environment
from posttrain.verifiers.steps import problem_of
from posttrain.models.device import use_threads

def fine_tune_settings(star: StarConfig) -> SFTConfig:
    """The SFT settings of one iteration's fine-tuning."""
    return SFTConfig(steps=star.steps, batch_size=star.batch_size, lr=star.lr, warmup_steps=star.warmup_steps,
                     weight_decay=0.0)


def check_star(cfg: TrainConfig, star: StarConfig, env: Environment | None = None) -> None:
    """What the task must allow before a run directory is made: single-turn episodes, and
    with star.step_check, arithmetic chains the step checker can read."""
    env = make_env(cfg.env.name, **cfg.env.kwargs()) if env is None else env
    if is_multi_turn(env):
        raise ValueError(f"env.name={cfg.env.name!r} is a multi-turn environment; star samples single completions "
                         "(train on it with `posttrain train`)")
    probe = env.fixed_set("heldout", 1, seed=0)[0]
    if star.step_check and problem_of(probe) is None:
        raise ValueError(f"--star.step_check true checks arithmetic running sums, and env.name={cfg.env.name!r} "
                         f"is not an arithmetic task (its prompt: {probe.prompt!r}); set it to false")


def run_star(cfg: TrainConfig, star: StarConfig, run: RunDir, env: Environment | None = None) -> dict:
    """The iterations; returns {"start": held-out CI, "iterations": [one record each]} (star_iterations.json)."""
    use_threads(cfg.threads)
    env = make_env(cfg.env.name, **cfg.env.kwargs()) if env is None else env
    run.write_json("star.json", dataclasses.asdict(star))
    check_star(cfg, star, env)
    heldout = env.fixed_set("heldout", cfg.heldout_size, seed=0)
    policy, tokenizer, start = starting_policy(cfg, run, env)
    eval_params = dataclasses.replace(sampling_params(cfg), temperature=0.0)
    log = run.read_json("star_iterations.json") or {"start": None, "iterations": []}
    if log["start"] is None:
        log["start"] = evaluate_and_log(run, "start", policy, tokenizer, env, heldout, eval_params, "at the start")
        run.write_json("star_iterations.json", log)
    engine = make_engine(policy, tokenizer, sampling_params(cfg), shares_weights=True)

    for i in range(star.iterations):
        stage = f"star{i}"
        if i < len(log["iterations"]):  # finished before a kill: its result is on disk, its weights next
            policy.load_state_dict(load_checkpoint_weights(latest_checkpoint(run, stage), policy.config).state_dict())
            continue
        started = time.perf_counter()
        data_file = f"star_data_{i}.jsonl"
        stats = (run.read_json("star_data_stats.json") or {}).get(str(i))
        if stats is None or not (run.path / data_file).exists():  # sampled by the policy as iteration i starts
            examples = env.sample("train", star.prompts, seed=derive_seed(cfg.seed, "star-prompts", i))
            kept, stats = verified_rationales(engine, env, examples, star.samples_per_prompt,
                                              generator_for(cfg.seed, "star-sample", i), star.rationalize,
                                              star.distinct, star.step_check)
            run.write_jsonl(data_file, [rationale_row(e) for e in kept])  # the exact data this iteration trains on
            run.write_json("star_data_stats.json", {**(run.read_json("star_data_stats.json") or {}), str(i): stats})
        kept = [rationale_episode(row, g) for g, row in enumerate(run.read_jsonl(data_file))]
        if not kept:
            raise ValueError(f"iteration {i}: none of {stats['samples']} samples passed the verifier, so there is "
                             "nothing to fine-tune on; start from a stronger checkpoint (--init), raise "
                             "--star.samples_per_prompt or --star.prompts, or set --star.rationalize true")
        if star.restart and i > 0 and latest_checkpoint(run, stage) is None:  # STaR: every iteration from the start
            policy.load_state_dict(load_checkpoint_weights(Path(start), policy.config).state_dict())
        fine_tune(run, stage, kept, tokenizer, policy, fine_tune_settings(star), derive_seed(cfg.seed, "star", i),
                  cfg.checkpoint_every)
        engine.weight_version += 1  # the shared module changed: an int8 copy would be stale
        ci = evaluate_and_log(run, stage, policy, tokenizer, env, heldout, eval_params, f"after iteration {i}")
        record = {"iteration": i, **stats, "heldout": ci, "seconds": time.perf_counter() - started}
        console.print(f"iteration {i}: {stats['samples']} samples ({stats['tokens']} tokens), kept {stats['kept']}, "
                      f"rationalised {stats['rationalized']} of {stats['rationalization_samples']} hinted samples")
        log["iterations"].append(record)
        run.write_json("star_iterations.json", log)
    write_star_summary(run, log, cfg, star)
    return log


def write_star_summary(run: RunDir, log: dict, cfg: TrainConfig, star: StarConfig) -> None:
    def pct(ci: dict) -> str:
        return f"{100 * ci['mean']:.1f}% [{100 * ci['ci_low']:.1f}, {100 * ci['ci_high']:.1f}]"

    how = "from the starting checkpoint (STaR)" if star.restart else "continuing from the last iteration (RFT)"
    lines = [f"# {run.path.name}", "",
             f"STaR / rejection-sampling fine-tuning, spec `{run.read_json('meta.json')['spec_version']}`, seed "
             f"{cfg.seed}: {star.iterations} iterations × {star.prompts} prompts × {star.samples_per_prompt} "
             f"samples, rationalisation {'on' if star.rationalize else 'off'}, each iteration fine-tuned {how} for "
             f"{star.steps} steps at lr {star.lr:g}.", "",
             "| iteration | samples | tokens sampled | kept | rationalised | held-out pass@1 (95% CI) |",
             "|---|---|---|---|---|---|",
             f"| start | 0 | 0 | | | {pct(log['start'])} |"]
    samples = tokens = 0
    for r in log["iterations"]:
        samples += r["samples"] + r["rationalization_samples"]
        tokens += r["tokens"]
        lines.append(f"| {r['iteration']} | {samples} | {tokens} | {r['kept']} | {r['rationalized']} | "
                     f"{pct(r['heldout'])} |")
    lines += ["", "samples and tokens are cumulative and count rationalisation samples; kept counts this "
                  "iteration's verified completions (rationalised ones included)."]
    (run.path / "summary.md").write_text("\n".join(lines) + "\n")
