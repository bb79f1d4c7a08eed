"""The reward of a multi-step tool-use episode: final correctness, less the cost of the steps.

An agent is judged on its whole trajectory, not its last line. Two episodes that end with
the same right answer are not equally good if one called the tool once and the other
five times, or if one sent three malformed calls before getting it right. The agentic
reward adds those two costs to the verifier's verdict:

    reward = accuracy − step_cost × (tool calls) − malformed_penalty × (malformed calls)

where accuracy is the final answer's score (the verifier's, in [0, 1]). Only costs are
added, never bonuses: a bonus for well-formed calls would pay an episode whose answer is
wrong, and a policy optimising it would learn to call tools for their own sake. So a wrong
answer earns at most 0, and a right one at most 1, the fewer steps the better. A step
cost much above 1 / (calls a task needs) makes not answering cheaper than answering, and
the policy learns to guess: keep it small (0.01–0.05 on tool_arithmetic, which needs one call).

This is Kimi K2's "agentic" reward family reduced to its two measurable parts; the rubric
rewards (rewards/rubric.py) judge the answer's quality, and RewardStack combines them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AgenticReward:
    step_cost: float = 0.0  # subtracted per tool call the episode made
    malformed_penalty: float = 0.0  # subtracted per malformed call (bad format, unknown tool, bad arguments)

    def __post_init__(self) -> None:
        for name in ("step_cost", "malformed_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0 (a cost, never a bonus), got {value!r}")

    def __call__(self, accuracy: float, tool_calls: int, malformed_calls: int) -> tuple[float, dict[str, Any]]:
        """(reward, its parts) for one finished episode."""
        parts = {"accuracy": float(accuracy), "step_cost": -self.step_cost * tool_calls,
                 "malformed_penalty": -self.malformed_penalty * malformed_calls}
        return sum(parts.values()), parts
