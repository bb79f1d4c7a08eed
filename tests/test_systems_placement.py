"""posttrain/systems/placement.py: the three reference architectures of lesson 24 — which pool
holds which copy, the four paths' bytes worked by hand, the step composed by architecture,
and the settings that cannot be placed refused with what to do."""

import pytest

from posttrain.systems.hardware import DEVICES, GB, Cluster
from posttrain.systems.placement import TOKEN_BYTES, place, split_gpus
from posttrain.systems.plan import JobSettings
from posttrain.systems.shapes import PRESETS, parameter_count
from posttrain.systems.throughput import Workload, step_seconds

SHAPE = PRESETS["qwen2.5-1.5b"]
P = parameter_count(SHAPE)
W = Workload(prompts=8, samples_per_prompt=4, prompt_tokens=100, mean_response_tokens=200, response_cv=0.5)
H100 = DEVICES["h100-80gb"]


def roles(pool):
    return [c.role for c in pool.memory.copies]


def test_each_pool_holds_its_copies():
    colocated = place("colocated", SHAPE, Cluster(H100, 4), JobSettings(zero_stage=3), W)
    (every,) = colocated.pools
    assert roles(every) == ["policy", "reference", "rollout engine"] and every.gpus == 4
    assert every.memory.kv_cache_bytes > 0 and every.memory.activation_bytes > 0
    split = place("disaggregated", SHAPE, Cluster(H100, 4), JobSettings(zero_stage=3), W, rollout_gpus=1)
    trainer, rollout = split.pools
    assert (trainer.gpus, rollout.gpus) == (3, 1)
    assert roles(trainer) == ["policy", "reference"] and trainer.memory.kv_cache_bytes == 0
    assert roles(rollout) == ["rollout engine"] and rollout.memory.activation_bytes == 0
    # ZeRO-3 over the trainer pool's 3 GPUs: 16 bytes a parameter for the policy, 2 for the reference, / 3
    assert trainer.memory.copies[0].bytes_per_gpu == pytest.approx(16 * P / 3)
    assert trainer.memory.copies[1].bytes_per_gpu == pytest.approx(2 * P / 3)
    assert rollout.memory.copies[0].bytes_per_gpu == pytest.approx(2 * P)  # the engine's bf16 weights, whole
    # the one rollout GPU holds the whole batch's cache; colocated, each of 4 holds a quarter
    assert rollout.memory.kv_cache_bytes == pytest.approx(4 * every.memory.kv_cache_bytes)
    assert place("disaggregated", SHAPE, Cluster(H100, 4), JobSettings(), W).pools[0].gpus == 2  # half by default


def test_weights_and_trajectories_by_hand():
    unsharded = place("colocated", SHAPE, Cluster(H100, 4), JobSettings(zero_stage=0), W)
    weights = unsharded.path("weights")
    assert weights.bytes == 0 and weights.wire == "GPU memory"  # whole weights on every GPU, read in place
    assert unsharded.path("trajectories").bytes == 0
    split = place("disaggregated", SHAPE, Cluster(H100, 4), JobSettings(zero_stage=3), W)
    # the 2 trainer GPUs gather each other's half (bf16), then the bf16 weights cross to the engines once
    assert split.path("weights").bytes == pytest.approx(P * 2 / 2 + P * 2)
    assert split.path("trajectories").bytes == 32 * 300 * TOKEN_BYTES
    assert split.times.sync == split.path("weights").seconds


def test_collectives_by_hand():
    # 4 GPUs, a ring moves 3/4 of a tensor per pass; bf16 gradients and weights (2 bytes)
    zero0 = place("colocated", SHAPE, Cluster(H100, 4), JobSettings(zero_stage=0), W).path("collectives")
    assert zero0.bytes == pytest.approx(0.75 * 2 * P * 2)  # the gradients' all-reduce
    zero3 = place("colocated", SHAPE, Cluster(H100, 4), JobSettings(zero_stage=3), W).path("collectives")
    # reduce-scatter of the gradients, the policy gathered for forward and backward, the reference for its forward
    assert zero3.bytes == pytest.approx(0.75 * (P * 2 + 2 * P * 2 + P * 2))
    assert zero3.seconds == pytest.approx(zero3.bytes / H100.link_bytes_per_second)
    one = place("colocated", SHAPE, Cluster(H100, 1), JobSettings(zero_stage=0), W).path("collectives")
    assert one.bytes == 0 and one.wire == "GPU memory"


def test_step_is_a_sum_or_an_async_max():
    split = place("disaggregated", SHAPE, Cluster(H100, 8), JobSettings(), W)
    overlapped = place("async", SHAPE, Cluster(H100, 8), JobSettings(), W, max_staleness=2)
    assert split.times == overlapped.times  # the same pools do the same work
    assert split.step_seconds == pytest.approx(sum(split.times.as_dict().values()))
    assert overlapped.step_seconds == step_seconds(split.times, "async") < split.step_seconds
    assert (split.max_staleness, overlapped.max_staleness) == (0, 2)


@pytest.mark.parametrize("args,message", [
    (("colocated", JobSettings(), 8), None),
    (("mesh", JobSettings(), 8), "expected one of"),
    (("disaggregated", JobSettings(), 1), "only be colocated"),
    (("async", JobSettings(algo="dpo"), 8), "offline"),
])
def test_what_cannot_be_placed_is_refused(args, message):
    architecture, job, gpus = args
    if message is None:
        assert place(architecture, SHAPE, Cluster(H100, gpus), job, W).pools[0].fit.usable_bytes == 0.9 * 80 * GB
        return
    with pytest.raises(ValueError, match=message):
        place(architecture, SHAPE, Cluster(H100, gpus), job, W)
    with pytest.raises(ValueError, match="at least one GPU in each"):
        split_gpus(4, 4)
