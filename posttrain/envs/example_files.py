"""Examples as JSONL files: one `Example` per line, {prompt, expected_answer, id?, meta?}.

`save_examples_jsonl` writes a list of examples (a generated task's split, say) and
`load_examples_jsonl` reads it back, equal to what was saved. Nothing here knows which task
made the examples: a row is read the way a verifier reads an example
(`verifiers/contract.py::as_example`), so what loads can be scored, and a verifier's
`check_example` can refuse, by line, a problem it could never score. A task built on your
own files, in more formats, with column mapping and splits, is envs/jsonl_file.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from posttrain.envs.dataset_files import read_jsonl
from posttrain.files import write_atomic
from posttrain.types import Example
from posttrain.verifiers.contract import as_example

REQUIRED_FIELDS = ("prompt", "expected_answer")
OPTIONAL_FIELDS = ("id", "meta")


def save_examples_jsonl(examples: list[Example], path: str | Path) -> None:
    """Write one JSON object per line. Written to a temporary file and renamed, so a
    killed process never leaves half a dataset behind."""
    records = [
        {"prompt": e.prompt, "expected_answer": e.expected_answer, "id": e.id, "meta": e.meta} for e in examples
    ]
    write_atomic(path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))


def load_examples_jsonl(path: str | Path, check: Callable[[Example], str | None] | None = None) -> list[Example]:
    """Read the file `save_examples_jsonl` writes (an int `expected_answer` is read as its
    decimal string). Blank lines are skipped; anything else that is not a valid example,
    or that `check` (a verifier's `check_example`) says can never be scored, stops loading
    with the file, line number and problem."""
    examples = []
    for row in read_jsonl(Path(path)):  # the line loop every JSONL source shares, errors named by line
        example = _example_from_record(row.record, row.where)
        problem = check(example) if check else None
        if problem:
            raise ValueError(f"{row.where}: {problem}; or remove the line")
        examples.append(example)
    if not examples:
        raise ValueError(f"{path}: the file holds no examples (it is empty or blank)")
    return examples


def _example_from_record(record: dict[str, Any], where: str) -> Example:
    # an unknown key is usually a typo ("answer" for "expected_answer"): say so, don't drop it
    allowed = REQUIRED_FIELDS + OPTIONAL_FIELDS
    unknown = sorted(set(record) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {list(allowed)}")
    for name in REQUIRED_FIELDS:
        if name not in record:
            raise ValueError(f"{where}: missing required field {name!r}")
    example, problem = as_example(record)  # the verifiers' own reading: what loads, scores
    if example is None:
        raise ValueError(f"{where}: {problem}")
    return example
