"""Where is my wall-clock going? A decision tree over a run's logged time/* metrics.

Every RL step's row in metrics.jsonl carries the wall time of each role (roles/controller.py:
time/rollout, time/score, time/reference, time/train, time/sync; PRIME adds
time/process_reward), the step's own wall time (time/step, pipelines/rl.py), the dev-set
evaluation's (time/dev_eval, on the steps that run one), and for Ray runs the slowest
worker's sampling time (time/rollout_compute). `where_time_goes` averages them and walks a
tree of questions a systems engineer would ask, in order:

    1. Is the time in the roles at all?   step − Σ roles: evaluation, logging, checkpoints
    2. Which term binds?                  the largest (colocated, sync) or the longer side
                                          of the async max
    3. Why is that term large?            per role: the long tail (truncated responses),
                                          Ray's overhead (wait vs compute), rows that train,
                                          a reference that could be free, a slow verifier
    4. What would the topology buy?       async hides min(rollout, trainer side)

It reads plain dicts (the rows of one stage), so a lesson can feed it made-up numbers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from posttrain.systems.throughput import (ROLES, Lever, RoleTimes, bottleneck, role_times_from_metrics,
                                          step_seconds)


@dataclass(frozen=True)
class WallClock:
    """A run's mean step, by role, with what to look at first."""

    steps: int
    topology: str  # colocated, sync or async: inferred from the metrics the run logged
    step_seconds: float  # mean time/step
    roles: RoleTimes  # mean seconds per role (the controller's wait for rollouts)
    outside_seconds: float  # step time no role accounts for (dev evaluation, logging, checkpoints)
    rollout_compute_seconds: float  # Ray: the slowest worker's own sampling; else the rollout's time
    findings: list[str]


def mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(float(r.get(key, 0.0)) for r in rows)


def topology_of(rows: list[dict]) -> str:
    """async when batches were stale, sync when Ray workers sampled, else colocated."""
    if any(r.get("staleness_max", 0) > 0 for r in rows):
        return "async"
    return "sync" if any("time/rollout_compute" in r for r in rows) else "colocated"


def where_time_goes(rows: list[dict]) -> WallClock:
    """The decision tree over the RL rows of one run (rows with time/step)."""
    rows = [r for r in rows if "time/step" in r]
    if not rows:
        raise ValueError("no row has time/step: give the RL rows of a run's metrics.jsonl (stage 'rl'); "
                         "runs from before time/step was logged cannot be read")
    topology = topology_of(rows)
    step = mean(rows, "time/step")
    roles = RoleTimes(**{role: statistics.fmean(getattr(role_times_from_metrics(r), role) for r in rows)
                         for role in ROLES})
    compute = mean(rows, "time/rollout_compute") if topology != "colocated" else roles.rollout
    accounted = step_seconds(roles, "colocated")  # the controller's own roles never overlap one another
    outside = step - accounted
    findings = []
    # 1. time outside the roles
    if outside > 0.15 * step:
        evaluation = mean(rows, "time/dev_eval")
        findings.append(f"{outside / step:.0%} of the step is outside the five roles ({outside:.2f} s a step"
                        + (f", of which dev evaluation {evaluation:.2f} s averaged over steps" if evaluation else "")
                        + "): evaluate less often (rl.eval_every, rl.dev_size), checkpoint less often")
    # 2. the binding term
    if topology == "async":
        binding = "rollout" if compute >= roles.trainer_side else bottleneck(roles, "async")
        side = ("the rollout (workers sampling)" if binding == "rollout" else
                f"the trainer side ({roles.trainer_side:.2f} s: score + reference + train + sync)")
        findings.append(f"async: the step is the longer of the rollout ({compute:.2f} s sampling) and the trainer "
                        f"side ({roles.trainer_side:.2f} s); {side} binds, so speed that up — the other side's "
                        "savings only add idle time")
    else:
        binding = bottleneck(roles, topology)
        share = getattr(roles, binding) / step
        findings.append(f"{binding} takes {share:.0%} of the step ({getattr(roles, binding):.2f} of {step:.2f} s): "
                        "the largest term")
    # 3. why that term
    findings += _why(binding, roles, rows, topology, compute)
    # 4. what the topology would buy
    if topology != "async" and min(roles.rollout, roles.trainer_side) > 0.2 * step:
        hidden = min(roles.rollout, roles.trainer_side)
        findings.append(f"async one step ahead would overlap the rollout with the trainer side: at most "
                        f"{hidden:.2f} s of {step:.2f} s hidden ({hidden / step:.0%}), on separate hardware, for one "
                        "step of staleness (--dist.topology async)")
    return WallClock(len(rows), topology, step, roles, outside, compute, findings)


def _why(binding: str, roles: RoleTimes, rows: list[dict], topology: str, compute: float) -> list[str]:
    out = []
    if binding == "rollout":
        truncated, length = mean(rows, "truncated_fraction"), mean(rows, "response_length")
        if truncated > 0.1:
            out.append(f"{truncated:.0%} of responses hit max_new_tokens (mean length {length:.0f} tokens): the "
                       "batch waits for its longest rows, the straggler tax; cap the length with a shaped penalty, "
                       "or pack/refill finished rows (stragglers.py)")
        if topology == "sync" and roles.rollout - compute > 0.1 * roles.rollout:
            out.append(f"the controller waited {roles.rollout:.2f} s for rollouts the slowest worker sampled in "
                       f"{compute:.2f} s: the rest is Ray's dispatch, gather and unpickling, or uneven shards")
        out.append("decode is the cost: more rows per decode step (until compute-bound, roofline.crossover_rows), "
                   "prefix caching, speculative decoding or low-precision sampling (scheduling.py)")
    elif binding == "train":
        skipped = mean(rows, "skipped_rows")
        out.append(f"the update trains {1 - skipped:.0%} of rows (rl.update.skip_inert_rows leaves out those with no "
                   "gradient): its FLOPs are 6 × parameters × tokens; share each group's prompt "
                   "(rl.update.share_prompt), train fewer epochs, or LoRA (less optimizer work, not fewer FLOPs)")
    elif binding == "reference":
        out.append("the reference is a full forward pass per step: share the prompt (rl.update.share_prompt), or drop "
                   "it (β = 0 and rl.kl.track false), or compute ref log-probs in the rollout engine")
    elif binding == "verifier":
        out.append("scoring is slow: score in parallel processes or while the next batch samples; a code or "
                   "math verifier's timeouts bound its tail")
    elif binding == "sync":
        out.append("weight sync is slow: share the weights in one process (colocated), push bf16, push LoRA "
                   "adapters only, or broadcast with NCCL instead of an object store (gantt.weight_sync)")
    return out


def render(clock: WallClock) -> str:
    """A table of the mean step and the findings, for the terminal or a lesson."""
    lines = [f"{clock.steps} RL steps, {clock.topology}: {clock.step_seconds:.2f} s per step on average", "",
             "| role | seconds per step | share |", "|---|---|---|"]
    for role, seconds in clock.roles.as_dict().items():
        lines.append(f"| {role} | {seconds:.3f} | {seconds / clock.step_seconds:.0%} |")
    if clock.topology != "colocated":
        lines.append(f"| (rollout sampling, slowest worker) | {clock.rollout_compute_seconds:.3f} | |")
    lines.append(f"| outside the roles | {clock.outside_seconds:.3f} | {clock.outside_seconds / clock.step_seconds:.0%} |")
    lines += ["", *[f"- {f}" for f in clock.findings]]
    return "\n".join(lines)


# A lever a run has already pulled: the config.json setting (dotted path) and its value that mean so
PULLED = {
    "async, one step ahead": ("dist.topology", "async"),
    "low-precision rollout": ("rl.sampling.weights", "int8"),
    "each prompt once per group": ("rl.update.share_prompt", True),
    "skip rows with no gradient": ("rl.update.skip_inert_rows", True),
}


def _setting(config: dict, dotted: str):
    for key in dotted.split("."):
        config = config.get(key, {}) if isinstance(config, dict) else {}
    return config


def open_levers(config: dict, rows: list[dict], levers: list[Lever]) -> list[Lever]:
    """The levers a run has not pulled yet (lesson 28's allocator spends only these): those
    its config.json already sets (PULLED) are left out, and so is a length cap when almost
    no response reached max_new_tokens (truncated_fraction under 1%): there is no tail for
    it to cut."""
    truncated = mean([r for r in rows if "time/step" in r] or [{}], "truncated_fraction")
    out = []
    for lever in levers:
        pulled = PULLED.get(lever.name)
        if pulled and _setting(config, pulled[0]) == pulled[1]:
            continue
        if lever.name.startswith("length cap") and truncated < 0.01:
            continue
        out.append(lever)
    return out
