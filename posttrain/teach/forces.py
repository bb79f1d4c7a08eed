"""Lesson 26's three-forces simulator: signal, estimator, cost.

Every post-training design answers three questions. Where does the reward come from, and
how much of the truth does it carry (signal)? How is that reward turned into a gradient,
and how noisy or biased is the result (estimator)? What has to be resident and what has to
be generated every step (cost)? A *method* is one answer to all three; a *design* applies
one method to the prompts a verifier can check and one (maybe the same) to the rest. Each
design gets a loss in [0, 1] per force (0 is best); the user weighs the forces, and the
design with the lowest weighted loss wins.

What is measured and what is assumed:

* measured, by the library: a verifier's fidelity (`verifier_fidelity`: the share of the
  golden correct pack it pays times the share of the golden exploit pack it refuses, with
  the real specs of posttrain/verifiers/final_int.py), and each sampled estimator's noise
  (`estimator_noise`: the relative variance of a policy-gradient estimate built with the
  library's `leave_one_out_baseline`, `group_advantages` and a perfect critic, on a
  Bernoulli reward);
* assumed, and named below with the reason: a learned reward model's fidelity, the
  discount for preference pairs written by another policy, DPO's estimator loss, and what
  generating costs next to holding a model copy.

The simulator is a model, small enough to argue with; its numbers are ours, not a survey.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.algorithms.grpo import group_advantages
from posttrain.algorithms.rloo import leave_one_out_baseline
from posttrain.eval.packs import example_of, load_pack
from posttrain.verifiers.final_int import get_spec

FORCES = ("signal", "estimator", "cost")

# A learned reward model agrees with the gold on a fresh sample, and drifts from it as the
# policy searches its blind spots (lesson 15: the proxy rises while the gold peaks and falls).
RM_FIDELITY = 0.6
# Preference pairs collected once, from another policy: the labels are as good as a reward
# model's, but they describe answers the policy being trained no longer writes.
OFFLINE_FRESHNESS = 0.75
# DPO samples nothing, so it has no sampling noise; its weakness is bias (it follows the
# gradient of a loss on someone else's pairs, not of its own expected reward). Scored
# between the measured critic (~0.43) and the group baseline (~0.47) on one side and
# REINFORCE (~0.70) on the other: an assumption.
CLOSED_FORM_LOSS = 0.5
# Generating a step's rollouts costs about two resident model copies' worth: rollout is
# most of an RL step's wall clock (the spec of lesson 28: 60-80%).
ONLINE_COST = 2.0
MAX_COPIES = 4  # policy, reference, reward model, critic
# The tie-break: TIE × the sum of all three losses is added to every score, so that of two
# designs equal on the forces you weighed, the one worse on a force you gave no weight ranks
# second. It is at most 3 × TIE = 0.003, under TOLERANCE: it orders designs, it never separates them.
TIE = 1e-3
# Two designs whose weighted losses (the score without the tie-break) differ by less than this
# are a tie: the simulator cannot tell them apart. It is about twice the most that the difference
# between two designs' weighted losses moves when the estimator noise is measured again with
# another seed: 0.0105 over seeds 0-9 at 20,000 groups, anywhere in the triangle, at any coverage
# (the group baseline's estimator loss alone spans 0.467 to 0.478; tests/test_lesson17_26.py).
TOLERANCE = 0.02


@dataclass(frozen=True)
class Method:
    reward: str  # "verifier" | "reward model" | "pairs"
    # "critic" (PPO with GAE) | "group" (a group baseline: GRPO, RLOO) | "none" (REINFORCE)
    # | "closed form" (DPO)
    estimator: str
    copies: int  # models resident while it trains
    online: bool  # samples from the policy every step


@dataclass(frozen=True)
class Design:
    name: str  # what it does
    recipe: str  # the published recipe it is
    uncheckable: Method  # applied to the prompts no verifier can check
    checkable: Method  # applied to the prompts a verifier can check


PPO_RM = Method("reward model", "critic", 4, True)
GRPO_VERIFIER = Method("verifier", "group", 2, True)
GRPO_RM = Method("reward model", "group", 3, True)
PPO_VERIFIER = Method("verifier", "critic", 3, True)
REINFORCE_VERIFIER = Method("verifier", "none", 2, True)
DPO = Method("pairs", "closed form", 2, False)

# Order matters only for exact ties (R1-Zero and R1 are the same design when every prompt
# is checkable): the first listed wins.
DESIGNS = (
    Design("GRPO on a verifier", "R1-Zero", GRPO_VERIFIER, GRPO_VERIFIER),
    Design("GRPO: a verifier where one exists, a reward model elsewhere", "R1", GRPO_RM, GRPO_VERIFIER),
    Design("PPO with a critic on a reward model", "RLHF (InstructGPT)", PPO_RM, PPO_RM),
    Design("DPO on preference pairs", "DPO (Zephyr)", DPO, DPO),
    Design("PPO with a critic on a verifier", "PPO-RLVR", PPO_VERIFIER, PPO_VERIFIER),
    Design("DPO where no verifier exists, PPO on a verifier where one does", "Tülu 3", DPO, PPO_VERIFIER),
    Design("a group baseline on a reward model", "RLOO (back to basics)", GRPO_RM, GRPO_RM),
    Design("REINFORCE on a verifier, no baseline", "REINFORCE", REINFORCE_VERIFIER, REINFORCE_VERIFIER),
)


# --------------------------------------------------------------------------------------
# Measured by the library
# --------------------------------------------------------------------------------------


def verifier_fidelity(spec_version: str) -> float:
    """(share of the golden correct pack paid) × (share of the golden exploit pack refused)
    under the spec: 1.0 for an honest verifier, 0.0 for one that pays every exploit."""
    spec = get_spec(spec_version)
    paid = lambda pack: sum(spec(example_of(r), r["completion"])["reward"] for r in pack) / len(pack)
    return paid(load_pack("golden")) * (1.0 - paid(load_pack("exploits")))


def estimator_noise(p: float = 0.3, k: int = 16, groups: int = 20_000, seed: int = 0) -> dict[str, float]:
    """Per-sample relative variance Var[g]/E[g]² of the policy-gradient estimate for a
    Bernoulli policy (a right answer with probability p, reward 1 if right) from groups of
    k samples, with each estimator's advantage:
        "none"    A = r (REINFORCE, no baseline)
        "critic"  A = r − p (a perfect value function: PPO's critic at its best)
        "group"   r − the mean of the other k − 1 (RLOO's `leave_one_out_baseline`): the
                  group as baseline, unbiased; the simulator's "group" estimator
        "grpo"    GRPO's (r − group mean) / group std (`group_advantages`). Dividing by the
                  std rescales each group's estimate to about √(p(1−p)) whatever its
                  draws, which makes the magnitude steadier (a lower number here) at the
                  price of weighting prompts by difficulty (lesson 14's bias): not the same
                  gradient, so the simulator does not use it
    The estimate of one group is g = mean_i A_i ∇log π(a_i), with ∇log π(a) = a − p for the
    logit; multiplied by k so the number is per sample. All four see the same samples."""
    if not 0.0 < p < 1.0 or k < 2 or groups < 100:
        raise ValueError(f"estimator_noise needs 0 < p < 1, k >= 2, groups >= 100; got p={p}, k={k}, groups={groups}")
    gen = torch.Generator().manual_seed(seed)
    r = (torch.rand(groups * k, generator=gen) < p).float()  # (G·k,) reward 1 if the answer is right
    ids = torch.arange(groups).repeat_interleave(k)  # (G·k,)
    score = r - p  # (G·k,) ∇_θ log π(a) for a Bernoulli(σ(θ)) policy
    adv = {"none": r, "critic": r - p, "group": r - leave_one_out_baseline(r, ids),
           "grpo": group_advantages(r, ids, "group", 1e-6)}
    noise = {}
    for name, a in adv.items():
        g = (a * score).view(groups, k).mean(dim=1)  # (G,) one gradient estimate per group
        noise[name] = (k * g.var() / g.mean() ** 2).item()
    return noise


# --------------------------------------------------------------------------------------
# The simulator (pure arithmetic on the numbers above)
# --------------------------------------------------------------------------------------


def method_losses(m: Method, checkable: bool, fidelity: float, noise: dict[str, float]) -> dict[str, float]:
    """The method's loss per force on one kind of prompt, each in [0, 1]."""
    if m.reward == "verifier":
        signal = 1.0 - fidelity if checkable else 1.0  # nothing to check: no signal at all
    elif m.reward == "reward model":
        signal = 1.0 - RM_FIDELITY
    else:
        signal = 1.0 - RM_FIDELITY * OFFLINE_FRESHNESS
    if m.estimator == "closed form":
        estimator = CLOSED_FORM_LOSS
    else:
        v = noise[m.estimator]  # per-sample relative variance, 0..inf
        estimator = v / (1.0 + v)
    cost = (m.copies + (ONLINE_COST if m.online else 0.0)) / (MAX_COPIES + ONLINE_COST)
    return {"signal": signal, "estimator": estimator, "cost": cost}


def design_losses(d: Design, coverage: float, fidelity: float, noise: dict[str, float]) -> dict[str, float]:
    """The design's loss per force: its two methods mixed by the share of prompts a
    verifier can check (`coverage`)."""
    if not 0.0 <= coverage <= 1.0:
        raise ValueError(f"coverage is a share of prompts, in [0, 1]; got {coverage}")
    u = method_losses(d.uncheckable, False, fidelity, noise)
    c = method_losses(d.checkable, True, fidelity, noise)
    return {f: (1.0 - coverage) * u[f] + coverage * c[f] for f in FORCES}


def normalised(weights: tuple[float, float, float]) -> tuple[float, float, float]:
    """The forces' weights as a point of the triangle (they sum to 1)."""
    if len(weights) != 3 or min(weights) < 0:
        raise ValueError(f"weights are three numbers >= 0 (signal, estimator, cost); got {weights}")
    total = sum(weights)
    if total == 0:
        raise ValueError("every force has weight 0: turn at least one up, or nothing can be preferred")
    return tuple(w / total for w in weights)


def weighted(losses: dict[str, float], weights: tuple[float, float, float]) -> float:
    """Σ_f w_f · loss_f with the weights normalised: the score on the forces you weighed."""
    return sum(wf * losses[f] for wf, f in zip(normalised(weights), FORCES))


def score(losses: dict[str, float], weights: tuple[float, float, float]) -> float:
    """Σ_f w_f · loss_f with the weights normalised, plus the tie-break TIE · Σ_f loss_f."""
    return weighted(losses, weights) + TIE * sum(losses.values())


def rank(weights: tuple[float, float, float], coverage: float, fidelity: float,
         noise: dict[str, float]) -> list[dict]:
    """Every design with its losses, weighted loss and score, best first (a stable sort:
    exact ties keep DESIGNS' order)."""
    rows = []
    for d in DESIGNS:
        losses = design_losses(d, coverage, fidelity, noise)
        rows.append({"design": d, "losses": losses, "weighted": weighted(losses, weights),
                     "score": score(losses, weights)})
    return sorted(rows, key=lambda row: row["score"])


def tied_at_top(ranking: list[dict], tolerance: float = TOLERANCE) -> list[dict]:
    """The rows of `ranking` (rank's output) whose weighted loss is within `tolerance` of the
    best one's: the designs the simulator cannot tell apart on the forces you weighed. One
    row when the top is clear; the tie-break, not the forces, orders the others."""
    if not ranking:
        return []
    best = min(row["weighted"] for row in ranking)
    return [row for row in ranking if row["weighted"] - best < tolerance]


# The corners of the slider panel and the recipe each recovers: (signal, estimator, cost, coverage).
CORNERS = {
    "all signal, every prompt checkable": ((1, 0, 0), 1.0),
    "all signal, a fifth of the prompts uncheckable": ((1, 0, 0), 0.8),
    "all estimator, nothing checkable": ((0, 1, 0), 0.0),
    "all cost": ((0, 0, 1), 0.5),
    "signal and cost, half the prompts checkable": ((1, 0, 1), 0.5),
}


def corners(fidelity: float, noise: dict[str, float]) -> dict[str, str]:
    """The recipe that wins at each of CORNERS."""
    return {name: rank(w, cov, fidelity, noise)[0]["design"].recipe for name, (w, cov) in CORNERS.items()}


def corner_ties(fidelity: float, noise: dict[str, float]) -> dict[str, list[str]]:
    """At each of CORNERS, every recipe within TOLERANCE of the top (the winner first)."""
    return {name: [row["design"].recipe for row in tied_at_top(rank(w, cov, fidelity, noise))]
            for name, (w, cov) in CORNERS.items()}

