"""The memory envelope of one model: weights, gradients, optimizer state, activations, LoRA,
and how ZeRO spreads them over GPUs.

Training with AdamW keeps, per parameter:

                                  weights  grads  fp32 master  Adam m, v   total
    float32 (this machine)           4       4         -          8        16 bytes
    mixed precision, bf16 grads      2       2         4          8        16 bytes
    mixed precision, fp32 grads      2       4         4          8        18 bytes

so a 7B model needs 112-126 GB before a single activation: more than one 80 GB GPU.
Inference keeps the weights alone (2 bytes in bf16) plus the KV cache (kv_cache.py).

ZeRO (Rajbhandari et al. 2020, https://arxiv.org/abs/1910.02054) shards across N
data-parallel GPUs: stage 1 the optimizer state (master copy, m, v), stage 2 also the
gradients, stage 3 also the weights (what FSDP calls full sharding). Activations are
never sharded by ZeRO: each GPU keeps those of its own micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.systems.shapes import ModelShape


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each piece of training state."""

    name: str
    weight_bytes: float  # the copy the forward pass reads
    grad_bytes: float
    master_bytes: float  # an fp32 copy the optimizer updates when the weights are bf16 (0 in pure fp32)
    optimizer_bytes: float  # AdamW's first and second moments, fp32: 8

    @property
    def bytes_per_parameter(self) -> float:
        return self.weight_bytes + self.grad_bytes + self.master_bytes + self.optimizer_bytes

    @property
    def sharded_optimizer_bytes(self) -> float:
        """What ZeRO stage 1 shards: everything only the optimizer reads."""
        return self.master_bytes + self.optimizer_bytes


FP32_ADAMW = Precision("float32 AdamW", 4, 4, 0, 8)
MIXED_ADAMW = Precision("bf16 + fp32 master, AdamW", 2, 2, 4, 8)
MIXED_ADAMW_FP32_GRADS = Precision("bf16 + fp32 master and grads, AdamW", 2, 4, 4, 8)
PRECISIONS = {"fp32": FP32_ADAMW, "mixed": MIXED_ADAMW, "mixed_fp32_grads": MIXED_ADAMW_FP32_GRADS}


@dataclass(frozen=True)
class TrainingState:
    """Training state per GPU, in bytes."""

    weights: float
    grads: float
    optimizer: float  # master copy + Adam moments

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def training_state_bytes(parameters: float, precision: Precision, zero_stage: int = 0, gpus: int = 1,
                         trained_parameters: float | None = None) -> TrainingState:
    """Weights, gradients and optimizer state per GPU for `parameters` parameters of which
    `trained_parameters` (default: all) get gradients and optimizer state (LoRA trains a
    few), sharded over `gpus` by ZeRO stage 0 (replicated), 1, 2 or 3."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={zero_stage}: ZeRO has stages 0 (none), 1 (optimizer), 2 (+ gradients), "
                         "3 (+ weights)")
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: at least one")
    trained = parameters if trained_parameters is None else trained_parameters
    shard = lambda stage: gpus if zero_stage >= stage else 1  # noqa: E731 - the rule of the table above
    return TrainingState(weights=parameters * precision.weight_bytes / shard(3),
                         grads=trained * precision.grad_bytes / shard(2),
                         optimizer=trained * precision.sharded_optimizer_bytes / shard(1))


def inference_weight_bytes(parameters: float, bytes_per_weight: float = 2) -> float:
    """A frozen copy (reference, reward model, rollout engine): the weights alone."""
    return parameters * bytes_per_weight


def activation_elements_per_token(shape: ModelShape) -> int:
    """Numbers autograd keeps per token in one Llama block for the backward pass (no
    checkpointing, fused attention that keeps no T × T matrix), read off the block's ops:

        attention norm      its input and its output                      2 × hidden
        q, k, v             q and k after RoPE, v (the attention's inputs) q + 2 × kv
        attention output    the kernel's output and its reshaped copy     2 × q
        MLP norm            its input and its output                      2 × hidden
        SwiGLU              gate, up, silu(gate), silu(gate) × up          4 × intermediate

    (A 2-matrix GELU MLP keeps the activation's input and output: 2 × intermediate.)
    Korthikanti et al. 2022 (https://arxiv.org/abs/2205.05198) count the same way for GPT."""
    mlp = (2 * shape.mlp_matrices - 2) * shape.intermediate
    return 4 * shape.hidden + 3 * shape.q_dim + 2 * shape.kv_dim + mlp


def activation_bytes(shape: ModelShape, rows: int, seq_len: int, bytes_per_element: float,
                     checkpointing: bool = False, attention_matrix: bool = False) -> float:
    """Activations kept for backward over a micro-batch of `rows` × `seq_len` tokens.

    Without checkpointing every layer keeps activation_elements_per_token per token. With
    (per-layer) activation checkpointing each layer keeps only its input (hidden numbers per
    token), and backward recomputes one layer at a time, so one layer's full set is live on
    top. `attention_matrix`: an unfused attention also keeps its softmax, heads × seq_len
    numbers per token per layer (the T² term flash attention removes)."""
    tokens = rows * seq_len
    per_layer = activation_elements_per_token(shape) + (shape.n_heads * seq_len if attention_matrix else 0)
    if checkpointing:
        return tokens * (shape.n_layers * shape.hidden + per_layer) * bytes_per_element
    return tokens * shape.n_layers * per_layer * bytes_per_element


def logits_bytes(tokens: int, vocab: int, bytes_per_element: float = 4, copies: int = 2) -> float:
    """The output layer's logits over `tokens` positions: with a 150k vocabulary the largest
    tensor of a step. Two copies by default (the logits and the softmax backward needs);
    computing log-probs in chunks (models/logprobs.py) caps `tokens` at one chunk."""
    return tokens * vocab * bytes_per_element * copies


# the projections LoRA adapts here (models/hf.py add_lora): every one
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_parameter_count(shape: ModelShape, rank: int, targets: tuple[str, ...] = LORA_TARGETS) -> int:
    """Adapter parameters: rank × (d_in + d_out) for each adapted matrix of each layer
    (Hu et al. 2021: W + B·A with A of r × d_in and B of d_out × r)."""
    sizes = {"q_proj": (shape.hidden, shape.q_dim), "k_proj": (shape.hidden, shape.kv_dim),
             "v_proj": (shape.hidden, shape.kv_dim), "o_proj": (shape.q_dim, shape.hidden),
             "gate_proj": (shape.hidden, shape.intermediate), "up_proj": (shape.hidden, shape.intermediate),
             "down_proj": (shape.intermediate, shape.hidden)}
    unknown = [t for t in targets if t not in sizes]
    if unknown:
        raise ValueError(f"LoRA targets {unknown} are not known: expected some of {list(sizes)}")
    if rank < 1:
        raise ValueError(f"LoRA rank={rank}: at least 1")
    return shape.n_layers * sum(rank * (d_in + d_out) for d_in, d_out in (sizes[t] for t in targets))


def lora_training_bytes(parameters: float, adapter_parameters: float, precision: Precision,
                        base_bytes_per_weight: float | None = None) -> TrainingState:
    """LoRA: the base frozen at `base_bytes_per_weight` (default: the precision's weight
    bytes; 0.5 for a 4-bit QLoRA base), the adapters trained with the full per-parameter
    state. The frozen base doubles as the reference model (adapters switched off)."""
    base = precision.weight_bytes if base_bytes_per_weight is None else base_bytes_per_weight
    return TrainingState(weights=parameters * base + adapter_parameters * precision.weight_bytes,
                         grads=adapter_parameters * precision.grad_bytes,
                         optimizer=adapter_parameters * precision.sharded_optimizer_bytes)
