"""The code exercise of lesson 18a, in the shape `posttrain check` runs it (teach/exercises.py
builds an `Exercise` from each entry of `PART_III_B`): the library's own function adapted
to the stub's signature, the cases, and the hint a failure prints.

    18a  draw_probabilities   P(each prompt is drawn) under a pass-rate band and draw weights

The reference is `PromptPool.probabilities` (data/curation.py) on a pool of placeholder
prompts given the pass counts, at step 0 with no easy → hard order. Every case is
deterministic and runs in milliseconds.
"""

from __future__ import annotations

import torch

from posttrain.data.curation import PromptPool
from posttrain.types import Example


def _ref_draw_probabilities(passes, tries, low, high, weights):
    examples = [Example(prompt=f"prompt {i}", expected_answer="0") for i in range(len(passes))]
    pool = PromptPool(examples, seed=0, steps=1, band=(low, high), weights=weights)
    pool.set_measurement([int(n) for n in passes], tries)
    return torch.tensor(pool.probabilities(0), dtype=torch.float64)


def _draw_cases():
    u_shaped = torch.tensor([0, 3, 8, 4, 1, 7, 8, 0, 0, 6])  # (N,) of 8: hopeless, solved and the middle
    band = (0.125, 0.875)
    return [
        ("no band, uniform weights", (u_shaped, 8, 0.0, 1.0, "uniform")),
        ("no band, failure weights (1 − p: the hopeless drawn most)", (u_shaped, 8, 0.0, 1.0, "failure")),
        ("no band, signal weights (p(1 − p): 0/8 and 8/8 never drawn)", (u_shaped, 8, 0.0, 1.0, "signal")),
        ("band 1/8..7/8, uniform (the ends of the band are inside it)", (u_shaped, 8, *band, "uniform")),
        ("band 1/8..7/8, failure", (u_shaped, 8, *band, "failure")),
        ("band 3/8..1/2 and 4 tries", (torch.tensor([1, 2, 3, 4, 2, 0]), 4, 0.375, 0.5, "signal")),
        ("nothing inside the band: every prompt is a candidate", (torch.tensor([0, 8, 8, 0, 8]), 8, *band, "failure")),
        ("every candidate's weight is 0: drawn uniformly", (torch.tensor([8, 8, 8]), 8, 0.0, 1.0, "failure")),
    ]


PART_III_B: dict[str, dict] = {
    "18a": dict(function="draw_probabilities", lesson="18a", reference=_ref_draw_probabilities, cases=_draw_cases,
                hint="p = passes / tries; candidates = low <= p <= high (or every prompt if none is); weight 1, "
                     "1 − p or p(1 − p) per candidate, all 1 if they sum to 0; probability = weight / total over "
                     "the candidates, 0 for everyone else. Compare p with the band's ends inclusively."),
}
