"""Files: writing so that a killed process never leaves half of one behind, a full disk
reported by the file it stopped, and reading JSONL so that a bad line is reported by file
and line number."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

# out of space on the device, or out of the user's quota on it: the same remedy either way
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def _read_umask() -> int:
    """The process's umask. Reading it means setting it, so it is read once, at import."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


PROCESS_UMASK = _read_umask()


class DiskFullError(OSError):
    """A write stopped for lack of space (ENOSPC) or quota (EDQUOT). Still an OSError with
    the original errno, so code that handles OSError keeps working; `filename` names the
    file being written and `advice` says what to do (the caller knows whether the work can
    be resumed)."""

    def __init__(self, code: int, path: str | os.PathLike | None,
                 advice: str = "free space and run the command again"):
        super().__init__(code, os.strerror(code), None if path is None else str(path))
        self.advice = advice

    def __str__(self) -> str:
        where = f" while writing {self.filename}" if self.filename else ""
        return f"disk full{where} ({self.strerror}); {self.advice}"


def disk_full_errno(error: BaseException | None) -> int | None:
    """ENOSPC or EDQUOT if `error`, or an error it was raised from or while handling, is a
    full disk; else None. Some writers hide it: on a full disk torch.save raises
    RuntimeError("... unexpected pos ...") with the OSError only as its __context__."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            return error.errno
        error = error.__cause__ or error.__context__
    return None


@contextmanager
def naming_disk_full(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise a full disk inside the block as a DiskFullError naming `path`: the OSError
    from a failed write() or fsync() carries no file name, so without this the user learns
    that the disk is full but not where."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as error:
        code = disk_full_errno(error)
        if code is None:
            raise
        raise DiskFullError(code, path) from error


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write `data` to `path` so that a reader sees either the old file or the whole new
    one, never half of it: write a temporary file in the same directory, flush it to disk,
    then `os.replace` it into place (atomic on POSIX and Windows). Creates missing parent
    directories."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with naming_disk_full(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        # the name `.<name>.<random>.tmp` is what RunDir.resume sweeps up after a kill -9
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            # mkstemp makes the file 0600; the file it becomes gets the mode a plain open() would give it
            # (the old file's, or 0666 less the umask), so a run directory stays readable by whom it was
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o666 & ~PROCESS_UMASK)
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


def jsonl_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """Rows as JSON Lines, one object a line, non-ASCII kept as written: the text a generated
    data file holds, byte for byte the same on every rebuild."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_or_check(texts: Mapping[Path, str], rebuild: str, argv: Sequence[str]) -> int:
    """The command line of a generated file: write each path's text (atomically), or with
    `--check` in argv write nothing and return 1, naming the stale paths and `rebuild`, the
    command that rewrites them, when one differs from its text. Returns 0 otherwise."""
    if "--check" in argv:
        stale = [str(path) for path, text in texts.items()
                 if not path.is_file() or path.read_text(encoding="utf-8") != text]
        if stale:
            print(f"out of date (run {rebuild}): {', '.join(stale)}")
        return 1 if stale else 0
    for path, text in texts.items():
        write_atomic(path, text)
        print(f"wrote {text.count(chr(10))} rows to {path}")
    return 0
