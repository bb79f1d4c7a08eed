"""ToolEnvironment: the base class of a multi-turn task whose model may call tools.

It implements the multi-turn protocol of posttrain/roles/environment.py (structurally:
envs/ does not import roles/) on top of a task's own four methods:

    the task (yours)   sample(split, n, seed), fixed_set(split, n, seed),
                       score(example, answer) -> {"reward", "details"}, and for SFT
                       demonstration_turns(example) (the model turns of a correct episode;
                       `demonstration` and `solution` run them through step for the rest)
    the protocol       reset(example) -> state, step(state, model_turn) -> TurnResult,
                       max_turns, max_total_tokens                     (this class)

One episode, as the agent loop drives it:

    state = env.reset(example)
    model turn 1  "<tool_call>calculator: 347*829</tool_call>"
    env.step      -> TurnResult(observation="<tool_result>287663</tool_result>\\n", done=False)
    model turn 2  "Final: 287663"                       (no tool call: the final answer)
    env.step      -> TurnResult(done=True, reward=score(example, "Final: 287663")["reward"])

A turn is parsed by posttrain/envs/tool_calls.py (thinking, calls, answer). A turn with no
call, well-formed or not, is the final answer: its text outside <think> blocks is scored.
A turn with calls runs them in order (ToolRegistry.call never raises) and returns their
results as the observation. What goes wrong ends the episode with reward 0 or becomes an
observation the model can react to, always with a reason in the details (END_REASONS):

    a malformed call        on_malformed="continue": a <tool_error> observation;
                            on_malformed="end": done, reward 0, reason "malformed_call"
    a tool that raised or   the tool's own on_error policy (posttrain/envs/tools.py):
    timed out               "continue" (an error observation) or "end" (reason "tool_failed")
    a call in the last turn done, reward 0, reason "max_turns": its result could never be used

The final details: reason, turns, tool_calls (name, arguments, ok, reason, error, seconds,
output of each), malformed (reason, message, text of each), and the scorer's own details under
"answer". max_total_tokens is for the loop, which counts tokens; this class counts turns.

A tool-use task in a few lines (tests/test_tool_env.py runs this very text; imports:
random, Example, final_int, split_of from envs/arithmetic.py, calculator_tool):

    class Squares(ToolEnvironment):
        \"\"\"What is n*n for a 4-digit n? Answer `Final: <int>`.\"\"\"

        def __init__(self, max_turns: int = 3):
            super().__init__([calculator_tool()], call_format="compact", max_turns=max_turns)

        def sample(self, split, n, seed=None):
            return [self.example(k) for k in random.Random(seed).choices(self.numbers(split), k=n)]

        def fixed_set(self, split, n, seed=0):  # distinct problems, the same every call
            return [self.example(k) for k in random.Random(seed).sample(self.numbers(split), n)]

        def numbers(self, split):  # a hash of each number picks its split: none is in two
            return [k for k in range(1000, 10000) if split_of(str(k)) == split]

        def example(self, k):
            return Example(f"Q: {k}^2\\n", str(k * k), id=f"squares-{k}")

        def demonstration_turns(self, example):
            k = example.prompt[3:-3]
            return [f"<tool_call>calculator: {k}*{k}</tool_call>", f"Final: {int(k) ** 2}"]

        def score(self, example, answer):
            return final_int.score(example, answer, "final_int/strict-v1")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.tool_calls import CALL_FORMATS, RESULT_CLOSE, RESULT_OPEN, MalformedCall, parse_turn
from posttrain.envs.tools import Tool, ToolRegistry, ToolResult
from posttrain.rewards.agentic import AgenticReward
from posttrain.roles.thinking import check_thinking_policy
from posttrain.types import ENVIRONMENT_TURN, MODEL_TURN, Example, TurnResult

ON_MALFORMED = ("continue", "end")
END_REASONS: dict[str, str] = {
    "answered": "the model gave a turn without tool calls; it was scored",
    "malformed_call": "a malformed tool call, with on_malformed='end': reward 0",
    "tool_failed": "a tool whose on_error is 'end' raised or timed out: reward 0",
    "max_turns": "the model called a tool in its last allowed turn: reward 0",
}


@dataclass
class ToolEpisode:
    """The state of one episode (what reset returns and step updates)."""

    example: Example
    turns: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    malformed: list[dict[str, str]] = field(default_factory=list)  # the first max_calls_per_turn of each turn
    n_malformed: int = 0  # all of them


class ToolEnvironment:
    """Base class; a subclass supplies the task (sample, fixed_set, score, and
    demonstration_turns for SFT) and passes its tools here. Module docstring: the episode,
    what ends it, the details.

    tools               the Tools the model may call (or a ToolRegistry)
    call_format         "json" (Hermes/Qwen, chat models) or "compact" (character models)
    max_turns           model turns per episode; a call in the last one ends it with reward 0
    max_total_tokens    the token budget of the whole trajectory, for the agent loop to enforce
    on_malformed        "continue" (an error observation) or "end" (reward 0)
    max_calls_per_turn  calls run per turn; the rest are reported as too_many_calls
    agentic_reward      the costs of the steps taken, subtracted from the answer's score
                        (rewards/agentic.py); None = the answer's score alone
    """

    def __init__(self, tools: list[Tool] | ToolRegistry, call_format: str = "json", max_turns: int = 4,
                 max_total_tokens: int = 512, on_malformed: str = "continue", max_calls_per_turn: int = 4,
                 agentic_reward: AgenticReward | None = None, thinking: str = "keep_all"):
        check_thinking_policy(thinking)
        if call_format not in CALL_FORMATS:
            raise ValueError(f"call_format must be one of {CALL_FORMATS}, got {call_format!r}")
        if on_malformed not in ON_MALFORMED:
            raise ValueError(f"on_malformed must be one of {ON_MALFORMED}, got {on_malformed!r}")
        for name, value in (("max_turns", max_turns), ("max_total_tokens", max_total_tokens),
                            ("max_calls_per_turn", max_calls_per_turn)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.tools = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.call_format, self.on_malformed = call_format, on_malformed
        self.max_turns, self.max_total_tokens = max_turns, max_total_tokens
        # a model that floods one turn with calls gets the first few run and an error for the rest
        self.max_calls_per_turn = max_calls_per_turn
        self.agentic_reward = agentic_reward or AgenticReward()
        # which earlier thinking the model reads before its next turn (roles/thinking.py); the agent
        # loop reads it, so training and `posttrain eval` sample alike
        self.thinking = thinking

    @property
    def spec_version(self) -> str:
        """The scorer's name, recorded with every measurement (meta.json): a subclass whose
        score is a named verifier returns that name, and a new version when score changes."""
        return f"{type(self).__name__}/v1"

    # --- the multi-turn protocol -----------------------------------------------------------

    def reset(self, example: Example) -> ToolEpisode:
        return ToolEpisode(example)

    def step(self, state: ToolEpisode, model_turn: str) -> TurnResult:
        state.turns += 1
        parsed = parse_turn(model_turn, self.tools, self.call_format)
        if not parsed.has_calls:
            scored = self.score(state.example, parsed.answer)
            # format_ok on top, where a stacked format term reads a scorer's (rewards/stack.py::Format)
            return self._end(state, "answered", float(scored["reward"]), answer=scored["details"],
                             format_ok=bool(scored["details"].get("format_ok")))
        malformed = list(parsed.malformed)
        calls = parsed.calls[: self.max_calls_per_turn]
        if len(parsed.calls) > len(calls):
            malformed.append(MalformedCall("too_many_calls", f"{len(parsed.calls)} calls in one turn; at most "
                                           f"{self.max_calls_per_turn} run, the rest were skipped", ""))
        state.n_malformed += len(malformed)
        if len(malformed) > self.max_calls_per_turn:  # 10^5 broken tags must not become 10^5 lines of context
            skipped = len(malformed) - self.max_calls_per_turn
            malformed = malformed[: self.max_calls_per_turn] + [
                MalformedCall("too_many_calls", f"{skipped} more malformed calls in this turn, not listed", "")]
        state.malformed += [m.details() for m in malformed]
        if malformed and self.on_malformed == "end":
            return self._end(state, "malformed_call", 0.0)
        if state.turns >= self.max_turns:
            return self._end(state, "max_turns", 0.0)
        observation = []
        for call in calls:
            result = self.tools.call(call)
            # the output too: an agentic reward term reads whether the answer used it (rewards/agentic.py)
            state.tool_calls.append({"arguments": call.arguments, **result.details(), "output": result.output})
            if result.ends_episode:
                return self._end(state, "tool_failed", 0.0, failed_tool=result.name, error=result.error)
            observation.append(self.format_result(result))
        observation += [self.format_error(m) for m in malformed]
        # the record so far: the agent loop keeps it on an episode that a budget then ends
        return TurnResult("".join(observation), done=False, details={"turn": state.turns, **self.record(state)})

    # --- how results read (override for another convention) -----------------------------------

    def format_result(self, result: ToolResult) -> str:
        """The observation of one call. A chat model expects its template's tool turn
        around it; the agent loop, which knows the template, can add that."""
        if result.ok:
            return f"{RESULT_OPEN}{result.output}{RESULT_CLOSE}\n"
        return f"<tool_error>{result.name}: {result.error}</tool_error>\n"

    def format_error(self, malformed: MalformedCall) -> str:
        return f"<tool_error>{malformed.reason}: {malformed.message}</tool_error>\n"

    # --- the task (the subclass's) ------------------------------------------------------------

    def sample(self, split: str, n: int, seed: int | None = None) -> list[Example]:
        raise NotImplementedError(f"{type(self).__name__} must define sample(split, n, seed)")

    def fixed_set(self, split: str, n: int, seed: int = 0) -> list[Example]:
        raise NotImplementedError(f"{type(self).__name__} must define fixed_set(split, n, seed)")

    def demonstration_turns(self, example: Example) -> list[str]:
        """The model turns of a correct episode, for SFT; the tool results come from
        really running them (`demonstration`)."""
        raise NotImplementedError(f"{type(self).__name__} must define demonstration_turns(example) "
                                  "(or override solution)")

    def demonstration(self, example: Example) -> list[tuple[str, str]]:
        """A correct episode as (source, text) segments, MODEL_TURN and ENVIRONMENT_TURN, the
        environment's text produced by this environment's own step(), so a demonstration
        reads exactly like a rollout. For SFT, as for RL, the ENVIRONMENT_TURN text is state,
        not action: it must get loss mask 0 (training on it teaches the model to write tool
        results itself, the very thing it cannot do), and each MODEL_TURN ends with the
        model's stop token, as a sampled turn does. Raises if the episode's answer does not
        score 1: a demonstration that fails its own scorer would teach the wrong thing."""
        state, segments, result = self.reset(example), [], None
        for text in self.demonstration_turns(example):
            segments.append((MODEL_TURN, text))
            result = self.step(state, text)
            if result.observation:
                segments.append((ENVIRONMENT_TURN, result.observation))
            if result.done:
                break
        # the answer's score, before any step costs (agentic_reward) are subtracted
        if result is None or not result.done or result.details.get("reward_parts", {}).get("accuracy") != 1.0:
            raise ValueError(f"{type(self).__name__}: the demonstration of {example.id or example.prompt!r} "
                             f"does not end with reward 1 ({result.details if result else 'no turns'}); "
                             "fix demonstration_turns or the scorer")
        return segments

    def solution(self, example: Example) -> str:
        """The demonstration as one text (the Environment protocol's solution). Its tool
        results must not be trained on: SFT on a multi-turn task should read
        `demonstration(example)` and mask the ENVIRONMENT_TURN segments."""
        return "".join(text for _, text in self.demonstration(example))

    def score(self, example: Example, completion: str) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} must define score(example, answer)")

    # --- plumbing --------------------------------------------------------------------------------

    def _end(self, state: ToolEpisode, reason: str, accuracy: float, **extra: Any) -> TurnResult:
        reward, parts = self.agentic_reward(accuracy, len(state.tool_calls), state.n_malformed)
        # solved = the answer's own verdict, whatever the step costs (pass@1 counts it: verifiers/contract.py)
        details = {"reason": reason, "correct": parts["accuracy"] >= 1.0, "turns": state.turns,
                   "reward_parts": parts, **self.record(state), **extra}
        return TurnResult("", done=True, reward=reward, details=details)

    @staticmethod
    def record(state: ToolEpisode) -> dict[str, Any]:
        """The calls of the episode so far: what the agentic reward terms read (rewards/agentic.py)."""
        return {"n_tool_calls": len(state.tool_calls), "n_malformed": state.n_malformed,
                "tool_calls": state.tool_calls, "malformed": state.malformed}
