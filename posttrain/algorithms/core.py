"""Shared math for every RL algorithm, and the contract each algorithm follows.

Every function here is pure: tensors and scalars in, tensors (or floats) out, no config
objects. Conventions used throughout:

    B   rows (episodes) in the batch        T   token positions per row (padded)
    V   vocabulary size                     G   number of groups (prompts)

Per-token tensors are (B, T) and aligned with `batch.tokens`: position t of `logp`,
`old_logp`, `ref_logp` holds log π(tokens[t] | tokens[<t]). Masks are float 1.0 / 0.0;
`response_mask` is 1 exactly on the tokens the policy generated (EOS included). Nothing
at a masked-out position may reach a result or a gradient: the functions below use
`torch.where` rather than `x * mask` wherever a padded value could be inf or NaN,
because inf * 0 is NaN.
"""

from __future__ import annotations

import dataclasses

from typing import Callable, ClassVar, Protocol

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from posttrain.types import PolicyOutputs, RolloutBatch

# exp() overflows float32 above ~88. Log-ratios are clamped to ±20 before exponentiating:
# a ratio of e^20 ≈ 5e8 is already far outside any trust region, so the clamp only ever
# touches tokens that are broken anyway, and it keeps one such token from turning the
# whole batch's loss into inf or NaN.
MAX_LOG_RATIO = 20.0


# --------------------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------------------


class Algorithm(Protocol):
    """What the controller and trainer need from an RL algorithm.

    An algorithm is a `@dataclass` whose fields are its hyperparameters (each default
    commented with its source), validated in `__post_init__` (a bad value raises
    ValueError naming the field, the value and what is allowed). Because every
    algorithm has this same shape, the registry is a plain dict of classes.

    The controller runs, once per rollout batch::

        batch = dataclasses.replace(batch, **algo.compute_advantages(batch))

    and the trainer, for each (mini)batch and each epoch::

        loss, metrics = algo.compute_loss(outputs, batch)
        loss.backward()
    """

    name: ClassVar[str]  # the registry key, e.g. "grpo"

    @property
    def uses_reference(self) -> bool:
        """True when `compute_loss` reads `batch.ref_logp` (e.g. a KL penalty is on);
        the controller skips the reference forward pass otherwise."""
        ...

    @property
    def uses_critic(self) -> bool:
        """True when the algorithm trains a value head (PPO); it then reads
        `outputs.values` and `batch.values` / `batch.returns`."""
        ...

    def compute_advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Return at least {"advantages": (B, T), zero off the response}; may add
        "returns" (B, T). Runs without gradients: advantages are constants in the loss."""
        ...

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Return (scalar loss to minimise, metrics as python floats)."""
        ...


def check_field(algo: object, field: str, ok: bool, allowed: str) -> None:
    """Raise ValueError if `ok` is False, naming the class, the field, its value and what
    is allowed; for use in an algorithm's `__post_init__`. Write conditions so that NaN
    fails them (`x >= 0`, not `not x < 0`)."""
    if not ok:
        value = getattr(algo, field)
        raise ValueError(f"{type(algo).__name__}.{field}={value!r} is invalid; allowed: {allowed}")


def check_loss_fields(algo: object) -> None:
    """The checks every algorithm with `loss_agg`, `entropy_coef` and `max_len` fields
    shares: a known aggregation, a non-negative entropy bonus, and a generation budget
    whenever the aggregation divides by one (Dr.GRPO's seq-mean-token-sum-norm)."""
    loss_agg = getattr(algo, "loss_agg")
    check_field(algo, "loss_agg", loss_agg in LOSS_AGG_MODES, f"one of {list(LOSS_AGG_MODES)}")
    check_field(algo, "entropy_coef", getattr(algo, "entropy_coef") >= 0.0, "a number >= 0")
    if loss_agg == "seq-mean-token-sum-norm":
        max_len = getattr(algo, "max_len")
        check_field(algo, "max_len", isinstance(max_len, int) and max_len > 0,
                    "a positive int with loss_agg='seq-mean-token-sum-norm' (the generation budget, max_new_tokens)")


def make_from_registry(registry: dict[str, type], kind: str, name: str, params: dict) -> object:
    """Build `registry[name](**params)`, or raise ValueError listing the valid names (for an
    unknown name) or the valid fields with their defaults (for a bad parameter)."""
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {sorted(registry)}")
    cls = registry[name]
    fields = [f for f in dataclasses.fields(cls)]
    help_text = ", ".join(
        f"{f.name}={f.default if f.default is not dataclasses.MISSING else f.default_factory()!r}"
        if f.default_factory is not dataclasses.MISSING or f.default is not dataclasses.MISSING
        else f"{f.name}=<required>" for f in fields)
    unknown = sorted(set(params) - {f.name for f in fields})
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for {kind} {name!r}; valid fields (with defaults): {help_text}")
    try:
        return cls(**params)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{err}\nvalid fields of {name!r} (with defaults): {help_text}") from err


# --------------------------------------------------------------------------------------
# Masked reductions
# --------------------------------------------------------------------------------------


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x · mask over `dim` (all elements when None). Positions where mask == 0
    contribute exactly 0 even if x is inf or NaN there."""
    x = torch.where(mask != 0, x * mask, 0.0)  # not x * mask alone: inf * 0 = NaN
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x · mask / Σ mask over `dim`. Where the mask is all zero the result is 0, not
    NaN (and so is its gradient)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    # Divide by 1 where there is nothing to average: the numerator is 0 there, so the
    # result is 0. (torch.where on the quotient would still back-propagate 0/0 = NaN.)
    safe_count = torch.where(count > 0, count, torch.ones_like(count))
    return masked_sum(x, mask, dim) / safe_count


def masked_var(
    x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, unbiased: bool = True
) -> torch.Tensor:
    """Variance of the masked entries of x over `dim`. `unbiased` divides the sum of
    squared deviations by n − 1 (Bessel) instead of n. Returns 0 where there are too
    few entries (n ≤ 1 when unbiased, n = 0 otherwise)."""
    mean = masked_mean(x, mask, dim)
    if dim is not None:
        mean = mean.unsqueeze(dim)
    sq_dev = masked_sum((x - mean) ** 2, mask, dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    denom = count - 1 if unbiased else count
    safe_denom = torch.where(denom > 0, denom, torch.ones_like(denom))
    return torch.where(denom > 0, sq_dev / safe_denom, torch.zeros_like(sq_dev))


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(x − mean) / sqrt(var + eps) with mean and unbiased variance over all masked
    entries. With `shift_mean=False` only the scale changes (the mean is added back).
    Masked-out positions come back as 0."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask != 0, whitened, 0.0)


# --------------------------------------------------------------------------------------
# Loss aggregation: how a (B, T) matrix of per-token losses becomes one number
# --------------------------------------------------------------------------------------

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def agg_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int | None = None
) -> torch.Tensor:
    """Reduce per-token losses (B, T) over the response tokens to a scalar.

    Let L[b] = Σ_t loss[b, t] · mask[b, t] and n[b] = Σ_t mask[b, t].

        token-mean               Σ_b L[b] / Σ_b n[b]: every token in the batch weighs the
                                 same, so long responses weigh more (DAPO, arXiv:2503.14476, Sec. 3.3).
        seq-mean-token-mean      (1/B) Σ_b L[b] / n[b]: each sequence weighs the same, its
                                 tokens share that weight (GRPO's 1/G Σ_i 1/|o_i| Σ_t).
        seq-mean-token-sum       (1/B) Σ_b L[b]: no length division at all.
        seq-mean-token-sum-norm  (1/B) Σ_b L[b] / max_len: a constant divisor (the
                                 generation budget) instead of |o_i|, which removes GRPO's
                                 length bias (Dr. GRPO, arXiv:2503.20783).

    B counts every row. A row (or batch) with no response tokens contributes 0; none of
    the modes returns NaN.
    """
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    if mode == "seq-mean-token-mean":
        return masked_mean(loss_mat, mask, dim=-1).mean()
    if mode == "seq-mean-token-sum":
        return masked_sum(loss_mat, mask, dim=-1).mean()
    if mode == "seq-mean-token-sum-norm":
        if max_len is None or max_len <= 0:
            raise ValueError(
                f"loss aggregation 'seq-mean-token-sum-norm' needs a positive constant max_len "
                f"(the generation budget, e.g. max_new_tokens), got max_len={max_len!r}"
            )
        return (masked_sum(loss_mat, mask, dim=-1) / max_len).mean()
    raise ValueError(f"unknown loss aggregation mode {mode!r}; choose one of {list(LOSS_AGG_MODES)}")


# --------------------------------------------------------------------------------------
# KL estimators between the current policy π and the reference π_ref, per token
# --------------------------------------------------------------------------------------
# The tokens were sampled from π (on-policy), so each is a single-sample Monte Carlo
# estimate of KL(π ‖ π_ref) = E_π[log π − log π_ref] at that position.
# See J. Schulman, "Approximating KL Divergence" (2020), http://joschu.net/blog/kl-approx.html


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log π − log π_ref, (B, T). Unbiased but high variance, and negative on some
    tokens, so a per-token penalty with it can reward moving away from π_ref."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π − log π_ref)², (B, T). Always ≥ 0, low variance, biased (its
    expectation is an f-divergence that matches KL only to second order)."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = r − log r − 1 with r = π_ref / π, (B, T). Unbiased for KL(π ‖ π_ref) since
    E_π[r] = 1, always ≥ 0 since log r ≤ r − 1, and low variance. This is the estimator in
    the GRPO paper (arXiv:2402.03300, Eq. 4). The log-ratio is clamped to ±MAX_LOG_RATIO
    so exp cannot overflow to inf when π puts almost no mass on a token π_ref likes."""
    log_r = (ref_logp - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    return torch.exp(log_r) - log_r - 1


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(π ‖ π_ref) estimate (B, T) with the estimator named `kind`."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {list(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[kind](logp, ref_logp)


# --------------------------------------------------------------------------------------
# PPO's clipped surrogate objective
# --------------------------------------------------------------------------------------


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's pessimistic policy loss (arXiv:1707.06347, Eq. 7), negated to be minimised.

    Args:
        logp:      (B, T) log π_θ(token | prefix), differentiable.
        old_logp:  (B, T) log π_old(token | prefix) from sampling time, a constant.
        adv:       (B, T) advantage of each token, a constant.
        mask:      (B, T) response mask.
        eps_low, eps_high: the trust region is ratio ∈ [1 − eps_low, 1 + eps_high]
                   (equal in PPO; DAPO's clip-higher raises eps_high, arXiv:2503.14476).
        dual_clip: constant c > 1, or None. For negative advantages the loss is capped at
                   −adv · c, so a token whose ratio has exploded cannot dominate the
                   update (dual-clip PPO, Ye et al., AAAI 2020, arXiv:1912.09729).
        agg, max_len: how per-token losses become a scalar, see `agg_loss`.

    Returns (loss, metrics) where metrics are python floats over response tokens:
        clipfrac    fraction of tokens where the clipped branch is the active one
                    (the gradient through those tokens is zero)
        approx_kl   k3 estimate of KL(π_old ‖ π_θ): the tokens were sampled from π_old
        ratio_mean, ratio_max
        dual_clipfrac (only with dual_clip) fraction of tokens capped by the dual clip
    """
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be a constant > 1 (3 is common) or None, got {dual_clip!r}")
    # Off the response the log-ratio is set to 0 (ratio 1) whatever padding holds, even
    # -inf log-probs or inf advantages: the backward pass multiplies by those values, and
    # 0 · inf is NaN. agg_loss then drops the padded losses themselves.
    on = mask != 0
    log_ratio = torch.where(on, logp - old_logp, 0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T) π_θ / π_old

    pg_loss1 = -adv * ratio  # (B, T) the unclipped surrogate
    pg_loss2 = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # (B, T)
    pg_loss_clip = torch.maximum(pg_loss1, pg_loss2)  # (B, T) PPO's min over objectives = max over losses
    pg_loss_mat = pg_loss_clip
    if dual_clip is not None:
        pg_loss3 = -adv * dual_clip  # (B, T) the dual-clip cap, only meaningful for adv < 0
        pg_loss_mat = torch.where(adv < 0, torch.minimum(pg_loss_clip, pg_loss3), pg_loss_clip)  # (B, T)
    loss = agg_loss(pg_loss_mat, mask, agg, max_len)

    with torch.no_grad():
        metrics = {
            "clipfrac": masked_mean((pg_loss2 > pg_loss1).float(), mask).item(),
            # k3 with r = π_θ / π_old, samples from π_old: E[(r − 1) − log r] = KL(old ‖ θ)
            "approx_kl": masked_mean((ratio - 1) - log_ratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
            "ratio_max": ratio.masked_fill(~on, 0.0).max().item() if on.any() else 0.0,
        }
        if dual_clip is not None:
            metrics["dual_clipfrac"] = masked_mean((pg_loss_mat < pg_loss_clip).float(), mask).item()
    return loss, metrics


# --------------------------------------------------------------------------------------
# From logits to per-token log-probs and entropies (what the trainer feeds the loss)
# --------------------------------------------------------------------------------------


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: (..., V) -> (...).

    H = logsumexp(z) − Σ_v softmax(z)_v z_v, which needs one (…, V) softmax and no
    log-softmax copy."""
    probs = torch.softmax(logits, dim=-1)  # (B, T, V)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)  # (B, T)


def _next_token_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits[:, t-1] predicts tokens[:, t]: drop the last position (it predicts past the
    end), and divide by the sampling temperature so log-probs match the distribution the
    rollout actually sampled from."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    shifted = logits[:, :-1]  # (B, T-1, V) a view, no copy
    return shifted if temperature == 1.0 else shifted / temperature


def token_logp(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs aligned with `tokens`.

    Args:
        logits: (B, T, V) the model's output at every position.
        tokens: (B, T) long, the sequence the logits were computed on.
        temperature: divide the logits by this first (the rollout's sampling temperature).

    Returns (B, T): out[:, t] = log p(tokens[:, t] | tokens[:, :t]), computed from
    logits[:, t-1]. Position 0 has no prediction and holds 0.
    """
    z = _next_token_logits(logits, temperature)  # (B, T-1, V)
    # log softmax(z)[tok] = z[tok] − logsumexp(z): gathers one logit per position instead
    # of materialising the full (B, T-1, V) log-softmax.
    picked = z.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    logp = picked - torch.logsumexp(z, dim=-1)  # (B, T-1)
    return F.pad(logp, (1, 0))  # (B, T) position 0 gets 0


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the next-token distribution aligned like `token_logp`: out[:, t] is
    H(p(· | tokens[:, :t])) from logits[:, t-1], temperature applied; out[:, 0] = 0. (B, T)"""
    z = _next_token_logits(logits, temperature)  # (B, T-1, V)
    return F.pad(entropy_from_logits(z), (1, 0))  # (B, T)


# Logits for a 49k-token vocabulary are the largest tensor in a training step: 64 rows ×
# 110 positions × 49152 × 4 bytes is 1.4 GB, and backward keeps a copy. The trainer only
# needs log-probs where the loss looks (the response), so it computes the logits there and
# only there, a chunk of positions at a time, and recomputes each chunk's logits during
# backward instead of storing them.
LOGITS_BUDGET = 2**25  # elements of one chunk of logits (128 MB in float32)


def response_logp_and_entropy(
    hidden: torch.Tensor,
    lm_head: torch.nn.Linear,
    tokens: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float = 1.0,
    logits_budget: int = LOGITS_BUDGET,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logp` and `token_entropy` on the response positions only, (B, T) each,
    exactly 0 wherever response_mask is 0.

    hidden (B, T, D) are the final hidden states; lm_head is the (D -> V) output layer. Position t
    is predicted from hidden[:, t-1]. Chunks of at most `logits_budget` logits are run
    under activation checkpointing when there is more than one, so peak memory is one
    chunk's logits, whatever the batch."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, T, _ = hidden.shape
    rows, cols = response_mask[:, 1:].nonzero(as_tuple=True)  # cols + 1 are the predicted positions
    states, targets = hidden[rows, cols], tokens[rows, cols + 1]  # (n, D), (n,)

    def logp_and_entropy(h: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = lm_head(h).float() / temperature  # (c, V)
        log_norm = torch.logsumexp(z, dim=-1)  # (c,)
        logp = z.gather(-1, target[:, None]).squeeze(-1) - log_norm
        entropy = log_norm - (torch.softmax(z, dim=-1) * z).sum(-1)
        return logp, entropy

    chunk = max(1, logits_budget // lm_head.weight.shape[0])  # positions per chunk
    chunked = len(states) > chunk and torch.is_grad_enabled()
    parts = [torch.utils.checkpoint.checkpoint(logp_and_entropy, states[i : i + chunk], targets[i : i + chunk],
                                               use_reentrant=False) if chunked
             else logp_and_entropy(states[i : i + chunk], targets[i : i + chunk])
             for i in range(0, len(states), chunk)]
    logp = torch.cat([p[0] for p in parts]) if parts else hidden.new_zeros(0)
    entropy = torch.cat([p[1] for p in parts]) if parts else hidden.new_zeros(0)
    index = (rows, cols + 1)
    return (hidden.new_zeros(B, T).index_put(index, logp.to(hidden.dtype)),
            hidden.new_zeros(B, T).index_put(index, entropy.to(hidden.dtype)))


# --------------------------------------------------------------------------------------
# Group statistics (the K samples of one prompt share a group id)
# --------------------------------------------------------------------------------------


def group_mean_std(
    values: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row mean, unbiased std and size of the row's group, without a loop over groups.

    Args:
        values: (B,) float, e.g. rewards.
        group_ids: (B,) long, any integers; rows with equal ids form a group.

    Returns (mean, std, count), each (B,) and broadcast back to rows. std uses Bessel's
    N − 1; a group of one row has std 0 (there is no spread to estimate).
    """
    _, idx = torch.unique(group_ids, return_inverse=True)  # (B,) ids relabelled 0..G-1
    G = int(idx.max()) + 1
    count = torch.zeros(G, dtype=values.dtype).index_add_(0, idx, torch.ones_like(values))  # (G,)
    mean = torch.zeros(G, dtype=values.dtype).index_add_(0, idx, values) / count  # (G,)
    sq_dev = (values - mean[idx]) ** 2  # (B,) two-pass variance: stable when values are large
    ss = torch.zeros(G, dtype=values.dtype).index_add_(0, idx, sq_dev)  # (G,)
    var = torch.where(count > 1, ss / (count - 1).clamp(min=1), torch.zeros_like(ss))  # (G,)
    return mean[idx], var.sqrt()[idx], count[idx]


def zero_variance_group_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups whose rewards are all equal. Such a group has advantage 0 on
    every sample under any group baseline, so it contributes no policy gradient (what
    DAPO's dynamic sampling filters out, arXiv:2503.14476 Sec. 3.2)."""
    _, idx = torch.unique(group_ids, return_inverse=True)  # (B,)
    G = int(idx.max()) + 1
    # all equal <=> max == min within the group
    gmax = torch.full((G,), -torch.inf, dtype=rewards.dtype).scatter_reduce(0, idx, rewards, "amax")
    gmin = torch.full((G,), torch.inf, dtype=rewards.dtype).scatter_reduce(0, idx, rewards, "amin")
    return (gmax == gmin).float().mean().item()


# --------------------------------------------------------------------------------------
# Pieces shared by the algorithms beyond GRPO (REINFORCE, RLOO, CISPO, PPO, ...)
# --------------------------------------------------------------------------------------


def policy_gradient_loss(
    logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean", max_len: int | None = None
) -> torch.Tensor:
    """REINFORCE's loss, agg(−adv · logp) (Williams 1992, "Simple statistical
    gradient-following algorithms"). `adv` is a constant, so the gradient is
    −agg(adv · ∇ log π): the score-function estimator, with no ratio and no clip.

    Args:
        logp: (B, T) log π_θ(token | prefix), differentiable.
        adv:  (B, T) the weight on each token's log-prob (advantage, or advantage times a
              constant importance weight as in CISPO).
        mask, agg, max_len: response mask and aggregation, see `agg_loss`.

    At θ = θ_old its gradient equals that of `clipped_surrogate` (∇ ratio = ∇ log π there).
    """
    # The gradient reaching logp is −adv · (upstream), and upstream is 0 off the response:
    # zero adv there too, or an inf advantage in padding would make 0 · inf = NaN. (A −inf
    # log-prob in padding is harmless: agg_loss drops the NaN product and its gradient.)
    adv = torch.where(mask != 0, adv, 0.0)  # (B, T)
    return agg_loss(-adv * logp, mask, agg, max_len)


def importance_ratio(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_ratio, ratio) of π_θ / π_old per token, (B, T) each. Off the response the
    log-ratio is 0 (ratio 1) whatever padding holds; it is clamped to ±MAX_LOG_RATIO so
    exp cannot overflow. Differentiable in `logp`, the same computation as inside
    `clipped_surrogate`."""
    log_ratio = torch.where(mask != 0, logp - old_logp, 0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    return log_ratio, torch.exp(log_ratio)


@torch.no_grad()
def ratio_metrics(log_ratio: torch.Tensor, ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """approx_kl (k3 of the ratio, samples from π_old: an estimate of KL(π_old ‖ π_θ)),
    ratio_mean and ratio_max over response tokens, named as `clipped_surrogate` names them."""
    on = mask != 0
    return {
        "approx_kl": masked_mean((ratio - 1) - log_ratio, mask).item(),
        "ratio_mean": masked_mean(ratio, mask).item(),
        "ratio_max": ratio.masked_fill(~on, 0.0).max().item() if on.any() else 0.0,
    }


@torch.no_grad()
def advantage_metrics(adv: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """adv_mean and adv_std (unbiased) over response tokens."""
    return {"adv_mean": masked_mean(adv, mask).item(), "adv_std": masked_var(adv, mask).sqrt().item()}
