"""The model's thinking across tool calls: what of its earlier `<think>…</think>` it sees
when it writes its next turn, and a check that a chat template does not drop it unasked.

The policies (THINKING_POLICIES), applied to earlier MODEL turns only (the prompt and the
tool output are never changed):

    keep_all   (default) every turn's thinking stays. The context of turn k+1 is the
               context of turn k plus what was appended since: the whole episode is ONE
               token sequence, sampled once, trained once, each model token's old_logp
               taken in the very context the trainer will recompute it in.
    keep_last  only the most recent model turn keeps its thinking; older ones lose it
               (saves context on long episodes; the latest reasoning is what the next
               call builds on).
    drop       no earlier thinking is shown (Qwen3's chat template does this to assistant
               turns before the last user message; DeepSeek-R1's to all earlier turns).

The agent loop (roles/agent.py) runs all three, on token ids, never on re-tokenised text:
`thinking_token_mask` marks which of a model turn's sampled ids lie inside its thinking,
and the next turn's context leaves those ids out of the turns the policy strips, keeping
every other id as drawn.

Why keep_last and drop split an episode into one training row per model turn: under them,
turn k is sampled whole, thinking included, but turn k+1 is sampled in a context from
which turn k's thinking has been removed. So the sequence "context of turn k + turn k as
sampled" is NOT a prefix of the context of turn k+1, and no single sequence holds every
model turn in the context it was generated in. A teacher-forced pass over the concatenated
trajectory would compute log-probs under contexts the sampler never saw: the ratio
π_θ/π_old would be off from the first step, silently. The honest layout is one row per
model turn, (the ids the model read, that turn's sampled ids), each row sharing the
episode's reward (types.py `Turn.context_ids`, `Episode.training_rows`), with the group
statistics counting each episode once (`RolloutBatch.row_weights`). It costs a forward pass
over the shared context per turn instead of one per episode, which is why keep_all is the
default. `context_for_next_turn` and `training_rows` below are the same rule on text, for
reading and for the lessons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from posttrain.types import MODEL_TURN, Turn
# the tag parser lives with the verifiers (a scorer reads the answer after the thinking);
# imported here under the names this module has always offered
from posttrain.verifiers.think_tags import THINK_CLOSE, THINK_OPEN, split_thinking, strip_thinking, thinking_spans

if TYPE_CHECKING:  # for the annotation only: importing transformers here would slow every start-up
    from transformers import PreTrainedTokenizerBase

THINKING_POLICIES = ("keep_all", "keep_last", "drop")


def thinking_token_mask(decode: Callable[[list[int]], str], token_ids: list[int]) -> list[bool]:
    """For each id of a model turn, whether it lies wholly inside a <think>…</think> block
    (tags included) of the turn's text. Token boundaries come from decoding each prefix,
    so a BPE token spanning the block's edge ("</think>" merged with the newline after it)
    is kept, not cut: a policy strips whole sampled ids, never re-tokenised text. The mask
    only shapes a context the model reads; the trainer reads that same context back
    (Turn.context_ids), so it needs to be sensible, not exact to the character."""
    ends, longest = [], 0
    for k in range(1, len(token_ids) + 1):
        # a prefix ending inside a multi-byte character can decode shorter: never step back
        longest = max(longest, len(decode(token_ids[:k])))
        ends.append(longest)
    spans = thinking_spans(decode(token_ids))
    starts = [0] + ends[:-1]
    return [end > start and any(lo <= start and end <= hi for lo, hi in spans) for start, end in zip(starts, ends)]


def check_thinking_policy(policy: str) -> None:
    if policy not in THINKING_POLICIES:
        raise ValueError(f"thinking policy must be one of {THINKING_POLICIES}, got {policy!r}")


def context_for_next_turn(prompt: str, turns: list[Turn], policy: str = "keep_all") -> str:
    """The text the model reads before it writes its next turn, after `turns` (model and
    environment turns, in order), under a thinking policy (module docstring)."""
    check_thinking_policy(policy)
    model_turns = [i for i, turn in enumerate(turns) if turn.source == MODEL_TURN]
    keep = {"keep_all": set(model_turns), "keep_last": set(model_turns[-1:]), "drop": set()}[policy]
    pieces = [prompt]
    for i, turn in enumerate(turns):
        shown = turn.text if turn.source != MODEL_TURN or i in keep else strip_thinking(turn.text)
        pieces.append(shown)
    return "".join(pieces)


@dataclass
class TrainingRow:
    """One sequence the trainer sees: `context` (tokenised by the caller; never trained on)
    followed by `turns`, whose MODEL turns are trained and whose other turns are masked."""

    context: str
    turns: list[Turn]


def training_rows(prompt: str, turns: list[Turn], policy: str = "keep_all") -> list[TrainingRow]:
    """How one episode becomes training rows under a policy: keep_all gives one row, the
    whole trajectory; keep_last and drop give one row per model turn, each in the context
    it was sampled from (module docstring). The environment turn after the last model turn
    (if any) belongs to no row: nothing was sampled after it."""
    check_thinking_policy(policy)
    if policy == "keep_all":
        return [TrainingRow(prompt, list(turns))]
    return [TrainingRow(context_for_next_turn(prompt, turns[:i], policy), [turn])
            for i, turn in enumerate(turns) if turn.source == MODEL_TURN]


# --- does the chat template keep earlier thinking? ----------------------------------------

MARKER = "th1nk1ng-marker-7c2f"  # text no template adds itself, to find in the rendering


@dataclass
class ThinkingCheck:
    kept: bool  # the earlier assistant turn's thinking is in the rendered conversation
    rendered: str  # the template's text, to read when it was not
    message: str


def template_keeps_thinking(tokenizer: PreTrainedTokenizerBase) -> ThinkingCheck:
    """Render [user, assistant with <think>, user] through `tokenizer.apply_chat_template`
    (a Hugging Face tokenizer) and report whether the assistant's thinking survived. A
    template that drops it (Qwen3's strips <think> from assistant turns before the last user
    message) would make a re-rendered conversation differ from the sampled one: check before
    building a multi-turn context by re-rendering messages, rather than by appending ids."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{type(tokenizer).__name__} has no chat template: nothing to check (a model without "
                         "one sees the trajectory as plain text, and plain text drops nothing)")
    answer = "The answer is 4."
    conversation = [{"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": f"{THINK_OPEN}{MARKER}{THINK_CLOSE}{answer}"},
                    {"role": "user", "content": "And 3+3?"}]
    try:
        rendered = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    except Exception as error:  # a template's own error (jinja), reported with what we asked it to render
        raise ValueError(f"the chat template failed to render a user/assistant/user conversation: "
                         f"{type(error).__name__}: {error}") from None
    if answer not in rendered:
        return ThinkingCheck(False, rendered, "the template dropped the whole earlier assistant turn, not only "
                             "its thinking: it cannot render a multi-turn episode faithfully")
    if MARKER not in rendered:
        return ThinkingCheck(False, rendered, "the template strips <think>…</think> from earlier assistant turns: "
                             "a conversation re-rendered from messages loses the thinking the model saw when it "
                             "sampled (use token-in/token-out, or the keep_last/drop rows of training_rows)")
    return ThinkingCheck(True, rendered, "the template keeps earlier thinking")
