"""Reference: a frozen copy of the starting policy.

Its log-probs anchor the KL term that keeps the trained policy from drifting far from
where it started (where the reward is still trustworthy and the text still fluent).
It is a separate copy, never updated; it is only run when the algorithm asks for it
(`algorithm.uses_reference`), because the extra forward pass is not free.
"""

from __future__ import annotations

import copy

import torch

from posttrain.models import load_checkpoint_model
from posttrain.models.device import model_device, place
from posttrain.models.logprobs import response_logp
from posttrain.types import RolloutBatch


class Reference:
    def __init__(self, policy: torch.nn.Module, share_prompt: bool = True):
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)
        self.share_prompt = share_prompt  # each group's prompt computed once (models/shared_prefix.py)

    @torch.no_grad()
    def logp(self, batch: RolloutBatch) -> torch.Tensor:
        """log π_ref(token | prefix), (B, T), zero off the response."""
        return response_logp(self.model, batch, self.share_prompt)


class AdapterOff(torch.nn.Module):
    """A LoRA policy with its adapters switched off, i.e. the frozen base it started from,
    as a module: forward, hidden_states and lm_head run the policy's own parameters, so it
    adds no second copy of the weights. Both the RL reference below and the preference
    losses (which call the module itself) read π_ref through it."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    @property
    def config(self):
        return self.policy.config

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.policy.compute_dtype

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.policy.lm_head  # LoRA adapts attention and MLP projections, never the head

    def forward(self, *args, **kwargs) -> torch.Tensor:
        with self.policy.adapter_disabled():
            return self.policy(*args, **kwargs)

    def hidden_states(self, *args, **kwargs) -> torch.Tensor:
        with self.policy.adapter_disabled():
            return self.policy.hidden_states(*args, **kwargs)

    def new_cache(self, *args, **kwargs):
        return self.policy.new_cache(*args, **kwargs)  # a cache holds no weights: the policy's kind serves


class AdapterOffReference(Reference):
    """The reference of a LoRA policy: the policy itself with its adapters switched off."""

    def __init__(self, policy: torch.nn.Module, share_prompt: bool = True):
        self.model = AdapterOff(policy)
        self.share_prompt = share_prompt


def make_reference(policy: torch.nn.Module, start_weights, share_prompt: bool = True) -> Reference:
    """The frozen starting policy: the weights at `start_weights`, or, for a LoRA policy,
    the policy with its adapters off."""

    if getattr(policy.config, "lora_r", 0):
        return AdapterOffReference(policy, share_prompt)
    # loaded on the CPU in float32; the reference then lives where the policy does, in its precision
    start = load_checkpoint_model(start_weights, policy.config)
    return Reference(place(start, model_device(policy), policy.compute_dtype), share_prompt)
