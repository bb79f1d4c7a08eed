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

The same parts as terms of a reward stack (rl.reward.terms), each logged on its own
("reward/<name>") and, under rl.reward.normalize per_term, normalised on its own (GDPO).
The agent loop (roles/agent.py) applies the stack to a finished episode: a term reads the
final model turn as `completion` and the environment's details (a tool environment's
`tool_calls`, each with its output, and `n_malformed`: envs/tool_env.py) as `scored`:

    tool_validity     the share of the episode's call attempts that were well-formed and ran;
                      1 with no attempt (nothing was invalid): a cost on broken calls, never a
                      bonus for calling (the same for every sample that calls cleanly or not at all)
    call_cost         −(call attempts): a price per step, as step_cost above
    used_tool_result  1 when a number in the final answer appears in a successful call's output,
                      else 0. Unlike the two above it is a bonus, wrong answers included: it pays
                      for grounding, and it is the term a policy hacks: an answer
                      copied from a search snippet uses a tool result whether or not it is the
                      answer (envs/search_qa.py), so keep it below the verifier's weight
    transcript_rubric the rule-based rubric (rewards/rubric.py) on the whole transcript, model
                      turns and observations, instead of the final answer: a loop of repeated
                      calls or a runaway episode costs there

    --rl.reward.terms "accuracy + 0.2*tool_validity + 0.1*rubric"   (accuracy: the environment's verdict)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from posttrain.rewards.rubric import rule_based_rubric
from posttrain.rewards.stack import RewardTerm, Scored
from posttrain.roles.agent import TRANSCRIPT
from posttrain.types import Example


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


# ---------------------------------------------------------------------------------------
# The same parts as reward-stack terms (module docstring)
# ---------------------------------------------------------------------------------------


def tool_record(scored: Scored, term: str) -> tuple[list[dict[str, Any]], int]:
    """(the episode's calls that ran, its malformed call attempts), as a tool environment
    records them; ValueError naming `term` for an episode no tool environment scored. An
    episode a budget cut before the environment answered once made no call."""
    details = scored["details"]
    if "tool_calls" not in details:
        if "budget_exhausted" in details:
            return [], 0
        raise ValueError(f"reward term {term} reads the tool calls a tool environment records in its details "
                         f"(tool_calls, n_malformed: envs/tool_env.py), and this sample's details have none "
                         f"({sorted(details)[:8]}); use it with a tool environment (env.name tool_arithmetic or "
                         "search_qa)")
    return list(details["tool_calls"]), int(details.get("n_malformed", 0))


@dataclass(frozen=True)
class ToolCallValidity:
    """ok calls / (calls + malformed attempts); 1.0 when the episode attempted none."""

    name: str = "tool_validity"

    @property
    def spec(self) -> str:
        return self.name

    def __call__(self, example: Example, completion: str, scored: Scored) -> float:
        calls, malformed = tool_record(scored, self.name)
        attempts = len(calls) + malformed
        return 1.0 if attempts == 0 else sum(bool(call["ok"]) for call in calls) / attempts


@dataclass(frozen=True)
class ToolCallCost:
    """−(calls + malformed attempts): with weight w, each attempt costs w."""

    name: str = "call_cost"

    @property
    def spec(self) -> str:
        return self.name

    def __call__(self, example: Example, completion: str, scored: Scored) -> float:
        calls, malformed = tool_record(scored, self.name)
        return -float(len(calls) + malformed)


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class UsedToolResult:
    """1.0 when a number written in the final answer also appears in the output of a call
    that ran (the calculator's product, a figure in a retrieved passage), else 0.0. It reads
    whether the answer drew on a tool, not whether it is right: module docstring."""

    name: str = "used_tool_result"

    @property
    def spec(self) -> str:
        return self.name

    def __call__(self, example: Example, completion: str, scored: Scored) -> float:
        calls, _ = tool_record(scored, self.name)
        returned = {n for call in calls if call["ok"] for n in NUMBER.findall(str(call.get("output", "")))}
        return 1.0 if returned & set(NUMBER.findall(completion)) else 0.0


@dataclass(frozen=True)
class OnTranscript:
    """`term` scoring the whole episode, model turns and observations in order (what the agent
    loop passes under scored[TRANSCRIPT]), instead of its final answer; a single completion is
    its own transcript."""

    term: RewardTerm
    name: str

    @property
    def spec(self) -> str:
        return f"{self.name}={self.term.spec} on the transcript"

    def __call__(self, example: Example, completion: str, scored: Scored) -> float | Scored:
        return self.term(example, scored.get(TRANSCRIPT, completion), scored)


TOOL_TERMS = (ToolCallValidity, ToolCallCost, UsedToolResult)  # the terms that need a tool environment's record

# rl.reward.terms's agentic presets (pipelines/build.py adds them to its own)
AGENTIC_PRESETS: dict[str, Callable[[], Sequence[tuple[float, RewardTerm]]]] = {
    "tool_validity": lambda: [(1.0, ToolCallValidity())],
    "call_cost": lambda: [(1.0, ToolCallCost())],
    "used_tool_result": lambda: [(1.0, UsedToolResult())],
    "transcript_rubric": lambda: [(1.0, OnTranscript(rule_based_rubric(), "transcript_rubric"))],
}
