"""The code exercises of Part V (lessons 26-27), in the shape `posttrain check` runs them
(teach/exercises.py builds an `Exercise` from each entry of `PART_V`): the library's own
function adapted to the stub's signature, the cases, and the hint a failure prints.

    26  design_scores         the three-forces simulator's score of every design
    27  truncated_is_weights  min(π_old / π_behaviour, cap) for off-policy rollouts

Every case is deterministic and runs in milliseconds.
"""

from __future__ import annotations

import torch

from posttrain.roles.off_policy import truncated_is_weights
from posttrain.teach.forces import FORCES, score


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------
# 26 · the simulator's scoring rule
# --------------------------------------------------------------------------------------


def _ref_scores(losses, weights):
    w = tuple(float(x) for x in weights)
    return torch.tensor([score(dict(zip(FORCES, row.tolist())), w) for row in losses], dtype=torch.float64)


def _score_cases():
    losses = torch.rand(8, 3, generator=_gen(26))  # (D, 3) eight designs
    tied = torch.tensor([[0.0, 0.24, 0.67], [0.0, 0.43, 0.83], [0.4, 0.43, 1.0]])  # equal on signal
    return [
        ("eight designs, weights summing to 1", (losses, torch.tensor([0.5, 0.3, 0.2]))),
        ("weights that do not sum to 1 (only their direction counts)", (losses, torch.tensor([5.0, 3.0, 2.0]))),
        ("all weight on one force", (losses, torch.tensor([0.0, 0.0, 1.0]))),
        ("an exact tie on the only weighted force (the 0.001 term decides)", (tied, torch.tensor([1.0, 0.0, 0.0]))),
    ]


# --------------------------------------------------------------------------------------
# 27 · truncated importance weights
# --------------------------------------------------------------------------------------


def _is_cases():
    g = _gen(27)
    old = -torch.rand(3, 6, generator=g) * 4  # (B, T) log-probs ≤ 0
    behaviour = -torch.rand(3, 6, generator=g) * 4
    mask = torch.tensor([[1.0] * 6, [1.0] * 3 + [0.0] * 3, [0.0] + [1.0] * 4 + [0.0]])
    far_old = torch.tensor([[-0.1, -9.0, -3.0], [-9.0, -0.1, -0.1]])
    far_behaviour = torch.tensor([[-9.0, -0.1, -0.1], [-0.1, -9.0, -3.0]])  # ratios e^±8.9, e^±2.9
    return [
        ("on-policy: every weight is 1", (old, old.clone(), torch.ones(3, 6), 2.0)),
        ("ragged responses (masked positions are 0)", (old, behaviour, mask, 2.0)),
        ("ratios far above and below the cap", (far_old, far_behaviour, torch.ones(2, 3), 5.0)),
        ("a cap of 1: nothing above 1 survives, nothing below is raised", (old, behaviour, mask, 1.0)),
    ]


PART_V: dict[str, dict] = {
    "26": dict(function="design_scores", lesson="26", reference=_ref_scores, cases=_score_cases,
               hint="w = weights / weights.sum(); score = losses @ w + 0.001 · losses.sum(dim=1). "
                    "Normalise the weights first: (5, 3, 2) must score like (0.5, 0.3, 0.2)."),
    "27": dict(function="truncated_is_weights", lesson="27", reference=truncated_is_weights, cases=_is_cases,
               hint="w = exp(old_logp − behaviour_logp), then clamp(max=cap) (only from above: a weight of "
                    "0.01 stays 0.01), then times the mask so padding is 0."),
}
