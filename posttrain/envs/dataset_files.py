"""Users' data files, read one way for problems (envs/jsonl_file.py) and preference pairs
(data/preference.py): every row comes with where it is, so every error can name it.

    what --env.path / --rl.preference.pairs names       how it is read                 a row is named
    a .jsonl file                            json, line by line             "FILE, line 7" (from 1)
    a .json file: a list of objects, or      json                           "FILE, 'test' row 3" (from 0)
      an object of such lists by split
      ({"train": [...], "test": [...]})
    a .parquet file                          pyarrow                        "FILE, row 3" (from 0, as dataset[3])
    a directory written by save_to_disk      datasets.load_from_disk        "DIR, 'train' row 3"
      (a Dataset or a DatasetDict)
    a directory of such data files           each file as above; a file     as its file
                                             named train*/test*/... is that split

Parquet and saved datasets need the optional `datasets` package (pyarrow comes with it:
`pip install 'posttrain[data]'`); JSON and JSONL need nothing.

Splits a source names ("train", "test", "validation", ...) come back with each row; what
a split means to a task is the task's business (jsonl_file.py). Column mapping renames a
source's columns to the names the task reads, e.g. "prompt=question,expected_answer=answer"
(`parse_columns`), and says which column is missing and which exist when one is absent.

Conversations are TRL's conversational format: a list of {"role", "content"} turns.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.verifiers.contract import shown

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
# how the ecosystem names splits -> the name our tasks use; anything else is refused by name
SPLIT_NAMES = {"train": "train", "validation": "dev", "valid": "dev", "val": "dev", "dev": "dev",
               "test": "heldout", "heldout": "heldout", "held_out": "heldout"}
INSTALL_DATA = "pip install 'posttrain[data]' (or pip install datasets)"


@dataclass(frozen=True)
class Row:
    """One record of a data source: its columns, its location for error messages, and
    the split its source put it in (our name: train, dev or heldout; None when unsaid)."""

    where: str
    record: dict[str, Any]
    split: str | None = None


def read_rows(path: str | Path, columns: dict[str, str] | None = None) -> list[Row]:
    """Every row of the data source at `path` (see the module docstring), columns renamed
    by `columns` ({our name: its column}). Raises ValueError naming the file, line or row
    of the first problem; an empty source is an error too."""
    path = Path(path)
    if path.is_dir():
        rows = _read_directory(path)
    elif not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    elif path.suffix == ".jsonl":
        rows = read_jsonl(path, None)
    elif path.suffix == ".json":
        rows = _read_json(path, None)
    elif path.suffix == ".parquet":
        rows = _read_parquet(path, None)
    else:
        raise ValueError(f"{path}: unknown data format {path.suffix!r}; give a {', '.join(DATA_SUFFIXES)} file or a "
                         "directory written by datasets' save_to_disk")
    if not rows:
        raise ValueError(f"{path}: no examples: the source holds no rows (it is empty or blank)")
    return [Row(row.where, rename_columns(row.record, columns or {}, row.where), row.split) for row in rows]


def split_of_name(name: str, where: str) -> str:
    """Our split name for a source's split `name` ('test' -> 'heldout'), or ValueError."""
    if name not in SPLIT_NAMES:
        raise ValueError(f"{where}: unknown split {name!r}; name splits {sorted(SPLIT_NAMES)} (test and heldout are "
                         "the held-out split, validation and dev the dev split)")
    return SPLIT_NAMES[name]


def read_jsonl(path: Path, split: str | None = None) -> list[Row]:
    """One Row per non-blank line, each named "FILE, line N" (from 1) in errors."""
    rows = []
    for number, line in enumerate(_text(path).split("\n"), start=1):
        if line.strip() == "":
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg}): {line[:80]!r}") from None
        rows.append(Row(where, _object(record, where), split))
    return rows


def _read_json(path: Path, split: str | None) -> list[Row]:
    try:
        data = json.loads(_text(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}, line {error.lineno}: not valid JSON ({error.msg})") from None
    if isinstance(data, list):
        return [Row(f"{path}, row {i}", _object(record, f"{path}, row {i}"), split) for i, record in enumerate(data)]
    if isinstance(data, dict) and all(isinstance(value, list) for value in data.values()) and data:
        if list(data) == ["data"]:  # {"data": [...]}: one unnamed split, as `datasets`' JSON loader's field=
            return _read_json_list(path, "data", data["data"], split)
        return [row for name, records in data.items()
                for row in _read_json_list(path, name, records, split_of_name(name, f"{path}, key {name!r}"))]
    raise ValueError(f"{path}: a .json data file is a list of objects, or an object of such lists by split "
                     f"({{\"train\": [...], \"test\": [...]}}); got {shown(data, 80)}")


def _read_json_list(path: Path, name: str, records: list, split: str | None) -> list[Row]:
    return [Row(f"{path}, {name!r} row {i}", _object(record, f"{path}, {name!r} row {i}"), split)
            for i, record in enumerate(records)]


def _read_parquet(path: Path, split: str | None) -> list[Row]:
    parquet = _optional("pyarrow.parquet", path)
    try:
        records = parquet.read_table(path).to_pylist()
    except Exception as error:  # pyarrow's own errors (not Parquet, truncated) are many classes
        raise ValueError(f"{path}: cannot read as Parquet: {error}") from None
    return [Row(f"{path}, row {i}", record, split) for i, record in enumerate(records)]


def _read_directory(path: Path) -> list[Row]:
    """A saved dataset (save_to_disk leaves dataset_info.json or dataset_dict.json), else
    every data file in the directory, each a split when its name says which."""
    if (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists():
        return _read_saved(path)
    files = sorted(p for p in path.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file())
    if not files:
        raise ValueError(f"{path}: the directory holds no {', '.join(DATA_SUFFIXES)} file and is not a dataset "
                         "written by save_to_disk (no dataset_info.json or dataset_dict.json)")
    readers = {".jsonl": read_jsonl, ".json": _read_json, ".parquet": _read_parquet}
    rows = []
    for file in files:
        name = file.name.split(".")[0].split("-")[0]  # "train-00000-of-00001.parquet" is train's
        rows += readers[file.suffix](file, split_of_name(name, str(file)) if name in SPLIT_NAMES else None)
    return rows


def _read_saved(path: Path) -> list[Row]:
    datasets = _optional("datasets", path)
    try:
        saved = datasets.load_from_disk(str(path))
    except Exception as error:  # a half-written or foreign directory: its own message says what
        raise ValueError(f"{path}: cannot load with datasets.load_from_disk: {error}") from None
    if isinstance(saved, datasets.DatasetDict):
        return [Row(f"{path}, {name!r} row {i}", record, split_of_name(name, f"{path}, split {name!r}"))
                for name, dataset in saved.items() for i, record in enumerate(dataset.to_list())]
    return [Row(f"{path}, row {i}", record) for i, record in enumerate(saved.to_list())]


def _optional(module: str, path: Path):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"{path}: reading it needs the optional package {module.split('.')[0]!r}: "
                         f"{INSTALL_DATA}; JSON and JSONL files need nothing") from None


def _text(path: Path) -> str:
    """The file as UTF-8 text (a byte-order mark, as Windows editors write, is dropped); a
    byte that is not UTF-8 is a ValueError naming the file, the line and the byte in it."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot read: {error.strerror or error}") from error
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        bad = " ".join(f"0x{byte:02x}" for byte in raw[error.start:error.end])
        raise ValueError(f"{path}, line {line}: not UTF-8 text ({bad} at byte {column} of the line: {error.reason}); "
                         "save the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 FILE > NEW` for a Latin-1 file") from None


def _object(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__} (a row is an object of columns)")
    return record


# --- column mapping ------------------------------------------------------------------------


def parse_columns(text: str, setting: str) -> dict[str, str]:
    """"prompt=question,expected_answer=answer" -> {"prompt": "question", ...}: our name on
    the left, the source's column on the right. Raises ValueError naming `setting`."""
    mapping: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        ours, sep, theirs = (side.strip() for side in item.partition("="))
        if not sep or not ours or not theirs:
            raise ValueError(f"{setting}={text!r}: {item!r} is not OURS=THEIRS (e.g. 'prompt=question,"
                             "expected_answer=answer': our column name, then the dataset's)")
        if ours in mapping:
            raise ValueError(f"{setting}={text!r}: {ours!r} is mapped twice")
        mapping[ours] = theirs
    return mapping


def rename_columns(record: dict[str, Any], columns: dict[str, str], where: str) -> dict[str, Any]:
    """`record` with each mapped column under our name (the others kept as they are)."""
    if not columns:
        return record
    out = dict(record)
    for ours, theirs in columns.items():
        if theirs not in record:
            raise ValueError(f"{where}: no column {theirs!r} (mapped to {ours!r}); the row has columns "
                             f"{sorted(record)}")
        if ours in record and ours not in columns.values():
            raise ValueError(f"{where}: the row has its own column {ours!r} and {theirs!r} is mapped onto it; map "
                             "one of them only (or rename the other)")
        out.pop(theirs)
    for ours, theirs in columns.items():
        out[ours] = record[theirs]
    return out


def missing_column(where: str, wanted: str, record: dict[str, Any], hint: str) -> ValueError:
    """The error for a row without the column `wanted`: which columns it does have, and
    how to map one of them (`hint`, e.g. "--env.columns 'prompt=COLUMN'")."""
    return ValueError(f"{where}: no column {wanted!r}; the row has columns {sorted(record)}: {hint}")


# --- conversations (TRL's conversational format) ------------------------------------------


def conversation(value: Any, where: str, column: str) -> list[dict[str, str]]:
    """`value` checked as a conversation: a non-empty list of {"role": str, "content": str}
    turns (other keys dropped). Raises ValueError naming the row, column and turn."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: column {column!r} must be a str or a conversation (a non-empty list of "
                         f"{{'role', 'content'}} turns), got {shown(value, 80)}")
    turns = []
    for i, turn in enumerate(value):
        if not (isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str)):
            raise ValueError(f"{where}: column {column!r}, turn {i}: a turn is {{'role': str, 'content': str}}, got "
                             f"{shown(turn, 80)}")
        turns.append({"role": turn["role"], "content": turn["content"]})
    return turns


def assistant_text(value: Any, where: str, column: str) -> str:
    """A response given as a str, or as a conversation of one assistant turn (TRL's
    conversational completion / chosen / rejected): its text."""
    if isinstance(value, str):
        return value
    turns = conversation(value, where, column)
    if len(turns) != 1 or turns[0]["role"] != "assistant":
        raise ValueError(f"{where}: column {column!r} as a conversation must be one assistant turn (the response), "
                         f"got roles {[turn['role'] for turn in turns]}")
    return turns[0]["content"]


def plain_prompt(turns: list[dict[str, str]]) -> str:
    """The text a conversation stands for where no chat template applies (gpt_mini, a base
    model) and the prompt's identity (its split, repeats): one user turn is its content;
    anything longer is written "role: content" a line each, ending "assistant: "."""
    if len(turns) == 1 and turns[0]["role"] == "user":
        return turns[0]["content"]
    return "".join(f"{turn['role']}: {turn['content']}\n" for turn in turns) + "assistant: "
