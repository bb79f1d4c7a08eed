"""Policy: what the library calls on a policy model, beyond what every torch.nn.Module has.

    PolicyShape  the sizes a caller reads off `policy.config`: dim, max_seq_len, vocab_size
    Policy       config, compute_dtype, lm_head, hidden_states, new_cache (and parameters)

Two kinds implement it, GPTMini (models/gpt_mini.py) and HFPolicy (models/hf.py), and so do
the wrappers that stand in for one (the reference with its LoRA adapters off,
roles/reference.py; a reward model's body). It is a structural protocol: none of them
inherits from it, and a type checker verifies each against it where one is passed. Naming
it on a signature says what the function reads; `torch.nn.Module` alone would not, since
Module's `__getattr__` makes every unknown attribute a "Tensor | Module".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch


class PolicyShape(Protocol):
    """The sizes of a policy (GPTMiniConfig, HFPolicyConfig), read-only here."""

    @property
    def dim(self) -> int: ...  # D, the width of the hidden states

    @property
    def max_seq_len(self) -> int: ...  # the longest row, prompt and response, it can read

    @property
    def vocab_size(self) -> int: ...  # V, the width of the logits


class Policy(Protocol):
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

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...
