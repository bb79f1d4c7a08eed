"""Stage 2 (alternative): preference optimisation (DPO and its family), offline on a pairs
file or on pairs built from the starting policy's samples, or online in rounds of fresh
pairs from the current policy."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

import torch

from posttrain.algorithms.core import masked_mean
from posttrain.algorithms.preference import make_preference_loss
from posttrain.config import TrainConfig
from posttrain.data.preference import load_preference_data, load_preference_jsonl, save_preference_jsonl
from posttrain.data.preference_rows import group_by_prompt, pair_gaps, pairs_from_verifier, preference_episodes
from posttrain.eval.evaluate import evaluate_pass_at_1
from posttrain.eval.ranker_agreement import ranker_agreement
from posttrain.models import load_checkpoint_model
from posttrain.models.device import model_device, place
from posttrain.pipelines.alerts import AlertPolicy
from posttrain.pipelines.build import pair_ranker, sampling_params, trainer_settings
from posttrain.pipelines.preference_train import (
    batch_indices,
    cache_reference_logps,
    evaluate_preference,
    preference_batch,
)
from posttrain.roles.controller import rollout_metrics
from posttrain.roles.environment import score_episodes
from posttrain.roles.reference import make_reference
from posttrain.roles.rollout import RolloutEngine
from posttrain.roles.trainer import Trainer
from posttrain.runs.checkpoints import latest_checkpoint, save_checkpoint
from posttrain.runs.console import console
from posttrain.runs.rundir import RunDir
from posttrain.runs.stage import run_stage
from posttrain.seeds import derive_seed, generator_for
from posttrain.types import RolloutBatch


def verifier_pairs(cfg: TrainConfig, env, tokenizer, policy, round: int = 0, n_prompts: int = 0,
                   split: str = "train", score: Callable | None = None) -> tuple[list, dict[str, float]]:
    """Preference pairs from the policy's own samples: n_prompts prompts of `split` ×
    rl.samples_per_prompt completions at rl.sampling.temperature, scored by the verifier;
    within a prompt every distinct correct completion is paired with every distinct
    incorrect one (ties give no pair). Returns (pairs, stats about where they came from).
    Round r of online DPO draws its own prompts and samples; round 0 of the train split
    draws what an offline run draws.

    `score` ranks the samples instead of the verifier: a reward model's ProxyReward (the
    training reward with rl.rm.path) or the policy judging itself (rl.preference.self_reward). Its
    scores are continuous, so each prompt gives one pair, its best sample against its worst
    (equal scores: none), and the stats add the verifier's mean on the samples
    (`sampled_gold_mean`: whether the ranker's favourites are right) and how the ranker
    agrees with the verifier on them (eval/ranker_agreement.py: AUROC, pair agreement, CIs)."""

    n_prompts = n_prompts or cfg.rl.preference.pair_prompts
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
        stats.update(ranker_agreement(groups, pairs, seed=derive_seed(cfg.seed, "ranker-agreement", *tag)))
    return pairs, stats


def split_evenly(total: int, parts: int) -> list[int]:
    """[7, 7, 6] for (20, 3): sizes that sum to total, the first ones larger by at most one."""
    return [total // parts + (i < total % parts) for i in range(parts)]


# passes over a round's pairs past which the stage warns: on arithmetic, online DPO + NLL
# went from beating offline by 3.6–5.2 points at ~5 passes to losing by 8 at ~10 (one seed
# of two), and offline fell 3–6 points
MAX_PASSES_WITHOUT_WARNING = 8


def preference_stage(cfg: TrainConfig, run: RunDir, env, tokenizer, policy, reference_weights: Path,
                     stage: str = "pref") -> None:
    """Train on preference pairs with one loss of the DPO family, through the same Trainer,
    step loop and checkpoints as the RL stage.

    Offline (rl.preference.online_rounds = 1): one set of pairs, from the file rl.preference.pairs or built by the
    verifier from the starting policy's samples, and rl.steps steps on it.
    Online / iterative (rl.preference.online_rounds = N > 1): the same budget — rl.preference.pair_prompts sampled
    prompts and rl.steps gradient steps in all — split into N rounds; each round samples
    the *current* policy, lets the verifier (or, with rl.rm.path, a reward model) build
    pairs, and trains on those. Pairs then come from the distribution being trained
    (on-policy) instead of only the start's. The reference stays the starting policy, and
    one trainer (optimizer and learning-rate schedule) runs through all rounds, so the only
    difference from offline is where the data comes from; with rl.preference.refresh_reference, each
    round's reference is instead the policy as that round starts (iterative DPO).

    With model.lora_r > 0 only LoRA adapters train, and the reference is the policy with
    its adapters off (no second copy of the weights), as in the RL stage.

    The stage checkpoints every checkpoint_every steps and at the end of every round, and
    saves every round's pairs before training on them, so a run killed anywhere in the
    stage resumes where it stopped and logs what an uninterrupted run logs.

    `stage` names its checkpoints and metrics rows; a stage of a --stages run, named after
    its loss ("dpo"), also prefixes its pair files ("dpo_pairs.jsonl", "dpo_rounds.json")."""
    files = "" if stage == "pref" else f"{stage}_"  # `posttrain train`'s names stay as they were
    rounds_file = f"{stage}_rounds.json"
    rounds = cfg.rl.preference.online_rounds
    round_steps = split_evenly(cfg.rl.steps, rounds)
    round_prompts = split_evenly(cfg.rl.preference.pair_prompts, rounds)
    round_start = [sum(round_steps[:r]) for r in range(rounds)]  # the stage step each round starts at
    if cfg.model.lora_r and not getattr(policy.config, "lora_r", 0):
        policy.add_lora(cfg.model.lora_r, cfg.model.lora_alpha, base=reference_weights)  # train adapters only
    # what ranks the training pairs: the verifier, a reward model (rl.rm.path), or the policy
    # judging its own samples (rl.preference.self_reward); the held-out pairs stay the verifier's, so their
    # accuracy is measured against the truth
    rank_by = pair_ranker(cfg.rl, env.score, policy, tokenizer)
    # the starting policy (LoRA: the adapters off)
    reference = make_reference(policy, reference_weights, cfg.rl.update.share_prompt)
    loss = make_preference_loss(cfg.rl.algo, **cfg.rl.algo_params)
    trainer = Trainer(policy, **trainer_settings(cfg.rl))

    def pairs_for_round(r: int) -> tuple[list, dict]:
        """Round r's pairs, from its file when a killed run already built them (the policy
        that built them is gone: it was trained on)."""
        name = files + ("pairs.jsonl" if rounds == 1 else f"pairs_round{r}.jsonl")
        stats = (run.read_json(rounds_file) or {}).get(str(r))
        if (run.path / name).exists() and stats is not None:
            return load_preference_jsonl(run.path / name), stats
        if cfg.rl.preference.pairs:
            pairs = load_preference_data(cfg.rl.preference.pairs, cfg.rl.preference.pairs_columns)
            stats = {"pairs": len(pairs)}
        else:
            pairs, stats = verifier_pairs(cfg, env, tokenizer, policy, r, round_prompts[r], score=rank_by)
            if not pairs and r == 0:
                raise ValueError(f"no preference pairs: on all {cfg.rl.preference.pair_prompts} prompts the starting "
                                 f"policy's {cfg.rl.samples_per_prompt} samples were all right or all wrong; raise "
                                 "rl.preference.pair_prompts, rl.samples_per_prompt or rl.sampling.temperature, or pass "
                                 "rl.preference.pairs FILE")
            if not pairs:  # the policy now solves (or fails) every prompt it drew: keep the last data
                console.print(f"[yellow]round {r}: no pairs; training on round {r - 1}'s pairs again")
                pairs, _ = pairs_for_round(r - 1)
                stats = {**stats, "reused_round": r - 1}
        save_preference_jsonl(pairs, run.path / name)  # the exact data this round saw
        run.write_json(rounds_file, {**(run.read_json(rounds_file) or {}), str(r): stats})
        return pairs, stats

    def round_reference(r: int) -> torch.nn.Module:
        """The module π_ref is read from in round r: the starting policy, or with
        rl.preference.refresh_reference the policy as round r starts, saved so that a run killed
        mid-round resumes against the same reference."""
        if not (cfg.rl.preference.refresh_reference and r > 0):
            return reference.model
        saved = latest_checkpoint(run, f"{stage}_reference")
        if saved is None or saved.name != f"step_{round_start[r]:06d}":
            saved = save_checkpoint(run, f"{stage}_reference", round_start[r], policy, tokenizer, keep_last=1)
        reference_now = place(load_checkpoint_model(saved, policy.config), model_device(policy), policy.compute_dtype)
        return reference_now.eval().requires_grad_(False)

    current: dict = {}  # the round being trained: its number, rows (with π_ref's log-probs) and stats

    def start_round(r: int, step: int) -> None:
        pairs, stats = pairs_for_round(r)
        if r == 0 and step == 0:
            kind = "pairs" if cfg.rl.preference.pairs else "verifier-built pairs"
            console.print(f"preference data: {len(pairs)} {kind}")
        rows = preference_episodes(pairs, tokenizer, policy.config.max_seq_len)
        if loss.gap_weighting != "none":
            pair_gaps(rows)  # every pair scored, or the record without scores named before the round trains
        if loss.uses_reference:
            cache_reference_logps(round_reference(r), rows, tokenizer.pad_id)
        # how many times the round trains on each of its pairs; past a few, the loss fits
        # these pairs instead of the preference (docs/algorithms/dpo.md, "Online against offline")
        passes = round_steps[r] * min(cfg.rl.prompts_per_step, len(rows)) / len(rows)
        if passes > MAX_PASSES_WITHOUT_WARNING:
            console.print(f"[yellow]round {r}: {round_steps[r]} steps × {min(cfg.rl.prompts_per_step, len(rows))} "
                          f"pairs over {len(rows)} pairs trains on each pair {passes:.0f} times; preference losses "
                          "overfit that: raise rl.preference.pair_prompts (more pairs) or lower rl.steps")
        current.update(round=r, rows=rows, stats=stats, passes=passes)

    # held-out pairs: the starting policy's samples on dev prompts, never trained on; the
    # loss's implicit-reward accuracy on them says whether the preference generalises
    dev_file = run.path / f"{files}pairs_dev.jsonl"
    if cfg.rl.steps and not dev_file.exists():  # built before any step: `policy` is the start
        dev_pairs, _ = verifier_pairs(cfg, env, tokenizer, policy, 0, cfg.rl.dev_size, split="dev")
        save_preference_jsonl(dev_pairs, dev_file)
    dev_pairs = load_preference_jsonl(dev_file) if dev_file.exists() and dev_file.stat().st_size else []
    dev = env.fixed_set("dev", cfg.rl.dev_size, seed=0)
    params = dataclasses.replace(sampling_params(cfg), temperature=1.0)

    def evaluate(step: int) -> dict[str, float]:
        engine = RolloutEngine(policy, tokenizer, params, shares_weights=True)
        metrics = {"dev_pass@1": evaluate_pass_at_1(engine, env, dev)["pass@1"]}
        # KL(π ‖ π_ref), length and reward on the policy's own samples (T = 1), as the RL stage logs them
        episodes = score_episodes(env.score, engine.generate(dev[:64], 1, generator_for(cfg.seed, "pref-kl", step)))
        batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
        batch.ref_logp = reference.logp(batch)
        metrics.update({k: v for k, v in rollout_metrics(batch, batch.episodes).items() if k != "zero_variance_groups"})
        # the third health check: per-token entropy of the policy on its own samples, estimated as
        # the mean −log π of the sampled tokens (at T = 1 its expectation is the entropy); DPO off
        # its pairs' distribution can collapse it (every answer the same) or blow it up (babble)
        metrics["entropy"] = masked_mean(-batch.old_logp, batch.response_mask).item()
        if dev_pairs:
            held_out = evaluate_preference(policy, dev_pairs, cfg.rl.algo, cfg.rl.algo_params, tokenizer,
                                           reference.model)
            metrics.update({f"dev_pref_{k}": v for k, v in held_out.items()})
        policy.train()
        return metrics

    def pref_step(step: int) -> dict[str, float]:
        started = time.perf_counter()
        r = max(i for i in range(rounds) if round_start[i] <= step)
        if current.get("round") != r:
            start_round(r, step)
        seed = derive_seed(cfg.seed, "pref") if r == 0 else derive_seed(cfg.seed, "pref", r)
        indices = batch_indices(len(current["rows"]), cfg.rl.prompts_per_step, seed, step - round_start[r])
        row = trainer.update(preference_batch(current["rows"], indices, tokenizer.pad_id, loss.gap_weighting), loss)
        row["time/train"] = time.perf_counter() - started
        if step == round_start[r]:
            row.update({"round": r, **{f"round_{k}": v for k, v in current["stats"].items()},
                        "round_passes": current["passes"]})
        if (step + 1) % cfg.rl.eval_every == 0 or step == cfg.rl.steps - 1:
            started = time.perf_counter()
            row.update(evaluate(step), **{"time/eval": time.perf_counter() - started})
        alerts.after_step(step, row)  # the monitors (chosen likelihood collapsing, ...), and rl.alerts.action
        return row

    alerts = AlertPolicy(cfg.rl, run, stage, policy, tokenizer)
    run_stage(run, stage, alerts.last_step(cfg.rl.steps), pref_step, policy, tokenizer, trainer,
              cfg.checkpoint_every, stop_after=alerts.should_stop,
              checkpoint_also=lambda step: step + 1 in round_start,  # the end of a round
              show=lambda m: f"loss {m['loss']:.3f}  acc {m['accuracy']:.2f}")
