"""The RL stage's curated prompt pool (data/curation.py), as a run makes and records it.

    build_pool(cfg, env)        the pool rl.curation asks for, or None: the train split's fixed
                                set, screened against the held-out and dev sets the run is scored
                                on, then against itself (data/decontamination.py), and for items
                                a guess passes when rl.curation.exclude_guessable (data/guessable.py);
                                then, with rl.curation.balance_topics, each topic capped at the
                                median topic's count (data/curation.py::cap_topics)
    measure_pass_rates(...)     k samples of every prompt from the rollout engine, batched in
                                whole groups, scored by the verifier: passes per prompt
    prepare_pool(...)           the measurement before the first RL step: made once, kept in
                                curation.json, so a run killed before its first checkpoint
                                resumes without measuring again
    remeasure(...)              the same pass during training, every rl.curation.remeasure_every steps
    write_record(run, pool)     curation.jsonl (every prompt: kept or dropped, why, when, how
                                often drawn) and curation.json (the counts summary.md reports)
"""

from __future__ import annotations

import time
from collections import Counter

from posttrain.config import TrainConfig
from posttrain.roles.engines import Engine
from posttrain.data.curation import KEPT, PromptPool, band_verdict, cap_topics, difficulty
from posttrain.data.decontamination import screen
from posttrain.data.guessable import guessable
from posttrain.eval.evaluate import sampler
from posttrain.roles.environment import score_episodes
from posttrain.runs.console import console
from posttrain.runs.rundir import RunDir
from posttrain.seeds import derive_seed, generator_for
from posttrain.types import Environment, Example
from posttrain.verifiers.contract import is_solved

RECORD, REPORT = "curation.jsonl", "curation.json"


def pool_seed(cfg: TrainConfig) -> int:
    """The seed of the pool's fixed set. Its own: the SFT demonstrations are the train
    split's fixed set at cfg.seed, and a pool that began with them would begin with prompts
    the policy was taught."""
    return derive_seed(cfg.seed, "curation-pool")


def build_pool(cfg: TrainConfig, env: Environment) -> PromptPool | None:
    """The curated pool of cfg.rl.curation (None when pool_size is 0), not yet measured."""
    cur = cfg.rl.curation
    if not cur.enabled():
        return None
    drawn = env.fixed_set("train", cur.pool_size, seed=pool_seed(cfg))
    scored_on = env.fixed_set("heldout", cfg.heldout_size, seed=0) + env.fixed_set("dev", cfg.rl.dev_size, seed=0)
    matches = screen([e.prompt for e in drawn], [e.prompt for e in scored_on], cur.match, cur.ngram_size,
                     cur.ngram_overlap)
    reasons = [None if m is None else m.reason((scored_on if m.against == "heldout" else drawn)[m.index].prompt)
               for m in matches]
    if cur.exclude_guessable:
        reasons = [reason or guessable(e) for e, reason in zip(drawn, reasons)]
    screened_out = [(e, reason) for e, reason in zip(drawn, reasons) if reason is not None]
    kept = [e for e, reason in zip(drawn, reasons) if reason is None]
    if cur.balance_topics:  # after screening: a topic is capped by the prompts that could be trained on
        kept, capped = cap_topics(kept, derive_seed(cfg.seed, "curation-topics"))
        screened_out += capped
    return PromptPool(kept, seed=cfg.seed, steps=cfg.rl.steps, band=(cur.min_pass_rate, cur.max_pass_rate),
                      online=cur.online, weights=cur.weights, order=cur.order, screened_out=screened_out)


def measure_pass_rates(engine: Engine, env: Environment, examples: list[Example], k: int, seed: int) -> list[int]:
    """How many of k samples of each example the verifier counts as solved. Sampled at
    the engine's own settings (rl.sampling: what a training group sees), as many whole
    groups per batch as the engine decodes at once, each batch from its own seed."""
    sample, passes = sampler(env), []
    per_batch = max(1, engine.max_rows // k)
    for first in range(0, len(examples), per_batch):
        chunk = examples[first : first + per_batch]
        episodes = score_episodes(env.score, sample(engine, chunk, k, generator_for(seed, "curation-batch", first)))
        counts: Counter[int] = Counter()
        for e in episodes:  # group_id = the example's index in the chunk
            counts[e.group_id] += is_solved(e.reward, e.details)
        passes += [counts[i] for i in range(len(chunk))]
    return passes


def measure(pool: PromptPool, engine: Engine, env: Environment, k: int, seed: int, step: int) -> dict[str, float]:
    """A measurement pass over the pool, applied to it; what it cost."""
    start = time.perf_counter()
    passes = measure_pass_rates(engine, env, pool.examples, k, derive_seed(seed, "curation-measure", step))
    pool.set_measurement(passes, k, step)
    return {"curation/measure_seconds": time.perf_counter() - start,
            "curation/measure_samples": float(k * len(pool.examples))}


def prepare_pool(cfg: TrainConfig, run: RunDir, pool: PromptPool, engine: Engine, env: Environment) -> None:
    """Before the first RL step: measure the pool (when something reads its pass rates),
    refuse a band that keeps nothing, and write the record. A measurement already in
    curation.json for this very pool (a run killed before its first checkpoint) is reused."""
    cur = cfg.rl.curation
    report = run.read_json(REPORT) or {}
    saved = report.get("measurement", {})
    if cur.measures():
        if saved.get("pool") == pool.fingerprint() and saved.get("k") == cur.k:
            pool.set_measurement(saved["passes"], cur.k)
        else:
            console.print(f"[bold]curation[/]: measuring the pass rates of {len(pool.examples)} prompts, "
                          f"{cur.k} samples each")
            cost = measure(pool, engine, env, cur.k, cfg.seed, -1)
            saved = {"pool": pool.fingerprint(), "k": cur.k, "passes": [m.passes for m in pool.first],
                     "seconds": cost["curation/measure_seconds"], "samples": cost["curation/measure_samples"]}
        kept = sum(status == KEPT for status in pool.status)
        if kept == 0:
            raise ValueError(f"rl.curation: the pass-rate band [{cur.min_pass_rate}, {cur.max_pass_rate}] keeps none "
                             f"of the {len(pool.examples)} prompts (pass counts of {cur.k}: "
                             f"{dict(sorted(Counter(saved['passes']).items()))}); widen the band or choose prompts "
                             "the policy sometimes solves (another level or task)")
    write_record(run, pool, {"measurement": saved} if saved else {})
    console.print(f"[bold]curation[/]: {summary_line(pool)}")


def remeasure(cfg: TrainConfig, pool: PromptPool, engine: Engine, env: Environment, step: int) -> dict[str, float]:
    """rl.curation.remeasure_every's pass, at the start of `step`; {} on other steps."""
    every = cfg.rl.curation.remeasure_every
    if not every or step == 0 or step % every:
        return {}
    return measure(pool, engine, env, cfg.rl.curation.k, cfg.seed, step)


def summary_line(pool: PromptPool) -> str:
    kept = sum(status == KEPT for status in pool.status)
    out = Counter(status for status in pool.status if status != KEPT)
    why = ", ".join(f"{count} {reason}" for reason, count in out.most_common())
    screened = f"{len(pool.screened_out)} screened out (dedup, decontamination, guessable, topic balance), " \
        if pool.screened_out else ""
    return f"{screened}{kept} of {len(pool.examples)} prompts in the pool" + (f" ({why} out of it)" if why else "")


def write_record(run: RunDir, pool: PromptPool, extra: dict | None = None) -> None:
    """curation.jsonl, one line per prompt drawn for the pool (screened out or not), and
    curation.json, the counts; rewritten whole, so the latest call describes the pool as it is."""
    rows = [{"prompt": e.prompt, "id": e.id, "label": difficulty(e), "status": "screened out", "reason": reason}
            for e, reason in pool.screened_out]
    for i, e in enumerate(pool.examples):
        first, last = pool.first[i], pool.measured[i]
        rows.append({"prompt": e.prompt, "id": e.id, "label": pool.labels[i],
                     "status": "kept" if pool.status[i] == KEPT else "dropped",
                     "reason": "" if pool.status[i] == KEPT else pool.status[i],
                     "changed_at_step": pool.changed_at[i], "draws": pool.draws[i],
                     "first_pass_rate": None if first is None else [first.passes, first.tries],
                     "last_pass_rate": None if last is None else [last.passes, last.tries, last.step]})
    run.write_jsonl(RECORD, rows)
    report = {**(run.read_json(REPORT) or {}), **(extra or {}), **counts(pool)}
    run.write_json(REPORT, report)


def counts(pool: PromptPool) -> dict:
    """What summary.md reports (runs/report.py::curation_lines): the screening, the
    measurement's histogram, the pool now."""
    first = [m for m in pool.first if m is not None]
    before = Counter(band_verdict(m.passes, m.tries, *pool.band) for m in first)
    by_label: dict[str, dict] = {}
    for label in sorted({lab for lab in pool.labels if lab is not None}):
        members = [i for i, lab in enumerate(pool.labels) if lab == label]
        measured = [pool.first[i].rate for i in members if pool.first[i] is not None]
        by_label[f"{label:g}"] = {"prompts": len(members), "kept_now": sum(pool.status[i] == KEPT for i in members),
                                  "draws": sum(pool.draws[i] for i in members),
                                  "first_pass_rate": sum(measured) / len(measured) if measured else None}
    return {
        "screened_out": dict(Counter(reason.split(":")[0] for _, reason in pool.screened_out)),
        "pool": len(pool.examples),
        "band": list(pool.band),
        "histogram_before_rl": dict(sorted(Counter(f"{m.passes}/{m.tries}" for m in first).items(),
                                          key=lambda item: int(item[0].split("/")[0]))),
        "kept_before_rl": before.pop(KEPT, 0),
        "dropped_before_rl": dict(before),  # why, by band_verdict: solved, hopeless, too easy, too hard
        "kept_now": sum(status == KEPT for status in pool.status),
        "dropped_online": pool.dropped_online,
        "fallback_steps": pool.fallback_steps,
        "draws": sum(pool.draws),
        "distinct_prompts_drawn": sum(d > 0 for d in pool.draws),
        "by_label": by_label,
    }
