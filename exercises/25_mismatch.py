"""Exercise 25 · How far the sampler is from the trainer (lesson 25).

The same sampled tokens have a log-prob under the sampler that drew them and under the
trainer: sampler_logp and trainer_logp, one number per token. With the importance weight
w = π_trainer / π_sampler = exp(trainer_logp − sampler_logp) of each token, return a float
tensor of four numbers:

    mean |trainer_logp − sampler_logp|          nats per token
    mean (w − 1 − log w)                         k3: KL(sampler ‖ trainer), tokens drawn by the sampler
    share of tokens with w > cap                 what a truncated weight would clip
    (Σ w)² / (n · Σ w²)                          the effective sample fraction: 1 = no loss

Compute in float64: a KL of 1e-7 is what float32 rounds away.

Check:  posttrain check 25
"""

import torch


def mismatch_stats(sampler_logp: torch.Tensor, trainer_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """(4,) [mean |Δ|, k3 KL, clipped fraction, effective sample fraction] from two (n,) log-probs."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 25: write mismatch_stats")
    # ---- END OF YOUR CODE ----
