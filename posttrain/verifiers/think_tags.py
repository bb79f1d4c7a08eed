"""`<think>…</think>` blocks in a completion's text: the one parser every reader of thinking
shares. The verifiers read the answer after the thinking (final_int/think-v1), the agent
loop decides which earlier thinking the next turn sees (roles/thinking.py), the tool-call
parser skips calls written inside thinking (envs/tool_calls.py), and the thinking-budget
sampler finds where thinking opens and closes (roles/think_budget.py).

It lives with the verifiers, the lowest room that reads completions, so that a scorer can
use it without importing the roles above it.

Cost: one left-to-right scan with str.find, linear in the text.
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# What a thinking budget appends when it runs out (roles/think_budget.py), before THINK_CLOSE:
# our own wording of Qwen3's idea, short because gpt_mini reads it one character at a time.
# Here, beside the tags, because demonstrations of a cut-off thinking (envs/thinking_modes.py)
# must end exactly as the sampler ends one.
EARLY_STOP = "\nTime is up; answering now.\n"


def forced_text(early_stop: str = EARLY_STOP) -> str:
    """What a row that spent its thinking budget gets appended: the instruction, the closing
    tag and the newline a demonstration has between its thinking and its answer."""
    return f"{early_stop}{THINK_CLOSE}\n"


def split_thinking(text: str) -> tuple[list[str], str, bool]:
    """(the text of each <think> block, the text outside them, whether a <think> was left
    open: an unclosed block runs to the end of the text)."""
    blocks: list[str] = []
    outside: list[str] = []
    position = 0
    while True:
        start = text.find(THINK_OPEN, position)
        if start < 0:
            outside.append(text[position:])
            return blocks, "".join(outside), False
        outside.append(text[position:start])
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
        if end < 0:
            blocks.append(text[start + len(THINK_OPEN):])
            return blocks, "".join(outside), True
        blocks.append(text[start + len(THINK_OPEN):end])
        position = end + len(THINK_CLOSE)


def thinking_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) character spans of each <think>…</think> block in `text`, tags included;
    an unclosed block runs to the end."""
    spans, position = [], 0
    while (start := text.find(THINK_OPEN, position)) >= 0:
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
        end = len(text) if end < 0 else end + len(THINK_CLOSE)
        spans.append((start, end))
        position = end
    return spans


def strip_thinking(text: str) -> str:
    """`text` without its <think>…</think> blocks; an unclosed <think> drops the rest."""
    return split_thinking(text)[1]
