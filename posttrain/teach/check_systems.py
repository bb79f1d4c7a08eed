"""The code exercises of the systems lessons (22b and after) for `posttrain check`:
each one's reference, computed by posttrain/systems, its cases and its hint; exercises.py
registers them beside lessons 00-14's. The library's answers are plain Python numbers, so
each reference returns them as a float64 tensor, the shape the stub returns.
"""

from __future__ import annotations

import math

import torch

from posttrain.systems import gantt, stragglers
from posttrain.systems.memory import MIXED_ADAMW
from posttrain.systems.rl_memory import rl_memory
from posttrain.systems.throughput import RoleTimes, step_seconds


def _ref_decode_by_patch(lengths, a, b, cap):
    L = lengths.tolist()
    return torch.tensor([stragglers.static_batch_seconds(L, a, b), stragglers.decode_seconds(L, a, b),
                         stragglers.decode_seconds([min(x, cap) for x in L], a, b)], dtype=torch.float64)


def _decode_cases():
    typical = torch.tensor(stragglers.expected_lengths(256, 20.0, 1.0), dtype=torch.float64)
    return [
        ("one straggler among short rows", (torch.tensor([3.0, 1.0, 2.0, 7.0]), 1.0, 0.1, 5.0)),
        ("every row the same length: packing changes nothing", (torch.tensor([4.0, 4.0, 4.0]), 0.5, 0.2, 10.0)),
        ("a cap above every row changes nothing", (torch.tensor([5.0, 9.0, 2.0]), 0.3, 0.05, 100.0)),
        ("256 log-normal rows (mean 20, cv 1), our sampler's a and b, cap 80", (typical, 6.5e-3, 2e-4, 80.0)),
    ]


def _ref_step_ends(rollout, train, sync, max_staleness):
    g = gantt.simulate("async" if max_staleness else "sync", rollout, train, sync, max_staleness or 1)
    return torch.tensor(g.step_ends(), dtype=torch.float64)


def _gantt_cases():
    jumpy = [1.0, 6.0, 1.0, 6.0, 1.0, 6.0]
    return [
        ("sync, by hand: [3.5, 7.0]", ([2.0, 2.0], [1.0, 1.0], 0.5, 0)),
        ("async one step ahead, by hand: [3.5, 5.5, 7.5]", ([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], 0.5, 1)),
        ("async, rollouts that jump, k = 1", (jumpy, [3.0] * 6, 0.0, 1)),
        ("async, rollouts that jump, k = 2 (a second batch in flight helps)", (jumpy, [3.0] * 6, 0.0, 2)),
        ("async, the trainer is the slower lane, k = 3", ([2.0] * 4, [4.0] * 4, 0.5, 3)),
    ]


def _ref_grpo_bytes(parameters, gpus, zero_stage):
    memory = rl_memory("grpo", parameters, MIXED_ADAMW, zero_stage, gpus)
    return torch.tensor([c.bytes_per_gpu for c in memory.copies], dtype=torch.float64)


def _copies_cases():
    return [(f"{gpus} GPU{'s' if gpus > 1 else ''}, ZeRO stage {stage}", (8e9, gpus, stage))
            for gpus, stage in ((1, 0), (8, 0), (8, 1), (8, 2), (8, 3))]


def _ref_mismatch(sampler_logp, trainer_logp, cap):
    m = stragglers.logprob_mismatch(sampler_logp.tolist(), trainer_logp.tolist(), cap)
    return torch.tensor([m.mean_abs_logp_diff, m.kl_k3, m.clipped_fraction, m.effective_sample_fraction],
                        dtype=torch.float64)


def _mismatch_cases():
    g = torch.Generator().manual_seed(25)
    sampler = -torch.rand(200, generator=g, dtype=torch.float64) * 3  # (n,) log-probs of sampled tokens
    return [
        ("the same kernels: every statistic at its ideal", (sampler, sampler.clone(), 2.0)),
        ("int8-sized noise, 1e-3 nats", (sampler, sampler + 1e-3 * torch.randn(200, generator=g, dtype=torch.float64),
                                        2.0)),
        ("one token three times likelier under the trainer (w = 3 > cap)",
         (torch.tensor([-1.0, -2.0], dtype=torch.float64), torch.tensor([-1.0, -2.0 + math.log(3)], dtype=torch.float64),
          2.0)),
        ("a sampler that favours its own tokens by 0.3 nats", (sampler, sampler - 0.3, 1.2)),
    ]


def _ref_seconds_saved(times, topology, levers):
    t = RoleTimes(**times)
    before = step_seconds(t, topology)
    return torch.tensor([before - step_seconds(t.scaled(f), topology) for f in levers], dtype=torch.float64)


def _lever_cases():
    step = {"rollout": 6.0, "verifier": 0.5, "reference": 1.0, "train": 2.5, "sync": 0.5}
    levers = [{"rollout": 0.5}, {"reference": 0.0}, {"train": 0.5, "reference": 0.5}, {"sync": 0.0}]
    trainer_bound = {**step, "rollout": 3.0}
    return [
        ("colocated: every lever saves its own share", (step, "colocated", levers)),
        ("async, the rollout binds: trainer-side levers save nothing", (step, "async", levers)),
        ("async, the trainer side binds: the rollout lever saves nothing", (trainer_bound, "async", levers)),
    ]


# lesson: (the stub's function, the library's answer, the cases, the hint said on any failure)
SYSTEMS_EXERCISES = {
    "22b": ("decode_seconds_by_patch", _ref_decode_by_patch, _decode_cases,
        "static = (a + b·n)·max(L); packed = a·max(L) + b·ΣL; capped = packed on min(L, cap). "
        "Use lengths.max(), lengths.sum() and lengths.clamp(max=cap); return torch.stack or torch.tensor "
        "of the three. See straggler_patches in posttrain/systems/stragglers.py."),
    "22c": ("step_end_times", _ref_step_ends, _gantt_cases,
        "Keep three clocks: when each weight version was published (version 0 at 0), when the rollout "
        "lane is free, when the trainer is free. Rollout s starts at max(rollout free, published[s]) for "
        "sync, published[max(0, s − k)] for async; training starts at max(its batch sampled, trainer "
        "free); the sync ends train_end + sync_seconds, which publishes version s + 1 and frees the "
        "trainer. See simulate in posttrain/systems/gantt.py."),
    "24": ("grpo_bytes_per_gpu", _ref_grpo_bytes, _copies_cases,
        "policy = 2/s3 + 2/s2 + 12/s1 bytes a parameter, where sK = gpus when zero_stage >= K (else 1); "
        "reference = 2/s3; engine = 2, never sharded. See training_state_bytes in "
        "posttrain/systems/memory.py and rl_memory in posttrain/systems/rl_memory.py."),
    "25": ("mismatch_stats", _ref_mismatch, _mismatch_cases,
        "d = trainer − sampler (in float64), w = exp(d): [d.abs().mean(), (w − 1 − d).mean(), "
        "(w > cap).float().mean(), w.sum()**2 / (n · (w**2).sum())]. See logprob_mismatch in "
        "posttrain/systems/stragglers.py."),
    "28": ("seconds_saved", _ref_seconds_saved, _lever_cases,
        "step(times) − step(times with the lever's factors multiplied in), one lever at a time, each on "
        "the original times; step is the sum, or for async max(rollout, the other four summed). See "
        "rank_levers and step_seconds in posttrain/systems/throughput.py."),
}
