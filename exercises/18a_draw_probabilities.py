"""Exercise 18a · Which prompts a curated run draws, and how often (lesson 18a).

A pool of N training prompts has been measured: prompt i passed passes[i] of `tries`
samples, so its pass rate is p_i = passes[i] / tries. Return the probability that each
prompt is a step's draw:

  1. The candidates are the prompts whose pass rate is inside the band, low <= p_i <= high
     (both ends included). If no prompt is inside the band, every prompt is a candidate
     (a run keeps drawing rather than stop).
  2. Each candidate has a weight by `weights`:
         "uniform"  1
         "failure"  1 − p_i      (what the policy fails is drawn most)
         "signal"   p_i (1 − p_i) (the solved and the hopeless are never drawn)
     If every candidate's weight is 0 (say, all solved under "failure"), every candidate
     gets weight 1 instead.
  3. A candidate's probability is its weight over the candidates' total; every other
     prompt's is 0.

Check:  posttrain check 18a
"""

import torch


def draw_probabilities(passes: torch.Tensor, tries: int, low: float, high: float, weights: str) -> torch.Tensor:
    """(N,) float64 probabilities summing to 1, from the (N,) integer pass counts."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 18a: write draw_probabilities")
    # ---- END OF YOUR CODE ----
