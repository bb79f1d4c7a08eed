"""Who may write a run directory: one process at a time, by an exclusive lock on <run>/.lock
(RunLock, shared within a process by hold_lock), and what a run killed before it started
leaves behind, which the next run created beside it removes (sweep_unstarted).

A run starts in three writes: the directory with its lock, config.json, then meta.json
(pipelines/run.py::start_run). A directory without meta.json has run nothing; it is removed
only when named like a run, holding nothing but its lock, config.json and temporary files,
and when no live process holds (or is taking) its lock. runs/rundir.py is the rest of a run
directory: its files, resume and discard.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import time
import weakref
from pathlib import Path

from posttrain.files import DiskFullError, naming_disk_full

LOCK_FILE = ".lock"


class RunDirError(ValueError):
    """A run directory, or a file in it, that cannot be used as asked; the message names it
    and says what to do. A ValueError, so the command line prints it without a traceback."""



# The names a run directory can have (RunDir.create: <timestamp>-<name>[-N]), and what one
# that was killed before it started holds: nothing else is ever removed by sweep_unstarted
RUN_DIR_NAME = re.compile(r"\d{8}-\d{6}-.+")
DISCARDED_DIR_NAME = re.compile(r"\.\d{8}-\d{6}-.+\.discarded\.tmp")
UNSTARTED_FILES = frozenset({LOCK_FILE, "config.json"})
# How long a directory whose lock holds no PID yet may be one another process is creating
# this instant (it writes its PID once it holds the lock, within microseconds): left alone
CREATING_SECONDS = 60.0


def is_unstarted(path: Path) -> bool:
    """Whether `path` looks like a run directory killed before it started: named like one,
    holding at most its lock, config.json and temporary files (no meta.json: start_run
    writes it last; a discarded run's hidden remains count too)."""
    if path.is_symlink() or not path.is_dir():
        return False
    if DISCARDED_DIR_NAME.fullmatch(path.name):
        return True
    if not RUN_DIR_NAME.fullmatch(path.name):
        return False
    return all(name in UNSTARTED_FILES or (name.startswith(".") and name.endswith(".tmp"))
               for name in os.listdir(path))


def sweep_unstarted(out: Path) -> list[Path]:
    """Remove the directories in `out` that runs killed before they started left behind
    (is_unstarted), each only once its lock shows no live process holds it; the removed."""
    swept = []
    for path in sorted(out.iterdir()):
        try:
            if is_unstarted(path) and remove_if_abandoned(path):
                swept.append(path)
        except OSError:  # removed by another process meanwhile, or not ours to read: leave it
            continue
    return swept


def remove_if_abandoned(path: Path) -> bool:
    """Remove an unstarted directory unless a live process may still hold or be taking it."""
    lock_path = path / LOCK_FILE
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:  # killed between its mkdir and its lock, or being created this instant
        if time.time() - path.stat().st_mtime < CREATING_SECONDS:
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    with os.fdopen(fd, "r+b", buffering=0) as lock:
        holder = lock.read(32).strip()
        if not holder and time.time() - os.fstat(fd).st_mtime < CREATING_SECONDS:
            return False  # its creator may not hold the lock yet: taking it now would refuse that creator
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # alive: a run just starting (a slow environment between config and meta)
            return False
        if not is_unstarted(path):  # it started before the lock was ours
            return False
        shutil.rmtree(path, ignore_errors=True)
    return True


class RunLock:
    """An exclusive `flock` on <run>/.lock, held while this object lives. The file holds the
    holder's PID, so a refused writer can say whom it waited for."""

    def __init__(self, run_path: Path):
        path = run_path / LOCK_FILE
        try:
            with naming_disk_full(path):
                self.file = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644), "r+b", buffering=0)
        except DiskFullError:
            raise
        except OSError as error:
            raise RunDirError(f"cannot open {path} to take the run's lock ({error.strerror}): only a user who can "
                              f"write to {run_path} can write the run") from None
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self.file.read(32).decode(errors="replace").strip() or "unknown: it is just starting"
            self.file.close()
            raise RunDirError(
                f"{run_path} is being written by another posttrain process (PID {holder}, holding {path}); two "
                f"writers would log the same steps twice and overwrite each other's checkpoints. Wait for it to "
                f"finish, or stop it (kill {holder if holder.isdigit() else '<PID>'}) and resume then: a killed run "
                f"resumes exactly from its last checkpoint") from None
        with naming_disk_full(path):
            self.file.truncate(0)
            self.file.write(f"{os.getpid()}\n".encode())


# The locks this process holds, by resolved run path. A process is one writer: a second
# RunDir for a run it already holds shares the lock (a test that resumes in-process, while
# the killed attempt's objects still await garbage collection, is still one writer).
_HELD: weakref.WeakValueDictionary[str, RunLock] = weakref.WeakValueDictionary()


def hold_lock(run_path: Path) -> RunLock:
    key = str(run_path.resolve())
    lock = _HELD.get(key)
    if lock is None:
        lock = _HELD[key] = RunLock(run_path)
    return lock


def _forget_locks_in_child() -> None:
    """A forked child shares its parent's locks (one open file, two descriptors) and would
    keep them alive if it outlived the parent: close its copies. Closing a copy does not
    unlock; only the last descriptor does, and the parent still has it."""
    for lock in list(_HELD.values()):
        lock.file.close()
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)
