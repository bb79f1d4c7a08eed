"""The code exercises `posttrain check` runs: for each, the function the stub defines, the
library's answer adapted to the stub's signature, the cases (deterministic, small, each run
in milliseconds, the awkward ones included: padding that holds NaN, a group of one sample, a
response longer than the budget) and the hint a failure prints.

Lessons 03-14's exercises and the measurement course's `pick_best` are defined here; the
other lessons' are gathered from check_part3.py (15-18), check_part3b.py (18a),
check_part4.py (23), check_part5.py (26-27), check_systems_basics.py (19-22a) and
check_systems.py (22b and after). `EXERCISES` holds them all in lesson order; check.py
loads a learner's solution and compares it with them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

from posttrain.algorithms import make_algorithm
from posttrain.algorithms.core import agg_loss, clipped_surrogate, kl_k3, masked_mean, policy_gradient_loss
from posttrain.algorithms.dapo import overlong_penalty
from posttrain.algorithms.grpo import group_advantages
from posttrain.algorithms.rloo import leave_one_out_baseline
from posttrain.teach.check_part3 import PART_III
from posttrain.teach.check_part3b import PART_III_B
from posttrain.teach.check_part4 import PART_IV
from posttrain.teach.check_part5 import PART_V
from posttrain.teach.check_selection import pick_best_cases, reference_pick_best, same_sample
from posttrain.teach.check_systems import SYSTEMS_EXERCISES
from posttrain.teach.check_systems_basics import SYSTEMS_BASICS
from posttrain.teach.widgets import BUDGET, synthetic_batch


@dataclass
class Exercise:
    function: str  # the name the stub defines
    lesson: str  # which lesson it belongs to, for the hint
    reference: Callable[..., Any]  # the library's answer, same signature as the stub
    cases: Callable[[], list[tuple[str, tuple]]]  # (case name, positional arguments)
    hint: str  # said on any failure
    grad_of_first: bool = False  # also compare ∂output/∂(first argument), for losses
    # None if the learner's result matches the library's, else what is wrong; None = check.py's tensor check
    compare: Callable[[Any, Any], str | None] | None = None
    source: str = ""  # where the library's version is, when no lesson names it


# --------------------------------------------------------------------------------------
# Cases. Every one is deterministic (seeded), small, and runs in milliseconds.
# --------------------------------------------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mask(lengths: list[int], T: int, start: int = 1) -> torch.Tensor:
    """(B, T) response mask: row b is 1 on positions [start, start + lengths[b])."""
    mask = torch.zeros(len(lengths), T)
    for b, n in enumerate(lengths):
        mask[b, start:start + n] = 1.0
    return mask


def _token_cases(seed: int, extra: int = 0) -> list[tuple[str, tuple]]:
    """(B, T) tensors for loss exercises: plain, ragged lengths, and padding full of NaN."""
    g = _gen(seed)
    mask = _mask([5, 2, 4], T=7)
    logp = -torch.rand(3, 7, generator=g) * 3  # (B, T) log-probs are ≤ 0
    other = torch.randn(3, 7, generator=g)
    extras = [torch.randn(3, 7, generator=g) for _ in range(extra)]
    poisoned = [torch.where(mask == 0, torch.tensor(float("nan")), t) for t in (logp, other, *extras)]
    full = torch.ones(3, 7)
    return [
        ("every position is a response token", (logp, other, *extras, full)),
        ("rows of different lengths (5, 2, 4 tokens)", (logp, other, *extras, mask)),
        ("padding and prompt positions hold NaN", (*poisoned, mask)),
    ]


def _group_cases() -> list[tuple[str, tuple]]:
    r = torch.tensor
    return [
        ("one group of four", (r([1.0, 0.0, 0.0, 1.0]), r([0, 0, 0, 0]))),
        ("two groups", (r([1.0, 0.0, 0.5, 0.5, 0.0, 1.0]), r([0, 0, 0, 1, 1, 1]))),
        ("a group whose rewards are all equal", (r([1.0, 1.0, 1.0, 0.0, 1.0]), r([0, 0, 0, 1, 1]))),
        ("a group of one sample", (r([1.0, 0.0, 1.0, 0.3]), r([0, 0, 0, 7]))),
        ("group ids that are neither sorted nor contiguous", (r([0.2, 0.9, 0.4, 0.1]), r([5, 2, 5, 2]))),
    ]


# --------------------------------------------------------------------------------------
# The library's answers, adapted to each stub's signature
# --------------------------------------------------------------------------------------


def _ref_kl_k3(logp, ref_logp):
    return kl_k3(logp, ref_logp)


def _ref_advantages(batch):
    return make_algorithm("dr_grpo", budget=BUDGET).compute_advantages(batch)["advantages"]


def _ref_sft_loss(logp, mask):
    return -masked_mean(logp, mask)


def _ref_masked_mean(x, mask):
    return masked_mean(x, mask)


def _ref_reinforce_loss(logp, adv, mask):
    return policy_gradient_loss(logp, adv, mask, agg="seq-mean-token-sum")


def _ref_clipped(logp, old_logp, adv, mask, eps=0.2):
    return clipped_surrogate(logp, old_logp, adv, mask, eps, eps, agg="token-mean")[0]


def _ref_group_advantages(rewards, group_ids):
    return group_advantages(rewards, group_ids, "group", 1e-6)


def _ref_loo(rewards, group_ids):
    return leave_one_out_baseline(rewards, group_ids)


def _ref_overlong(lengths, max_len, cache_len):
    return overlong_penalty(lengths, max_len, cache_len)


def _ref_sum_norm(loss_mat, mask, max_len):
    return agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", max_len)


def _advantage_cases():
    return [
        ("two groups of four", (synthetic_batch([[(1, 3), (0, 5), (0, 2), (1, 4)], [(0, 2), (1, 2), (1, 6), (1, 3)]]),)),
        ("a group whose rewards are all equal", (synthetic_batch([[(1, 3), (1, 4)], [(0, 2), (1, 5)]]),)),
        ("rewards on a large scale", (synthetic_batch([[(100, 3), (0, 5), (50, 2)]]),)),
    ]


def _clipped_cases():
    out = []
    for name, (logp, adv, mask) in _token_cases(10):
        g = _gen(11)
        # ratios spread over [0.5, 1.6], so every corner of the clip table occurs
        old = logp - torch.empty(3, 7).uniform_(-0.7, 0.45, generator=g)
        old = torch.where(torch.isnan(logp), torch.tensor(float("nan")), old)
        out.append((name, (logp, old, adv, mask)))
    out.append(("ε = 0.1 instead of 0.2", (*out[1][1], 0.1)))
    return out


def _overlong_cases():
    lengths = torch.tensor([3, 30, 38, 39, 44, 48, 50])
    return [
        ("budget 48, ramp over the last 10", (lengths, 48, 10)),
        ("budget 20, ramp over the last 4", (torch.tensor([1, 15, 16, 17, 19, 20, 25]), 20, 4)),
        ("the ramp switched off (cache_len 0)", (lengths, 48, 0)),
    ]


def _sum_norm_cases():
    cases = _token_cases(14)  # (loss_mat, other, mask): the loss matrix and the mask are used
    return [(name, (a[0], a[-1], 12)) for name, a in cases] + [
        ("a different budget (max_len 5)", (cases[1][1][0], cases[1][1][-1], 5))]


EXERCISES: dict[str, Exercise] = {
    "03": Exercise("kl_k3", "03", _ref_kl_k3,
                   lambda: [(n, a[:2]) for n, a in _token_cases(3)[:2]]
                   + [("π equals π_ref (KL must be exactly 0)", (torch.full((2, 3), -1.2), torch.full((2, 3), -1.2)))],
                   "k3 = r − log r − 1 with r = π_ref / π = exp(ref_logp − logp), per token; it is ≥ 0 "
                   "everywhere and 0 where the two agree. See `kl_k3` in posttrain/algorithms/core.py."),
    "04": Exercise("compute_advantages", "04", _ref_advantages, _advantage_cases,
                   "A_i = r_i − mean of r over the row's group (no division by the std), copied onto "
                   "every response token, 0 elsewhere: (B, T), i.e. rewards[:, None] minus the group "
                   "mean, times batch.response_mask."),
    "05": Exercise("sft_loss", "05", _ref_sft_loss, lambda: [(n, (a[0], a[-1])) for n, a in _token_cases(5)],
                   "The mean negative log-likelihood over response tokens only: −Σ(logp·mask)/Σmask. "
                   "Where the mask is 0 the log-prob may be anything, even NaN: select with "
                   "torch.where(mask != 0, logp, 0.0) before summing, because NaN · 0 is NaN.",
                   grad_of_first=True),
    "08": Exercise("masked_mean", "08", _ref_masked_mean, lambda: [(n, (a[0], a[-1])) for n, a in _token_cases(8)]
                   + [("a mask that is all zero (the answer is 0, not NaN)", (torch.randn(2, 3), torch.zeros(2, 3)))],
                   "Average x over positions where mask is 1. Masked positions must not matter even if "
                   "they hold NaN (use torch.where, not x * mask), and an all-zero mask gives 0.",
                   grad_of_first=True),
    "09": Exercise("reinforce_loss", "09", _ref_reinforce_loss, lambda: _token_cases(9),
                   "loss = −(1/B) Σ_b Σ_t mask·adv·logp: sum over each row's tokens, average over rows "
                   "(B counts every row). Keep NaN in padding out with torch.where, not a multiplication.",
                   grad_of_first=True),
    "10": Exercise("clipped_surrogate_loss", "10", _ref_clipped, _clipped_cases,
                   "ratio = exp(logp − old_logp); per token max(−adv·ratio, −adv·clamp(ratio, 1 − eps, "
                   "1 + eps)); then the mean over response tokens. Compute the ratio only where mask is 1 "
                   "(torch.where) so NaN in padding cannot reach the loss or its gradient.",
                   grad_of_first=True),
    "11": Exercise("grpo_advantages", "11", _ref_group_advantages, _group_cases,
                   "(r − group mean) / (group std + 1e-6), std unbiased (divide by n − 1); a group of "
                   "one sample has std 0, so its advantage is 0. Group ids can be any integers in any order."),
    "12": Exercise("leave_one_out_baseline", "12", _ref_loo, _group_cases,
                   "b_i = (sum of the group's rewards − r_i) / (K − 1). A group of one has no others: "
                   "use its own reward as baseline (advantage 0) instead of dividing by zero."),
    "13": Exercise("overlong_penalty", "13", _ref_overlong, _overlong_cases,
                   "0 up to max_len − cache_len tokens, then ((max_len − cache_len) − length) / cache_len, "
                   "never below −1; all zeros when cache_len is 0. Return floats."),
    "14": Exercise("seq_mean_token_sum_norm", "14", _ref_sum_norm, _sum_norm_cases,
                   "Sum each row's masked losses, divide by the constant max_len (not by the row's "
                   "length), average over rows. NaN in padding must not leak: torch.where before summing.",
                   grad_of_first=True),
    # the measurement course's exercise (docs/course/M0.5_selection.md), named for its function
    "pick_best": Exercise("pick_best", "course M0.5", reference_pick_best, pick_best_cases,
                          "Return the sample with the highest reward; among equal rewards, the one with the "
                          "smallest id in string order, whatever order the list is in. max() by reward alone keeps "
                          "whichever maximum comes first, so the same samples shuffled give another choice; the "
                          "smallest completion is deterministic too, but it is not the rule `posttrain bon` logs.",
                          compare=same_sample, source="posttrain/search/best_of_n.py, pick_best"),
}
EXERCISES.update({key: Exercise(**fields) for key, fields in PART_III.items()})  # lessons 15-18
EXERCISES.update({key: Exercise(**fields) for key, fields in PART_III_B.items()})  # lesson 18a
EXERCISES.update({key: Exercise(**fields) for key, fields in PART_IV.items()})  # lesson 23
EXERCISES.update({key: Exercise(**fields) for key, fields in PART_V.items()})  # lessons 26-27


# the systems lessons: their references and cases are in check_systems_basics.py (19-22a) and
# check_systems.py (22b and after)
EXERCISES.update({number: Exercise(function, number, reference, cases, hint)
                  for number, (function, reference, cases, hint) in {**SYSTEMS_BASICS, **SYSTEMS_EXERCISES}.items()})


def lesson_order(key: str) -> tuple:
    """Lessons by number (22 < 22b < 23), then the named exercises."""
    match = re.fullmatch(r"(\d+)([a-z]?)", key)
    return (0, int(match.group(1)), match.group(2)) if match else (1, 0, key)


EXERCISES = dict(sorted(EXERCISES.items(), key=lambda item: lesson_order(item[0])))
