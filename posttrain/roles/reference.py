"""Reference: a frozen copy of the starting policy.

Its log-probs anchor the KL term that keeps the trained policy from drifting far from
where it started (where the reward is still trustworthy and the text still fluent).
It is a separate copy, never updated. The extra forward pass is not free, so a step runs
it as far as something reads it (`Reference.score`): on every row when the loss has a KL
term (`algorithm.uses_reference`) or an implicit PRM reads π_ref; on an evenly spaced
sample of rows when only the logged KL does (rl.kl.track_rows); not at all without one
(`NoReference`: rl.kl.track false and no KL term).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from posttrain.algorithms.core import kl_k3, masked_mean
from posttrain.models import load_checkpoint_model
from posttrain.models.device import model_device, place
from posttrain.models.hf import HFPolicy
from posttrain.models.logprobs import response_logp
from posttrain.models.policy import Policy, PolicyShape
from posttrain.types import RolloutBatch


def evenly_spaced_rows(batch_size: int, n: int) -> list[int]:
    """n of batch_size rows, evenly spaced: rows are grouped by prompt, so every part of the
    batch is represented, and the choice is the same on a resumed run."""
    return [i * batch_size // n for i in range(n)]


def kl_to_reference(batch: RolloutBatch, ref_logp: torch.Tensor) -> float:
    """KL(π_old ‖ π_ref) estimated on the sampled tokens with k3 (unbiased, never negative)."""
    return masked_mean(kl_k3(batch.old_logp, ref_logp), batch.response_mask).item()


class Reference:
    """`every_row`: whether something besides the KL log reads ref_logp (a KL term in the loss,
    which an adaptive KL controller always has, its β being multiplied and never 0; an implicit
    PRM), so that every row is scored. Otherwise `log_rows` rows of each batch are (a mean needs
    a sample, not every row); 0 = every row."""

    def __init__(self, policy: Policy, share_prompt: bool = True, every_row: bool = True, log_rows: int = 0):
        self.model: Policy = copy.deepcopy(policy).eval().requires_grad_(False)
        self.share_prompt = share_prompt  # each group's prompt computed once (models/shared_prefix.py)
        self.every_row, self.log_rows = every_row, log_rows

    @torch.no_grad()
    def logp(self, batch: RolloutBatch) -> torch.Tensor:
        """log π_ref(token | prefix), (B, T), zero off the response."""
        return response_logp(self.model, batch, self.share_prompt)

    def score(self, batch: RolloutBatch) -> dict[str, float]:
        """Step 3 of the controller: batch.ref_logp on every row, or the KL to the reference
        measured on a sample of rows (a sample as large as the batch is the batch)."""
        if self.every_row or not 0 < self.log_rows < batch.batch_size:
            batch.ref_logp = self.logp(batch)
            return {}
        logged = batch.select(evenly_spaced_rows(batch.batch_size, self.log_rows))
        return {"kl_ref": kl_to_reference(logged, self.logp(logged))}


class NoReference:
    """No reference at all: nothing in the loss reads π_ref, and the KL is not logged."""

    def score(self, batch: RolloutBatch) -> dict[str, float]:
        return {}


class AdapterOff(torch.nn.Module):
    """A LoRA policy with its adapters switched off, i.e. the frozen base it started from,
    as a module: forward, hidden_states and lm_head run the policy's own parameters, so it
    adds no second copy of the weights. Both the RL reference below and the preference
    losses (which call the module itself) read π_ref through it."""

    def __init__(self, policy: HFPolicy) -> None:
        super().__init__()
        self.policy = policy

    @property
    def config(self) -> PolicyShape:
        return self.policy.config

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.policy.compute_dtype

    @property
    def lm_head(self) -> torch.nn.Linear:
        return self.policy.lm_head  # LoRA adapts attention and MLP projections, never the head

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        with self.policy.adapter_disabled():
            return self.policy(*args, **kwargs)

    def hidden_states(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        with self.policy.adapter_disabled():
            return self.policy.hidden_states(*args, **kwargs)

    def new_cache(self, *args: Any, **kwargs: Any) -> Any:
        return self.policy.new_cache(*args, **kwargs)  # a cache holds no weights: the policy's kind serves


class AdapterOffReference(Reference):
    """The reference of a LoRA policy: the policy itself with its adapters switched off."""

    def __init__(self, policy: HFPolicy, share_prompt: bool = True, every_row: bool = True, log_rows: int = 0):
        self.model = AdapterOff(policy)
        self.share_prompt = share_prompt
        self.every_row, self.log_rows = every_row, log_rows


def make_reference(policy: Policy, start_weights: Path, share_prompt: bool = True, every_row: bool = True,
                   log_rows: int = 0) -> Reference:
    """The frozen starting policy: the weights at `start_weights`, or, for a LoRA policy,
    the policy with its adapters off. `every_row`, `log_rows`: see Reference."""

    if isinstance(policy, HFPolicy) and policy.config.lora_r:  # LoRA is HFPolicy's (models/hf.py::add_lora)
        return AdapterOffReference(policy, share_prompt, every_row, log_rows)
    # loaded on the CPU in float32; the reference then lives where the policy does, in its precision
    start = load_checkpoint_model(start_weights, policy.config)
    return Reference(place(start, model_device(policy), policy.compute_dtype), share_prompt, every_row, log_rows)
