"""Environment: the task's prompts and its verifier.

An environment (see posttrain/envs/) offers `sample(split, n, seed)` for prompts and
`score(example, completion) -> {"reward", "details"}` for rewards. This role applies the
verifier to freshly sampled episodes. The verifier sees only text: it cannot be
backpropagated through, which is why RL needs a policy-gradient estimator at all.

A multi-turn environment (`MultiTurnEnvironment`: tool use, games) answers every model turn
with an observation instead of waiting for one completion; roles/agent.py runs the loop,
and the episodes it returns already carry the reward of the final turn.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, TypeGuard, runtime_checkable

from posttrain.types import ENVIRONMENT_TURN, MODEL_TURN, Episode, Example, TurnResult  # noqa: F401 (docstring)
from posttrain.types import Environment  # the protocol lives in types.py, where every band can name it


@runtime_checkable
class MultiTurnEnvironment(Environment, Protocol):
    """An Environment whose episodes alternate model turns and observations.

    `reset(example)` starts an episode and returns its state (any object the environment
    wants to keep per episode: a game board, the tool calls so far); the prompt is the
    first observation, so reset returns no text. `step(state, model_turn)` reads the
    model's turn (its decoded text) and answers with a TurnResult: the observation to
    append (tool output, the game's reply), whether the episode is done, and when done
    its reward and details. The loop (roles/agent.py) stops an episode that reaches
    `max_turns` model turns, `max_total_tokens` response tokens (model and observation
    tokens together) or the model's positions with reward 0 and the budget named in its
    details.

    A whole environment (a model that must ask for a hint before answering):

        class HintThenAnswer:
            spec_version = "hint-then-answer-1"
            max_turns, max_total_tokens = 3, 96

            def sample(self, split, n, seed):
                return [Example(f"What is {i}+{i}? Ask 'hint?' first.\\n", str(2 * i)) for i in range(n)]

            def fixed_set(self, split, n, seed=0):
                return self.sample(split, n, seed)

            def solution(self, example):
                return f"Final: {example.expected_answer}"

            def demonstration(self, example):  # for SFT: the model's turns and the observations between
                return [(MODEL_TURN, "hint?"), (ENVIRONMENT_TURN, "<hint>double it</hint>\\n"),
                        (MODEL_TURN, self.solution(example))]

            def score(self, example, completion):
                ok = completion.strip() == f"Final: {example.expected_answer}"
                return {"reward": float(ok), "details": {"reason": "ok" if ok else "wrong"}}

            def reset(self, example):
                return {"example": example, "hinted": False}

            def step(self, state, model_turn):
                if "hint?" in model_turn and not state["hinted"]:
                    state["hinted"] = True
                    return TurnResult(observation="<hint>double it</hint>\\n")
                result = self.score(state["example"], model_turn)
                return TurnResult(done=True, reward=result["reward"], details=result["details"])

    (tests/test_agent_loop.py runs environments of this shape.)
    """

    max_turns: int  # model turns per episode at most; reaching it ends the episode with reward 0
    max_total_tokens: int  # response tokens (model + observations) per episode at most, the same way

    def demonstration(self, example: Example) -> list[tuple[str, str]]:
        """A correct episode as (source, text) segments, MODEL_TURN and ENVIRONMENT_TURN in
        order, for SFT (pipelines/sft.py): each model turn is trained and ended with EOS as
        a sampled turn ends; each observation is tokenised as the agent loop tokenises it
        and masked, since the model must learn to call the tool, not to write its output."""
        ...

    def reset(self, example: Example) -> Any: ...

    def step(self, state: Any, model_turn: str) -> TurnResult: ...


def is_multi_turn(env: Environment) -> TypeGuard[MultiTurnEnvironment]:
    """Whether `env` declares the multi-turn protocol (reset, step and both budgets): then
    the rollout role samples it with the agent loop (roles/agent.py), not `generate`."""
    return isinstance(env, MultiTurnEnvironment)


def score_episodes(score: Callable[[Example, str], dict[str, Any]], episodes: list[Episode]) -> list[Episode]:
    """Fill in `reward` and `details` of each episode, in place. `score` is the
    environment's verifier (`env.score`) or a reward built on it (posttrain/rewards/stack.py).
    A multi-turn episode (`turns`) keeps the reward its environment gave it along the way:
    its last completion alone is not what was scored."""
    for episode in episodes:
        if episode.turns is not None:
            continue
        result = score(episode.example, episode.completion)
        episode.reward = float(result["reward"])
        episode.details = result["details"]
    return episodes
