"""Controller: the loop that makes the other five roles take turns.

One RL step, in the order a paper's pseudocode gives it (see `rl_step`):

    1. sample    the rollout engine draws K completions per prompt, capturing old_logp
    2. score     the environment's verifier turns each completion into a reward
    3. reference the frozen reference model scores the same tokens (only if the loss uses KL)
    4. advantage the algorithm turns rewards into per-token advantages
    5. update    the trainer minimises the algorithm's loss
    6. sync      the fresh weights are copied into the rollout engine
    7. log       metrics, samples, and now and then a checkpoint

The whole job (`run_pipeline`) is: SFT from scratch → held-out eval → RL → held-out eval.
Every random draw of step s is seeded from (seed, stage, s), never from a global stream,
so a run resumed from a checkpoint makes exactly the draws an uninterrupted run makes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch

from posttrain.algorithms.core import kl_k3, masked_mean, zero_variance_group_fraction
from posttrain.config import TrainConfig, to_dict
from posttrain.envs import make_env
from posttrain.eval.evaluate import evaluate_pass_at_1
from posttrain.eval.monitors import check_all
from posttrain.eval.report import RUN_MONITORS, write_plots, write_summary
from posttrain.eval.rundir import RunDir
from posttrain.models import is_pretrained, load_checkpoint_model, load_tokenizer, make_policy, save_checkpoint_model
from posttrain.models.value_head import ValueHead
from posttrain.rewards import AdaptiveKLController
from posttrain.roles.environment import score_episodes
from posttrain.roles.reference import make_reference
from posttrain.roles.rollout import RolloutEngine, SamplingParams, encode_prompt
from posttrain.roles.trainer import Trainer, sft_loss
from posttrain.distributed.backend import RolloutRequest, make_rollout
from posttrain.distributed.data_parallel import make_trainer
from posttrain.types import Episode, RolloutBatch

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console()


def derive_seed(seed: int, *parts: object) -> int:
    """A seed for one purpose at one step, independent of everything that ran before."""
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def generator_for(seed: int, *parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, *parts))


# ---------------------------------------------------------------------------------------
# checkpoints: checkpoints/<stage>/step_<N>/ holds the model (a transformers-loadable
# directory) and trainer_state.pt; checkpoints/<stage>/latest names the newest complete one
# ---------------------------------------------------------------------------------------


def save_checkpoint(run: RunDir, stage: str, step: int, model, tokenizer, trainer: Trainer | None = None,
                    extra: dict | None = None, keep_last: int = 2) -> Path:
    stage_dir = run.checkpoints / stage
    final = stage_dir / f"step_{step:06d}"
    tmp = stage_dir / f".step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint_model(model, tokenizer, tmp)
    if trainer is not None:
        torch.save({"trainer": trainer.state_dict(), "step": step, **(extra or {})}, tmp / "trainer_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (stage_dir / ".latest.tmp").write_text(final.name)
    (stage_dir / ".latest.tmp").replace(stage_dir / "latest")
    for old in sorted(stage_dir.glob("step_*"))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run: RunDir, stage: str) -> Path | None:
    pointer = run.checkpoints / stage / "latest"
    if not pointer.exists():
        return None
    path = run.checkpoints / stage / pointer.read_text().strip()
    return path if path.is_dir() else None


# ---------------------------------------------------------------------------------------
# the shared step loop: resume, progress bar, metrics, checkpoints
# ---------------------------------------------------------------------------------------


def run_stage(
    run: RunDir,
    stage: str,
    steps: int,
    step_fn: Callable[[int], dict[str, float]],
    model,
    tokenizer,
    trainer: Trainer,
    checkpoint_every: int,
    on_resume: Callable[[dict], None] = lambda state: None,
    extra_state: Callable[[], dict] = lambda: {},
    show: Callable[[dict], str] = lambda m: "",
) -> None:
    """Run steps [start, steps) of a stage, where start follows the last checkpoint."""
    start = 0
    checkpoint = latest_checkpoint(run, stage)
    if checkpoint is not None:
        model.load_state_dict(load_checkpoint_model(checkpoint, model.config).state_dict())
        state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
        trainer.load_state_dict(state["trainer"])
        on_resume(state)
        start = state["step"] + 1
        console.print(f"[yellow]resuming {stage} from {checkpoint} (step {start} of {steps})")
    for name in ("metrics.jsonl", "samples.jsonl"):
        run.truncate_jsonl(name, lambda row: row.get("stage") != stage or row.get("step", -1) < start)
    if start >= steps:
        return

    columns = [TextColumn(f"[bold]{stage}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(stage, total=steps, completed=start, info="")
        for step in range(start, steps):
            metrics = step_fn(step)
            run.append_jsonl("metrics.jsonl", [{"stage": stage, "step": step, **metrics}])
            if (step + 1) % checkpoint_every == 0 or step == steps - 1:
                save_checkpoint(run, stage, step, model, tokenizer, trainer, extra_state())
            progress.update(task, advance=1, info=show(metrics))


# ---------------------------------------------------------------------------------------
# stage 1: supervised fine-tuning on the environment's worked solutions
# ---------------------------------------------------------------------------------------


def demonstration_episodes(env, tokenizer, examples) -> list[Episode]:
    """Each demonstration as an Episode whose response is the reference solution + EOS."""
    episodes = []
    for i, example in enumerate(examples):
        response = tokenizer.encode(env.solution(example)) + [tokenizer.eos_id]
        episodes.append(Episode(example=example, group_id=i, prompt_ids=encode_prompt(tokenizer, example.prompt),
                                response_ids=response, response_logp=[0.0] * len(response)))
    return episodes


def sft_stage(cfg: TrainConfig, run: RunDir, env, tokenizer, policy) -> None:
    demos = demonstration_episodes(env, tokenizer, env.fixed_set("train", cfg.sft.num_examples, seed=cfg.seed))
    trainer = Trainer(policy, lr=cfg.sft.lr, total_steps=cfg.sft.steps, warmup_steps=cfg.sft.warmup_steps,
                      weight_decay=cfg.sft.weight_decay, grad_clip=1.0)

    def step_fn(step: int) -> dict[str, float]:
        rows = torch.randint(len(demos), (cfg.sft.batch_size,), generator=generator_for(cfg.seed, "sft", step))
        batch = RolloutBatch.collate([demos[i] for i in rows.tolist()], tokenizer.pad_id)
        return trainer.update(batch, sft_loss)

    run_stage(run, "sft", cfg.sft.steps, step_fn, policy, tokenizer, trainer, cfg.checkpoint_every,
              show=lambda m: f"loss {m['loss']:.3f}")


# ---------------------------------------------------------------------------------------
# stage 2: reinforcement learning against the verifier
# ---------------------------------------------------------------------------------------


def sampling_params(cfg: TrainConfig) -> SamplingParams:
    s = cfg.rl.sampling
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens,
                          stop_at_newline=not cfg.env.cot, compile=s.compile)


def rl_stage(cfg: TrainConfig, run: RunDir, env, tokenizer, policy, reference_weights: Path) -> None:
    algo = cfg.rl.make_algorithm()

    def rollout_request(step: int, round: int) -> RolloutRequest:
        tag = (step,) if round == 0 else (step, round)  # round 0 draws what a plain step draws
        examples = env.sample("train", cfg.rl.prompts_per_step, seed=derive_seed(cfg.seed, "rl-prompts", *tag))
        return RolloutRequest(examples, cfg.rl.samples_per_prompt, derive_seed(cfg.seed, "rl-sample", *tag))

    # the rollout role and its weight sync: in this process, or Ray workers (posttrain/distributed/)
    rollout = make_rollout(cfg.dist, policy, tokenizer, sampling_params(cfg), rollout_request, horizon=cfg.rl.steps)
    engine = rollout.engine  # the local engine dev-set evaluation samples from
    use_reference = algo.uses_reference or cfg.rl.track_kl
    reference = make_reference(policy, reference_weights) if use_reference else None
    critic = ValueHead(policy.config.dim) if algo.uses_critic else None
    # one process, or rank 0 of --dist.trainer_ranks data-parallel processes (distributed/data_parallel.py)
    trainer = make_trainer(cfg.dist.trainer_ranks, policy, lr=cfg.rl.lr, total_steps=cfg.rl.steps,
                           warmup_steps=cfg.rl.warmup_steps, weight_decay=cfg.rl.weight_decay,
                           grad_clip=cfg.rl.grad_clip, micro_batch_size=cfg.rl.micro_batch_size, critic=critic)
    if cfg.rl.micro_batch_size == 0 and is_pretrained(cfg.model):
        rows = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
        console.print(f"[yellow]rl.micro_batch_size 0: all {rows} rows go through one forward and backward pass, "
                      "and a real model's activations for that take many GB (SmolLM2-135M, 64 rows of ~110 "
                      "tokens: a run was killed for memory at 11.7 GB). With --rl.micro_batch_size 8 a "
                      "whole SmolLM2 GRPO step peaked at 3.4 GB; with a per-sequence loss (GRPO's) the "
                      "update is the same")
    dev = env.fixed_set("dev", cfg.rl.eval_size, seed=0)
    # an algorithm that drops uninformative groups (DAPO's dynamic sampling) offers filter_batch
    filter_batch = getattr(algo, "filter_batch", None)
    reward = cfg.rl.make_reward(env.score)
    kl_controller = AdaptiveKLController(algo.kl_coef, cfg.rl.kl_target, cfg.rl.kl_horizon) if cfg.rl.kl_target else None

    timings: dict[str, float] = defaultdict(float)  # wall time per role, reset every step

    @contextmanager
    def timed(role: str):
        start = time.perf_counter()
        yield
        timings[f"time/{role}"] += time.perf_counter() - start

    def sample_and_score(step: int, round: int) -> list[Episode]:
        with timed("rollout"):  # 1. sample
            episodes = rollout.sample(step, round)
        with timed("score"):  # 2. score
            return score_episodes(reward, episodes)

    def collate(episodes: list[Episode]) -> RolloutBatch:
        return RolloutBatch.collate(episodes, tokenizer.pad_id, temperature=engine.params.temperature or 1.0)

    def informative_episodes(step: int) -> tuple[list[Episode], dict[str, float]]:
        """Sample rounds of fresh prompts, keeping whole groups that pass filter_batch,
        until prompts_per_step groups are kept or the rounds run out."""
        kept: list[Episode] = []
        sampled_groups, sampled_rewards = 0, []
        for round in range(cfg.rl.max_sampling_rounds):
            episodes = sample_and_score(step, round)
            sampled_rewards += [e.reward for e in episodes]
            for e in episodes:  # group ids unique across rounds
                e.group_id += round * cfg.rl.prompts_per_step
            sampled_groups += cfg.rl.prompts_per_step
            kept += filter_batch(collate(episodes)).episodes
            if len({e.group_id for e in kept}) >= cfg.rl.prompts_per_step:
                break
        groups = sorted({e.group_id for e in kept})[: cfg.rl.prompts_per_step]
        kept = [e for e in kept if e.group_id in set(groups)]
        # reward_mean describes the kept (hard) groups only; this one is comparable across algorithms
        stats = {"sampling_rounds": round + 1, "kept_group_fraction": len(groups) / sampled_groups,
                 "reward_sampled_mean": sum(sampled_rewards) / len(sampled_rewards)}
        # nothing informative at all: train on the last round, whose advantages are all 0
        return (kept or episodes), stats

    history = [r for r in run.read_jsonl("metrics.jsonl") if r.get("stage") == "rl"]  # for the live monitors

    def rl_step(step: int) -> dict[str, float]:
        timings.clear()
        step_start = time.perf_counter()
        if filter_batch is None:  # 1. sample and 2. score
            episodes, sampling_stats = sample_and_score(step, 0), {}
        else:
            episodes, sampling_stats = informative_episodes(step)
        batch = collate(episodes)
        with timed("reference"):  # 3. reference (and the critic's values at sampling time)
            if reference is not None:
                batch.ref_logp = reference.logp(batch)
            if critic is not None:
                batch.values = trainer.values(batch)
        with timed("train"):
            batch = dataclasses.replace(batch, **algo.compute_advantages(batch))  # 4. advantage
            batch, off_policy = rollout.off_policy_correction(batch, trainer)  # async: stale episodes, TIS
            metrics = trainer.update(batch, algo.compute_loss, cfg.rl.epochs, cfg.rl.minibatches,  # 5. update
                                     generator_for(cfg.seed, "rl-minibatch", step))
        with timed("sync"):
            rollout.push()  # 6. sync
        metrics.update(**rollout_metrics(batch), **sampling_stats, **off_policy, **rollout.step_metrics(), **timings,
                       weight_version=rollout.version)
        metrics["pass_rate"] = sum(e.details.get("reason") == "ok" for e in episodes) / len(episodes)
        if kl_controller is not None:  # steer β for the next step from this step's KL
            metrics["kl_coef"] = algo.kl_coef
            algo.kl_coef = kl_controller.update(metrics["kl_ref"], 1)
        if (step + 1) % cfg.rl.eval_every == 0 or step == cfg.rl.steps - 1:
            metrics["dev_pass@1"] = evaluate_pass_at_1(engine, env, dev)["pass@1"]
        run.append_jsonl("samples.jsonl", [sample_row("rl", step, e) for e in episodes])  # 7. log
        metrics["time/step"] = time.perf_counter() - step_start  # wall time; roles can overlap (async)
        warn_as_it_happens(history, {"step": step, **metrics})
        return metrics

    def extra_state() -> dict:
        # an algorithm with state between steps (REINFORCE's running-mean baseline) saves it too
        # the async rollout saves its batches sampled ahead (waiting for those in flight)
        state = {"weight_version": rollout.version, "rollout": rollout.state_dict()}
        if hasattr(algo, "state_dict"):
            state["algorithm"] = algo.state_dict()
        if kl_controller is not None:
            state["kl_controller"] = kl_controller.state_dict()
        return state

    def on_resume(state: dict) -> None:
        rollout.push(version=state["weight_version"])  # the engine must sample from the restored weights
        rollout.load_state_dict(state.get("rollout", {}))  # {}: a checkpoint from before rollouts had state
        if "algorithm" in state:
            algo.load_state_dict(state["algorithm"])
        if kl_controller is not None:
            kl_controller.load_state_dict(state["kl_controller"])
            algo.kl_coef = kl_controller.value

    try:
        run_stage(run, "rl", cfg.rl.steps, rl_step, policy, tokenizer, trainer, cfg.checkpoint_every,
                  on_resume=on_resume, extra_state=extra_state,
                  show=lambda m: f"reward {m['reward_mean']:.2f}  len {m['response_length']:.0f}"
                                 + (f"  dev {m['dev_pass@1']:.2f}" if "dev_pass@1" in m else ""))
    finally:
        rollout.close()  # stops the Ray workers (and the local cluster, if this run started it)
        trainer.close()  # stops the data-parallel trainer ranks, if any


# ---------------------------------------------------------------------------------------
# stage 2 (alternative): offline preference optimisation (DPO and its family)
# ---------------------------------------------------------------------------------------


def verifier_pairs(cfg: TrainConfig, env, tokenizer, policy, round: int = 0, n_prompts: int = 0,
                   split: str = "train", score: Callable | None = None) -> tuple[list, dict[str, float]]:
    """Preference pairs from the policy's own samples: n_prompts prompts of `split` ×
    rl.samples_per_prompt completions at rl.sampling.temperature, scored by the verifier;
    within a prompt every distinct correct completion is paired with every distinct
    incorrect one (ties give no pair). Returns (pairs, stats about where they came from).
    Round r of online DPO draws its own prompts and samples; round 0 of the train split
    draws what an offline run draws.

    `score` ranks the samples instead of the verifier: a reward model's ProxyReward (the
    training reward with rl.rm.path). Its scores are continuous, so each prompt gives one
    pair, its best sample against its worst, and the stats add the verifier's mean on the
    samples (`sampled_gold_mean`): whether the reward model's favourites are right."""
    from posttrain.preference_data import group_by_prompt, pairs_from_verifier

    n_prompts = n_prompts or cfg.rl.pair_prompts
    tag = () if (round, split) == (0, "train") else (split, round)
    engine = RolloutEngine(policy, tokenizer, sampling_params(cfg), shares_weights=True)
    examples = env.sample(split, n_prompts, seed=derive_seed(cfg.seed, "pair-prompts", *tag))
    episodes = engine.generate(examples, cfg.rl.samples_per_prompt, generator_for(cfg.seed, "pair-sample", *tag))
    groups = group_by_prompt(score_episodes(score or env.score, episodes))
    pairs = pairs_from_verifier(groups, best_vs_worst=score is not None)
    # the numbers that explain a pair count: a near-deterministic policy repeats itself
    # (few distinct completions), and a prompt it always or never solves gives no pair
    stats = {"pairs": len(pairs), "pair_prompts": len(groups),
             "prompts_with_pairs": len({p.prompt for p in pairs}) / max(1, len(groups)),
             "distinct_completions": sum(len({e.completion for e in g}) for g in groups.values()) / max(1, len(groups)),
             "sampled_reward_mean": sum(e.reward for e in episodes) / max(1, len(episodes))}
    if score is not None:
        stats["sampled_gold_mean"] = sum(e.details["gold_reward"] for e in episodes) / max(1, len(episodes))
    return pairs, stats


def split_evenly(total: int, parts: int) -> list[int]:
    """[7, 7, 6] for (20, 3): sizes that sum to total, the first ones larger by at most one."""
    return [total // parts + (i < total % parts) for i in range(parts)]


# passes over a round's pairs past which the stage warns: on arithmetic, online DPO + NLL
# went from beating offline by 3.6–5.2 points at ~5 passes to losing by 8 at ~10 (one seed
# of two), and offline fell 3–6 points
MAX_PASSES_WITHOUT_WARNING = 8


def preference_stage(cfg: TrainConfig, run: RunDir, env, tokenizer, policy, reference_weights: Path) -> None:
    """Train on preference pairs with one loss of the DPO family.

    Offline (rl.online_rounds = 1): one set of pairs, from the file rl.pairs or built by the
    verifier from the starting policy's samples, and rl.steps steps on it.
    Online / iterative (rl.online_rounds = N > 1): the same budget — rl.pair_prompts sampled
    prompts and rl.steps gradient steps in all — split into N rounds; each round samples
    the *current* policy, lets the verifier (or, with rl.rm.path, a reward model) build
    pairs, and trains on those. Pairs then
    come from the distribution being trained (on-policy) instead of only the start's. The
    reference stays the starting policy, and one optimizer runs through all rounds, so the
    only difference from offline is where the data comes from; with rl.refresh_reference,
    each round's reference is instead the policy as that round starts (iterative DPO).

    With model.lora_r > 0 only LoRA adapters train, and the reference is the policy with
    its adapters off (no second copy of the weights), as in the RL stage.

    The stage checkpoints every checkpoint_every steps and at the end of every round, with
    the optimizer state, and saves every round's pairs before training on them, so a run
    killed anywhere in the stage resumes where it stopped and logs what an uninterrupted
    run logs."""
    from posttrain.algorithms.preference import evaluate_preference, train_preference
    from posttrain.preference_data import load_preference_jsonl, save_preference_jsonl

    rounds = cfg.rl.online_rounds
    round_steps, round_prompts = split_evenly(cfg.rl.steps, rounds), split_evenly(cfg.rl.pair_prompts, rounds)
    # what ranks the training pairs: the verifier, or a reward model (rl.rm.path); the
    # held-out pairs stay the verifier's, so their accuracy is measured against the truth
    rank_by = cfg.rl.make_reward(env.score) if cfg.rl.rm.path else None
    if cfg.model.lora_r and not getattr(policy.config, "lora_r", 0):
        policy.add_lora(cfg.model.lora_r, cfg.model.lora_alpha)  # train adapters only
    reference = make_reference(policy, reference_weights)  # the starting policy (LoRA: the adapters off)
    reference_model = reference.model  # the module the losses read log π_ref from
    # AdamW without decay, constant lr: a short fine-tune that should not pull toward 0
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.rl.lr, weight_decay=0.0)
    start = 0
    checkpoint = latest_checkpoint(run, "pref")
    if checkpoint is not None:
        if not (checkpoint / "trainer_state.pt").exists():
            return  # a finished stage from before per-step checkpoints
        policy.load_state_dict(load_checkpoint_model(checkpoint, policy.config).state_dict())
        state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
        optimizer.load_state_dict(state["trainer"])
        start = state["step"] + 1
        if start < cfg.rl.steps:
            console.print(f"[yellow]resuming pref from {checkpoint} (step {start} of {cfg.rl.steps})")
    run.truncate_jsonl("metrics.jsonl", lambda row: row.get("stage") != "pref" or row.get("step", -1) < start)
    if start >= cfg.rl.steps:
        return

    def pairs_for_round(r: int) -> tuple[list, dict]:
        """Round r's pairs, from its file when a killed run already built them (the policy
        that built them is gone: it was trained on)."""
        name = "pairs.jsonl" if rounds == 1 else f"pairs_round{r}.jsonl"
        stats = (run.read_json("pref_rounds.json") or {}).get(str(r))
        if (run.path / name).exists() and stats is not None:
            return load_preference_jsonl(run.path / name), stats
        if cfg.rl.pairs:
            pairs = load_preference_jsonl(cfg.rl.pairs)
            stats = {"pairs": len(pairs)}
        else:
            pairs, stats = verifier_pairs(cfg, env, tokenizer, policy, r, round_prompts[r], score=rank_by)
            if not pairs and r == 0:
                raise ValueError(f"no preference pairs: on all {cfg.rl.pair_prompts} prompts the starting policy's "
                                 f"{cfg.rl.samples_per_prompt} samples were all right or all wrong; raise "
                                 "rl.pair_prompts, rl.samples_per_prompt or rl.sampling.temperature, or pass "
                                 "rl.pairs FILE")
            if not pairs:  # the policy now solves (or fails) every prompt it drew: keep the last data
                console.print(f"[yellow]round {r}: no pairs; training on round {r - 1}'s pairs again")
                pairs, _ = pairs_for_round(r - 1)
                stats = {**stats, "reused_round": r - 1}
        save_preference_jsonl(pairs, run.path / name)  # the exact data this round saw
        run.write_json("pref_rounds.json", {**(run.read_json("pref_rounds.json") or {}), str(r): stats})
        return pairs, stats

    # held-out pairs: the starting policy's samples on dev prompts, never trained on; the
    # loss's implicit-reward accuracy on them says whether the preference generalises
    if not (run.path / "pairs_dev.jsonl").exists():  # built before any step, so `policy` is the start
        dev_pairs, _ = verifier_pairs(cfg, env, tokenizer, policy, 0, cfg.rl.eval_size, split="dev")
        save_preference_jsonl(dev_pairs, run.path / "pairs_dev.jsonl")
    dev_pairs = load_preference_jsonl(run.path / "pairs_dev.jsonl") if (run.path / "pairs_dev.jsonl").stat().st_size else []
    dev = env.fixed_set("dev", cfg.rl.eval_size, seed=0)
    params = dataclasses.replace(sampling_params(cfg), temperature=1.0)

    def evaluate(step: int) -> dict[str, float]:
        engine = RolloutEngine(policy, tokenizer, params, shares_weights=True)
        metrics = {"dev_pass@1": evaluate_pass_at_1(engine, env, dev)["pass@1"]}
        # KL(π ‖ π_ref), length and reward on the policy's own samples (T = 1), as the RL stage logs them
        episodes = score_episodes(env.score, engine.generate(dev[:64], 1, generator_for(cfg.seed, "pref-kl", step)))
        batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
        batch.ref_logp = reference.logp(batch)
        metrics.update({k: v for k, v in rollout_metrics(batch).items() if k != "zero_variance_groups"})
        if dev_pairs:
            held_out = evaluate_preference(policy, dev_pairs, cfg.rl.algo, cfg.rl.algo_params, tokenizer,
                                           reference_model)
            metrics.update({f"dev_pref_{k}": v for k, v in held_out.items()})
        policy.train()
        return metrics

    with Progress(TextColumn("[bold]pref"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("pref", total=cfg.rl.steps, completed=start)
        first = 0
        for r, n_steps in enumerate(round_steps):
            if first + n_steps <= start:  # a round finished before the kill
                first += n_steps
                continue
            pairs, stats = pairs_for_round(r)
            if r == 0 and start == 0:
                console.print(f"preference data: {len(pairs)} {'pairs' if cfg.rl.pairs else 'verifier-built pairs'}")
            # how many times the round trains on each of its pairs; past a few, the loss fits
            # these pairs instead of the preference (docs/algorithms/dpo.md, "Online against offline")
            batch_pairs = min(cfg.rl.prompts_per_step, len(pairs))  # train_preference's batch: all when fewer
            passes = n_steps * batch_pairs / len(pairs)
            if passes > MAX_PASSES_WITHOUT_WARNING:
                console.print(f"[yellow]round {r}: {n_steps} steps × {batch_pairs} pairs "
                              f"over {len(pairs)} pairs trains on each pair {passes:.0f} times; preference losses "
                              "overfit that: raise rl.pair_prompts (more pairs) or lower rl.steps")

            clock = [time.perf_counter()]

            def on_step(local: int, metrics: dict, first: int = first, n_steps: int = n_steps) -> None:
                step = first + local
                row = {"stage": "pref", "step": step, **metrics, "time/train": time.perf_counter() - clock[0]}
                if local == 0:
                    row.update({"round": r, **{f"round_{k}": v for k, v in stats.items()}, "round_passes": passes})
                if (step + 1) % cfg.rl.eval_every == 0 or step == cfg.rl.steps - 1:
                    started = time.perf_counter()
                    row.update(evaluate(step), **{"time/eval": time.perf_counter() - started})
                run.append_jsonl("metrics.jsonl", [row])
                if (step + 1) % cfg.checkpoint_every == 0 or local == n_steps - 1:
                    # the optimizer stands in for a Trainer: its state_dict() is what a resume needs
                    save_checkpoint(run, "pref", step, policy, tokenizer, optimizer)
                progress.update(task, advance=1)
                clock[0] = time.perf_counter()

            round_reference = reference_model
            if cfg.rl.refresh_reference and r > 0:
                # iterative DPO: π_ref is the policy as this round starts; saved, so that a run
                # killed mid-round resumes against the same reference
                saved = latest_checkpoint(run, "pref_reference")
                if saved is None or saved.name != f"step_{first:06d}":
                    saved = save_checkpoint(run, "pref_reference", first, policy, tokenizer, keep_last=1)
                round_reference = load_checkpoint_model(saved, policy.config).eval().requires_grad_(False)
            seed = derive_seed(cfg.seed, "pref") if r == 0 else derive_seed(cfg.seed, "pref", r)
            train_preference(policy, pairs, cfg.rl.algo, steps=n_steps, lr=cfg.rl.lr,
                             batch_size=cfg.rl.prompts_per_step, loss_params=cfg.rl.algo_params, tokenizer=tokenizer,
                             reference=round_reference, max_grad_norm=cfg.rl.grad_clip or float("inf"), seed=seed,
                             on_step=on_step, optimizer=optimizer, start_step=max(0, start - first))
            first += n_steps


def warn_as_it_happens(history: list[dict], row: dict) -> None:
    """Print a monitor's alert on the step it first fires (summary.md lists them all again)."""
    history[:] = [r for r in history if r["step"] < row["step"]] + [row]
    for alert in check_all(history, RUN_MONITORS):
        if alert["step"] == row["step"]:
            console.print(f"[bold red]warning[/] step {alert['step']}: {alert['message']}")


def rollout_metrics(batch: RolloutBatch) -> dict[str, float]:
    lengths = batch.response_lengths()
    kl = {}
    if batch.ref_logp is not None:
        # KL(π_old ‖ π_ref) estimated on the sampled tokens with k3 (unbiased, never negative)
        kl["kl_ref"] = masked_mean(kl_k3(batch.old_logp, batch.ref_logp), batch.response_mask).item()
    return {
        **kl,
        "reward_mean": batch.rewards.mean().item(),
        "reward_std": batch.rewards.std().item() if batch.batch_size > 1 else 0.0,
        "zero_variance_groups": zero_variance_group_fraction(batch.rewards, batch.group_ids),
        "response_length": lengths.mean().item(),
        "truncated_fraction": sum(not e.finished for e in batch.episodes) / batch.batch_size,
    }


def sample_row(stage: str, step: int, episode: Episode) -> dict:
    return {"stage": stage, "step": step, "id": episode.example.id, "group": episode.group_id,
            "prompt": episode.example.prompt, "completion": episode.completion, "reward": episode.reward,
            "details": episode.details, "weight_version": episode.weight_version}


# ---------------------------------------------------------------------------------------
# the whole job
# ---------------------------------------------------------------------------------------


def start_run(cfg: TrainConfig, command: str) -> RunDir:
    run = RunDir.create(cfg.out_dir, cfg.name or f"{cfg.env.name}-{cfg.rl.algo}")
    run.write_json("config.json", to_dict(cfg))
    env = make_env(cfg.env.name, **cfg.env.kwargs())
    run.write_meta({
        "loop": "C (train)",
        "entry_point": command,
        "seed": cfg.seed,
        "spec_version": env.spec_version,
        "dataset": {"env": cfg.env.name, "level": cfg.env.level, "split_rule": getattr(env, "split_rule", ""),
                    "heldout_size": cfg.eval_size},
        "sampling": {"train": dataclasses.asdict(cfg.rl.sampling), "eval": {"temperature": 0.0, "decoding": "greedy"}},
    })
    return run


def run_pipeline(cfg: TrainConfig, run: RunDir) -> dict:
    """SFT → held-out eval → RL → held-out eval → summary. Safe to call again on a
    partly finished run directory: finished pieces are skipped, the rest resumes."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    env = make_env(cfg.env.name, **cfg.env.kwargs())
    heldout = env.fixed_set("heldout", cfg.eval_size, seed=0)
    console.print(f"[bold]run[/] {run.path}  model={cfg.model.name}  spec={env.spec_version}  algo={cfg.rl.algo}")

    if cfg.init:
        policy, tokenizer = load_checkpoint_model(Path(cfg.init), cfg.model), load_tokenizer(Path(cfg.init), cfg.model)
        start_weights = Path(cfg.init)
    else:
        torch.manual_seed(derive_seed(cfg.seed, "init"))
        policy, tokenizer = make_policy(cfg.model)  # gpt_mini from scratch, or a pretrained model
        sft_stage(cfg, run, env, tokenizer, policy)
        # RL starts from (and the reference is) the SFT result; with sft.steps=0, the random init
        start_weights = latest_checkpoint(run, "sft") or save_checkpoint(run, "init", 0, policy, tokenizer)
        policy.load_state_dict(load_checkpoint_model(start_weights, policy.config).state_dict())

    results = run.read_json("summary.json") or {}
    eval_params = dataclasses.replace(sampling_params(cfg), temperature=0.0)
    if "sft" not in results:
        results["sft"] = evaluate_and_log(run, "sft", policy, tokenizer, env, heldout, eval_params)
        run.write_json("summary.json", results)

    stage = "pref" if cfg.rl.is_preference else "rl"
    if stage == "pref":
        preference_stage(cfg, run, env, tokenizer, policy, start_weights)
        trained = latest_checkpoint(run, "pref")  # none with rl.steps = 0: the policy is the start
        if trained is not None:
            policy.load_state_dict(load_checkpoint_model(trained, policy.config).state_dict())
    else:
        if cfg.model.lora_r:  # train adapters only; the reference is the policy with them off
            policy.add_lora(cfg.model.lora_r, cfg.model.lora_alpha)
        rl_stage(cfg, run, env, tokenizer, policy, start_weights)
    if stage not in results:
        results[stage] = evaluate_and_log(run, stage, policy, tokenizer, env, heldout, eval_params)
    results["final_stage"] = stage
    write_summary(run, results, cfg, env.spec_version)
    write_plots(run, stage)
    return run.read_json("summary.json")


def evaluate_and_log(run: RunDir, stage: str, policy, tokenizer, env, examples, params: SamplingParams) -> dict:
    engine = RolloutEngine(policy, tokenizer, params, shares_weights=True)
    result = evaluate_pass_at_1(engine, env, examples)
    run.write_jsonl(f"eval_{stage}.jsonl", [sample_row(f"eval_{stage}", 0, e) for e in result["episodes"]])
    ci = result["ci"]
    console.print(f"[bold]held-out pass@1 after {stage}[/]: {ci['mean']:.3f} "
                  f"(95% CI {ci['ci_low']:.3f}–{ci['ci_high']:.3f}, n={ci['n']})")
    return ci
