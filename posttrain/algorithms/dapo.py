"""DAPO: Decoupled Clip and Dynamic sAmpling Policy Optimization (Yu et al., arXiv:2503.14476).

Background. DAPO is GRPO with the KL term removed and four fixes for long chain-of-thought
RL, each a few lines:

1. Clip-higher (Sec. 3.1). PPO's symmetric clip caps how fast an unlikely token can grow:
   ratio ≤ 1 + ε lets p = 0.01 reach only 0.012, while p = 0.9 may reach 1.08. Entropy
   collapses. Decoupling the bounds, ε_low = 0.2 and ε_high = 0.28, leaves room to explore.
2. Dynamic sampling (Sec. 3.2). A group whose K rewards are all equal has advantage 0 on
   every sample, so it adds no gradient but still dilutes the batch. Over-sample and keep
   only groups with 0 < accuracy < 1 (`informative_groups`, `DAPO.filter_batch`).
3. Token-level loss (Sec. 3.3). GRPO averages within each sequence first, so a token of a
   long response weighs less than a token of a short one. DAPO averages over all tokens
   of the batch: loss_agg="token-mean".
4. Overlong reward shaping (Sec. 3.4). Truncated responses used to get the same reward as
   wrong ones, which punishes sound but long reasoning. The soft penalty ramps from 0 to −1
   over the last L_cache tokens of the budget L_max and is added to the reward:

       R_length(|y|) = 0                               |y| ≤ L_max − L_cache
                     = ((L_max − L_cache) − |y|) / L_cache   L_max − L_cache < |y| ≤ L_max
                     = −1                              L_max < |y|

Conventions: advantages are GRPO's (group mean, unbiased group std); the penalty is added
before normalisation; dynamic sampling filters on the verifier's reward (batch.rewards,
without the length penalty), as the paper filters on accuracy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.contract import check_field
from posttrain.algorithms.grpo import GRPO
from posttrain.types import PolicyOutputs, RolloutBatch


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO's soft overlong punishment R_length (arXiv:2503.14476, Sec. 3.4), (B,).

    Args:
        lengths:   (B,) response lengths in tokens (EOS included).
        max_len:   L_max, the generation budget.
        cache_len: L_cache, the width of the ramp at the end of the budget; 0 turns it off.

    0 up to L_max − L_cache, then linear down to −1 at L_max, and −1 beyond.
    """
    if cache_len <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    expected = max_len - cache_len  # the length a response may use for free
    return ((expected - lengths.float()) / cache_len).clamp(min=-1.0, max=0.0)


def informative_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) bool: True for rows whose group's rewards are not all equal (non-zero variance).

    Equality is exact (max == min), not std > 0, which float rounding could trip. Only
    such groups carry a group-relative learning signal (arXiv:2503.14476, Sec. 3.2)."""
    _, idx = torch.unique(group_ids, return_inverse=True)  # (B,) ids relabelled 0..G-1
    G = int(idx.max()) + 1 if idx.numel() else 0
    gmax = rewards.new_full((G,), -torch.inf).scatter_reduce(0, idx, rewards, "amax")  # (G,)
    gmin = rewards.new_full((G,), torch.inf).scatter_reduce(0, idx, rewards, "amin")  # (G,)
    return (gmax > gmin)[idx]  # (B,)


@dataclass
class DAPO(GRPO):
    """GRPO + clip-higher + token-level loss + overlong shaping + dynamic sampling.

    Dynamic sampling is the controller's loop; this class gives it the filter. The contract:

        kept = []                                # whole groups only
        while groups(kept) < prompts_per_step and rounds < max_rounds:
            batch = sample and score a fresh set of prompts (group ids unique across rounds)
            kept.append(algo.filter_batch(batch))   # drops all-equal groups
        batch = concatenate(kept), truncated to prompts_per_step whole groups
        batch = replace(batch, **algo.compute_advantages(batch))

    Cap the rounds (a policy that solves everything would loop forever) and log the
    fraction of groups dropped. Never call compute_advantages on an empty batch.
    """

    name: ClassVar[str] = "dapo"

    clip_eps_low: float = 0.2  # Sec. 3.1: ε_low stays at PPO's 0.2
    clip_eps_high: float = 0.28  # Sec. 3.1: clip-higher
    loss_agg: str = "token-mean"  # Sec. 3.3: every token of the batch weighs the same
    # L_max (Sec. 3.4) = the generation budget, the same quantity GRPO's max_len names; no
    # default of its own: `posttrain train` fills in rl.sampling.max_new_tokens (a longer
    # response raises an error instead of being silently penalised).
    max_len: int | None = None
    # L_cache: the paper uses 4096 of a 20480-token budget (20%); 20% of 48 is ~10.
    overlong_cache: int = 10
    dynamic_sampling: bool = True  # Sec. 3.2; filter_batch is a no-op when False

    @property
    def accepts_turn_rows(self) -> bool:  # type: ignore[override]
        """Not with overlong shaping: it would charge a turn row for its turn's length."""
        return self.overlong_cache == 0

    @property
    def accepts_reward_terms(self) -> bool:  # type: ignore[override]
        """Not with overlong shaping: its penalty is added to the summed reward, outside any term."""
        return super().accepts_reward_terms and self.overlong_cache == 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_field(self, "overlong_cache", isinstance(self.overlong_cache, int) and self.overlong_cache >= 0,
                    "an int >= 0 (0 turns the overlong penalty off)")
        if self.overlong_cache > 0:
            check_field(self, "max_len", isinstance(self.max_len, int) and self.max_len > self.overlong_cache,
                        f"an int > overlong_cache={self.overlong_cache} (L_max, the generation budget)")

    def filter_batch(self, batch: RolloutBatch) -> RolloutBatch:
        """The rows of `batch` whose group has non-zero reward variance (all rows when
        dynamic_sampling is False). Call it after scoring, before compute_advantages."""
        if not self.dynamic_sampling:
            return batch
        keep = informative_groups(batch.rewards, batch.group_ids)  # (B,)
        return batch.select(keep.nonzero().squeeze(-1))

    def shaped_rewards(self, batch: RolloutBatch) -> torch.Tensor:
        """batch.rewards + R_length, (B,)."""
        lengths = batch.response_lengths()  # (B,)
        if self.overlong_cache > 0 and batch.batch_size and lengths.max() > (self.max_len or 0):
            raise ValueError(
                f"a response has {int(lengths.max())} tokens but DAPO.max_len={self.max_len}: set max_len to the "
                "rollout's max_new_tokens (the overlong penalty measures lengths against it)"
            )
        return batch.rewards + overlong_penalty(lengths, self.max_len or 0, self.overlong_cache)

    @torch.no_grad()
    def compute_advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """GRPO's advantages of the length-shaped rewards."""
        return super().compute_advantages(dataclasses.replace(batch, rewards=self.shaped_rewards(batch)))

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """GRPO's loss with DAPO's defaults, plus the fraction of responses the overlong
        penalty touched."""
        loss, metrics = super().compute_loss(outputs, batch)
        penalty = overlong_penalty(batch.response_lengths(), self.max_len or 0, self.overlong_cache)
        metrics["overlong_frac"] = (penalty < 0).float().mean().item()
        return loss, metrics
