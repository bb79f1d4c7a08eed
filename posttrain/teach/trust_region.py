"""TRPO's step next to PPO's, on one batch and one policy, for lesson 27.

TRPO (Schulman et al. 2015, arXiv:1502.05477) maximises the surrogate
L(θ) = mean_t ρ_t · A_t subject to KL(π_old ‖ π_θ) ≤ δ: it linearises L, approximates the KL
by its second-order term ½ Δᵀ F Δ (F the Fisher matrix), solves F x = g by conjugate
gradient using only Fisher-vector products, scales x to land on the KL boundary and backs
off along it until the true KL is within δ and L improved. PPO's clip replaces all of that
with a flat objective past ratio 1 ± ε and a few plain gradient epochs.

Teaching code, not a registered algorithm: it needs the full next-token distribution (the
exact KL, not a sampled estimate) and a whole-batch second-order solve that the trainer's
minibatch loop does not do.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from posttrain.algorithms.core import clipped_surrogate, masked_mean
from posttrain.types import RolloutBatch


def response_log_probs(model: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """log π(· | prefix) over the whole vocabulary at every predicted position, (B, T-1, V):
    row t is the distribution that produced tokens[:, t+1]."""
    # the plain-math attention kernel: the fused CPU kernel has no second derivative, and the
    # Fisher-vector product differentiates the KL's gradient
    with sdpa_kernel(SDPBackend.MATH):
        hidden = model.hidden_states(batch.tokens, batch.attention_mask)  # type: ignore[operator]  # (B, T, D)
    logits = model.lm_head(hidden[:, :-1]).float() / batch.temperature  # type: ignore[operator]  # (B, T-1, V)
    return torch.log_softmax(logits, dim=-1)


def mean_kl(old_dist: torch.Tensor, new_dist: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    """KL(π_old ‖ π_θ) summed over the vocabulary, averaged over response tokens: the exact
    quantity TRPO constrains (not the k1/k3 sample estimates the trainer logs)."""
    per_token = (old_dist.exp() * (old_dist - new_dist)).sum(-1)  # (B, T-1)
    return masked_mean(per_token, batch.response_mask[:, 1:])


def surrogate(dist: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    """L(θ) = token-mean of ρ_t · A_t, ρ_t = π_θ(token) / π_old(token): the objective both
    methods improve. The batch's advantages must be filled in (GRPO's, say)."""
    taken = dist.gather(-1, batch.tokens[:, 1:, None])[..., 0]  # (B, T-1) log π_θ(token)
    ratio = (taken - batch.old_logp[:, 1:]).exp()  # (B, T-1)
    if batch.advantages is None:
        raise ValueError("the batch has no advantages: fill them first, e.g. with "
                         "dataclasses.replace(batch, **make_algorithm('grpo').compute_advantages(batch))")
    return masked_mean(ratio * batch.advantages[:, 1:], batch.response_mask[:, 1:])


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _set_flat(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()


def conjugate_gradient(matvec: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, iters: int = 10,
                       tol: float = 1e-10) -> torch.Tensor:
    """x ≈ A⁻¹ b for a symmetric positive-definite A known only through x ↦ A x: never forms
    A, which for a policy would be (parameters × parameters)."""
    x = torch.zeros_like(b)
    r, p = b.clone(), b.clone()  # residual b − A x at x = 0, and the first search direction
    rr = r @ r
    for _ in range(iters):
        ap = matvec(p)
        alpha = rr / (p @ ap)
        x += alpha * p
        r -= alpha * ap
        rr_next = r @ r
        if rr_next < tol:
            break
        p = r + (rr_next / rr) * p
        rr = rr_next
    return x


def trpo_step(model: torch.nn.Module, batch: RolloutBatch, max_kl: float, cg_iters: int = 10,
              damping: float = 0.01, backtracks: int = 12) -> tuple[torch.nn.Module, dict[str, float]]:
    """One TRPO update of a copy of `model` on `batch`. Returns (the updated copy, metrics):
    kl (exact mean KL reached), gain (L(θ_new) − L(θ_old)), predicted_kl (½ Δᵀ F Δ of the
    full step, = max_kl by construction), step_fraction (the line search's 0.5^k) and
    accepted (1 if a step within max_kl that improves L was found, else 0: θ is unchanged).
    `damping` adds λI to F so conjugate gradient stays stable where F is nearly singular."""
    policy = copy.deepcopy(model).train(False).requires_grad_(True)
    params = [p for p in policy.parameters() if p.requires_grad]
    with torch.no_grad():
        old_dist = response_log_probs(policy, batch)  # (B, T-1, V) π_old, a constant
    theta_old = _flat(params).detach().clone()

    dist = response_log_probs(policy, batch)
    gain_old = surrogate(dist, batch)
    g = _flat(torch.autograd.grad(gain_old, params, retain_graph=True))  # ∇L at θ_old
    kl = mean_kl(old_dist, dist, batch)
    kl_grad = _flat(torch.autograd.grad(kl, params, create_graph=True))  # 0 at θ_old, but its Jacobian is F

    def fisher_vector(v: torch.Tensor) -> torch.Tensor:
        # F v = ∇(∇KL · v): the Hessian of the KL at θ_old, which is the Fisher matrix
        return _flat(torch.autograd.grad(kl_grad @ v, params, retain_graph=True)) + damping * v

    direction = conjugate_gradient(fisher_vector, g, iters=cg_iters)  # ≈ F⁻¹ g, the natural gradient
    quadratic = direction @ fisher_vector(direction)  # xᵀ F x
    full_step = (2 * max_kl / quadratic).sqrt() * direction  # ½ Δᵀ F Δ = δ exactly
    metrics = {"predicted_kl": 0.5 * (full_step @ fisher_vector(full_step)).item(), "accepted": 0.0,
               "step_fraction": 0.0, "kl": 0.0, "gain": 0.0, "gain_old": gain_old.item()}
    with torch.no_grad():
        for k in range(backtracks):
            fraction = 0.5 ** k
            _set_flat(params, theta_old + fraction * full_step)
            new_dist = response_log_probs(policy, batch)
            new_kl, gain = mean_kl(old_dist, new_dist, batch).item(), (surrogate(new_dist, batch) - gain_old).item()
            if new_kl <= max_kl and gain > 0:  # the quadratic model was trusted only this far
                metrics.update(accepted=1.0, step_fraction=fraction, kl=new_kl, gain=gain)
                return policy, metrics
        _set_flat(params, theta_old)  # no acceptable step: TRPO keeps θ_old
    return policy, metrics


def ppo_step(model: torch.nn.Module, batch: RolloutBatch, clip_eps: float, epochs: int = 8,
             lr: float = 3e-4) -> tuple[torch.nn.Module, dict[str, float]]:
    """`epochs` full-batch Adam steps on a copy of `model` with PPO's clipped loss
    (`clipped_surrogate`, ratio in [1 − ε, 1 + ε]). Returns (the copy, metrics): the same
    exact kl and gain as `trpo_step`, and clipfrac at the last epoch. Nothing here bounds the
    KL: the clip only stops the push on tokens already past 1 ± ε."""
    policy = copy.deepcopy(model).train(False).requires_grad_(True)
    with torch.no_grad():
        old_dist = response_log_probs(policy, batch)
        gain_old = surrogate(old_dist, batch).item()
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    if batch.advantages is None:
        raise ValueError("the batch has no advantages: fill them before the PPO step, e.g. with GRPO's "
                         "compute_advantages")
    mask = batch.response_mask[:, 1:]
    clip: dict[str, float] = {}
    for _ in range(epochs):
        taken = response_log_probs(policy, batch).gather(-1, batch.tokens[:, 1:, None])[..., 0]  # (B, T-1)
        loss, clip = clipped_surrogate(taken, batch.old_logp[:, 1:], batch.advantages[:, 1:], mask,
                                       clip_eps, clip_eps)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        new_dist = response_log_probs(policy, batch)
        metrics = {"kl": mean_kl(old_dist, new_dist, batch).item(),
                   "gain": surrogate(new_dist, batch).item() - gain_old, "clipfrac": clip.get("clipfrac", 0.0)}
    return policy, metrics
