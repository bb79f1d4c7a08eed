"""Helper processes that die with the process that started them, so a run killed with
SIGKILL (no atexit, no finally) leaves no worker behind to keep a core busy.

    in a child we wrote        die_with_parent(parent_pid)   its first act (the math worker)
    around any other program   command_dying_with_parent(argv)   the argv to start instead (marimo)
    to start either            spawn(argv, **popen_kwargs)   Popen from a thread that never ends

How. On Linux the kernel does it: `prctl(PR_SET_PDEATHSIG, SIGKILL)` asks for SIGKILL the
moment the parent dies, even while the child is stuck in one long C call (a sympy power
tower holds the GIL for minutes: no thread of the child could act then). Two catches:

  - The race: if the parent died between the fork and the prctl call, no signal will ever
    come. The child then already has a new parent (init or a subreaper), so it compares
    os.getppid() with the parent it was told about and exits when they differ.
  - The kernel means the parent THREAD: the signal fires when the thread that forked the
    child ends, not the process. A worker started from a short-lived thread would be
    killed when that thread returns, in the middle of another thread's request. `spawn`
    therefore forks from the main thread or from one daemon thread that lives as long as
    the process.

Elsewhere (macOS, or prctl refused), a watchdog thread polls os.getppid() and, for a child
that reads its requests from a pipe, waits for the pipe to hang up; it ends the process
when either says the parent is gone. It needs the GIL, so it cannot stop a child stuck in
one C call; only the kernel's signal can. A program we do not write (marimo) cannot run
our thread: there the wrapper stays resident as its parent, runs it as a child, and kills
it when the wrapper's own parent goes.

Imports nothing from posttrain: the math worker runs as `python -I math_worker.py`, where
posttrain may not be importable, and loads this file by its path. Run as a script, this
file is the wrapper: `python -I processes.py [--watchdog] PARENT_PID -- PROGRAM ARG...`.
"""

from __future__ import annotations

import ctypes
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
EXIT_ORPHANED = 70  # what a child exits with when it finds its parent gone (EX_SOFTWARE: not a crash of ours)
WATCH_SECONDS = 0.5  # how often the watchdog looks: an orphan burns at most this long once noticed
WRAPPER = os.path.abspath(__file__)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent thread ends. True if it
    will (Linux with a working prctl), False where there is no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the running program's libc (glibc or musl)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc symbols, or a prctl-less libc
        return False


def _hung_up(fd: int, timeout_seconds: float) -> bool:
    """True when nobody holds the write end of the pipe `fd` any more (POLLHUP). Waiting
    on the hang-up only, never on data, so the thread that reads the pipe loses nothing."""
    poller = select.poll()
    poller.register(fd, select.POLLHUP)
    return any(event & (select.POLLHUP | select.POLLERR | select.POLLNVAL)
               for _, event in poller.poll(timeout_seconds * 1000))  # fmt: skip


def watch_parent(parent_pid: int, pipe_fd: int | None = None, poll_seconds: float = WATCH_SECONDS) -> threading.Thread:
    """Start a daemon thread that ends this process (os._exit: no cleanup that could hang)
    once os.getppid() is no longer `parent_pid`, or once the pipe `pipe_fd` from the parent
    hangs up. The fallback where the kernel's signal is missing, and a second line where
    it is not (a parent that closed our pipe has no more work for us)."""

    def watch() -> None:
        while True:
            if pipe_fd is None:
                time.sleep(poll_seconds)
                hung_up = False
            else:
                hung_up = _hung_up(pipe_fd, poll_seconds)
            if hung_up or os.getppid() != parent_pid:
                os._exit(EXIT_ORPHANED)

    thread = threading.Thread(target=watch, daemon=True, name="watch-parent")
    thread.start()
    return thread


def die_with_parent(parent_pid: int, pipe_fd: int | None = None, use_prctl: bool = True) -> str:
    """The first act of a child: make sure it ends when `parent_pid` does. Returns how:
    "prctl" (the kernel kills it; a watchdog thread watches `pipe_fd` as well when one is
    given) or "watchdog" (only the thread). Exits at once if the parent is already gone."""
    mechanism = "prctl" if use_prctl and set_parent_death_signal() else "watchdog"
    if os.getppid() != parent_pid:  # the race: the parent died before prctl could matter
        os._exit(EXIT_ORPHANED)
    if mechanism == "watchdog" or pipe_fd is not None:
        watch_parent(parent_pid, pipe_fd)
    return mechanism


def command_dying_with_parent(argv: list[str], use_prctl: bool = True) -> list[str]:
    """`argv` wrapped so that the program dies with this process: a Python prelude (this
    file as a script) sets the parent-death signal and then becomes the program by execvp,
    keeping its pid, its signals and its exit code. Not `preexec_fn`, which Python
    documents as unsafe when the parent has threads. `-I`: the prelude needs no PYTHON*
    variable, and this file's folder on sys.path would shadow the standard library
    (posttrain/types.py)."""
    mode = [] if use_prctl else ["--watchdog"]
    return [sys.executable, "-I", WRAPPER, *mode, str(os.getpid()), "--", *argv]


# One daemon thread per process starts every child from outside the main thread, so that
# the parent-death signal means "this process died", not "the calling thread returned".
_spawner: tuple[int, queue.Queue] | None = None
_spawner_lock = threading.Lock()


def _spawn_loop(requests: queue.Queue) -> None:
    while True:
        argv, kwargs, reply = requests.get()
        try:
            reply.put((subprocess.Popen(argv, **kwargs), None))
        except BaseException as error:  # noqa: BLE001  (given back to the caller, who raises it)
            reply.put((None, error))


def spawn(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen(argv, **popen_kwargs), forked by a thread that lives as long as
    this process (the main thread, or the spawner thread: see the module docstring)."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(argv, **popen_kwargs)
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # threads do not survive a fork
            _spawner = (os.getpid(), queue.Queue())
            threading.Thread(target=_spawn_loop, args=(_spawner[1],), daemon=True, name="spawner").start()
        requests = _spawner[1]
    reply: queue.Queue = queue.Queue(maxsize=1)
    requests.put((argv, popen_kwargs, reply))
    proc, error = reply.get()
    if error is not None:
        raise error
    return proc


def _supervise(parent_pid: int, argv: list[str]) -> int:
    """The wrapper without prctl: run `argv` as a child, kill it when our parent goes."""
    child = subprocess.Popen(argv)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())  # pass a polite stop on
    while True:
        try:
            return child.wait(timeout=WATCH_SECONDS)
        except subprocess.TimeoutExpired:
            if os.getppid() != parent_pid:
                child.kill()
                child.wait()
                return EXIT_ORPHANED
        except KeyboardInterrupt:  # Ctrl-C reached the child too (same process group): wait for it
            continue


def _wrapper_main(args: list[str]) -> int:
    use_prctl = args[:1] != ["--watchdog"]
    args = args if use_prctl else args[1:]
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: python -I processes.py [--watchdog] PARENT_PID -- PROGRAM [ARG...]", file=sys.stderr)
        return 2
    parent_pid, argv = int(args[0]), args[2:]
    if use_prctl and set_parent_death_signal():
        if os.getppid() != parent_pid:
            return EXIT_ORPHANED
        os.execvp(argv[0], argv)  # the signal request survives exec: the program inherits it
    if os.getppid() != parent_pid:
        return EXIT_ORPHANED
    return _supervise(parent_pid, argv)


if __name__ == "__main__":
    raise SystemExit(_wrapper_main(sys.argv[1:]))
