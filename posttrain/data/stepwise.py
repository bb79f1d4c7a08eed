"""Stepwise-supervision data: what a process reward model learns from.

A row is TRL's stepwise-supervision format (what its PRMTrainer reads), plus one optional
field of ours:

    {"prompt": "Q: 7+5+9\\n",
     "completions": ["7+5=12", "12+9=20", "Final: 20"],      the steps, in order
     "labels": [true, false, false],                          one per step
     "outcome": 0.0}                                          optional: the whole completion's
                                                              verifier reward (the ORM's label)

`labels` may also be numbers in [0, 1] (Monte-Carlo soft labels, rewards/monte_carlo_labels.py).
Without `outcome` the outcome is the last step's label: under the first-error convention
(verifiers/steps.py) that is "every step right", which is the outcome whenever a right
answer needs right steps. Other columns are ignored. Any source posttrain's data reader
takes works (JSONL, JSON, Parquet, a saved `datasets` directory: envs/dataset_files.py);
reading stops at the first bad row with its file and line and what is wrong.

`split_by_prompt` holds out a fixed share of prompts, by a stable hash of the prompt text,
so every completion of one prompt is on the same side and a rerun splits the same way.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from posttrain.envs.dataset_files import read_rows
from posttrain.files import write_atomic
from posttrain.rewards.process_reward_model import StepRecord


def _label(value: Any, where: str, i: int) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0:
        return float(value)
    raise ValueError(f"{where}: labels[{i}] is {value!r}; a label is true/false or a number in [0, 1]")


def record_from_row(record: dict, where: str) -> StepRecord:
    """One StepRecord from one row, or ValueError naming the row and what is wrong."""
    missing = [key for key in ("prompt", "completions", "labels") if key not in record]
    if missing:
        raise ValueError(f"{where}: missing {missing}; a stepwise row has prompt (text), completions (the steps, a "
                         f"list of text) and labels (one true/false per step); it has {sorted(record)}")
    prompt, steps, labels = record["prompt"], record["completions"], record["labels"]
    if not isinstance(prompt, str):
        raise ValueError(f"{where}: prompt must be text, got {type(prompt).__name__}")
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        raise ValueError(f"{where}: completions must be a list of step texts (TRL's stepwise format), got {steps!r:.80}")
    if not isinstance(labels, list) or len(labels) != len(steps):
        raise ValueError(f"{where}: labels must be a list with one label per step ({len(steps)} steps), "
                         f"got {labels!r:.80}")
    if not steps:
        raise ValueError(f"{where}: no steps: a row needs at least one step to label")
    values = [_label(v, where, i) for i, v in enumerate(labels)]
    outcome = record.get("outcome", values[-1])
    if isinstance(outcome, bool) or not isinstance(outcome, (int, float)) or not 0.0 <= float(outcome) <= 1.0:
        raise ValueError(f"{where}: outcome is {outcome!r}; give the verifier's reward, 0 or 1 (or leave it out: "
                         "the last step's label is used)")
    return StepRecord(prompt, list(steps), values, float(outcome))


def load_stepwise(path: str | Path) -> list[StepRecord]:
    return [record_from_row(row.record, row.where) for row in read_rows(path)]


def save_stepwise_jsonl(records: Sequence[StepRecord], path: str | Path) -> None:
    """Write records in the format load_stepwise reads, atomically (labels that are 0/1 as
    booleans, as TRL writes them)."""
    rows = []
    for r in records:
        labels = [bool(v) if v in (0.0, 1.0) else v for v in r.labels]
        rows.append(json.dumps({"prompt": r.prompt, "completions": r.steps, "labels": labels, "outcome": r.outcome},
                               ensure_ascii=False) + "\n")
    write_atomic(path, "".join(rows))


def split_by_prompt(records: Sequence[StepRecord], heldout_percent: int) -> tuple[list[StepRecord], list[StepRecord]]:
    """(train, held-out): a record is held out when the sha256 of its prompt, mod 100, is
    below `heldout_percent`."""
    if not 0 < heldout_percent < 100:
        raise ValueError(f"heldout_percent={heldout_percent}: give a share of prompts between 1 and 99")
    train, heldout = [], []
    for r in records:
        bucket = int.from_bytes(hashlib.sha256(r.prompt.encode()).digest()[:8], "big") % 100
        (heldout if bucket < heldout_percent else train).append(r)
    if not train or not heldout:
        raise ValueError(f"holding out {heldout_percent}% of prompts left {len(train)} training and {len(heldout)} "
                         f"held-out records (of {len(records)}): the file needs more distinct prompts")
    return train, heldout
