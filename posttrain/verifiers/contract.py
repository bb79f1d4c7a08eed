"""The one contract every verifier keeps, and the input checks they all share.

    score(example, completion) -> {"reward": float, "details": dict}

`example` is an `Example` or any mapping with a `prompt` and an `expected_answer` (and
optionally `id` and `meta`; other keys are ignored, so a completions-file record works as
it is). `expected_answer` is a str or an int: an int is what the JSONL line
`{"expected_answer": 4}` gives, and it scores exactly as its decimal string "4" does.

A verifier is total: it never raises on an example or a completion. What it cannot score
earns reward 0.0 with a reason code saying why, and `details["error"]` with the particulars
(the message the verifier would otherwise have raised):

    bad_example   the example is malformed (no prompt, an expected answer that is None,
                  a float, a bool, a list, ...): fix the data
    not_text      the completion is not a str (bytes, token ids, None): decode it first

Why not raise? A scorer runs inside the training loop on thousands of samples; one bad row
should show up in the reason counts of a report, not end a run hours in. Data that can
never be scored is refused earlier, when a file is loaded (`Verifier.check_example`).
A verifier never pays for what it could not check: every refusal is reward 0.0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from posttrain.types import Example

# Every verifier's REASONS includes these two, with these words.
CONTRACT_REASONS: dict[str, str] = {
    "bad_example": "the example is not an Example or a mapping with a str 'prompt' and a str or int "
    "'expected_answer' (details['error'] says which part); fix the data, the verifier does not guess",
    "not_text": "the completion is not a str (bytes, token ids, None, ...); decode the model's tokens "
    "to text before scoring",
}


class Verifier(Protocol):
    """What the registry (posttrain/verifiers/__init__.py) holds: a versioned scorer."""

    version: str  # recorded as details["spec_version"] in every result

    def __call__(self, example: Any, completion: Any) -> dict[str, Any]:
        """{"reward": float, "details": {"reason": one of REASONS, ...}}; never raises."""
        ...

    def check_example(self, example: Example) -> str | None:
        """None if this verifier can score the (well-formed) example, else what is wrong
        with it and how to fix it. Loaders call it to refuse data that could never score."""
        ...


def is_solved(reward: float, details: Mapping) -> bool:
    """Whether a scored completion counts as solved: the verifier's own word when it gives
    one (`details["correct"]`, as partial-credit graders report it), else a full reward of
    at least 1. Pass@1 is the fraction solved, never the mean reward."""
    correct = details.get("correct")
    if isinstance(correct, bool):
        return correct
    return reward >= 1.0


def canonical_answer(value: Any) -> str | None:
    """The expected answer as the str a verifier compares with: a str as it is, an int as
    its decimal string (4 -> "4", -7 -> "-7"); None for any other type."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):  # True is an int to Python
        try:
            return str(int(value))  # int(): an IntEnum member prints as its name otherwise
        except ValueError:  # more digits than sys.get_int_max_str_digits() allows
            return None
    return None


def shown(value: Any, limit: int = 60) -> str:
    """repr(value) cut to `limit` characters, for error messages; never raises (a repr
    can: a hostile __repr__, or an int longer than Python will print)."""
    try:
        return repr(value)[:limit]
    except Exception:
        return f"<a {type(value).__name__} that cannot be shown>"


def as_example(example: Any) -> tuple[Example | None, str]:
    """(the Example, "") with `expected_answer` and `id` as str, or (None, what is wrong
    with it). Reads an Example or a mapping; never raises."""
    try:
        return _as_example(example)
    except Exception as error:  # a mapping whose own methods raise: still not our crash
        return None, f"reading the example failed: {shown(error, 200)}"


def _as_example(example: Any) -> tuple[Example | None, str]:
    if isinstance(example, Example):
        fields: dict[str, Any] = {"prompt": example.prompt, "expected_answer": example.expected_answer,
                                  "id": example.id, "meta": example.meta}  # fmt: skip
    elif isinstance(example, Mapping):
        missing = [key for key in ("prompt", "expected_answer") if key not in example]
        if missing:
            return None, f"the example has no {' and no '.join(map(repr, missing))}; give both"
        fields = {key: example.get(key) for key in ("prompt", "expected_answer", "id", "meta")}
    else:
        return None, f"the example must be an Example or a mapping, got {type(example).__name__} {shown(example)}"
    prompt, answer, id_, meta = fields["prompt"], fields["expected_answer"], fields["id"], fields["meta"]
    if not isinstance(prompt, str):
        return None, f"'prompt' must be a str, got {type(prompt).__name__} {shown(prompt)}"
    expected = canonical_answer(answer)
    if expected is None:
        hint = ""
        if isinstance(answer, float):
            hint = f"; quote it (\"{answer}\") so its digits are the ones you mean"
        elif isinstance(answer, int) and not isinstance(answer, bool):
            hint = "; it has more digits than Python prints, give it as a str"
        return None, f"'expected_answer' must be a str or an int, got {type(answer).__name__} {shown(answer)}{hint}"
    example_id = "" if id_ is None else canonical_answer(id_)
    if example_id is None:
        return None, f"'id' must be a str or an int, got {type(id_).__name__} {shown(id_)}"
    if meta is None:
        meta = {}
    if not isinstance(meta, Mapping):
        return None, f"'meta' must be a mapping (a JSON object), got {type(meta).__name__} {shown(meta)}"
    if isinstance(example, Example) and expected is answer and example_id is id_ and meta is example.meta:
        return example, ""  # already canonical, the common case: nothing is copied
    return Example(prompt=prompt, expected_answer=expected, id=example_id, meta=dict(meta)), ""


def admit(example: Any, completion: Any) -> tuple[Example | None, str | None, str | None]:
    """(example, None, None) when both can be scored, else (None, reason, error) with a
    reason from CONTRACT_REASONS. The example is judged first: bad data is the deeper fault."""
    checked, error = as_example(example)
    if checked is None:
        return None, "bad_example", error
    if not isinstance(completion, str):
        return None, "not_text", (
            f"completion must be a str (the decoded model output), got {type(completion).__name__} "
            f"{shown(completion, 80)}; decode the tokens first"
        )
    return checked, None, None
