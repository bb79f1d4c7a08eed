"""What the RL stage trains on, beyond the task: `rl.curation`, which of the task's training
prompts a step draws (posttrain/data/curation.py), and `rl.preference`, where a preference
loss's pairs come from (a file, or the policy's own samples ranked by the verifier, a reward
model or the policy itself) and whether they are rebuilt in online rounds."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from posttrain.config.checks import check, check_non_negative, check_positive


CURATION_WEIGHTS = ("uniform", "failure", "signal")
CURATION_ORDERS = ("none", "easy_to_hard")
CURATION_MATCHES = ("exact", "ngram")


@dataclass
class CurationConfig:
    """Which training prompts RL samples, and how often (posttrain/data/curation.py): a pool of
    distinct training prompts, screened against the held-out and dev sets, measured under the
    current policy, filtered by pass rate, and drawn from by a curriculum."""

    # distinct training prompts in the curated pool (the train split's fixed set at the run's seed);
    # 0 = no pool: every step draws fresh prompts from the whole train split, as without curation
    pool_size: int = 0
    # samples per prompt when the pool's pass rates are measured (at rl.sampling's temperature, what
    # training samples), before the first step and every remeasure_every steps; 8 = a GRPO group, so a
    # measured pass rate is in steps of 1/8
    k: int = 8
    # keep the prompts whose measured pass rate is at least this (inclusive); 0 keeps the hopeless
    min_pass_rate: float = 0.0
    # ... and at most this (inclusive); 1 keeps the solved. 1/8..7/8 (0.125, 0.875) with k = 8 drops
    # both: what 0 or 8 of 8 samples solve gives GRPO advantage 0 in every row
    max_pass_rate: float = 1.0
    # also filter while training: a step's group outside the band is dropped and refilled by the
    # controller's sampling rounds (the loop of DAPO's dynamic sampling, capped by
    # rl.max_sampling_rounds), and its prompt leaves the pool; off = the band is applied to measurements only
    online: bool = False
    # steps between re-measuring the whole pool (k samples a prompt again; prompts the policy has
    # since learnt, or can now learn, move in or out of the band); 0 = measure once, before RL
    remeasure_every: int = 0
    # how a step draws from the pool: "uniform"; "failure", P(prompt) ∝ 1 − its latest pass rate p (the
    # measurement, then every group sampled from it), so what the policy fails comes up most; or "signal",
    # ∝ p(1 − p), the variance of its 0/1 reward, so neither the solved nor the hopeless come up
    weights: str = "uniform"
    # "easy_to_hard": the pool's difficulty labels (meta.difficulty, or arithmetic's level with
    # --env.arithmetic.levels) unlock one at a time over rl.steps, in equal stages; "none" draws every
    # label throughout
    order: str = "none"
    # how a training prompt is matched against the held-out and dev prompts (dropped: decontamination)
    # and the pool's earlier prompts (dropped: dedup): "exact" (normalised text) or "ngram" (also a
    # share of its n-grams in one other prompt; posttrain/data/decontamination.py)
    match: str = "exact"
    # match ngram: tokens per n-gram (words, numbers and single symbols); 13 is GPT-3's benchmark check.
    # A prompt of at most this many tokens is one n-gram, so lower it for short prompts (arithmetic: 11)
    ngram_size: int = 13
    ngram_overlap: float = 0.5  # match ngram: the share of a prompt's n-grams another prompt must hold
    # screen out the pool's multiple-choice and true/false items, which a guess passes 1/k of the time
    # (Kimi k1.5's RL data rule; posttrain/data/guessable.py); off
    exclude_guessable: bool = False
    # cap every topic of the pool (meta.topic, a data file's `topic` column; else the difficulty label)
    # at the median topic's count, a seeded draw, so the topic the data holds most of cannot take most
    # draws (Kimi k1.5 tagged its RL prompts by discipline to keep them balanced); what it drops is in curation.jsonl.
    # Off, as it shrinks the pool and arithmetic's levels are already drawn in equal shares
    balance_topics: bool = False

    def enabled(self) -> bool:
        return self.pool_size > 0

    def filters(self) -> bool:
        return (self.min_pass_rate, self.max_pass_rate) != (0.0, 1.0)

    def measures(self) -> bool:
        """Whether the pool's pass rates are measured: only when something reads them."""
        return self.enabled() and (self.filters() or self.weights != "uniform")

    def validate(self, prefix: str = "rl.curation") -> None:
        check_non_negative(self, prefix, "pool_size", "remeasure_every")
        check_positive(self, prefix, "k", "ngram_size")
        check(0 <= self.min_pass_rate <= self.max_pass_rate <= 1, f"{prefix}.min_pass_rate", self.min_pass_rate,
              f"0 <= min_pass_rate <= max_pass_rate={self.max_pass_rate} <= 1")
        check(self.weights in CURATION_WEIGHTS, f"{prefix}.weights", self.weights, f"one of {list(CURATION_WEIGHTS)}")
        check(self.order in CURATION_ORDERS, f"{prefix}.order", self.order, f"one of {list(CURATION_ORDERS)}")
        check(self.match in CURATION_MATCHES, f"{prefix}.match", self.match, f"one of {list(CURATION_MATCHES)}")
        check(0 < self.ngram_overlap <= 1, f"{prefix}.ngram_overlap", self.ngram_overlap, "a number in (0, 1]")
        if self.online:
            check(self.filters(), f"{prefix}.online", self.online, f"false unless a band is set: online filtering "
                  f"drops the groups outside [{prefix}.min_pass_rate, {prefix}.max_pass_rate], and [0, 1] drops none")
            # a band of 0 only (or 1 only) keeps groups that all scored alike: advantage 0 in every kept row
            check(self.max_pass_rate > 0 and self.min_pass_rate < 1, f"{prefix}.online", self.online,
                  f"false with the band [{self.min_pass_rate}, {self.max_pass_rate}]: online it keeps only groups whose "
                  "samples all scored alike, which carry no gradient; widen the band or filter before RL only")
        if self.remeasure_every:
            check(self.measures(), f"{prefix}.remeasure_every", self.remeasure_every,
                  f"0 unless pass rates are read (a band, or {prefix}.weights failure or signal)")
        if not self.enabled():
            changed = [f.name for f in dataclasses.fields(self)
                       if f.name != "pool_size" and getattr(self, f.name) != getattr(CurationConfig(), f.name)]
            check(not changed, f"{prefix}.pool_size", self.pool_size,
                  f"a positive number of prompts with {', '.join(f'{prefix}.{name}' for name in changed)} set: "
                  "curation works on a pool of distinct training prompts (e.g. --rl.curation.pool_size 2000)")


@dataclass
class PreferenceConfig:
    """A preference loss's data (pipelines/preference.py): pairs from a file, or built from the
    starting policy's samples, once (offline) or afresh each online round."""

    # a file of pairs (JSONL, JSON, Parquet, a saved dataset; chosen/rejected or KTO's
    # completion/label, posttrain/data/preference.py), or (when "") pairs built by the verifier
    # from samples of the starting policy: pair_prompts training prompts × rl.samples_per_prompt
    # completions, every correct one paired with every incorrect one
    pairs: str = ""
    # your column names for the pairs' (chosen, rejected, prompt, completion, label), when they
    # differ: "chosen=good,rejected=bad" (ours = yours; posttrain/envs/dataset_files.py)
    pairs_columns: str = ""
    pair_prompts: int = 256  # training prompts whose samples the verifier turns into pairs (no pairs file)
    # online (iterative) preference optimisation: the same budget in this many rounds, each
    # building fresh pairs from the current policy's samples; 1 = offline. On arithmetic, 20
    # rounds of 5 steps beat offline, 4 rounds of 25 did not (docs/algorithms/dpo.md)
    online_rounds: int = 1
    # iterative DPO's reference (Pang et al. 2024; Xiong et al. 2024): each online round starts with
    # π_ref = the current policy, one DPO problem anchored where its pairs were sampled; false keeps
    # the starting policy for every round (the KL logged at evaluation is always to it)
    refresh_reference: bool = False
    # self-rewarding (Yuan et al. 2024, arXiv:2401.10020): the policy judges its own samples (Y/N in the
    # compact judge prompt, P(Y) the score; rewards/self_judge.py), each prompt's best against its worst
    # a pair (ties none); the verifier only reports the judge's agreement per round (ranker_auroc,
    # ranker_pair_agreement). gpt_mini needs sft.judge_demos. false: the verifier ranks (or rl.rm.path)
    self_reward: bool = False
    # pair curation before a round trains (posttrain/data/pair_balance.py; what each drops is printed and
    # kept in <stage>_pair_balance.json): subsample so that the chosen response is the longer one in as
    # many pairs as it is the shorter one, and "be longer" cannot lower the loss; off, as it drops pairs
    balance_lengths: bool = False
    # ... and cap every topic (a pairs file's `topic` column, else the difficulty label, else the prompt's
    # first word) at the median topic's count, so one topic's preference cannot dominate; off
    balance_topics: bool = False
    # ... and, before both, drop exact duplicate pairs (same prompt, chosen and rejected) and keep at most
    # this many pairs a prompt, a seeded draw: a verifier pairing every right sample with every wrong one gives
    # a half-solved prompt up to K²/4 pairs (16 of 8 samples) and a nearly solved one a single pair. 0 = off,
    # duplicates kept too: every run measured so far trained on all its pairs
    max_pairs_per_prompt: int = 0
    # after training, the policy's held-out pass@1 and mean reward sampled at each of these temperatures,
    # beside the start's ("0,0.5,1"; 0 = greedy), in summary.md: how much the loss sharpened (or flattened)
    # the policy; "" = off, as it samples rl.preference.diagnostic_prompts problems per temperature twice
    eval_temperatures: str = ""
    # an out-of-distribution check, start and trained policy on a shifted task: arithmetic's held-out
    # problems at this level (4: two-digit terms, 5: minus signs; posttrain/envs/arithmetic.py); 0 = off
    ood_level: int = 0
    # ... or, for a file task (env jsonl, math, code, gsm8k), a file of problems in env.path's format, every
    # row held out; "" = off
    ood_path: str = ""
    # held-out (and out-of-distribution) problems the two checks above score per policy and temperature;
    # 200 gives a pass@1 a standard error of at most 0.035 and costs seconds on gpt_mini
    diagnostic_prompts: int = 200

    def temperatures(self) -> list[float]:
        """eval_temperatures as numbers, in the order given."""
        return [float(t) for t in self.eval_temperatures.split(",") if t.strip()]

    def validate(self, prefix: str = "rl.preference") -> None:
        check_positive(self, prefix, "pair_prompts", "online_rounds", "diagnostic_prompts")
        check_non_negative(self, prefix, "ood_level", "max_pairs_per_prompt")
        check(not (self.ood_level and self.ood_path), f"{prefix}.ood_path", self.ood_path,
              f"'' with {prefix}.ood_level={self.ood_level}: one out-of-distribution set at a time")
        try:
            temperatures = self.temperatures()
        except ValueError:
            temperatures = [-1.0]
        check(all(math.isfinite(t) and t >= 0 for t in temperatures), f"{prefix}.eval_temperatures",
              self.eval_temperatures, "non-negative numbers joined by ',' (e.g. \"0,0.5,1\"; 0 = greedy), or ''")
