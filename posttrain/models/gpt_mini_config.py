"""GPTMiniConfig: the shape of a gpt_mini, and the checks that a checkpoint fits it.

A checkpoint's config.json is a transformers Llama config (models/llama_format.py reads
and writes it); `read_llama_config` turns it into a GPTMiniConfig, refusing what GPTMini
cannot represent, and `check_same_config` lists every field where a checkpoint differs
from the config a run expects, instead of loading it into the wrong function.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from .llama_format import gpt_mini_fields


@dataclass
class GPTMiniConfig:
    vocab_size: int  # no default: it must match the tokenizer (CharTokenizer: 100)
    # With the defaults below the model has ~0.8M parameters: the prototype's size (ARCHITECTURE.md),
    # which learns the synthetic arithmetic tasks from scratch in minutes on 2 CPU cores.
    dim: int = 128
    n_layer: int = 4  # enough depth for a running sum over five numbers
    n_head: int = 4  # head_dim 32: wide enough per head, and even, as RoPE needs
    # ~8/3 * dim rounded up to a multiple of 32 (Llama's recipe): SwiGLU's three matrices
    # then cost about what the two of a classic 4 * dim MLP do.
    hidden_dim: int = 352
    max_seq_len: int = 128  # prompt + chain of thought + "Final: n" fits with room to spare
    rope_theta: float = 10000.0  # RoFormer's base; short sequences need no long-context base
    norm_eps: float = 1e-5  # Llama-2's value; keeps rsqrt finite on an all-zero vector
    tie_embeddings: bool = False  # Llama's default; with V = 100 tying saves only V * dim

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layer", "n_head", "hidden_dim", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTMiniConfig.{name}={value!r}: must be a positive int")
        for name in ("rope_theta", "norm_eps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GPTMiniConfig.{name}={getattr(self, name)!r}: must be > 0")
        if self.dim % self.n_head != 0:
            raise ValueError(
                f"GPTMiniConfig.dim={self.dim} is not divisible by n_head={self.n_head}: "
                f"each head gets dim / n_head channels; pick n_head dividing {self.dim}"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"GPTMiniConfig head_dim = dim / n_head = {self.head_dim} is odd: RoPE "
                "rotates channel pairs, so head_dim must be even; change dim or n_head"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit the model or config it is loaded into."""


def check_same_config(config: GPTMiniConfig, expected: GPTMiniConfig, directory: Path) -> None:
    """Raise CheckpointMismatchError listing every field where a checkpoint's config differs."""
    diffs = {
        f.name: (getattr(config, f.name), getattr(expected, f.name))
        for f in fields(GPTMiniConfig)
        if getattr(config, f.name) != getattr(expected, f.name)
    }
    if diffs:
        raise CheckpointMismatchError(
            f"checkpoint {directory} was saved with a different config:\n"
            + mismatch_lines(diffs)
            + "\nChange your config to match the checkpoint (e.g. --model.dim), or start from a "
            "checkpoint of this shape."
        )


def mismatch_lines(diffs: dict[str, tuple]) -> str:
    """One `name: checkpoint=X, expected=Y` line per differing field or tensor."""
    return "\n".join(f"  {k}: checkpoint={a}, expected={b}" for k, (a, b) in diffs.items())


def read_llama_config(directory: Path) -> GPTMiniConfig:
    """directory/config.json (LlamaConfig fields) -> GPTMiniConfig, refusing what GPTMini
    cannot represent instead of loading it wrong (models/llama_format.py reads the file)."""
    return GPTMiniConfig(**gpt_mini_fields(directory))

