"""Agent: the multi-turn rollout loop, token-in/token-out.

For K samples of each Example, every episode starts from its prompt (`env.reset`), then,
until the environment says done or a budget runs out:

    1. continue    every unfinished episode by one model turn, all in one batched call
                   (Engine.continue_rows: the sampler `generate` uses)
    2. step        env.step(state, the turn's text) -> TurnResult
    3. observe     the observation is tokenised once and appended as an ENVIRONMENT_TURN

Token-in/token-out is the whole point. A model turn keeps the ids the sampler drew with
their log π_old; its text is only read (by `env.step`), never encoded again, because
decode-then-encode does not give the same ids back in general (a BPE tokenizer may split
"</tool_call>" differently from how the model wrote it), and then the trainer would score
tokens the sampler never drew and the importance ratio would be wrong with no error. The
observation is tokenised exactly once, here, and those ids are what the model reads next
and what the trainer sees.

How an observation becomes tokens (`observation_ids`):
  - a tokenizer with a chat template (an instruct model, models/hf.py::HFTokenizer): the
    tokens the template puts between an assistant's message and the next assistant
    message when a `role` message holding the observation comes between them, i.e. the
    end of the assistant's turn, the observation's turn, and the header of the next
    assistant turn (SmolLM2: `<|im_end|>\\n<|im_start|>user\\nOBS<|im_end|>\\n<|im_start|>assistant\\n`).
    When the model's turn already ended with its end-of-turn token (EOS) that token is
    not written a second time.
  - any other tokenizer (gpt_mini's characters): the observation's text as it is.

Thinking across turns (roles/thinking.py): under keep_all (the default) the next turn's
context is the trajectory so far, so the episode is one training row. Under keep_last and
drop the loop leaves earlier turns' thinking ids out of the next context (the ids, never
re-tokenised text) and records that context on the turn it sampled (`Turn.context_ids`);
the controller then trains one row per model turn (`Episode.training_rows`). A chat
template that strips earlier <think> (Qwen3's) cannot strip it behind the loop's back:
the loop never renders a model turn through the template again.

An episode that reaches `env.max_turns` model turns, `env.max_total_tokens` response
tokens (model and observation tokens together) or the model's positions (max_seq_len: the
trainer reads the whole row; under keep_last / drop, the next turn's context) ends with reward 0 and that budget in its details
(`budget_exhausted`), never with an error; only a prompt that leaves no room for a first
turn is an error (a setting to fix). Episodes come back grouped exactly like
`generate`'s (the K samples of example i share group_id first_group + i), so GRPO and the
rest of the RL step read them unchanged; RolloutBatch.collate masks the environment's tokens.
An episode a budget ends keeps what its environment last reported along the way (a tool
environment's calls so far), so a reward that reads the calls sees them on it too.

A reward stacked on the environment's verdict (`reward`, rewards/stack.py's RewardStack:
Kimi K2's joint reward of verifiable, rubric and agentic terms) is applied to each finished
episode here: its terms read the final model turn as the completion, the environment's
reward and details as the scorer's result, and the whole transcript (model turns and
observations in order) under scored[TRANSCRIPT].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from posttrain.config import SamplingParams
from posttrain.models.hf import HFTokenizer
from posttrain.roles.environment import MultiTurnEnvironment
from posttrain.roles.engines import Engine
from posttrain.roles.engines.contract import STOP_BUDGET, STOP_TOKEN, Continuation, example_prompt_ids
from posttrain.roles.thinking import check_thinking_policy, thinking_token_mask
from posttrain.types import ENVIRONMENT_TURN, MODEL_TURN, Episode, Example, Tokenizer, Turn, TurnResult

# why an episode ended, in its details["ended_by"]
DONE, MAX_TURNS, MAX_TOTAL_TOKENS, MAX_SEQ_LEN = "done", "max_turns", "max_total_tokens", "max_seq_len"
_MARK = "\x00posttrain-observation\x00"  # stands in for the observation when the template is rendered
TRANSCRIPT = "transcript"  # the key of the whole episode's text in what a stacked reward's terms read


class EpisodeReward(Protocol):
    """A reward on top of a finished episode's verdict: (example, the final model turn,
    {"reward", "details", TRANSCRIPT}) -> {"reward", "details"}. A RewardStack is one."""

    def __call__(self, example: Example, completion: str, scored: dict[str, Any]) -> dict[str, Any]: ...


def chat_observation_ids(tokenizer: HFTokenizer, observation: str, role: str, after_end_of_turn: bool) -> list[int]:
    """The ids a chat template puts around an observation: from the end of an assistant's
    message to the start of the next assistant message (see the module docstring),
    tokenised as one string. `after_end_of_turn`: the model's turn already ends with EOS."""
    messages = [{"role": "user", "content": "question"}, {"role": "assistant", "content": _MARK},
                {"role": role, "content": _MARK}]
    text = tokenizer.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    between = text.split(_MARK)
    if len(between) != 3:
        raise ValueError(f"the chat template of {tokenizer!r} did not render an assistant message followed by a "
                         f"{role!r} message verbatim, so the tokens around an observation cannot be read from it: "
                         "pass another observation_role (e.g. 'user') or a tokenizer without a chat template")
    ids = tokenizer.encode(between[1] + observation + between[2])
    if after_end_of_turn and ids[:1] == [tokenizer.eos_id]:
        ids = ids[1:]  # the model already wrote its end-of-turn token: the trajectory has it once
    return ids


def observation_ids(tokenizer: Tokenizer, observation: str, role: str = "user",
                    after_end_of_turn: bool = False) -> list[int]:
    """The observation's tokens, tokenised once: wrapped as the chat template wraps a
    `role` message for a chat tokenizer, the text as it is for any other."""
    if isinstance(tokenizer, HFTokenizer) and tokenizer.chat:
        return chat_observation_ids(tokenizer, observation, role, after_end_of_turn)
    return tokenizer.encode(observation)


@dataclass
class _Running:
    """One episode while the loop runs it."""

    example: Example
    group_id: int
    state: Any
    prompt_ids: list[int]
    thinking: str = "keep_all"  # which earlier thinking the next turn sees (roles/thinking.py)
    turns: list[Turn] = field(default_factory=list)
    # per turn: which of a model turn's ids are thinking (None for an environment turn, and
    # under keep_all, which never needs it)
    thinking_masks: list[list[bool] | None] = field(default_factory=list)
    response_tokens: int = 0  # model and observation tokens so far
    result: TurnResult | None = None  # set when the episode ends
    ended_by: str = ""
    # the details of the environment's last answer: an episode a budget ends keeps them (its tool calls so far)
    progress: dict[str, Any] = field(default_factory=dict)

    @property
    def trajectory(self) -> list[int]:
        """The prompt and every turn as drawn: what the trainer reads under keep_all."""
        return self.prompt_ids + [i for turn in self.turns for i in turn.token_ids]

    @property
    def context(self) -> list[int]:
        """The ids the model reads before its next turn: the trajectory, less the thinking
        ids of the earlier model turns the policy strips (all but the last under keep_last,
        all under drop). Every id that stays is the one drawn or appended."""
        if self.thinking == "keep_all":
            return self.trajectory
        model_turns = [k for k, turn in enumerate(self.turns) if turn.source == MODEL_TURN]
        keep = set(model_turns[-1:]) if self.thinking == "keep_last" else set()
        context = list(self.prompt_ids)
        for k, (turn, mask) in enumerate(zip(self.turns, self.thinking_masks)):
            # (a model turn has its mask under keep_last and drop; an environment turn has none)
            if turn.source == MODEL_TURN and k not in keep and mask is not None:  # strip its thinking
                context += [i for i, thinking in zip(turn.token_ids, mask) if not thinking]
            else:
                context += turn.token_ids
        return context

    @property
    def model_turns(self) -> int:
        return sum(turn.source == MODEL_TURN for turn in self.turns)

    def end(self, reason: str, result: TurnResult | None = None) -> None:
        """Stop here: with the environment's final result, or a budget's reward 0."""
        self.ended_by = reason
        self.result = result or TurnResult(done=True, reward=0.0, details={**self.progress, "reason": reason})

    def episode(self, weight_version: int) -> Episode:
        assert self.result is not None and self.result.reward is not None, "an episode is read once it has ended"
        response_ids = [i for turn in self.turns for i in turn.token_ids]
        response_logp = [lp for turn in self.turns for lp in (turn.logp or [0.0] * len(turn.token_ids))]
        details = {**self.result.details, "turns": self.model_turns, "ended_by": self.ended_by}
        if self.ended_by != DONE:
            details["budget_exhausted"] = self.ended_by
        return Episode(example=self.example, group_id=self.group_id, prompt_ids=self.prompt_ids,
                       response_ids=response_ids, response_logp=response_logp,
                       completion="".join(turn.text for turn in self.turns), reward=float(self.result.reward),
                       details=details, weight_version=weight_version, finished=self.ended_by == DONE,
                       turns=self.turns)


class AgentLoop:
    """Samples a MultiTurnEnvironment's episodes; called as the rollout role's sampler
    (roles/rollout.py::sample_shard) in place of `engine.generate`.

    stop_strings      a model turn also ends at the first of these in its text (e.g.
                      "</tool_call>"), not only at EOS
    observation_role  the chat role an observation is rendered as (chat tokenizers only)
    thinking          which earlier <think>…</think> the model reads when it writes its next
                      turn: keep_all, keep_last or drop (roles/thinking.py); None takes the
                      environment's `thinking` setting, keep_all when it has none
    reward            a reward stacked on each finished episode's verdict (EpisodeReward);
                      None: the environment's own reward (the last TurnResult's)
    """

    def __init__(self, env: MultiTurnEnvironment, stop_strings: tuple[str, ...] = (), observation_role: str = "user",
                 thinking: str | None = None, reward: EpisodeReward | None = None):
        for budget, value in (("max_turns", env.max_turns), ("max_total_tokens", env.max_total_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(env).__name__}.{budget} is {value!r}: a multi-turn environment needs a "
                                 "positive integer budget, or one episode could run forever")
        # the protocol's optional setting (ToolEnvironment's, --env.tool_arithmetic.thinking): an environment that
        # declares none shows the model its whole trajectory
        if not thinking:
            thinking = getattr(env, "thinking", "keep_all")
        check_thinking_policy(thinking)
        self.env, self.stop_strings, self.observation_role = env, tuple(stop_strings), observation_role
        self.thinking = thinking
        self.reward = reward

    def __call__(self, engine: Engine, examples: list[Example], samples_per_prompt: int = 1,
                 generator: torch.Generator | None = None, params: SamplingParams | None = None,
                 first_group: int = 0) -> list[Episode]:
        """K = samples_per_prompt episodes of each example, grouped like `generate`'s."""
        params = params or engine.params
        tok, env = engine.tokenizer, self.env
        running = []
        for i, example in enumerate(examples):
            prompt_ids = example_prompt_ids(tok, example)
            for _ in range(samples_per_prompt):
                running.append(_Running(example, first_group + i, env.reset(example), prompt_ids, self.thinking))
        while True:
            contexts, budgets, rows = [], [], []
            for r in running:
                if r.result is not None:
                    continue
                context = r.context  # with keep_last / drop, shorter than the trajectory
                budget = min(params.max_new_tokens, env.max_total_tokens - r.response_tokens,
                             engine.max_seq_len - len(context))
                if r.model_turns >= env.max_turns:
                    r.end(MAX_TURNS)
                elif not r.turns and budget < 1:  # not even a first turn: a setting is wrong, not the episode
                    raise ValueError(f"the prompt {r.example.prompt[:60]!r} is {len(context)} tokens, which leaves "
                                     f"no room in the model's {engine.max_seq_len} positions for a "
                                     "model turn: shorten the prompt or use a longer-context model")
                elif budget < 1:
                    r.end(MAX_TOTAL_TOKENS if env.max_total_tokens <= r.response_tokens else MAX_SEQ_LEN)
                else:
                    contexts.append(context)
                    budgets.append(budget)
                    rows.append(r)
            if not rows:
                break
            turns = engine.continue_rows(contexts, budgets, generator, params, self.stop_strings)
            for r, turn, budget, context in zip(rows, turns, budgets, contexts):
                # the context it was sampled in, when that is not the trajectory: its training row's
                context_ids = context if len(context) != len(r.prompt_ids) + r.response_tokens else None
                self.take_turn(r, turn, budget < params.max_new_tokens, tok, engine.max_seq_len,
                               context_ids)
        episodes = [r.episode(engine.weight_version) for r in running]
        if self.reward is not None:
            for r, episode in zip(running, episodes):
                stack_reward(self.reward, r, episode)
        return episodes

    def take_turn(self, r: _Running, turn: Continuation, cut_by_episode_budget: bool, tok: Tokenizer, max_seq_len: int,
                  context_ids: list[int] | None = None) -> None:
        """Append the model's turn, ask the environment, append its observation (if it fits
        the episode's budget and the model's positions: the trainer reads the whole row)."""
        r.turns.append(Turn(MODEL_TURN, turn.token_ids, turn.logp, turn.text, context_ids=context_ids))
        r.thinking_masks.append(None if r.thinking == "keep_all" else thinking_token_mask(tok.decode, turn.token_ids))
        r.response_tokens += len(turn.token_ids)
        if turn.stop == STOP_BUDGET and cut_by_episode_budget:
            # cut off by the episode's own budget, not the per-turn one: nothing complete to answer
            r.end(MAX_TOTAL_TOKENS if r.response_tokens >= self.env.max_total_tokens else MAX_SEQ_LEN)
            return
        result = self.env.step(r.state, turn.text)
        r.progress = result.details
        if result.done:
            if result.reward is None:
                raise ValueError(f"{type(self.env).__name__}.step ended an episode (done=True) without a reward: "
                                 "return TurnResult(done=True, reward=..., details=...)")
            r.end(DONE, result)
            return
        if not result.observation:
            return  # the model simply goes on (a thought, a partial answer)
        ids = observation_ids(tok, result.observation, self.observation_role,
                              after_end_of_turn=turn.stop == STOP_TOKEN and turn.token_ids[-1] == tok.eos_id)
        if r.response_tokens + len(ids) > self.env.max_total_tokens:
            r.end(MAX_TOTAL_TOKENS)  # the observation does not fit: the trajectory ends at the model's turn
            return
        if len(r.context) + len(ids) > max_seq_len:  # the next turn's row would start past the positions
            r.end(MAX_SEQ_LEN)
            return
        r.turns.append(Turn(ENVIRONMENT_TURN, ids, None, result.observation))
        r.thinking_masks.append(None)
        r.response_tokens += len(ids)


def stack_reward(reward: EpisodeReward, r: _Running, episode: Episode) -> None:
    """`reward` on one finished episode, in place: its terms read the final model turn (the
    answer the environment scored), the environment's verdict, and the transcript."""
    answer = next((turn.text for turn in reversed(r.turns) if turn.source == MODEL_TURN), "")
    scored = reward(episode.example, answer,
                    {"reward": episode.reward, "details": episode.details, TRANSCRIPT: episode.completion})
    episode.reward, episode.details = float(scored["reward"]), scored["details"]
