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

import torch

from posttrain.config.commands import StarConfig
from posttrain.config import SFTConfig, TrainConfig
from posttrain.envs import make_env
from posttrain.eval.evaluate import solved
from posttrain.pipelines.build import sampling_params
from posttrain.pipelines.run import evaluate_and_log, starting_policy
from posttrain.pipelines.sft import fine_tune
from posttrain.roles.environment import is_multi_turn, score_episodes
from posttrain.roles.engines import Engine, make_engine
from posttrain.roles.engines.contract import example_prompt_ids
from posttrain.runs.checkpoints import latest_checkpoint, load_checkpoint_weights
from posttrain.runs.console import console
from posttrain.runs.rundir import RunDir
from posttrain.seeds import derive_seed, generator_for
from posttrain.types import PROMPT_MESSAGES, Environment, Episode, Example
from posttrain.verifiers.steps import arithmetic_step_labels, problem_of
from posttrain.models.device import use_threads

# The hint a rationalisation prompt carries: one line after the question stating the final
# answer. For the arithmetic task, "Q: 7+5+9+3+1\n" becomes "Q: 7+5+9+3+1\nAnswer: 25\n";
# for a conversation prompt (an instruct model's chat) the line ends the last user turn.
# STaR put the answer in the few-shot prompt the same way; a model fine-tuned only on
# hint-free prompts may ignore it, which the iteration log shows as 0 rationalised.
HINT = "Answer: {answer}\n"


def with_answer_hint(example: Example) -> Example:
    """`example` with the line HINT after its prompt (and in its last user turn, for a conversation)."""
    hint = HINT.format(answer=example.expected_answer)
    meta = dict(example.meta)
    if meta.get(PROMPT_MESSAGES):
        turns = [dict(turn) for turn in meta[PROMPT_MESSAGES]]
        last_user = max(i for i, turn in enumerate(turns) if turn.get("role") == "user")
        turns[last_user]["content"] = turns[last_user]["content"].rstrip("\n") + "\n" + hint
        meta[PROMPT_MESSAGES] = turns
    prompt = example.prompt if example.prompt.endswith("\n") else example.prompt + "\n"
    return dataclasses.replace(example, prompt=prompt + hint, meta=meta)


def steps_all_correct(episode: Episode) -> bool:
    """Whether every step of an arithmetic chain checks (verifiers/steps.py: each running sum
    right and following the problem), not only its final answer."""
    steps, labels = arithmetic_step_labels(episode.example, episode.completion)
    return bool(steps) and all(labels)


def keep_verified(episodes: list[Episode], distinct: bool, step_check: bool = False) -> list[Episode]:
    """The episodes the verifier counts as solved and that ended on a stop token (a
    completion cut off by the budget would teach the model not to stop); with `distinct`,
    each completion text once per prompt, the first drawn; with `step_check`, only those
    whose every step checks too (`steps_all_correct`)."""
    kept, seen = [], set()
    for episode in episodes:
        key = (episode.example.id, episode.example.prompt, episode.completion)
        if (solved(episode) and episode.finished and not (distinct and key in seen)
                and (not step_check or steps_all_correct(episode))):
            kept.append(episode)
            seen.add(key)
    return kept


def verified_rationales(engine: Engine, env: Environment, examples: list[Example], samples_per_prompt: int,
                        generator: torch.Generator, rationalize: bool, distinct: bool,
                        step_check: bool = False) -> tuple[list[Episode], dict]:
    """One iteration's training set: (kept episodes, stats). Every kept episode was passed by
    `env.score` (and, with `step_check`, by the step checker); rationalised ones carry
    details["rationalized"] = True and the hint-free prompt's example and prompt_ids (the
    hint was only how they were found)."""
    episodes = score_episodes(env.score, engine.generate(examples, samples_per_prompt, generator))
    kept = keep_verified(episodes, distinct, step_check)
    solved_groups = {e.group_id for e in kept}  # a prompt whose only pass was cut off is rationalised too
    stats = {"samples": len(episodes), "tokens": sum(len(e.response_ids) for e in episodes), "kept": len(kept),
             "prompts_solved": len(solved_groups) / max(1, len(examples)),
             "sampled_pass_rate": sum(solved(e) for e in episodes) / max(1, len(episodes)),
             # passed by the verifier but dropped by the step checker: a right answer from a wrong chain
             "step_rejected": len(keep_verified(episodes, distinct)) - len(kept) if step_check else 0,
             "rationalization_samples": 0, "rationalized": 0}
    unsolved = [ex for i, ex in enumerate(examples) if i not in solved_groups]
    if rationalize and unsolved:
        hinted = engine.generate([with_answer_hint(ex) for ex in unsolved], samples_per_prompt, generator)
        for episode in hinted:  # scored against the original problem: the hint is not part of it
            episode.example = unsolved[episode.group_id]
        rescued = keep_verified(score_episodes(env.score, hinted), distinct, step_check)
        for episode in rescued:  # trained without the hint: the original prompt's tokens
            episode.prompt_ids = example_prompt_ids(engine.tokenizer, episode.example)
            episode.details = {**episode.details, "rationalized": True}
        kept += rescued
        stats.update(kept=len(kept), rationalization_samples=len(hinted), rationalized=len(rescued),
                     tokens=stats["tokens"] + sum(len(e.response_ids) for e in hinted))
    for episode in kept:  # SFT targets: the log-probs of the sampler play no part
        episode.response_logp = [0.0] * len(episode.response_ids)
    return kept, stats


def rationale_row(episode: Episode) -> dict:
    """One line of star_data_<i>.jsonl: what a resumed run trains on, token for token."""
    ex = episode.example
    return {"id": ex.id, "prompt": ex.prompt, "expected_answer": ex.expected_answer, "meta": ex.meta,
            "prompt_ids": episode.prompt_ids, "response_ids": episode.response_ids, "completion": episode.completion,
            "reward": episode.reward, "details": episode.details}


def rationale_episode(row: dict, group_id: int) -> Episode:
    example = Example(row["prompt"], row["expected_answer"], row["id"], row["meta"])
    return Episode(example=example, group_id=group_id, prompt_ids=row["prompt_ids"], response_ids=row["response_ids"],
                   response_logp=[0.0] * len(row["response_ids"]), completion=row["completion"],
                   reward=row["reward"], details=row["details"])


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
