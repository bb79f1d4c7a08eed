"""How good are a reward model's probabilities? Accuracy, ranking (AUROC) and calibration
(ECE, a reliability table), each with a bootstrap CI over solutions.

    accuracy     fraction of labels matched by `probability > 0.5`
    AUROC        the chance a random positive scores above a random negative (ties count
                 half; Mann-Whitney U / (n_pos · n_neg)). 0.5 is chance; it ignores the
                 threshold, so it is what a selector (best-of-N, beam search) cares about
    ECE          expected calibration error over equal-width bins of the predicted
                 probability: Σ_b (n_b / n) · |mean label_b − mean probability_b|
                 (Naeini et al. 2015; Guo et al. 2017 use 10 bins, as here). 0 = a "0.8"
                 is right 80% of the time

Steps of one solution are not independent draws (after a first error every later label
is 0), so the bootstrap resamples whole solutions (groups) and recomputes the statistic
on the steps they carry: a CI that counted steps as independent would be too narrow.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

N_BINS = 10  # Guo et al. 2017's choice; at ~1,000 held-out steps a bin holds ~100 on average


def _tensors(probs: Sequence[float], labels: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    p, y = torch.as_tensor(probs, dtype=torch.float64), torch.as_tensor(labels, dtype=torch.float64)
    if p.shape != y.shape or p.numel() == 0:
        raise ValueError(f"need as many probabilities as labels, at least one ({p.numel()} and {y.numel()} given)")
    if (p < 0).any() or (p > 1).any() or p.isnan().any():
        raise ValueError("probabilities must lie in [0, 1]: pass σ(logit), not the logit")
    return p, (y > 0.5).double()


def accuracy(probs: Sequence[float], labels: Sequence[float]) -> float:
    p, y = _tensors(probs, labels)
    return ((p > 0.5).double() == y).double().mean().item()


def auroc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """Area under the ROC curve; NaN when one class is missing (then it is undefined)."""
    s, y = torch.as_tensor(scores, dtype=torch.float64), (torch.as_tensor(labels, dtype=torch.float64) > 0.5)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    # average ranks (ties share their mean rank), then Mann-Whitney U of the positives
    order = s.argsort()
    ranks = torch.empty_like(s)
    ranks[order] = torch.arange(1, len(s) + 1, dtype=torch.float64)
    values, inverse = s.unique(return_inverse=True)
    mean_rank = torch.zeros(len(values), dtype=torch.float64).index_add_(0, inverse, ranks)
    mean_rank /= torch.bincount(inverse, minlength=len(values)).double()
    u = mean_rank[inverse][y].sum().item() - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)


def _bins(p: torch.Tensor, n_bins: int) -> torch.Tensor:
    # bin b holds [b/n, (b+1)/n); a probability of exactly 1 goes to the top bin
    return (p * n_bins).long().clamp(max=n_bins - 1)


def reliability_table(probs: Sequence[float], labels: Sequence[float], n_bins: int = N_BINS) -> list[dict]:
    """Per bin of predicted probability: its range, how many predictions fell in it, their
    mean probability and the fraction of them that were right (empty bins included)."""
    p, y = _tensors(probs, labels)
    b = _bins(p, n_bins)
    rows = []
    for k in range(n_bins):
        inside = b == k
        n = int(inside.sum())
        rows.append({"bin": f"{k / n_bins:.1f}-{(k + 1) / n_bins:.1f}", "n": n,
                     "mean_probability": p[inside].mean().item() if n else float("nan"),
                     "fraction_positive": y[inside].mean().item() if n else float("nan")})
    return rows


def expected_calibration_error(probs: Sequence[float], labels: Sequence[float], n_bins: int = N_BINS) -> float:
    p, y = _tensors(probs, labels)
    b = _bins(p, n_bins)
    count = torch.bincount(b, minlength=n_bins).double()
    gap = (torch.bincount(b, weights=y, minlength=n_bins) - torch.bincount(b, weights=p, minlength=n_bins)).abs()
    return (gap.sum() / count.sum()).item()  # Σ_b n_b/n · |Σy/n_b − Σp/n_b| = Σ_b |Σy − Σp| / n


def grouped_bootstrap_ci(groups: Sequence[tuple[Sequence[float], Sequence[float]]],
                         statistic: Callable[[list[float], list[float]], float],
                         confidence: float = 0.95, n_resamples: int = 1000, seed: int = 0) -> dict[str, float]:
    """Percentile bootstrap of `statistic(probs, labels)` resampling whole groups (solutions)
    with replacement. 1,000 resamples: the statistics here re-sort or re-bin every time, and
    the percentile's Monte-Carlo error at 1,000 is ~0.1 standard errors, small next to the
    interval. Resamples where the statistic is undefined (NaN: AUROC with one class) are
    dropped; `resamples` says how many counted."""
    if not groups:
        raise ValueError("no groups to resample: evaluate on at least one solution")
    probs = [list(map(float, g[0])) for g in groups]
    labels = [list(map(float, g[1])) for g in groups]

    def flat(idx) -> tuple[list[float], list[float]]:
        return [v for i in idx for v in probs[i]], [v for i in idx for v in labels[i]]

    point = statistic(*flat(range(len(groups))))
    generator = torch.Generator().manual_seed(seed)
    values = []
    for _ in range(n_resamples):
        idx = torch.randint(0, len(groups), (len(groups),), generator=generator).tolist()
        value = statistic(*flat(idx))
        if value == value:  # not NaN
            values.append(value)
    if not values:
        return {"mean": point, "ci_low": float("nan"), "ci_high": float("nan"), "n": len(groups), "resamples": 0}
    tail = (1 - confidence) / 2
    low, high = torch.quantile(torch.tensor(values, dtype=torch.float64),
                               torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return {"mean": point, "ci_low": low, "ci_high": high, "n": len(groups), "resamples": len(values)}
