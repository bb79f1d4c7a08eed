"""Run directories: what every command leaves behind.

    runs/<timestamp>-<name>/
      config.json     the resolved configuration (re-runnable with --config)
      meta.json       git commit, spec and dataset versions, seeds, sampling, packages
      metrics.jsonl   one JSON object per step
      samples.jsonl   raw prompts, completions, rewards and score details
      summary.md / summary.json
      *.png           plots
      checkpoints/    model weights (+ optimizer state) to resume or evaluate
      .lock           held by the one process writing the directory; holds its PID

Every whole-file write goes to a temporary file first and is renamed into place, so a
run killed at any instant leaves either the old file or the new one, never half of one.
JSONL files are appended line by line and flushed; on resume the lines written after
the last checkpoint are dropped, so the resumed run's log equals an uninterrupted one.

One writer per directory. Two processes resuming one run would log the same steps twice
and overwrite each other's checkpoints, so creating or resuming a run takes an exclusive
`flock` on its `.lock` and holds it for the whole run; a second writer is refused at once.
The kernel drops the lock when its process dies, however it dies, so `kill -9` never
leaves a stale lock and resume after it stays exact. Holding the lock is also what makes
it safe for a resume to delete the temporary files of killed writes: nobody else can be
in the middle of writing them.

A run file that cannot be read (truncated, corrupt) is reported as a RunDirError naming
the file, what is wrong and what to do, never as a parser's traceback.

A kill -9 at any instant leaves a directory that resumes or one the next run removes. A
run starts in three writes: the directory (with its .lock), config.json, then meta.json
(pipelines/run.py::start_run). Killed before meta.json, nothing ran in it: `--resume` says
so, and the next run created in the same out_dir removes it (`sweep_unstarted`: only a
directory named like a run, holding nothing but its lock, config.json and temporary files,
whose lock no live process holds). From meta.json on it resumes.

Whatever stops a run from inside `RunDir.resumable` (a reward function that raised, a
Ctrl-C, a full disk, code that called sys.exit()) leaves it resumable, and the error
carries the command that resumes this very directory.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

from posttrain.files import DiskFullError, disk_full_errno, naming_disk_full, write_atomic
from posttrain.rewards.function_source import described, where_raised
from posttrain.runs.console import console
# RunDirError is the lock's too (a run another process holds); importers keep naming it here
from posttrain.runs.run_lock import LOCK_FILE, RunDirError, hold_lock, is_unstarted, sweep_unstarted
from posttrain.runs.trackers import NO_TRACKERS, Trackers
from posttrain.types import Episode

class ExitInsideRun(ValueError):
    """Code a run called raised SystemExit (sys.exit(), exit(), argparse's parse_args()),
    GeneratorExit or another BaseException that is not an Exception. Let through, it would
    end the process as if posttrain itself had exited, with that status (0 for sys.exit())
    and no word of why; as this error it is named, with where it was raised."""


def add_note(error: BaseException, note: str) -> None:
    """PEP 678's note (printed under the error by a traceback, and by the command line's
    own error lines); Python 3.10 has no add_note, so the list is kept by hand there."""
    if sys.version_info >= (3, 11):
        error.add_note(note)
    else:
        error.__notes__ = [*getattr(error, "__notes__", []), note]


# What to do about a damaged JSON file of a run, by its name: each is made at a different
# moment, so each has its own remedy.
REMEDIES = {
    "config.json": "it holds the run's settings and is written only when the run starts: restore it from a copy, "
                   "or start a new run with the flags recorded under \"command\" in meta.json",
    "summary.json": "delete it and resume: the held-out evaluations it records are recomputed from the checkpoints",
    "pref_rounds.json": "it records which preference pairs each round trained on, and a resume without it would "
                        "train on different pairs: restore it from a copy, or start a new run",
}


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path) -> Any:
    """The parsed file, or None if there is none; a file that is not JSON raises RunDirError."""
    if not path.exists():
        return None
    raw = path.read_bytes()
    try:
        return json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        what = (f"at line {error.lineno} column {error.colno}: {error.msg}" if isinstance(error, json.JSONDecodeError)
                else "not UTF-8 text")
        remedy = REMEDIES.get(path.name, "restore it from a copy, or start a new run")
        raise RunDirError(f"{path} is truncated or corrupt ({len(raw)} bytes, not valid JSON {what}): "
                           f"{remedy}") from None


def read_jsonl(path: Path) -> list[dict]:
    """Every line of a JSONL file. A last line without its newline is a write torn by a
    kill (or a full disk) and is skipped: the resume that follows rewrites the file without
    it. Any other line that is not a JSON object was damaged after it was written, and
    dropping it silently would shift every plot and mean built on the file, so it raises
    RunDirError naming the file and line."""
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")  # the last element is b"" when the file ends with a newline
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            if number == len(lines):  # torn: no newline after it
                continue
            what = f"column {error.colno}: {error.msg}" if isinstance(error, json.JSONDecodeError) else "not UTF-8"
            raise RunDirError(f"{path}:{number} is damaged (not valid JSON at {what}): "
                               f"{line[:60]!r}. A killed write can only tear the last line, so the file was changed "
                               "after it was written: delete that line (that row is lost) or restore the file, then "
                               "run again") from None
        if not isinstance(row, dict):
            raise RunDirError(f"{path}:{number} is a JSON {type(row).__name__}, not an object: delete that line or "
                               "restore the file, then run again")
        rows.append(row)
    return rows


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5, cwd=Path(__file__).resolve().parent)
        if out.returncode == 0:
            return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown"


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("posttrain", "torch", "transformers", "tokenizers", "safetensors", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def check_run_location(out_dir: str | os.PathLike, name: str) -> None:
    """Refuse, before any directory is made, a run name that would put the run somewhere
    other than directly inside out_dir, and an out_dir that cannot hold run directories."""
    if re.search(r"[/\\\0]", name) or ".." in name or len(name.encode()) > 200:
        # the name becomes one path component: '../../x' or '/abs' would place the run elsewhere
        safe = re.sub(r"[^\w.-]+", "-", name).replace("..", ".").strip("-.")[:100] or "run"
        raise RunDirError(f"name={name!r} is not allowed: a run name becomes one directory inside out_dir, so it "
                           "cannot contain '/', '\\' or '..' (nor be an absolute path) and is at most 200 bytes; "
                           f"use letters, digits, '-', '_' and '.', e.g. name={safe!r}, and choose the parent folder "
                           "with out_dir")
    out = Path(out_dir)
    existing = next(p for p in (out, *out.parents) if p.exists())  # "." at worst
    if not existing.is_dir():
        where = "is a file" if existing == out else f"cannot be created: {existing} is a file"
        raise RunDirError(f"out_dir={str(out_dir)!r} {where}, not a directory: run directories are created inside "
                           "out_dir; pass a directory (a missing one is created), e.g. out_dir='runs'")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirError(f"out_dir={str(out_dir)!r} is not writable ({existing} belongs to someone else or is "
                           "read-only): pass a directory you can write to")


class RunDir:
    """A run directory. `RunDir(path)` and `RunDir.open` only read; `create` and `resume`
    hold the directory's lock until `close()` (or a `with` block's end, or the process's)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        # --report_to's trackers while run_pipeline reports (runs/trackers.py::reporting): each
        # metrics line the step loop writes, and each RL step's samples, are copied to them
        self.trackers: Trackers = NO_TRACKERS
        self.checkpoints = self.path / "checkpoints"
        self.lock: RunLock | None = None
        self.created_here = False  # made by this process (create), not resumed: see __exit__

    @classmethod
    def create(cls, out_dir: str, name: str) -> RunDir:
        """A new, locked `out_dir/<timestamp>-<name>[-N]/`. `mkdir` either makes a directory
        or fails, so when runs started in the same second race for one name, each one that
        loses tries the next suffix: no check-then-create gap in which two can both win."""
        check_run_location(out_dir, name)
        out = Path(out_dir)
        with naming_disk_full(out):
            out.mkdir(parents=True, exist_ok=True)
        for swept in sweep_unstarted(out):
            console.print(f"[yellow]removed {swept}: a run killed while it was starting (before its meta.json), "
                          "in which nothing had run")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in range(1, 10_000):
            path = out / (f"{stamp}-{name}" if suffix == 1 else f"{stamp}-{name}-{suffix}")
            try:
                with naming_disk_full(path):
                    path.mkdir()
                break
            except FileExistsError:
                continue
        else:
            raise RunDirError(f"{out}: 10,000 runs named {name!r} started within one second; wait a second")
        run = cls(path)
        run.lock = hold_lock(path)  # no other process can resume it yet: it has no config.json
        run.created_here = True
        return run

    @classmethod
    def open(cls, path: str) -> RunDir:
        """An existing run, to read."""
        run = cls(Path(path))
        if not (run.path / "config.json").is_file():
            raise FileNotFoundError(f"{path!r} is not a run directory (no config.json in it); pass runs/<id> as written by `posttrain run`")
        return run

    @classmethod
    def resume(cls, path: str) -> RunDir:
        """An existing run, locked for writing, with the temporary files of killed writes removed.
        A directory whose run was killed before it started (no meta.json) is refused, saying so."""
        unstarted = is_unstarted(Path(path))
        run = cls(Path(path)) if unstarted else cls.open(path)
        run.lock = hold_lock(run.path)  # first: a live writer, a run starting this instant too, is named as such
        if not (run.path / "meta.json").is_file():
            run.close()
            again = (f"`posttrain train --config {run.path / 'config.json'}`" if (run.path / "config.json").is_file()
                     else "the command that made it")
            swept = f"; the next run created in {run.path.parent} removes this directory" if unstarted else ""
            raise RunDirError(f"{path} was killed while it was starting (it has no meta.json, which a run writes last "
                              f"as it starts): nothing ran in it, so there is nothing to resume. Start it again with "
                              f"{again}{swept}")
        removed = run.remove_stale_temp_files()
        if removed:
            console.print(f"[yellow]removed {len(removed)} unfinished temporary file(s) of a killed write: "
                          + ", ".join(str(p.relative_to(run.path)) for p in removed))
        return run

    def close(self) -> None:
        """Release the lock (when no other RunDir of this process holds it)."""
        self.lock = None

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        """Release the lock; and when a run this process created fails before its first
        step (a model that will not load, an environment that fails when first used), remove
        it: a folder of settings and no results is not a run, only clutter that looks like
        one. A run that has done any work keeps everything it wrote, to resume from."""
        if exc_type is not None and self.created_here and not self.has_results():
            self.discard()
        self.close()

    # what a step or an evaluation writes; config.json, meta.json, trackers' files and the
    # `init` checkpoint of gpt_mini's random start are only set-up, rebuilt by a new run
    RESULT_FILES = ("metrics.jsonl", "samples.jsonl", "summary.json")

    def has_results(self) -> bool:
        """Whether any step or held-out evaluation has written its record here."""
        written = [self.path / name for name in self.RESULT_FILES] + list(self.path.glob("eval_*.jsonl"))
        return any(path.is_file() and path.stat().st_size > 0 for path in written)

    def discard(self) -> None:
        """Remove the whole directory (a run that never started), releasing its lock first.
        Renamed away first, in one step: a kill in the middle of the removal then leaves a
        hidden `.<name>.discarded.tmp` the next run sweeps, never half a run directory."""
        doomed = self.path.with_name(f".{self.path.name}.discarded.tmp")
        try:
            self.path.rename(doomed)
        except OSError:  # gone already, or a file system that will not rename it: remove it in place
            doomed = self.path
        self.close()
        shutil.rmtree(doomed, ignore_errors=True)
        console.print(f"[yellow]removed {self.path}: the run failed before its first step, so there is nothing to "
                      "resume; fix what the error says and start it again")

    @contextmanager
    def resumable(self, resume_command: str) -> Iterator[None]:
        """Whatever stops the run inside the block leaves it resumable, and says how. It
        can be: every write is atomic or an append that resume truncates, so stopping
        anywhere loses only the steps since the last checkpoint, as a kill would.

        A full disk (any write: logs, checkpoints, plots) becomes a DiskFullError whose advice
        is `resume_command`; SystemExit and other BaseExceptions that are not Exceptions
        (raised by code the run called: it never exits on purpose) become an ExitInsideRun
        naming where; every error but a RunDirError (whose message says what to do about the
        file it names) gets `resume_command` as a note, a Ctrl-C's KeyboardInterrupt too.
        No note when the run is about to be removed (__exit__: nothing to resume)."""
        try:
            yield
        except RunDirError:
            raise
        except Exception as error:
            code = disk_full_errno(error)
            if code is None:
                self.note_resume(error, resume_command)
                raise
            where = error.filename if isinstance(error, OSError) and error.filename else self.path
            raise DiskFullError(code, where, f"the run directory is resumable: free space and run "
                                f"`{resume_command}`") from error
        except KeyboardInterrupt as interrupt:
            self.note_resume(interrupt, resume_command)
            raise
        except BaseException as error:  # noqa: BLE001  (SystemExit, GeneratorExit: not ours, named)
            stopped = ExitInsideRun(f"{described(error)} was raised inside the run{where_raised(error)}: code the run "
                                    "calls (a reward term, a judge, a rubric criterion, an environment) asked the "
                                    "process to stop, which would have ended the run with no word of why. Raise an "
                                    "exception there instead (sys.exit(), exit() and argparse's parse_args() raise "
                                    "SystemExit)")
            self.note_resume(stopped, resume_command)
            raise stopped from error

    def note_resume(self, error: BaseException, resume_command: str) -> None:
        if not (self.created_here and not self.has_results()):  # else __exit__ removes the run
            add_note(error, f"the run directory {self.path} is resumable: `{resume_command}` continues it from "
                            "its last checkpoint")

    def remove_stale_temp_files(self) -> list[Path]:
        """Delete `.*.tmp` files and directories: what write_atomic and save_checkpoint leave
        when killed before their rename. Only safe under the lock (no live writer is
        mid-write); a nested run directory (a compare row) has its own lock and is left alone."""
        removed = []
        for parent, dirs, files in os.walk(self.path):
            here = Path(parent)
            for name in [*dirs, *files]:
                if not (name.startswith(".") and name.endswith(".tmp")):
                    continue
                if name in dirs and not (here / name).is_symlink():
                    shutil.rmtree(here / name)
                else:
                    (here / name).unlink()
                removed.append(here / name)
            dirs[:] = [d for d in dirs if not d.endswith(".tmp") and not (here / d / LOCK_FILE).exists()
                       and not (here / d / "meta.json").exists()]
        return removed

    def write_json(self, name: str, data: Any) -> None:
        write_json(self.path / name, data)

    def read_json(self, name: str) -> Any:
        return read_json(self.path / name)

    def append_jsonl(self, name: str, rows: list[dict]) -> None:
        with naming_disk_full(self.path / name), open(self.path / name, "a") as f:
            for row in rows:
                f.write(json.dumps(row, default=str) + "\n")
            f.flush()

    def write_jsonl(self, name: str, rows: list[dict]) -> None:
        write_atomic(self.path / name, "".join(json.dumps(row, default=str) + "\n" for row in rows))

    def read_jsonl(self, name: str) -> list[dict]:
        return read_jsonl(self.path / name)

    def truncate_jsonl(self, name: str, keep: Callable[[dict], bool]) -> None:
        """Drop the rows a resumed run is about to write again."""
        self.write_jsonl(name, [row for row in self.read_jsonl(name) if keep(row)])

    def write_meta(self, extra: dict[str, Any]) -> None:
        meta = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "git_commit": git_commit(),
            "command": " ".join(sys.argv),
            "packages": package_versions(),
            **extra,
        }
        self.write_json("meta.json", meta)


def sample_row(stage: str, step: int, episode: Episode) -> dict:
    """One line of samples.jsonl (or eval_<stage>.jsonl): a completion, raw, with its reward and details."""
    return {"stage": stage, "step": step, "id": episode.example.id, "group": episode.group_id,
            "prompt": episode.example.prompt, "completion": episode.completion, "reward": episode.reward,
            "details": episode.details, "weight_version": episode.weight_version,
            "finished": episode.finished}  # False: cut off by the generation budget
