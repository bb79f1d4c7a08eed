"""Files: writing so that a killed process never leaves half of one behind, and reading
JSONL so that a bad line is reported by file and line number."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write `data` to `path` so that a reader sees either the old file or the whole new
    one, never half of it: write a temporary file in the same directory, flush it to disk,
    then `os.replace` it into place (atomic on POSIX and Windows). Creates missing parent
    directories."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())  # the rename must not reach the disk before the data does
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def jsonl_objects(path: str | os.PathLike) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, object) for every non-blank line of a JSONL file, where = "path:line" for
    the caller's own error messages. An unreadable file, a line that is not JSON, or one
    that is not a JSON object raises ValueError naming the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read: {error}") from error
    for line_number, line in enumerate(text.split("\n"), start=1):
        if line.strip() == "":
            continue
        where = f"{path}:{line_number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg}): {line[:80]!r}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        yield where, obj
