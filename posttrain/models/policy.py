"""Policy: what the library calls on a policy model.

    PolicyShape  the sizes a caller reads off `policy.config`: dim, max_seq_len, vocab_size
    Trainable    what the one Trainer (roles/trainer.py) calls on any model it trains:
                 parameters and train(); a policy, a reward model, a PRM
    Policy       config, compute_dtype, lm_head, hidden_states, new_cache, and the
                 torch.nn.Module methods the roles call on a policy (the forward pass to
                 logits, eval, state_dict, ...)
    SavablePolicy  a Policy that writes itself as a checkpoint: save_pretrained

Two kinds implement it, GPTMini (models/gpt_mini.py) and HFPolicy (models/hf.py), and so do
the wrappers that stand in for one (the reference with its LoRA adapters off,
roles/reference.py; a reward model's body). It is a structural protocol: none of them
inherits from it, and a type checker verifies each against it where one is passed. Naming
it on a signature says what the function reads; `torch.nn.Module` alone would not, since
Module's `__getattr__` makes every unknown attribute a "Tensor | Module". Python has no
"a Module and a Policy" type, so the Module methods a holder of a policy calls are declared
here too: every torch.nn.Module has them, with these signatures.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import torch

from posttrain.types import Tokenizer


class PolicyShape(Protocol):
    """The sizes of a policy (GPTMiniConfig, HFPolicyConfig), read-only here."""

    @property
    def dim(self) -> int: ...  # D, the width of the hidden states

    @property
    def max_seq_len(self) -> int: ...  # the longest row, prompt and response, it can read

    @property
    def vocab_size(self) -> int: ...  # V, the width of the logits


class Trainable(Protocol):
    """A model the one Trainer trains (roles/trainer.py): the optimizer takes its
    parameters, and train() switches it to training mode before each step."""

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def train(self, mode: bool = True) -> Trainable: ...


class Policy(Trainable, Protocol):
    """A causal LM as the roles drive it: final hidden states (B, T, D) for token ids (B, T),
    the (D -> V) output layer kept apart so log-probs are computed a chunk at a time
    (models/logprobs.py), an empty KV cache to sample with, and the dtype its forward passes
    run in (models/device.py)."""

    @property
    def config(self) -> PolicyShape: ...

    @property
    def compute_dtype(self) -> torch.dtype: ...

    @property
    def lm_head(self) -> torch.nn.Linear: ...

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      position_ids: torch.Tensor | None = None, kv_cache: Any = None) -> torch.Tensor: ...

    def new_cache(self, batch_size: int, max_len: int | None = None) -> Any: ...

    # ---- torch.nn.Module's, as a holder of a policy calls them -----------------------------

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None, kv_cache: Any = None) -> torch.Tensor:
        """The logits (B, T, V): lm_head of the hidden states."""
        ...

    @property
    def training(self) -> bool: ...  # train() sets it, eval() clears it

    def train(self, mode: bool = True) -> Policy: ...

    def eval(self) -> Policy: ...

    def requires_grad_(self, requires_grad: bool = True) -> Policy: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any: ...

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]: ...

    def buffers(self) -> Iterator[torch.Tensor]: ...

    def modules(self) -> Iterator[torch.nn.Module]: ...

    def named_modules(self) -> Iterator[tuple[str, torch.nn.Module]]: ...


class SavablePolicy(Policy, Protocol):
    """A policy with weights of its own to write (GPTMini, HFPolicy, and so a reward model's
    body). A view of another policy's weights, such as the reference with LoRA adapters off
    (roles/reference.py::AdapterOff), is a Policy but not this."""

    def save_pretrained(self, directory: str | os.PathLike[str], tokenizer: Tokenizer | None = None) -> None:
        """A checkpoint directory transformers can load, with `tokenizer` beside the weights."""
        ...
