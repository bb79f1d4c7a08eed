"""The algorithm registry: a name -> class dict. Every entry follows the same contract
(`posttrain.algorithms.contract.Algorithm`), so callers never special-case an algorithm.

    algo = make_algorithm("grpo", kl_coef=0.04)
    algo = make_algorithm("dr_grpo", budget=48)   # max_len = the generation budget
"""

from __future__ import annotations

import dataclasses
from typing import Any

from posttrain.algorithms.cispo import CISPO
from posttrain.algorithms.contract import Algorithm, make_from_registry
from posttrain.algorithms.dapo import DAPO
from posttrain.algorithms.dppo import DPPOBinaryKL, DPPOBinaryTV
from posttrain.algorithms.dr_grpo import DrGRPO
from posttrain.algorithms.gmpo import GMPO
from posttrain.algorithms.grpo import GRPO
from posttrain.algorithms.gspo import GSPO
from posttrain.algorithms.kimi import Kimi
from posttrain.algorithms.lite_ppo import LitePPO
from posttrain.algorithms.opd import OPD
from posttrain.algorithms.ppo import PPO
from posttrain.algorithms.prime import PRIME
from posttrain.algorithms.reinforce import REINFORCE
from posttrain.algorithms.reinforce_pp import ReinforcePP
from posttrain.algorithms.rloo import RLOO
from posttrain.algorithms.sapo import SAPO

# The family tree, parent first: each entry is a small diff on the one it extends.
ALGORITHMS: dict[str, type[Algorithm]] = {
    "reinforce": REINFORCE,  # the root: −(R − b) · log π
    "rloo": RLOO,  # REINFORCE, leave-one-out baseline
    "kimi": Kimi,  # REINFORCE, group-mean baseline, + τ/2 · (log π(y) − log π_old(y))² (mirror descent)
    "ppo": PPO,  # REINFORCE + critic, ratio and clip
    "prime": PRIME,  # RLOO + an online implicit PRM's process returns, under PPO's clip
    "reinforce_pp": ReinforcePP,  # PPO without the critic, batch-whitened reward-to-go
    "grpo": GRPO,  # PPO's clip, group baseline instead of a critic
    "dr_grpo": DrGRPO,  # GRPO without /std and /|o|
    "lite_ppo": LitePPO,  # GRPO with the group mean over the batch std, and token-mean
    "dapo": DAPO,  # GRPO + clip-higher, token-mean, overlong shaping, dynamic sampling
    "gspo": GSPO,  # GRPO with a sequence-level ratio
    "cispo": CISPO,  # GRPO's advantages, clipped stop-gradient IS weight instead of the clip
    "sapo": SAPO,  # GRPO's advantages, a soft sigmoid gate on the ratio instead of the clip
    "gmpo": GMPO,  # GSPO's geometric mean of token ratios, each clipped in log space before the mean
    "dppo_tv": DPPOBinaryTV,  # CISPO's loss, tokens whose probability moved > δ (total variation) masked out
    "dppo_kl": DPPOBinaryKL,  # DPPO-TV with the binary KL as the divergence
    "opd": OPD,  # GRPO's loss on a frozen teacher's per-token reverse KL as the advantage (or its top-k forward KL)
}


def make_algorithm(name: str, budget: int | None = None, **params: Any) -> Algorithm:
    """Build the algorithm registered as `name` with hyperparameters `params`.

    `budget` is the generation budget (the rollout's max_new_tokens): an algorithm that
    measures lengths against it (`max_len`: Dr.GRPO's divisor, DAPO's L_max) gets it, unless
    `params` sets max_len on purpose, so the budget is set in one place.

    Raises ValueError for an unknown name (listing the valid names) and for an unknown
    or invalid hyperparameter (listing the valid fields with their defaults)."""
    if budget is not None and name in ALGORITHMS and "max_len" in {f.name for f in dataclasses.fields(ALGORITHMS[name])}:
        params.setdefault("max_len", budget)
    return make_from_registry(ALGORITHMS, "algorithm", name, params)


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "CISPO",
    "DAPO",
    "DPPOBinaryKL",
    "DPPOBinaryTV",
    "DrGRPO",
    "GRPO",
    "GMPO",
    "GSPO",
    "Kimi",
    "LitePPO",
    "OPD",
    "PPO",
    "PRIME",
    "REINFORCE",
    "RLOO",
    "SAPO",
    "ReinforcePP",
    "make_algorithm",
]
