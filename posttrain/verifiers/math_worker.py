"""Steps 2 and 3 of math/boxed-or-final-v1 and -v2 (posttrain/verifiers/math_answer.py): parse
the extracted answer and the expected one with math-verify, compare them, and never wait
longer than the deadline for it.

sympy can take minutes or hang on small inputs: comparing `\\boxed{9^{9^{9^{9}}}}` with
anything evaluates a power tower no computer can hold, and a set nested 20 braces deep
takes math-verify longer than a minute to parse (measured here: depth 8 ~1.3 s, depth 15
~3.6 s). math-verify's own timeout uses `signal.alarm`, which works only in the main
thread, so we call it with `parsing_timeout=None, timeout_seconds=None` and bound time
ourselves:

  - Parse and verify run in a persistent child process (`python -I math_worker.py`, this
    file run as a script, so it imports nothing of posttrain: `-I` keeps the script's
    folder off sys.path, and only the standard library and math-verify are needed) that
    answers one JSON line per request. The parent waits with a hard deadline; when it
    passes, the child is SIGKILLed, the caller reports "timeout", and the next call
    starts a fresh child (~1 s to import sympy, not counted against that call's
    deadline). A process, not a thread, because a thread cannot be killed: a runaway
    sympy computation would keep burning one of our two cores for the rest of the run.
    Reused across calls because starting Python + sympy costs ~1 s and a round trip over
    a pipe costs well under a millisecond.
  - The child dies with its parent (posttrain/guards/processes.py): its first act asks the kernel
    for SIGKILL when the parent dies, and a watchdog thread leaves when the request pipe
    hangs up. Without that, a trainer killed with SIGKILL in the middle of a power tower
    left the child computing at 100% of a core, reparented to init (measured: still
    running 28 s later, with nothing to stop it but the memory limit).
  - Fallback: if the child cannot be started (no subprocesses allowed, say), the work
    runs in a daemon thread of this process whose result is abandoned at the deadline.
    The reward is still bounded in time, but a runaway computation keeps its core busy;
    `ask` says which mechanism answered.

    ask(expected, answer, timeout) -> (reply or None on timeout, "process" | "thread")

`compare` also says what kind of object each side parsed to (`kind`), so a spec can refuse
what math-verify would otherwise credit across kinds (math/boxed-or-final-v2 does).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

if __name__ != "__main__":  # as the worker script, it loads processes.py by path (at the end)
    from posttrain.guards import processes

WORKER_STARTUP_SECONDS = 60.0  # importing sympy takes ~1 s idle, much longer on a loaded box
WORKER_MEMORY_MB = 2048  # RLIMIT_AS of the child: a huge power fails instead of swapping
SHOWN_CHARS = 200  # how much of a parsed expression a reply keeps


def kind(parsed: list) -> str | None:
    """What math-verify made of a string, by its first reading: "scalar" (a number or an
    expression), "set" (a set, interval, tuple or matrix: anything holding several values
    or a range of them), "relation" (=, <, ... and their combinations), "text" (it read no
    math), or None (it read nothing)."""
    from sympy import Basic, MatrixBase, Set, Tuple
    from sympy.core.relational import Relational
    from sympy.logic.boolalg import BooleanAtom, BooleanFunction

    if not parsed:
        return None
    value = parsed[0]
    if isinstance(value, str):
        return "text"
    if isinstance(value, (Set, Tuple, MatrixBase, tuple, list)):
        return "set"
    # Eq, Lt, And, true; not sympy's Boolean, which a plain Symbol also is ('x' is a scalar)
    if isinstance(value, (Relational, BooleanFunction, BooleanAtom)):
        return "relation"
    return "scalar" if isinstance(value, Basic) else "text"


def compare(expected: str, answer: str) -> dict[str, Any]:
    """Parse both strings with math-verify and compare them. Slow and unbounded in time:
    call it through the worker, never directly on model output in the trainer.

    Returns {"status": "ok" | "unparsable" | "expected_unparsable", "equal": bool,
    "expected_math": str | None, "answer_math": str | None, "expected_kind": kind(...),
    "answer_kind": kind(...)}."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # math-verify warns once that its own timeout is off; we bound time ourselves (above)
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    # The answer is already extracted, so wrap it in a box and let the box be the only
    # thing math-verify looks for first; plain expressions ('1/2') are the fallback.
    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def read(text: str) -> list:
        return parse("\\boxed{" + text + "}", extraction_config=config, parsing_timeout=None)

    def shown(parsed: list) -> str | None:
        return str(parsed[0])[:SHOWN_CHARS] if parsed else None

    gold, pred = read(expected), read(answer)
    result = {"status": "ok", "equal": False, "expected_math": shown(gold), "answer_math": shown(pred),
              "expected_kind": kind(gold), "answer_kind": kind(pred)}
    if not gold:
        result["status"] = "expected_unparsable"
        return result
    if not pred:
        result["status"] = "unparsable"
        return result
    # verify(gold, target): the order matters for equations ('x=2' in gold matches '2').
    result["equal"] = bool(verify(gold, pred, timeout_seconds=None))
    if not result["equal"] and all(isinstance(p, str) for p in pred):
        result["status"] = "unparsable"  # only text came out, and the text did not match
    return result


def _serve() -> None:
    """The worker's loop: one JSON request per stdin line, one JSON reply per stdout
    line. Runs in the child process started by `_Worker`."""
    import resource

    limit = WORKER_MEMORY_MB * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = sys.stdout
    try:
        compare("1/2", "0.5")  # import and warm sympy before saying "ready"
    except Exception as error:  # ImportError above all: tell the parent what to install
        out.write(json.dumps({"ready": False, "error": f"{type(error).__name__}: {error}"}) + "\n")
        out.flush()
        return
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:  # EOF when the parent exits or closes the pipe
        try:
            request = json.loads(line)
            reply = compare(request["expected"], request["answer"])
        except BaseException as error:  # MemoryError, RecursionError, sympy internals
            reply = {"status": "error", "error": f"{type(error).__name__}: {error}"[:300]}
        out.write(json.dumps(reply) + "\n")  # ensure_ascii: lone surrogates travel safely
        out.flush()


class WorkerUnavailable(RuntimeError):
    """The child process could not be started; the caller falls back to a thread."""


class _Worker:
    """The persistent child process that runs `compare`, killed on timeout and restarted
    on the next call. One per parent process (a fork gets its own), shared by threads
    under a lock."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.owner_pid = -1
        self.buffer = b""
        self.lock = threading.Lock()
        self.unavailable: str | None = None  # set once starting failed: don't retry every call

    def _start(self) -> None:
        if self.unavailable is not None:
            raise WorkerUnavailable(self.unavailable)
        try:
            self.proc = processes.spawn(  # from a thread that lives as long as we do
                # -I: no PYTHON* variables, no user site, not this folder: posttrain unseen;
                # our pid: the parent the child checks it still has (processes.die_with_parent)
                [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in the terminal reaches the trainer only
            )  # fmt: skip
        except OSError as error:
            self.unavailable = f"could not start the math-verify worker: {error}"
            raise WorkerUnavailable(self.unavailable) from error
        self.owner_pid = os.getpid()
        self.buffer = b""
        hello = self._read_line(self._running()[2], time.monotonic() + WORKER_STARTUP_SECONDS)
        if hello is None or not hello.get("ready"):
            self.kill()
            said = (hello or {}).get("error", "no answer within the startup limit")
            if "No module named 'math_verify'" in str(said):
                raise ImportError(
                    "math-verify is not installed: `pip install math-verify` "
                    f"(the math answer scorer needs it); the worker said: {said}"
                )
            self.unavailable = f"the math-verify worker did not start: {said}"
            raise WorkerUnavailable(self.unavailable)

    def _running(self) -> tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]:
        """The worker process with its stdin and stdout, the pipes `_start` opened."""
        proc = self.proc
        if proc is None or proc.stdin is None or proc.stdout is None:  # only a bug gets here
            raise WorkerUnavailable("the math-verify worker is not running: _start it first")
        return proc, proc.stdin, proc.stdout

    def _read_line(self, stdout: IO[bytes], deadline: float) -> dict | None:
        """The next reply line, or None if the deadline passes (or the child dies) first."""
        fd = stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None  # EOF: the child died
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            return {"status": "error", "error": f"unreadable reply {line[:100]!r}"}

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.owner_pid == os.getpid():  # a forked child must not kill its parent's worker
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the whole group
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:  # always open: _start asked for both pipes
                    pipe.close()
        self.proc = None

    def ask(self, expected: str, answer: str, timeout: float) -> dict | None:
        """The worker's reply, or None on timeout (the worker is then killed)."""
        with self.lock:
            if self.proc is None or self.owner_pid != os.getpid() or self.proc.poll() is not None:
                self.kill()  # reaps a dead child; forgets (without killing) a parent's one
                self._start()
            proc, stdin, stdout = self._running()
            request = json.dumps({"expected": expected, "answer": answer}) + "\n"
            try:
                stdin.write(request.encode())
                stdin.flush()
            except OSError:  # died between calls
                self.kill()
                return {"status": "error", "error": "the worker closed its input"}
            reply = self._read_line(stdout, time.monotonic() + timeout)
            if reply is None:
                died = proc.poll() is not None
                self.kill()
                if died:
                    return {"status": "error", "error": "the worker died (memory limit?)"}
            return reply


_WORKER = _Worker()
atexit.register(_WORKER.kill)


def _ask_in_thread(expected: str, answer: str, timeout: float) -> dict | None:
    """Fallback: run `compare` in a daemon thread and abandon it at the deadline."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["reply"] = compare(expected, answer)
        except BaseException as error:
            box["reply"] = {"status": "error", "error": f"{type(error).__name__}: {error}"[:300]}

    thread = threading.Thread(target=run, daemon=True, name="math-verify-fallback")
    thread.start()
    thread.join(timeout)
    return box.get("reply")  # None while the thread still runs: a timeout


def shutdown_worker() -> None:
    """Stop the worker process now (it also stops at interpreter exit)."""
    with _WORKER.lock:
        _WORKER.kill()


def ask(expected: str, answer: str, timeout: float) -> tuple[dict | None, str]:
    """(reply, worker): the reply of `compare(expected, answer)` from the child process, or
    from a thread when no child can start; None when `timeout` seconds passed first.
    Raises ImportError only when math-verify itself is missing."""
    try:
        return _WORKER.ask(expected, answer, timeout), "process"
    except WorkerUnavailable:
        return _ask_in_thread(expected, answer, timeout), "thread"


def _load_processes() -> Any:
    """posttrain/guards/processes.py, loaded by its path: under `python -I` the posttrain package
    may not be importable (a source checkout run with PYTHONPATH), and that module imports
    nothing from it."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "guards", "processes.py")
    spec = importlib.util.spec_from_file_location("posttrain_processes", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module: is the posttrain package complete?")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":  # started by _Worker as `python -I math_worker.py PARENT_PID`
    processes = _load_processes()
    # first act: die with the parent (SIGKILL from the kernel, or our stdin hanging up)
    processes.die_with_parent(int(sys.argv[1]), pipe_fd=sys.stdin.fileno())
    _serve()
