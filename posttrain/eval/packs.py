"""Packs: small, frozen JSONL files shipped inside the package, so Loops A and B and the
scorer checks run with no model and no network.

    name       file                   what it is for
    golden     golden_correct.jsonl   in-spec correct completions: any reward 0 is a scorer bug
    exploits   golden_exploits.jsonl  completions that win a hackable spec and lose the honest ones
    frozen     frozen_rollouts.jsonl  ~100 scored-by-intent completions for Loop A (`eval`)
    bon        best_of_n.jsonl        8 candidates per prompt for Loop B (`bon`)
    kata       kata.jsonl             10 scored cases to label with FAILURE_LABELS

The fields of each file are described in `posttrain/data/packs/README.md`.
`posttrain/eval/make_packs.py` rebuilds every file, byte for byte, from a seed.

Frozen packs are an offline snapshot of some earlier "policy" (here: perturbed reference
solutions). They are right for measuring a scorer (Loop A) and demonstrating selection
(Loop B); they say nothing about what a policy will produce after training on them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from posttrain.files import jsonl_objects
from posttrain.types import Example
from posttrain.verifiers import VERIFIERS
from posttrain.verifiers.contract import as_example
from posttrain.verifiers.final_int import parse_final_line

# The packs live next to the code, not in the working directory, so an installed package
# finds them too. pyproject.toml must list them as package data (see the README).
PACKS_DIR = Path(__file__).resolve().parent.parent / "data" / "packs"

# The failure taxonomy of the measurement course (docs/course/failure_taxonomy.md), as the
# kata labels its cases: the seed's four ("model wrong / verifier wrong / data ambiguous /
# spec unclear") and the one that only an optimiser produces, a reward that got hacked.
FAILURE_LABELS: dict[str, str] = {
    "model-wrong": "the scorer is right and the completion is wrong: a fact about the policy",
    "verifier-wrong": "the scorer's reward is wrong for this completion (a parser bug, a loophole, a false negative)",
    "data-ambiguous": "the problem as posed admits more than one reading, or hides what is wanted (a prompt that "
                      "never states the answer format)",
    "spec-unclear": "the spec does not say clearly what this case gets (no rule, or one a reader cannot find): "
                    "write it down, with a test",
    "reward-hacked": "a completion built to win the scorer rather than solve the problem, and it won",
}

PACKS: dict[str, str] = {
    "golden": "golden_correct.jsonl",
    "exploits": "golden_exploits.jsonl",
    "frozen": "frozen_rollouts.jsonl",
    "bon": "best_of_n.jsonl",
    "kata": "kata.jsonl",
}


def pack_path(name_or_path: str | Path) -> Path:
    """A shipped pack by name ("frozen", "bon", ...) or any JSONL file by path."""
    if str(name_or_path) in PACKS:
        return PACKS_DIR / PACKS[str(name_or_path)]
    path = Path(name_or_path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no file {str(path)!r}; pass a JSONL path or one of the shipped packs: "
            f"{', '.join(PACKS)}"
        )
    return path


def file_sha256(path: str | Path) -> str:
    """A file's version as run directories record it: change a byte, change the hash."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def problems_version(examples: list[Example]) -> str:
    """The dataset version of a set of problems: a hash of each one's id, prompt, expected
    answer and meta, in id order. Not of a file: two models' completions files of the same
    problems differ in every completion, yet they measure on the same dataset, and the
    comparison refuses only what changes the measurement (eval/comparison.py)."""
    rows = sorted(([e.id, e.prompt, e.expected_answer, e.meta] for e in examples), key=lambda row: row[:3])
    text = json.dumps(rows, sort_keys=True, default=str, ensure_ascii=False)
    return "problems-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def read_jsonl_records(path: str | Path, required: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every line of a JSONL file as a dict. Blank lines are skipped; a line that is not a
    JSON object, or lacks a `required` field, stops loading with the file and line number."""
    records = []
    for where, record in jsonl_objects(path):
        missing = [name for name in required if name not in record]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}; the line has {sorted(record)}")
        records.append(record)
    if not records:
        raise ValueError(f"{path}: the file holds no records (it is empty or blank)")
    return records


def load_pack(name: str) -> list[dict[str, Any]]:
    """The raw records of a shipped pack."""
    if name not in PACKS:
        raise ValueError(f"unknown pack {name!r}; shipped packs: {', '.join(PACKS)}")
    return read_jsonl_records(pack_path(name))


def example_of(record: dict[str, Any]) -> Example:
    """The Example a record is about: its prompt, expected answer (an int is read as its
    decimal string), id and meta (a code problem's tests live in `meta.tests`), read the
    way every verifier reads them. A record no verifier could read raises ValueError."""
    example, problem = as_example(record)
    if example is None:
        raise ValueError(f"record {record.get('id', '')!r}: {problem}")
    return example


# ---------------------------------------------------------------------------------------
# A deliberately buggy scorer, used only by the kata. Not registered in SPECS: nothing
# should ever train or evaluate with it.
# ---------------------------------------------------------------------------------------


def _buggy_first_line(example: Example, completion: str) -> dict[str, Any]:
    """buggy/first-line-v0: checks `Final: <int>` on the FIRST line only. Written for
    strict-v1 one-line answers and then reused for cot-v1, where the Final line is last:
    every correct worked answer gets reward 0 (a false negative)."""
    expected = example.expected_answer.strip()
    first_line = completion.strip().split("\n")[0]
    reason, parsed = parse_final_line(first_line)
    if reason == "ok" and parsed != expected:
        reason = "wrong_answer"
    return {
        "reward": 1.0 if reason == "ok" else 0.0,
        "details": {"reason": reason, "parsed": parsed, "expected": expected,
                    "format_ok": parsed is not None, "spec_version": "buggy/first-line-v0"},
    }


KATA_ONLY_SCORERS = {"buggy/first-line-v0": _buggy_first_line}


def kata_scorer(spec_version: str):
    """The scorer a kata case was scored with: a registered verifier or the buggy one."""
    if spec_version in VERIFIERS:
        return VERIFIERS[spec_version]
    if spec_version in KATA_ONLY_SCORERS:
        return KATA_ONLY_SCORERS[spec_version]
    valid = list(VERIFIERS) + list(KATA_ONLY_SCORERS)
    raise ValueError(f"unknown spec_version {spec_version!r}; valid: {', '.join(valid)}")
