"""Where a preference stage's pairs come from, round by round.

    verifier_pairs      pairs from the policy's own samples, ranked by the verifier (or by a
                        reward model, or by the policy judging itself)
    split_evenly        one budget (steps, prompts) split into rounds
    PreferenceRounds    the stage's rounds: which round a step trains on; each round's pairs,
                        built once and saved (a resumed run reads them back); the round's
                        reference (the start, or with rl.preference.refresh_reference the policy as the
                        round starts); the round's rows with log π_ref cached
    Round               the round being trained, as its first step found it

Offline is one round (rl.preference.online_rounds = 1) whose pairs come from rl.preference.pairs or from the
starting policy; online splits the stage's budget into rl.preference.online_rounds rounds, each on
pairs the current policy's samples give. pipelines/preference.py trains on them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from posttrain.algorithms.preference import PreferenceLoss
from posttrain.config import TrainConfig
from posttrain.data.preference import load_preference_data, load_preference_jsonl, save_preference_jsonl
from posttrain.data.pair_balance import balance_lines, balance_pairs
from posttrain.data.preference_rows import group_by_prompt, pair_gaps, pairs_from_verifier, preference_episodes
from posttrain.eval.ranker_agreement import ranker_agreement
from posttrain.models import load_checkpoint_model
from posttrain.models.device import model_device, place
from posttrain.models.policy import Policy, SavablePolicy
from posttrain.pipelines.build import sampling_params
from posttrain.pipelines.preference_train import batch_indices, cache_reference_logps
from posttrain.roles.environment import score_episodes
from posttrain.roles.reference import Reference
from posttrain.roles.engines import make_engine
from posttrain.runs.checkpoints import latest_checkpoint, save_checkpoint
from posttrain.runs.console import console
from posttrain.runs.rundir import RunDir
from posttrain.seeds import derive_seed, generator_for
from posttrain.types import Environment, Episode, PreferencePair, Tokenizer


def verifier_pairs(cfg: TrainConfig, env: Environment, tokenizer: Tokenizer, policy: Policy, round: int = 0,
                   n_prompts: int = 0, split: str = "train",
                   score: Callable | None = None) -> tuple[list[PreferencePair], dict[str, float]]:
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
    engine = make_engine(policy, tokenizer, sampling_params(cfg), shares_weights=True)
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


def stage_file(stage: str, name: str) -> str:
    """A preference stage's file: `posttrain train`'s stage ("pref") keeps the plain name;
    a stage of a --stages run prefixes its own ("dpo_pairs.jsonl")."""
    return name if stage == "pref" else f"{stage}_{name}"


# passes over a round's pairs past which the stage warns: on arithmetic, online DPO + NLL
# went from beating offline by 3.6–5.2 points at ~5 passes to losing by 8 at ~10 (one seed
# of two), and offline fell 3–6 points
MAX_PASSES_WITHOUT_WARNING = 8


@dataclasses.dataclass
class Round:
    """The round being trained: its pairs as rows, each carrying log π_ref (cached once, as
    the round started: π_ref does not change within a round)."""

    index: int
    start: int  # the stage step it starts at
    rows: list[list[Episode]]  # each pair as two adjacent rows (preference_episodes)
    stats: dict[str, float]  # where its pairs came from, as <stage>_rounds.json records them
    passes: float  # how many times the round trains on each of its pairs
    seed: int  # its batch order

    def batch_indices(self, step: int, batch_size: int) -> list[int]:
        """The pairs stage step `step` trains on: the round's own shuffles, counted from its
        first step (a pure function of the step, so a resumed run draws the same)."""
        return batch_indices(len(self.rows), batch_size, self.seed, step - self.start)

    def record(self) -> dict[str, float]:
        """What the round's first step logs about it."""
        return {"round": self.index, **{f"round_{k}": v for k, v in self.stats.items()}, "round_passes": self.passes}


class PreferenceRounds:
    """The rounds of one preference stage. The same budget — rl.preference.pair_prompts sampled prompts
    and rl.steps gradient steps in all — split into rl.preference.online_rounds rounds; `at(step)` is
    the round a step trains on, started (pairs built or read back, π_ref cached) the first
    time a step of it runs, be it the round's first step or the step a resumed run starts at."""

    def __init__(self, cfg: TrainConfig, run: RunDir, stage: str, env: Environment, tokenizer: Tokenizer,
                 policy: SavablePolicy, reference: Reference, loss: PreferenceLoss, rank_by: Callable | None) -> None:
        self.cfg, self.run, self.stage, self.env, self.tokenizer, self.policy = cfg, run, stage, env, tokenizer, policy
        self.start_reference, self.loss, self.rank_by = reference, loss, rank_by
        self.count = cfg.rl.preference.online_rounds
        self.steps, self.prompts = split_evenly(cfg.rl.steps, self.count), split_evenly(cfg.rl.preference.pair_prompts, self.count)
        self.starts = [sum(self.steps[:r]) for r in range(self.count)]  # the stage step each round starts at
        self.record_file = f"{stage}_rounds.json"
        self.current: Round | None = None

    def at(self, step: int) -> Round:
        """The round step `step` trains on."""
        r = max(i for i in range(self.count) if self.starts[i] <= step)
        if self.current is None or self.current.index != r:
            self.current = self.start(r, step)
        return self.current

    def ends_at(self, step: int) -> bool:
        """Whether `step` is a round's last (the stage checkpoints it: the next round's pairs
        come from the policy as this one leaves it)."""
        return step + 1 in self.starts

    def start(self, r: int, step: int) -> Round:
        """Round r as a step of it first runs: its pairs as rows, π_ref's log-probs cached."""
        pairs, stats = self.pairs(r)
        if r == 0 and step == 0:
            console.print(f"preference data: {len(pairs)} {'pairs' if self.cfg.rl.preference.pairs else 'verifier-built pairs'}")
        rows = preference_episodes(pairs, self.tokenizer, self.policy.config.max_seq_len)
        if self.loss.gap_weighting != "none":
            pair_gaps(rows)  # every pair scored, or the record without scores named before the round trains
        if self.loss.uses_reference:
            cache_reference_logps(self.reference(r), rows, self.tokenizer.pad_id)
        # how many times the round trains on each of its pairs; past a few, the loss fits
        # these pairs instead of the preference (docs/algorithms/dpo.md, "Online against offline")
        per_step = min(self.cfg.rl.prompts_per_step, len(rows))
        passes = self.steps[r] * per_step / len(rows)
        if passes > MAX_PASSES_WITHOUT_WARNING:
            console.print(f"[yellow]round {r}: {self.steps[r]} steps × {per_step} pairs over {len(rows)} pairs "
                          f"trains on each pair {passes:.0f} times; preference losses overfit that: raise "
                          "rl.preference.pair_prompts (more pairs) or lower rl.steps")
        seed = derive_seed(self.cfg.seed, "pref") if r == 0 else derive_seed(self.cfg.seed, "pref", r)
        return Round(r, self.starts[r], rows, stats, passes, seed)

    def pairs(self, r: int) -> tuple[list, dict]:
        """Round r's pairs and their stats: read back when a killed run already built them
        (the policy that built them is gone: it was trained on), else built and saved
        before a step trains on them (the exact data this round saw)."""
        name = self.run.path / stage_file(self.stage, "pairs.jsonl" if self.count == 1 else f"pairs_round{r}.jsonl")
        stats = (self.run.read_json(self.record_file) or {}).get(str(r))
        if name.exists() and stats is not None:
            return load_preference_jsonl(name), stats
        pairs, stats = self.balance(r, *self.build_pairs(r))
        save_preference_jsonl(pairs, name)
        self.run.write_json(self.record_file, {**(self.run.read_json(self.record_file) or {}), str(r): stats})
        return pairs, stats

    def balance(self, r: int, pairs: list, stats: dict) -> tuple[list, dict]:
        """Round r's pairs after rl.preference.max_pairs_per_prompt, balance_topics and balance_lengths
        (data/pair_balance.py), what each dropped printed and kept in <stage>_pair_balance.json before
        any step trains on them; as they were when none is on, or when the round reuses the last
        round's pairs (balanced already)."""
        pref = self.cfg.rl.preference
        if not (pref.balance_lengths or pref.balance_topics or pref.max_pairs_per_prompt) or "reused_round" in stats:
            return pairs, stats
        kept, report = balance_pairs(pairs, pref.balance_lengths, pref.balance_topics,
                                     derive_seed(self.cfg.seed, "pair-balance", r), pref.max_pairs_per_prompt)
        console.print(f"round {r}: balancing kept {len(kept)} of {len(pairs)} pairs; "
                      + "; ".join(balance_lines(report)), highlight=False, markup=False)
        record_file = f"{self.stage}_pair_balance.json"
        self.run.write_json(record_file, {**(self.run.read_json(record_file) or {}), str(r): report})
        return kept, {**stats, "pairs": len(kept), "pairs_before_balance": len(pairs)}

    def build_pairs(self, r: int) -> tuple[list, dict]:
        """Round r's pairs from rl.preference.pairs, or from the current policy's samples ranked by the
        verifier (or rl.rm.path's reward model, or the policy judging itself)."""
        rl = self.cfg.rl
        if rl.preference.pairs:
            pairs = load_preference_data(rl.preference.pairs, rl.preference.pairs_columns)
            return pairs, {"pairs": len(pairs)}
        pairs, stats = verifier_pairs(self.cfg, self.env, self.tokenizer, self.policy, r, self.prompts[r],
                                      score=self.rank_by)
        if pairs:
            return pairs, stats
        if r == 0:
            raise ValueError(f"no preference pairs: on all {rl.preference.pair_prompts} prompts the starting policy's "
                             f"{rl.samples_per_prompt} samples were all right or all wrong; raise rl.preference.pair_prompts, "
                             "rl.samples_per_prompt or rl.sampling.temperature, or pass rl.preference.pairs FILE")
        # the policy now solves (or fails) every prompt it drew: keep the last data
        console.print(f"[yellow]round {r}: no pairs; training on round {r - 1}'s pairs again")
        pairs, _ = self.pairs(r - 1)
        return pairs, {**stats, "reused_round": r - 1}

    def reference(self, r: int) -> Policy:
        """The module π_ref is read from in round r: the starting policy, or with
        rl.preference.refresh_reference the policy as round r starts, saved so that a run killed
        mid-round resumes against the same reference."""
        if not (self.cfg.rl.preference.refresh_reference and r > 0):
            return self.start_reference.model
        policy, name = self.policy, f"{self.stage}_reference"
        saved = latest_checkpoint(self.run, name)
        if saved is None or saved.name != f"step_{self.starts[r]:06d}":
            saved = save_checkpoint(self.run, name, self.starts[r], policy, self.tokenizer, keep_last=1)
        reference_now = place(load_checkpoint_model(saved, policy.config), model_device(policy), policy.compute_dtype)
        return reference_now.eval().requires_grad_(False)
