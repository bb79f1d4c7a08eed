"""The memory of an RL job: its "four copies", per GPU, and whether it fits.

RLHF with PPO holds four models (Ouyang et al. 2022): the policy and the critic, both
trained (weights, gradients, optimizer state), and the reference and the reward model,
both frozen (weights only). GRPO drops the critic (the group mean is its baseline) and,
with a verifier instead of a learned reward, the reward model; DPO is offline, so it also
needs no rollout engine, and with precomputed reference log-probs not even the reference.
An online job that samples with an inference engine (vLLM, SGLang) also keeps the engine's
copy of the policy and its KV cache.

`rl_memory` adds the copies up per GPU; `fits` says whether that leaves room on the device.
`colocated_step_peak` is the single-process envelope of our own RL step (float32 on a CPU),
checked against the measured peak RSS of a SmolLM2 GRPO step (tests/test_systems_measured.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from posttrain.systems.kv_cache import kv_cache_bytes
from posttrain.systems.memory import (FP32_ADAMW, Precision, TrainingState, activation_bytes, inference_weight_bytes,
                                      logits_bytes, training_state_bytes)
from posttrain.systems.shapes import ModelShape

# the models each algorithm holds besides the policy (a learned reward only where it must be)
ALGORITHM_COPIES = {
    "ppo": ("reference", "reward model", "critic"),
    "grpo": ("reference",),  # rewards from a verifier; add a reward model with reward_model_parameters
    "dpo": ("reference",),  # offline pairs: no rollout engine
}
ONLINE = {"ppo": True, "grpo": True, "dpo": False}


@dataclass(frozen=True)
class ModelCopy:
    role: str
    parameters: float
    trained: bool
    bytes_per_gpu: float


@dataclass(frozen=True)
class RLMemory:
    """Everything an RL job keeps on each GPU, in bytes."""

    copies: list[ModelCopy]
    activation_bytes: float  # one micro-batch's, per GPU
    kv_cache_bytes: float  # the rollout engine's cache, per GPU
    device_bytes: float = 0.0

    @property
    def total_bytes(self) -> float:
        return sum(c.bytes_per_gpu for c in self.copies) + self.activation_bytes + self.kv_cache_bytes


def trained_copy(role: str, parameters: float, precision: Precision, zero_stage: int, gpus: int) -> ModelCopy:
    state = training_state_bytes(parameters, precision, zero_stage, gpus)
    return ModelCopy(role, parameters, True, state.total)


def frozen_copy(role: str, parameters: float, bytes_per_weight: float, zero_stage: int, gpus: int) -> ModelCopy:
    # under ZeRO-3 the frozen models are sharded like the trained ones (gathered layer by layer)
    share = gpus if zero_stage == 3 else 1
    return ModelCopy(role, parameters, False, inference_weight_bytes(parameters, bytes_per_weight) / share)


def rl_memory(algo: str, parameters: float, precision: Precision, zero_stage: int = 0, gpus: int = 1, *,
              activation_bytes_per_gpu: float = 0.0, kv_cache_bytes_per_gpu: float = 0.0,
              frozen_bytes_per_weight: float = 2, reward_model_parameters: float | None = None,
              critic_parameters: float | None = None, lora_state: TrainingState | None = None,
              rollout_tensor_parallel: int = 1) -> RLMemory:
    """Per-GPU memory of an RL job with `algo` (ppo, grpo, dpo) on a `parameters`-sized policy.

    reward_model_parameters / critic_parameters: their sizes (default: the policy's; a
    reward model for GRPO only when given). lora_state: the policy trains LoRA adapters
    (memory.lora_training_bytes), so the frozen base doubles as the reference. The online
    algorithms also hold a rollout engine: the policy's weights at frozen_bytes_per_weight,
    split over `rollout_tensor_parallel` GPUs, and its KV cache."""
    if algo not in ALGORITHM_COPIES:
        raise ValueError(f"algo={algo!r}: expected one of {sorted(ALGORITHM_COPIES)} (the memory of the others "
                         "matches their family: rloo, dr_grpo, dapo are grpo; ipo, kto, simpo are dpo)")
    if lora_state is not None:
        copies = [ModelCopy("policy (LoRA)", parameters, True, lora_state.total)]
    else:
        copies = [trained_copy("policy", parameters, precision, zero_stage, gpus)]
    for role in ALGORITHM_COPIES[algo]:
        if role == "reference" and lora_state is None:
            copies.append(frozen_copy("reference", parameters, frozen_bytes_per_weight, zero_stage, gpus))
        elif role == "reward model":
            copies.append(frozen_copy(role, reward_model_parameters or parameters, frozen_bytes_per_weight,
                                      zero_stage, gpus))
        elif role == "critic":
            copies.append(trained_copy(role, critic_parameters or parameters, precision, zero_stage, gpus))
    if algo == "grpo" and reward_model_parameters:
        copies.append(frozen_copy("reward model", reward_model_parameters, frozen_bytes_per_weight, zero_stage, gpus))
    if ONLINE[algo]:
        engine = inference_weight_bytes(parameters, frozen_bytes_per_weight) / rollout_tensor_parallel
        role = f"rollout engine (tensor-parallel {rollout_tensor_parallel})" if rollout_tensor_parallel > 1 else \
            "rollout engine"
        copies.append(ModelCopy(role, parameters, False, engine))
    return RLMemory(copies, activation_bytes_per_gpu, kv_cache_bytes_per_gpu if ONLINE[algo] else 0.0)


@dataclass(frozen=True)
class Fit:
    """Does an RL job fit on a device, and with how much to spare."""

    memory: RLMemory
    device_bytes: float
    usable_fraction: float  # of the device's memory: the rest goes to the CUDA context, the allocator's slack

    @property
    def usable_bytes(self) -> float:
        return self.device_bytes * self.usable_fraction

    @property
    def fits(self) -> bool:
        return self.memory.total_bytes <= self.usable_bytes

    @property
    def headroom_bytes(self) -> float:
        return self.usable_bytes - self.memory.total_bytes


def fits(memory: RLMemory, device_bytes: float, usable_fraction: float = 0.9) -> Fit:
    """Whether `memory` (per GPU) fits in `device_bytes`, keeping 1 - usable_fraction back."""
    if not 0 < usable_fraction <= 1:
        raise ValueError(f"usable_fraction={usable_fraction}: a fraction in (0, 1]")
    return Fit(memory, device_bytes, usable_fraction)


@dataclass(frozen=True)
class StepEnvelope:
    """The peak of one colocated RL step in one process, by what is live in each phase (bytes)."""

    runtime: float  # the interpreter, torch and transformers before any model exists
    resident: dict[str, float]  # alive through the whole step: weights, reference, optimizer state
    phases: dict[str, dict[str, float]] = field(default_factory=dict)  # phase -> what it adds on top

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: sum(self.phases[p].values()))

    @property
    def peak_bytes(self) -> float:
        return self.runtime + sum(self.resident.values()) + sum(self.phases[self.peak_phase].values())


def colocated_step_peak(shape: ModelShape, parameters: float, *, runtime_bytes: float, reference: bool,
                        sampler_rows: int, sampler_positions: int, train_tokens: int, logits_chunk_tokens: int,
                        precision: Precision = FP32_ADAMW) -> StepEnvelope:
    """Peak memory of our colocated RL step (roles/controller.py) once AdamW's moments
    exist (from the first update on): the weights, a reference copy (when the loss or the
    KL log reads it), m and v stay all along; the rollout adds its KV cache (sampler_rows ×
    sampler_positions) and its logits; the update adds the gradients, the activations of
    the `train_tokens` tokens of one forward/backward (all rows, or a micro-batch's; with a
    shared prompt, each group's prompt once plus every response) and one chunk of log-prob
    logits (models/logprobs.py computes them chunk by chunk and recomputes in backward)."""
    weight = precision.weight_bytes
    resident = {"policy weights": parameters * weight, "optimizer state": parameters * precision.sharded_optimizer_bytes}
    if reference:
        resident["reference weights"] = parameters * weight
    # the sampler draws from float32 logits: the logits, log-softmax, probabilities and a float64 CDF, all (rows, V)
    sampler_logits = sampler_rows * shape.vocab * (4 + 4 + 4 + 8)
    phases = {
        "rollout": {"kv cache": kv_cache_bytes(shape, sampler_rows, sampler_positions, weight),
                    "sampler logits": sampler_logits},
        # the chunk's logits, their softmax and the product the entropy sums: three (tokens, V) tensors
        "update": {"gradients": parameters * precision.grad_bytes,
                   "activations": activation_bytes(shape, 1, train_tokens, weight),
                   "logits chunk": logits_bytes(logits_chunk_tokens, shape.vocab, 4, copies=3)},
    }
    return StepEnvelope(runtime_bytes, resident, phases)
