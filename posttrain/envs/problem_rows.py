"""A row of a user's dataset as an Example, under TRL's conventions and our own.

    column            becomes                               TRL's name for it
    prompt            Example.prompt: a str, or a           prompt (standard or conversational)
                      conversation (list of {role, content})
    messages          a whole conversation: its last        messages (conversational language modeling)
                      assistant turn is the completion,
                      the turns before it the prompt
    completion        meta.solution, SFT's demonstration    completion
                      (a str, or one assistant turn)
    expected_answer   Example.expected_answer               (verl: ground_truth; TRL math sets: solution)
      or answer / ground_truth / solution
    id                Example.id (without one: "prompt-" and 16 hex digits of the prompt's sha256,
                      so a before/after comparison can pair the same problem's two answers)
    meta              merged into Example.meta (our JSONL format)
    split             the row's split (train, validation/dev, test/heldout)
    anything else     kept in Example.meta, so reward functions get it as a keyword argument
                      (so is an `answer` or `ground_truth` answer column, under its name)

The answer rule, in order: a column `expected_answer` is the answer (any `answer`,
`ground_truth` or `solution` beside it is an ordinary column, and a `solution` is then
the demonstration, as meta.solution); without one, exactly one of `answer`,
`ground_truth`, `solution` is the answer, and a row with two of them is refused as
ambiguous: map the one you mean with --env.columns 'expected_answer=COLUMN'.

A conversational prompt keeps its turns in meta["prompt_messages"] (types.PROMPT_MESSAGES):
an instruct model's chat template renders them (models/hf.py), while Example.prompt holds
their plain text (dataset_files.plain_prompt), which a model without a chat template reads
and which decides the problem's split and repeats.
"""

from __future__ import annotations

import hashlib
from typing import Any

from posttrain.envs.dataset_files import Row, assistant_text, conversation, missing_column, plain_prompt, split_of_name
from posttrain.types import PROMPT_MESSAGES, Example
from posttrain.verifiers.contract import as_example

ANSWER_COLUMNS = ("answer", "ground_truth", "solution")  # read when there is no expected_answer


def example_from_row(row: Row) -> tuple[Example, str | None]:
    """(the Example, its declared split: train, dev, heldout or None). Raises ValueError
    naming the row and what is wrong or missing."""
    record, where = dict(row.record), row.where
    turns, solution = prompt_of(record, where)
    if "completion" in record:
        if solution is not None:
            raise ValueError(f"{where}: both 'messages' (ending with an assistant turn) and 'completion' give the "
                             "completion; keep one")
        solution = assistant_text(record.pop("completion"), where, "completion")
    answer_column = answer_column_of(record, where, row.record)
    # the answer stays a column under its own name for reward functions (TRL's read `answer` or
    # `ground_truth`), except `solution`, which in meta is the demonstration
    answer = record.pop(answer_column) if answer_column in ("expected_answer", "solution") else record[answer_column]
    split = row.split
    if "split" in record:
        value = record.pop("split")
        split = split if value is None else split_of_name(str(value), where)  # None: a Parquet row left blank
    example_id = record.pop("id", None)
    meta = record.pop("meta", None) or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: 'meta' must be an object of extra columns, got {type(meta).__name__}")
    meta = dict(meta)
    for column, value in record.items():  # every other column: the reward functions' keyword arguments
        if column in meta:
            raise ValueError(f"{where}: {column!r} is both a column and a key of 'meta'; keep one")
        meta[column] = value
    if solution is not None:
        if "solution" in meta:
            raise ValueError(f"{where}: the completion is given twice ('completion' or 'messages', and a "
                             "'solution'); keep one")
        meta["solution"] = solution
    prompt: Any = turns
    if isinstance(turns, list):
        meta[PROMPT_MESSAGES] = turns
        prompt = plain_prompt(turns)
    if example_id is None:  # named by its prompt, as its split is: the same problem keeps its id in every file
        example_id = "prompt-" + hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]
    example, problem = as_example({"prompt": prompt, "expected_answer": answer, "id": example_id, "meta": meta})
    if example is None:
        read_from = f" (the expected answer is column {answer_column!r})" if answer_column != "expected_answer" else ""
        raise ValueError(f"{where}: {problem}{read_from}")
    return example, split


def prompt_of(record: dict[str, Any], where: str) -> tuple[str | list[dict[str, str]], str | None]:
    """(the prompt: a str or a conversation, the completion a `messages` column gave or
    None), popping the columns read."""
    if "prompt" in record and "messages" in record:
        raise ValueError(f"{where}: both 'prompt' and 'messages' are columns; a row is a prompt (with an optional "
                         "completion) or one whole conversation, not both")
    if "prompt" in record:
        value = record.pop("prompt")
        return (value, None) if isinstance(value, str) else (conversation(value, where, "prompt"), None)
    if "messages" in record:
        turns = conversation(record.pop("messages"), where, "messages")
        if turns[-1]["role"] != "assistant":
            return turns, None  # no answer given: the whole conversation is the prompt
        if len(turns) == 1:
            raise ValueError(f"{where}: 'messages' is one assistant turn and no prompt before it")
        return turns[:-1], turns[-1]["content"]
    raise missing_column(where, "prompt", record, "give the question as 'prompt' (a str or a list of "
                         "{role, content} turns) or a whole conversation as 'messages'; or map one with "
                         "--env.columns 'prompt=COLUMN'")


def answer_column_of(record: dict[str, Any], where: str, row: dict[str, Any]) -> str:
    """The column of `record` (`row` less the columns read so far) holding the expected
    answer, by the rule in the module docstring."""
    if "expected_answer" in record:
        return "expected_answer"
    found = [column for column in ANSWER_COLUMNS if column in record]
    if len(found) > 1:
        raise ValueError(f"{where}: columns {found} could each be the expected answer; say which with --env.columns "
                         f"'expected_answer={found[0]}' (the others stay columns for reward functions)")
    if not found:
        raise missing_column(where, "expected_answer", row, "give the answer the verifier checks as "
                             "'expected_answer' (or 'answer', 'ground_truth', 'solution'), or map a column with "
                             "--env.columns 'expected_answer=COLUMN' ('' for code problems, whose tests are "
                             "in meta.tests)")
    return found[0]


def assign_split(prompt_split: str, declared: str | None, declared_splits: set[str]) -> str:
    """The split a problem lands in. `prompt_split` is the sha256 split of its prompt, used
    unless the source says otherwise: a row the source puts in dev or heldout is there; a
    train row (or one it says nothing of) takes its hashed split unless the source gives
    that split itself, in which case it trains (a held-out set of the user's own is not
    topped up from the training data)."""
    if declared in ("dev", "heldout"):
        return declared
    return "train" if prompt_split in declared_splits else prompt_split
