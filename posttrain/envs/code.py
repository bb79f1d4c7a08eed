"""Code tasks: the reward is the fraction of the example's tests that pass when the
model's code runs in a sandbox.

    example.meta["tests"]   ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]
    completion              "Here you go:\\n```python\\ndef add(a, b):\\n    return a + b\\n```"
    score(...)              {"reward": 1.0, "details": {"reason": "ok", ...}}

Two layers, each usable alone:

    run_sandboxed(source)      run untrusted Python in a separate, limited process
    CodeTests()(ex, text)      extract the code, run it and the tests, explain the result

What the sandbox does (measured on the 2-core, root, Linux 6.x machine this was built on)

  When `unshare` and `setpriv` (util-linux) work, i.e. we are root on Linux, the child runs
  in fresh namespaces ("namespaces" in `SandboxResult.isolation`):
    - network: a new network namespace holds only a loopback that is down, so every
      connect() fails with ENETUNREACH, including to services on the host's 127.0.0.1;
    - processes: a new PID namespace. The code is PID 1 there and sees only its own
      processes; when it exits or is killed, the kernel kills everything it started, even
      children that called setsid() to leave the process group;
    - identity: a fresh unprivileged uid per run (no capabilities, no_new_privs). Files of
      other users that are not world-readable (/root, other sandboxes) are out of reach,
      and RLIMIT_NPROC, which the kernel ignores for root, now caps fork bombs;
    - filesystem: a new mount namespace where the mounts holding world-writable
      directories (`/` with /tmp, /dev/shm, ...) are read-only and only the run's
      temporary directory (its cwd, deleted afterwards) is writable;
    - environment: a whitelist (PATH, LANG, HOME, TMPDIR); nothing of the parent's.
  Otherwise ("prelude-only") the child is a plain `python -I -S` in its own session, as
  the same user, with the same environment whitelist and resource limits.

  In both modes the child's first act is to set resource limits on itself (CPU seconds,
  address space, file size, process count) and, with `python_guards=True`, to install a
  Python-level prelude that refuses sockets, fork/exec/subprocess, and writes outside the
  cwd. The parent enforces the wall clock and the output size by SIGKILL of the whole
  process group. (The limits are set by the child rather than in `preexec_fn` because
  CPython documents `preexec_fn` as unsafe in a process with threads, and torch starts
  threads.)

What it does not do
  - The prelude is a speed bump, not a security boundary: code can undo it (ctypes, a
    fresh import of a builtin module, `gc` digging). Without namespaces, a determined
    program can reach the network, write anywhere the user can, and, as root, fork without
    limit. Read-only access to world-readable files remains in both modes.
  - No seccomp filter, no cgroup (memory is capped per process by RLIMIT_AS, so N
    processes may use N times the limit), no limit on disk space in the temporary
    directory beyond RLIMIT_FSIZE per file.
  - A real deployment should run untrusted code in a container or VM sandbox built for
    it: gVisor, Firecracker, nsjail or bubblewrap with seccomp and cgroup limits.

The scorer's reward-hacking defence: a naive verifier that rewards "exit code 0" pays
for `import os; os._exit(0)` placed before the tests. Here the harness reports each test
on stdout as a line stamped with a random nonce, and only stamped lines count. Code that
walks interpreter frames could still find the nonce and forge lines; look at samples.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from posttrain.types import Example

# ---------------------------------------------------------------------------------------
# Part 1: run_sandboxed
# ---------------------------------------------------------------------------------------

STATUSES: dict[str, str] = {
    "ok": "the program ran to the end and exited with code 0",
    "error": "the program exited with a nonzero code (an exception, sys.exit(1), ...)",
    "timeout": "the wall-clock limit passed; the process group was killed",
    "cpu_limit": "the program used its CPU seconds (RLIMIT_CPU)",
    "memory_limit": "an allocation failed under the address-space limit (RLIMIT_AS)",
    "output_limit": "stdout or stderr exceeded max_output_bytes; the group was killed",
    "killed": "a signal ended the program (SIGSEGV, os.abort(), ...) and no limit explains it",
    "sandbox_error": "the sandbox itself could not start the program (a host problem)",
}

# Exit codes the prelude uses to say which limit ended the program. A program can exit
# with these codes itself and be mislabelled: the label explains, it never rewards.
EXIT_MEMORY = 101
EXIT_CPU = 102

# The child sees only these variables: no tokens, keys or proxies leak from the parent.
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # sbin for mount, which the root setup runs
# No user owns these. A fresh uid per run keeps concurrent runs from signalling each other
# and gives each its own RLIMIT_NPROC count (a collision, 1 in 10^6, would share it).
SANDBOX_UIDS = range(1_000_000, 2_000_000)


@dataclasses.dataclass
class SandboxResult:
    status: str  # one of STATUSES
    exit_code: int | None  # None when the program never started
    stdout: str  # decoded with errors="replace", cut at max_output_bytes
    stderr: str
    wall_seconds: float
    cpu_seconds: float  # user + system time of the whole process tree
    isolation: str  # "namespaces" or "prelude-only"
    python_guards: bool


# Runs as `python -I -S -c PRELUDE <cpu> <memory_mb> <fsize_mb> <nproc> <guards>
# <exit_memory> <exit_cpu>` with the program on stdin. It runs before any untrusted byte:
# limits first, then guards.
PRELUDE = r"""
import os, resource, signal, sys
cpu, memory_mb, fsize_mb, nproc, guards, exit_memory, exit_cpu = map(int, sys.argv[1:8])
MB = 1024 * 1024
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL a second later
resource.setrlimit(resource.RLIMIT_AS, (memory_mb * MB, memory_mb * MB))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_mb * MB, fsize_mb * MB))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
# A handler, not the default action: as PID 1 of a namespace the default would be ignored.
signal.signal(signal.SIGXCPU, lambda *_: os._exit(exit_cpu))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write raises OSError instead
program = sys.stdin.buffer.read()
null = os.open(os.devnull, os.O_RDONLY); os.dup2(null, 0); os.close(null)
ROOT = os.path.realpath(os.getcwd())

def install_guards():
    import builtins, io, posix, socket, _socket, _posixsubprocess

    def deny(what):
        def refuse(*args, **kwargs):
            raise PermissionError(f"{what} is blocked in the posttrain sandbox")
        return refuse

    socket.socket.__init__ = deny("network")
    for module in (socket, _socket):
        module.socket = socket.socket
        module.socketpair = deny("network")
    for name in ("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp",
                 "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp",
                 "execvpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl",
                 "spawnle", "spawnlp", "spawnlpe"):
        for module in (os, posix):
            if hasattr(module, name):
                setattr(module, name, deny("starting processes"))
    _posixsubprocess.fork_exec = deny("starting processes")

    def inside(path):
        if isinstance(path, int):
            return True  # an already-open file descriptor
        real = os.path.realpath(os.fsdecode(path))
        return real == os.devnull or os.path.commonpath([real, ROOT]) == ROOT

    def guard(function, *path_args):
        def guarded(*args, **kwargs):
            for i in path_args:
                if len(args) > i and not inside(args[i]):
                    raise PermissionError(f"writing outside {ROOT} is blocked: {args[i]!r}")
            return function(*args, **kwargs)
        return guarded

    real_open = io.open
    def open_(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and not inside(file):
            raise PermissionError(f"writing outside {ROOT} is blocked: {file!r}")
        return real_open(file, mode, *args, **kwargs)
    builtins.open = io.open = open_

    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    real_os_open = os.open
    def os_open(path, flags, *args, **kwargs):
        if flags & WRITE_FLAGS and not inside(path):
            raise PermissionError(f"writing outside {ROOT} is blocked: {path!r}")
        return real_os_open(path, flags, *args, **kwargs)
    os.open = posix.open = os_open
    for name, path_args in (("mkdir", (0,)), ("rmdir", (0,)), ("remove", (0,)),
                            ("unlink", (0,)), ("rename", (0, 1)), ("replace", (0, 1)),
                            ("symlink", (1,)), ("link", (1,)), ("chmod", (0,)),
                            ("chown", (0,)), ("truncate", (0,)), ("utime", (0,)),
                            ("mkfifo", (0,)), ("mknod", (0,))):
        if hasattr(os, name):
            wrapped = guard(getattr(os, name), *path_args)
            setattr(os, name, wrapped); setattr(posix, name, wrapped)

if guards:
    install_guards()
del install_guards
try:
    code = compile(program, "<sandbox>", "exec")
    del program
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
except MemoryError:
    os.write(2, b"\nMemoryError: the sandbox's memory limit was reached\n")
    os._exit(exit_memory)
"""

# Runs as root inside the new namespaces, then drops to the sandbox uid. The work
# directory becomes its own mount, so it stays writable when the mounts that hold
# world-writable directories become read-only. The mounts are this namespace's copies:
# the host's stay as they were.
NAMESPACE_SETUP = r"""
work=$1; uid=$2; shift 2
mount --bind "$work" "$work" || exit 125
for target in / /tmp /var/tmp /run /run/lock /dev/shm /dev/mqueue; do
    if grep -q "^[^ ]* $target " /proc/self/mounts; then
        mount -o remount,bind,ro "$target" || exit 125
    fi
done
cd "$work" && exec setpriv --reuid="$uid" --regid="$uid" --clear-groups --no-new-privs -- "$@"
"""


def _world_executable(path: str) -> bool:
    """True when a user with no privileges can run `path` (every directory on the way must
    be world-searchable; a pyenv under /root, mode 700, is not)."""
    path = os.path.realpath(path)
    parts = [path] + [os.path.dirname(path)]
    while parts[-1] != "/":
        parts.append(os.path.dirname(parts[-1]))
    try:
        return all(os.stat(p).st_mode & 0o001 for p in parts)
    except OSError:
        return False


def _namespace_python() -> str | None:
    """The interpreter the sandbox uid can run: ours if it is world-executable, else the
    system python3 (a pyenv or conda under /root is not), so versions may differ."""
    for candidate in (sys.executable, shutil.which("python3", path=SAFE_PATH)):
        if candidate and _world_executable(candidate):
            return candidate
    return None


def _namespace_command(work: str, uid: int) -> list[str]:
    return [
        "unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc",
        "--uts", "--", "/bin/sh", "-c", NAMESPACE_SETUP, "sh", work, str(uid),
        _namespace_python() or "python3",
    ]  # fmt: skip


@functools.cache
def namespaces_available() -> bool:
    """Probe once per process: can we build the namespace sandbox here? (Needs root on
    Linux, util-linux's unshare and setpriv, and a Python any user can run.)"""
    if os.geteuid() != 0 or not shutil.which("unshare", path=SAFE_PATH):
        return False
    if not shutil.which("setpriv", path=SAFE_PATH) or _namespace_python() is None:
        return False
    result = _run("pass", isolation="namespaces", cpu_seconds=2, wall_seconds=10,
                  memory_mb=256, max_output_bytes=4096, max_file_mb=1, max_processes=8,
                  python_guards=False)  # fmt: skip
    return result.status == "ok"


def run_sandboxed(
    source: str,
    *,
    cpu_seconds: int = 2,  # a test suite for one function needs well under a second
    wall_seconds: float = 5,  # > cpu_seconds: startup, sleeping and waiting count here only
    memory_mb: int = 256,  # address space, not RSS: Python itself maps ~30 MB at start
    max_output_bytes: int = 64_000,  # per stream; enough for tracebacks and test reports
    max_file_mb: int = 16,  # largest file the program may write
    max_processes: int = 32,  # RLIMIT_NPROC for the run's uid (namespaces mode only)
    python_guards: bool = True,
    isolation: str = "auto",  # "auto" (namespaces when available), "namespaces", "prelude-only"
) -> SandboxResult:
    """Run Python `source` in a separate, limited process and report how it ended. Never
    raises because of what `source` contains or does; see the module docstring for what is
    and is not isolated."""
    if isolation not in ("auto", "namespaces", "prelude-only"):
        raise ValueError(f"isolation must be auto, namespaces or prelude-only, got {isolation!r}")
    if isolation == "auto":
        isolation = "namespaces" if namespaces_available() else "prelude-only"
    elif isolation == "namespaces" and not namespaces_available():
        raise RuntimeError("namespaces are not available here (needs root, unshare, setpriv)")
    return _run(source, isolation=isolation, cpu_seconds=cpu_seconds,
                wall_seconds=wall_seconds, memory_mb=memory_mb,
                max_output_bytes=max_output_bytes, max_file_mb=max_file_mb,
                max_processes=max_processes, python_guards=python_guards)  # fmt: skip


def _run(source, *, isolation, cpu_seconds, wall_seconds, memory_mb, max_output_bytes,
         max_file_mb, max_processes, python_guards) -> SandboxResult:  # fmt: skip
    work = tempfile.mkdtemp(prefix="posttrain-sandbox-")
    try:
        settings = (cpu_seconds, memory_mb, max_file_mb, max_processes, python_guards,
                    EXIT_MEMORY, EXIT_CPU)  # fmt: skip
        prelude = ["-I", "-S", "-c", PRELUDE, *(str(int(v)) for v in settings)]
        if isolation == "namespaces":
            uid = secrets.choice(SANDBOX_UIDS)
            os.chown(work, uid, uid)
            command = _namespace_command(work, uid) + prelude
        else:
            command = [sys.executable] + prelude
        env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work}
        # surrogatepass: any str becomes bytes; invalid UTF-8 is then a SyntaxError there
        program = source.encode("utf-8", "surrogatepass")
        return _supervise(command, work, env, program, wall_seconds, cpu_seconds,
                          max_output_bytes, isolation, python_guards)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)  # rmtree never follows the code's symlinks


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except OSError:
        pass  # the child died before reading its program: its exit status tells why
    finally:
        try:
            pipe.close()
        except OSError:
            pass  # close() flushes, which fails the same way


def _supervise(command, work, env, program, wall_seconds, cpu_seconds, max_output_bytes,
               isolation, python_guards) -> SandboxResult:  # fmt: skip
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            command, cwd=work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,  # its own group, to kill whole
        )  # fmt: skip
    except OSError as error:
        return SandboxResult("sandbox_error", None, "", f"could not start: {error}", 0.0,
                             0.0, isolation, python_guards)  # fmt: skip
    # A thread feeds stdin so a huge program can never deadlock against a full stdout.
    threading.Thread(target=_feed, args=(proc.stdin, program), daemon=True).start()

    stdout, stderr = bytearray(), bytearray()
    out = {proc.stdout.fileno(): stdout, proc.stderr.fileno(): stderr}
    status = None
    with selectors.DefaultSelector() as selector:
        for fd in out:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and status is None:
            remaining = start + wall_seconds - time.monotonic()
            if remaining <= 0:
                status = "timeout"
                break
            events = selector.select(min(remaining, 0.1))
            if not events and _has_exited(proc.pid):
                break  # exited, but something it left behind still holds the pipes
            for key, _ in events:
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                buffer = out[key.fd]
                buffer += chunk[: max_output_bytes - len(buffer)]
                if len(buffer) >= max_output_bytes:
                    status = "output_limit"
    # Kill the group before reaping: until reaped, its pgid cannot be reused by anyone.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is already empty
    _, wait_status, usage = os.wait4(proc.pid, 0)
    proc.returncode = exit_code = os.waitstatus_to_exitcode(wait_status)
    for pipe in (proc.stdout, proc.stderr):
        pipe.close()
    cpu = usage.ru_utime + usage.ru_stime
    if status is None:
        status = _classify(exit_code, cpu, cpu_seconds)
    return SandboxResult(
        status=status,
        exit_code=exit_code,
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        wall_seconds=round(time.monotonic() - start, 3),
        cpu_seconds=round(cpu, 3),
        isolation=isolation,
        python_guards=python_guards,
    )


def _has_exited(pid: int) -> bool:
    """Whether `pid` has exited, without reaping it (WNOWAIT): we still need its rusage."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None


def _classify(exit_code: int, cpu: float, cpu_seconds: float) -> str:
    if exit_code == 0:
        return "ok"
    if exit_code == EXIT_MEMORY:
        return "memory_limit"
    # SIGXCPU's handler exits with EXIT_CPU; if the handler could not run (a long C call),
    # the hard limit's SIGKILL came a second later, which unshare reports as exit code 1.
    if exit_code in (EXIT_CPU, -signal.SIGXCPU) or cpu >= cpu_seconds:
        return "cpu_limit"
    return "killed" if exit_code < 0 else "error"


# ---------------------------------------------------------------------------------------
# Part 2: the scorer
# ---------------------------------------------------------------------------------------

# The closed set of reason codes. The reason names the FIRST thing that went wrong, in
# the order the harness runs: extract code, compile, define, test 1..n, finish.
REASONS: dict[str, str] = {
    "ok": "every test passed",
    "no_code": "the completion (or its fenced block) holds no code, only whitespace",
    "syntax_error": "the code does not compile (SyntaxError, null bytes, bad encoding)",
    "runtime_error": "the code raised while being defined, before any test ran",
    "wrong_answer": "a test's assert failed (AssertionError)",
    "test_error": "a test raised something other than AssertionError (NameError, ...)",
    "timeout": "the CPU or wall-clock limit ended the run",
    "memory_limit": "the code ran out of its memory limit",
    "output_limit": "the code printed more than the output limit",
    "exited_early": "the process ended before the harness finished (os._exit, a signal, "
    "closed stdout): a finish that carries no nonce earns nothing",
    "sandbox_error": "the sandbox could not start the program (a host problem, not the model)",
}

_STATUS_REASON = {"timeout": "timeout", "cpu_limit": "timeout", "memory_limit": "memory_limit",
                  "output_limit": "output_limit", "sandbox_error": "sandbox_error"}  # fmt: skip

# One lazy span per fence, scanning forward only: linear time even on a megabyte of
# backticks. An unclosed fence (a generation cut off by max_new_tokens) runs to the end.
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(completion: str) -> tuple[str, str]:
    """(code, where): the LAST ```python fenced block, because models often show a draft
    before the final version; else the whole completion. `where` is "fenced" or "whole"."""
    blocks = _FENCE.findall(completion)
    if blocks:
        return blocks[-1], "fenced"
    return completion, "whole"


# Runs in the sandbox after the prelude. It reports on stdout, one JSON line per event,
# each prefixed with the nonce; the parent trusts no other line. Everything the harness
# needs is bound before the untrusted code runs, so monkeypatching cannot reach it.
HARNESS = r'''
def _harness(solution, tests, nonce):
    import json, os
    dumps, write, exit_now = json.dumps, os.write, os._exit

    def report(**event):
        write(1, ("\n" + nonce + " " + dumps(event) + "\n").encode())

    def describe(error):
        name = type(error).__name__
        try:
            message = str(error)
        except BaseException:
            message = ""  # a hostile __str__ must not break the report
        return (name + ": " + message)[:300] if message else name

    try:
        code = compile(solution, "solution.py", "exec")
    except MemoryError:
        raise
    except BaseException as error:  # SyntaxError, ValueError (null bytes), RecursionError
        report(event="syntax_error", error=describe(error))
        exit_now(0)
    # __name__ is not "__main__": an `if __name__ == "__main__":` block reading stdin
    # would otherwise run and fail on the empty stdin.
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
    except MemoryError:
        raise
    except BaseException as error:  # SystemExit too: exiting is not passing
        report(event="runtime_error", error=describe(error))
        exit_now(0)
    for index, test in enumerate(tests):
        try:
            exec(compile(test, "test_%d.py" % index, "exec"), namespace)
            report(event="test", index=index, outcome="pass")
        except MemoryError:
            raise
        except AssertionError as error:
            report(event="test", index=index, outcome="fail", error=describe(error))
        except BaseException as error:
            report(event="test", index=index, outcome="error", error=describe(error))
    report(event="done")
    exit_now(0)  # skip atexit hooks and non-daemon threads the code may have left
'''


def _tests_of(example: Example) -> list[str]:
    """The example's tests as a list of sources, checked to compile. A bad example is a
    dataset bug, so it raises here (in the trusted parent) instead of scoring 0."""
    tests = example.meta.get("tests") if isinstance(example.meta, dict) else None
    if isinstance(tests, str):
        tests = [tests]  # one block of asserts: all or nothing
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(
            f"example {example.id!r}: meta['tests'] must be a str or a non-empty list of "
            f"str (Python assert statements), got {tests!r:.120}"
        )
    for index, test in enumerate(tests):
        try:
            compile(test, f"test_{index}.py", "exec")
        except (SyntaxError, ValueError) as error:
            raise ValueError(f"example {example.id!r}: test {index} does not compile: {error}")
    return tests


class CodeTests:
    """code/tests-v1: reward 1.0 iff every test in `example.meta["tests"]` passes after
    the completion's code ran (the last ```python block, else the whole text).
    code/tests-partial-v1 (`partial=True`): reward = passed tests / all tests, counted
    from nonce-stamped reports only, so tests passed before a later timeout still count.

    Tests run in the solution's namespace, in order; each is one str (typically one
    assert). A str instead of a list is a single all-or-nothing test. The code runs with
    `python -I -S`: only the standard library is importable.

    Contract (as final_int's): total on any str, explainable (`details["reason"]` in
    REASONS), deterministic for deterministic code; `wall_seconds` and `cpu_seconds`
    in details are measurements and vary run to run."""

    def __init__(self, partial: bool = False, cpu_seconds: int = 2, wall_seconds: float = 5,
                 memory_mb: int = 256, max_output_bytes: int = 64_000):  # fmt: skip
        self.partial = partial
        self.version = "code/tests-partial-v1" if partial else "code/tests-v1"
        self.limits = dict(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds,
                           memory_mb=memory_mb, max_output_bytes=max_output_bytes)  # fmt: skip

    def __call__(self, example: Example, completion: str) -> dict[str, Any]:
        if not isinstance(completion, str):
            raise TypeError(
                "completion must be a str (the decoded model output), got "
                f"{type(completion).__name__} {completion!r:.80}; decode the tokens first"
            )
        tests = _tests_of(example)
        code, where = extract_code(completion)
        if code.strip() == "":
            return self._result("no_code", [None] * len(tests), None, where, None)
        nonce = secrets.token_hex(16)
        program = HARNESS + f"_harness({code!r}, {tests!r}, {nonce!r})\n"
        run = run_sandboxed(program, **self.limits)
        events = _read_reports(run.stdout, nonce)
        outcomes: list[dict | None] = [None] * len(tests)
        reason, error = None, None
        for event in events:
            kind = event.get("event")
            if kind in ("syntax_error", "runtime_error"):
                reason, error = kind, event.get("error")
            elif kind == "test" and event.get("index") in range(len(tests)):
                outcomes[event["index"]] = event
                if event.get("outcome") != "pass" and reason is None:
                    reason = "wrong_answer" if event["outcome"] == "fail" else "test_error"
                    error = event.get("error")
            elif kind == "done" and reason is None:
                reason = "ok"
        if reason is None:  # no failure reported before the run ended: the sandbox says why
            reason = _STATUS_REASON.get(run.status, "exited_early")
        return self._result(reason, outcomes, error, where, run)

    def _result(self, reason, outcomes, error, where, run: SandboxResult | None):
        passed = sum(1 for o in outcomes if o and o.get("outcome") == "pass")
        if self.partial:
            reward = passed / len(outcomes)
        else:
            reward = 1.0 if reason == "ok" else 0.0
        return {
            "reward": reward,
            "details": {
                "reason": reason,
                "spec_version": self.version,
                "tests_passed": passed,
                "tests_total": len(outcomes),
                "test_outcomes": [o.get("outcome", "?") if o else "not_run" for o in outcomes],
                "error": error,
                "code_source": where,
                "status": run.status if run else None,
                "exit_code": run.exit_code if run else None,
                "stderr": run.stderr[-2000:] if run else "",  # the end holds the traceback
                "isolation": run.isolation if run else None,
                "wall_seconds": run.wall_seconds if run else 0.0,
                "cpu_seconds": run.cpu_seconds if run else 0.0,
            },
        }

    def __repr__(self) -> str:
        return f"<spec {self.version}>"


def _read_reports(stdout: str, nonce: str) -> list[dict]:
    """The harness's events, in order: lines that start with the nonce and parse."""
    events = []
    for line in stdout.split("\n"):
        if line.startswith(nonce + " "):
            try:
                event = json.loads(line[len(nonce) + 1 :])
            except ValueError:
                continue  # a line cut by the output limit
            if isinstance(event, dict):
                events.append(event)
    return events


SPECS: dict[str, CodeTests] = {s.version: s for s in (CodeTests(), CodeTests(partial=True))}


def score(example: Example, completion: str, spec_version: str = "code/tests-v1") -> dict[str, Any]:
    """Score one completion under a named spec version ("code/tests-v1" or
    "code/tests-partial-v1")."""
    if spec_version not in SPECS:
        raise ValueError(f"unknown spec_version {spec_version!r}; valid: {', '.join(SPECS)}")
    return SPECS[spec_version](example, completion)
