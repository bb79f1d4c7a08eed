"""Exercise 18 · An honest verifier: the final_int/cot-v1 spec (lesson 18).

A completion may show worked steps, then must end with one answer line. Reward 1.0 when,
after stripping surrounding ASCII whitespace (space, tab, newline, CR, form feed,
vertical tab):

  - exactly one line starts with "Final:" (lines are split on "\n"), and it is the last;
  - that line is "Final: " (one space) followed by an integer and nothing else;
  - the integer is written canonically: ASCII digits 0-9 only, an optional leading "-",
    no "+", no leading zero ("0" itself is fine), and not "-0";
  - the integer string equals the expected answer.

Anything else scores 0.0. The golden correct set must all pass and the golden exploit
pack must all fail (posttrain/data/packs/).

Check:  posttrain check 18
"""

import torch


def cot_v1_rewards(expected_answers: list[str], completions: list[str]) -> torch.Tensor:
    """(B,) rewards, 1.0 or 0.0, of completions[b] against expected_answers[b]."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 18: write cot_v1_rewards")
    # ---- END OF YOUR CODE ----
