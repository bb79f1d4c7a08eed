"""A thinking budget: at most B tokens inside `<think>` before the answer is forced.

Qwen3 (Yang et al. 2025, §4.3) lets a user cap how long a fused model thinks: once the
thinking has used its budget, generation stops, an instruction to stop thinking is appended
with the closing tag, and the model writes its answer from the thinking it has. The model
is never trained on that string: Qwen3 reports that thinking-mode fusion alone makes
answering from partial thinking work. gpt_mini does not manage it unless some of its /think
demonstrations are cut off the same way (envs/thinking_modes.py, budget_demos; docs/guides/search.md,
"Thinking-mode fusion"). This module is that sampler; the appended text is
verifiers/think_tags.py's EARLY_STOP, where the demonstrations read it too.

One row goes through at most three calls of the decode loop (Engine.continue_rows),
each batched over the rows still going:

    1. open      from the prompt until `<think>` appears in its text, or EOS, or
                 max_new_tokens: a row that answers without thinking (/no_think) ends here
    2. think     at most `budget` more tokens, until `</think>` appears
    3. answer    a row that closed its thinking itself continues to its answer; a row that
                 spent the whole budget first gets EARLY_STOP + "</think>\\n" appended, then
                 answers. Either way at most `answer_tokens` tokens.

So a forced row holds exactly `budget` sampled tokens between the token that completed
`<think>` and the appended text (tests/test_think_budget.py counts them). Budget 0 forces at
once: the thinking is the appended text alone.

The appended tokens were not chosen by the policy. The episode keeps them as an environment
turn (types.Turn), so they sit in the context and outside the response mask: a trainer
that took such an episode would never credit or blame the policy for them, and no
old_logp is invented for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from posttrain.config import SamplingParams
from posttrain.roles.engines import Engine
from posttrain.roles.engines.contract import STOP_BUDGET, STOP_STRING, STOP_TOKEN, Continuation, example_prompt_ids
from posttrain.types import ENVIRONMENT_TURN, MODEL_TURN, Episode, Example, Turn
from posttrain.verifiers.think_tags import EARLY_STOP, THINK_CLOSE, THINK_OPEN, forced_text


@dataclass
class ThinkingUse:
    """How one budgeted row spent its tokens."""

    opened: bool  # it wrote <think> (a /no_think answer does not)
    thinking_tokens: int  # sampled after the token that completed <think>: its thinking, </think> included
    forced: bool  # it reached the budget and had EARLY_STOP appended
    sampled_tokens: int  # every token the policy drew (EOS included), the appended ones not
    appended_tokens: int  # the appended instruction's tokens (0 unless forced)


def budgeted_generate(engine: Engine, examples: list[Example], budget: int, answer_tokens: int,
                      params: SamplingParams | None = None, generator: torch.Generator | None = None,
                      early_stop: str = EARLY_STOP) -> tuple[list[Episode], list[ThinkingUse]]:
    """One completion per example under a thinking budget of `budget` tokens (module
    docstring); the episodes (unscored) and how each spent its tokens."""
    if budget < 0 or answer_tokens < 1:
        raise ValueError(f"the thinking budget must be >= 0 and answer_tokens >= 1, got budget={budget}, "
                         f"answer_tokens={answer_tokens}")
    params = params or engine.params
    tok = engine.tokenizer
    prompts = [example_prompt_ids(tok, e) for e in examples]
    forced_ids = tok.encode(forced_text(early_stop))
    rows = len(examples)

    def go_on(which: list[int], contexts: Sequence[list[int]] | Mapping[int, list[int]], limit: list[int],
              stop: tuple[str, ...]) -> dict[int, Continuation]:
        """Continue the rows `which`, row i from contexts[i] (skipping a limit of 0: nothing to draw)."""
        chosen = [i for i in which if limit[i] > 0]
        drawn = engine.continue_rows([contexts[i] for i in chosen], [limit[i] for i in chosen], generator, params,
                                     stop_strings=stop) if chosen else []
        return dict(zip(chosen, drawn))

    opening = go_on(list(range(rows)), prompts, [params.max_new_tokens] * rows, (THINK_OPEN,))
    thinking_rows = [i for i in range(rows) if opening[i].stop == STOP_STRING]
    after_open = {i: prompts[i] + opening[i].token_ids for i in thinking_rows}
    thinking = go_on(thinking_rows, after_open, [budget if i in after_open else 0 for i in range(rows)],
                     (THINK_CLOSE,))
    closed = [i for i in thinking_rows if i in thinking and thinking[i].stop == STOP_STRING]
    # budget spent without </think> (or budget 0): force; an EOS while thinking ends the row unanswered
    forced = [i for i in thinking_rows if i not in thinking or thinking[i].stop == STOP_BUDGET]
    before_answer = {i: after_open[i] + (thinking[i].token_ids if i in thinking else [])
                     + (forced_ids if i in forced else []) for i in closed + forced}
    answering = go_on(closed + forced, before_answer, [answer_tokens if i in before_answer else 0
                                                       for i in range(rows)], ())

    episodes, uses = [], []
    for i, example in enumerate(examples):
        model_parts = [opening[i]] + ([thinking[i]] if i in thinking else [])
        first_logp = [p for part in model_parts for p in part.logp]
        first = Turn(MODEL_TURN, [t for part in model_parts for t in part.token_ids], first_logp,
                     "".join(part.text for part in model_parts))
        turns = [first]
        if i in forced:
            turns.append(Turn(ENVIRONMENT_TURN, list(forced_ids), None, forced_text(early_stop)))
        last = answering.get(i)
        if last is not None:
            if i in forced:
                turns.append(Turn(MODEL_TURN, last.token_ids, last.logp, last.text))
            else:  # all drawn by the policy: one model turn
                turns = [Turn(MODEL_TURN, first.token_ids + last.token_ids, first_logp + last.logp,
                              first.text + last.text)]
        final_stop = (last or (thinking[i] if i in thinking else opening[i])).stop
        episodes.append(Episode(
            example=example, group_id=i, prompt_ids=prompts[i],
            response_ids=[t for turn in turns for t in turn.token_ids],
            response_logp=[p for turn in turns for p in (turn.logp or [0.0] * len(turn.token_ids))],
            completion="".join(turn.text for turn in turns), weight_version=engine.weight_version,
            finished=final_stop == STOP_TOKEN, turns=turns if i in forced else None))
        sampled = sum(len(turn.token_ids) for turn in turns if turn.source == MODEL_TURN)
        uses.append(ThinkingUse(opened=i in after_open, thinking_tokens=len(thinking[i].token_ids) if i in thinking else 0,
                                forced=i in forced, sampled_tokens=sampled,
                                appended_tokens=len(forced_ids) if i in forced else 0))
    return episodes, uses
