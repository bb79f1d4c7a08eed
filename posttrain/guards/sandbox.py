"""Sandbox: run untrusted Python (a policy's code, an agent's tool call) in a separate,
limited process, and say how it ended.

    run_sandboxed(source) -> SandboxResult(status, exit_code, stdout, stderr, ...)

Two modes; the sandbox never drops from the first to the second on its own
(measured on the 2-core, root, Linux 6.x machine this was built on)

  "namespaces", when `unshare` and `setpriv` (util-linux) work, i.e. we are root on Linux.
  The child runs in fresh namespaces, built by posttrain/guards/sandbox_child.py:
    - network: only a loopback that is down: every connect() fails with ENETUNREACH,
      including to services on the host's 127.0.0.1;
    - processes: a new PID namespace. The code is PID 1 there and sees only its own
      processes; when it exits or is killed, the kernel kills everything it started, even
      children that called setsid() to leave the process group;
    - identity: a fresh unprivileged uid per run (no capabilities, no_new_privs). Files of
      other users that are not world-readable are out of reach, and RLIMIT_NPROC, which
      the kernel ignores for root, now caps fork bombs;
    - filesystem: a new root (chroot) holding only /usr, /etc, the lib/bin links, four
      /dev nodes, its own /proc, and the interpreter's prefix if it lives elsewhere, all
      read-only. The project checkout, run directories, data files, answer keys, /home,
      /root, /work, /opt and the host's /tmp are not there to read. Its one writable place
      is /sandbox (cwd, HOME, TMPDIR; /tmp links to it): a tmpfs of `max_disk_mb`, the
      disk quota (a write past it fails with ENOSPC), that vanishes with the namespace;
    - environment: a whitelist (PATH, LANG, HOME, TMPDIR); nothing of the parent's.
  A run of `pass` takes ~33 ms end to end, ~6 ms of it building that filesystem.
  "prelude-only", anywhere else (a non-root user, most containers): a plain `python -I -S`
  in its own session, as the same user. It is weak: the Python guards below are all that
  stands between the code and your files, the trainer's environment, and the network. So
  `run_sandboxed` refuses it (status "refused", stderr says what is missing and how to get
  namespaces) unless the caller opts in: `allow_weak_sandbox=True`, or once per process
  `permit_weak_sandbox()` (what `--env.allow_weak_sandbox true` does).

  In both modes the child's first act is to set resource limits on itself (CPU seconds,
  address space, file size, process count) and, with `python_guards=True`, to install a
  Python-level prelude that refuses sockets, fork/exec/subprocess, and writes outside the
  cwd. The parent enforces the wall clock and the output size by SIGKILL of the whole
  process group, and in prelude-only mode the disk quota by watching the work directory.
  (The limits are set by the child rather than in `preexec_fn` because CPython documents
  `preexec_fn` as unsafe in a process with threads, and torch starts threads.)

No orphans. The child's command line starts with a lifeline: `setpriv --pdeathsig KILL`
around `timeout -s KILL <wall + 2 s>` around `setpriv --pdeathsig KILL`. If the trainer
dies, even by SIGKILL, each link gets SIGKILL when its parent dies; `unshare --kill-child`
passes it to the namespace's PID 1 (which sets the signal again after its uid switch, since
the kernel clears it then), and the PID namespace takes the rest. If a link was not yet in
place, the outer timeout still ends everything 2 s past the wall limit. In namespace mode
nothing of the run is on the host's disk; in prelude-only mode the work directory carries
its owner's PID, and the next run in any process removes it once that PID is gone.

The parent is made non-dumpable (prctl PR_SET_DUMPABLE 0) the first time it runs
untrusted code, so a same-uid child cannot read /proc/<trainer>/environ, /mem or /fd. The
price, for the rest of that process's life: no core dumps, and no ptrace of the trainer by
its own user (gdb -p, py-spy dump need root).

What it does not do
  - The prelude is a speed bump, not a security boundary: code can undo it (ctypes, a
    fresh import of a builtin module, `gc` digging). In prelude-only mode a determined
    program can reach the network, read and write anywhere the user can, start daemons
    that outlive the run, and, as root, mount and fork without limit. Non-dumpability
    does not hide the trainer from a root child (CAP_SYS_PTRACE).
  - In namespace mode, /usr and /etc stay readable (the interpreter needs them); so does
    /proc's view of the kernel. No seccomp filter and no cgroup: memory is capped per
    process by RLIMIT_AS (N processes may use N times the limit), and the tmpfs quota is
    memory too.
  - A real deployment should run untrusted code in a container or VM sandbox built for
    it: gVisor, Firecracker, nsjail or bubblewrap with seccomp and cgroup limits.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from posttrain.guards.sandbox_child import (
    PRELUDE,
    SAFE_PATH,
    WORK,
    lifeline,
    namespace_command,
    namespace_python,
)

STATUSES: dict[str, str] = {
    "ok": "the program ran to the end and exited with code 0",
    "error": "the program exited with a nonzero code (an exception, sys.exit(1), ...)",
    "timeout": "the wall-clock limit passed; the process group was killed",
    "cpu_limit": "the program used its CPU seconds (RLIMIT_CPU)",
    "memory_limit": "an allocation failed under the address-space limit (RLIMIT_AS)",
    "output_limit": "stdout or stderr exceeded max_output_bytes; the group was killed",
    "disk_limit": "prelude-only mode: the work directory outgrew max_disk_mb; the group was killed",
    "killed": "a signal ended the program (SIGSEGV, os.abort(), ...) and no limit explains it",
    "refused": "no namespaces here and the caller did not allow the weak sandbox: nothing ran",
    "sandbox_error": "the sandbox itself could not start the program (a host problem)",
}

# Exit codes the prelude uses to say which limit ended the program. A program can exit
# with these codes itself and be mislabelled: the label explains, it never rewards.
EXIT_MEMORY = 101
EXIT_CPU = 102

# No user owns these. A fresh uid per run keeps concurrent runs from signalling each other
# and gives each its own RLIMIT_NPROC count (a collision, 1 in 10^6, would share it).
SANDBOX_UIDS = range(1_000_000, 2_000_000)
# prelude-only work directories are <tmp>/posttrain-sandbox-<owner pid>-<random>
WORK_PREFIX = "posttrain-sandbox-"
PR_SET_DUMPABLE = 4  # from <linux/prctl.h>

WEAK_SANDBOX_HELP = (
    "refusing to run untrusted code in the weak prelude-only sandbox ({problem}): it would run as your "
    "own user behind a Python guard it can undo, so it could read your files and the "
    "trainer's environment, write anywhere you can and reach the network. To get namespaces, run as "
    "root on Linux with util-linux's unshare and setpriv installed (in a VM, or a container started "
    "with --privileged or --cap-add SYS_ADMIN). To accept the weak sandbox instead: --env.allow_weak_sandbox "
    "true on the command line, or allow_weak_sandbox=True / posttrain.guards.sandbox.permit_weak_sandbox() in Python"
)

_weak_permitted = False  # the process-wide opt-in; see permit_weak_sandbox


@dataclasses.dataclass
class SandboxResult:
    status: str  # one of STATUSES
    exit_code: int | None  # None when the program never started
    stdout: str  # decoded with errors="replace", cut at max_output_bytes
    stderr: str
    wall_seconds: float
    cpu_seconds: float  # user + system time of the whole process tree
    isolation: str  # "namespaces", "prelude-only", or "none" when refused
    python_guards: bool


@functools.cache
def _namespace_problem() -> str | None:
    """Probe once per process: why the namespace sandbox cannot be built here, or None."""
    if not sys.platform.startswith("linux"):
        return f"no namespace sandbox: namespaces are Linux-only; this is {sys.platform}"
    if os.geteuid() != 0:
        return f"no namespace sandbox: not root (euid {os.geteuid()}); namespaces and a uid switch need root"
    for tool in ("unshare", "setpriv"):
        if not shutil.which(tool, path=SAFE_PATH):
            return f"no namespace sandbox: {tool} is not installed (util-linux)"
    if namespace_python() is None:
        return f"no namespace sandbox: no Python an unprivileged user can run ({sys.executable} is not world-executable)"
    result = _run("pass", isolation="namespaces", cpu_seconds=2, wall_seconds=10,
                  memory_mb=256, max_output_bytes=4096, max_file_mb=1, max_disk_mb=1,
                  max_processes=8, python_guards=False)  # fmt: skip
    if result.status != "ok":
        return (f"no namespace sandbox: a trial run failed ({result.status}, exit {result.exit_code}): "
                f"{result.stderr.strip()[-300:]}")
    return None


def namespaces_available() -> bool:
    """Can we build the namespace sandbox here? (Root on Linux, util-linux's unshare and
    setpriv, and a Python any user can run; probed once per process.)"""
    return _namespace_problem() is None


def permit_weak_sandbox() -> None:
    """Allow prelude-only mode for the rest of this process, where namespaces are
    unavailable. For a user who has read what that mode leaks (the module docstring)."""
    global _weak_permitted
    _weak_permitted = True


def weak_sandbox_refusal(allow_weak_sandbox: bool | None = None) -> str | None:
    """The message run_sandboxed would refuse with here, or None when code would run.
    Environments call it at construction, so a run fails before any work."""
    if namespaces_available() or (_weak_permitted if allow_weak_sandbox is None else allow_weak_sandbox):
        return None
    return WEAK_SANDBOX_HELP.format(problem=_namespace_problem())


@functools.cache
def make_parent_undumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0) on this process, once: a same-uid child can no longer read
    /proc/<our pid>/environ, mem or fd. Costs: no core dumps, no ptrace by our own user.
    False where there is no prctl (not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def run_sandboxed(
    source: str,
    *,
    cpu_seconds: int = 2,  # a test suite for one function needs well under a second
    wall_seconds: float = 5,  # > cpu_seconds: startup, sleeping and waiting count here only
    memory_mb: int = 256,  # address space, not RSS: Python itself maps ~30 MB at start
    max_output_bytes: int = 64_000,  # per stream; enough for tracebacks and test reports
    max_file_mb: int = 16,  # largest file the program may write
    max_disk_mb: int = 32,  # all its files together; in namespace mode RAM (a tmpfs)
    max_processes: int = 32,  # RLIMIT_NPROC for the run's uid (namespaces mode only)
    python_guards: bool = True,
    isolation: str = "auto",  # "auto" (namespaces when available), "namespaces", "prelude-only"
    # None: this process's choice (permit_weak_sandbox); False unless someone opted in,
    # because prelude-only mode leaks (module docstring)
    allow_weak_sandbox: bool | None = None,
) -> SandboxResult:
    """Run Python `source` in a separate, limited process and report how it ended. Never
    raises because of what `source` contains or does; see the module docstring for what is
    and is not isolated. Makes this process non-dumpable first (make_parent_undumpable)."""
    if isolation not in ("auto", "namespaces", "prelude-only"):
        raise ValueError(f"isolation must be auto, namespaces or prelude-only, got {isolation!r}")
    if isolation == "namespaces" and not namespaces_available():
        raise RuntimeError(f"isolation='namespaces' was asked for, but {_namespace_problem()}")
    if isolation == "auto":
        isolation = "namespaces" if namespaces_available() else "prelude-only"
    allowed = _weak_permitted if allow_weak_sandbox is None else allow_weak_sandbox
    if isolation == "prelude-only" and not allowed:
        problem = _namespace_problem() or "isolation='prelude-only' was asked for"
        return SandboxResult("refused", None, "", WEAK_SANDBOX_HELP.format(problem=problem), 0.0, 0.0,
                             "none", python_guards)  # fmt: skip
    make_parent_undumpable()
    return _run(source, isolation=isolation, cpu_seconds=cpu_seconds,
                wall_seconds=wall_seconds, memory_mb=memory_mb,
                max_output_bytes=max_output_bytes, max_file_mb=max_file_mb, max_disk_mb=max_disk_mb,
                max_processes=max_processes, python_guards=python_guards)  # fmt: skip


def _run(source, *, isolation, cpu_seconds, wall_seconds, memory_mb, max_output_bytes,
         max_file_mb, max_disk_mb, max_processes, python_guards) -> SandboxResult:  # fmt: skip
    settings = (cpu_seconds, memory_mb, max_file_mb, max_processes, python_guards, EXIT_MEMORY, EXIT_CPU)
    prelude = ["-I", "-S", "-c", PRELUDE, *(str(int(v)) for v in settings)]
    # surrogatepass: any str becomes bytes; invalid UTF-8 is then a SyntaxError there
    program = source.encode("utf-8", "surrogatepass")
    limits = (wall_seconds, cpu_seconds, max_output_bytes, isolation, python_guards)
    if isolation == "namespaces":  # its work directory is a tmpfs inside the namespace
        command = lifeline(wall_seconds) + namespace_command(secrets.choice(SANDBOX_UIDS), max_disk_mb)
        env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": WORK, "TMPDIR": WORK}
        return _supervise(command + prelude, "/", env, program, *limits, watch=None)
    _sweep_stale_work_dirs()
    work = tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-")
    try:
        env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work}
        command = lifeline(wall_seconds) + [sys.executable] + prelude
        return _supervise(command, work, env, program, *limits, watch=(work, max_disk_mb))
    finally:
        shutil.rmtree(work, ignore_errors=True)  # rmtree never follows the code's symlinks


def _sweep_stale_work_dirs() -> None:
    """Remove prelude-only work directories whose owner process is gone: a trainer killed
    by SIGKILL cannot remove its own."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        owner = name[len(WORK_PREFIX):].partition("-")[0]
        if name.startswith(WORK_PREFIX) and owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _disk_bytes(path: str, max_entries: int = 10_000) -> float:
    """Bytes allocated under `path`; infinity past `max_entries` files, so that counting
    stays cheap (a program that makes ten thousand files is over any sane quota)."""
    total, stack, seen = 0, [path], 0
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    seen += 1
                    if seen > max_entries:
                        return float("inf")
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue  # removed or made unreadable while we looked
    return total


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


def _supervise(command: list[str], cwd: str, env: dict[str, str], program: bytes, wall_seconds: float,
               cpu_seconds: int, max_output_bytes: int, isolation: str, python_guards: bool,
               watch: tuple[str, int] | None) -> SandboxResult:  # fmt: skip
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,  # its own group, to kill whole
        )  # fmt: skip
    except OSError as error:
        return SandboxResult("sandbox_error", None, "", f"could not start: {error}", 0.0,
                             0.0, isolation, python_guards)  # fmt: skip
    # A thread feeds stdin so a huge program can never deadlock against a full stdout.
    threading.Thread(target=_feed, args=(proc.stdin, program), daemon=True).start()

    stdout, stderr = bytearray(), bytearray()
    out = {proc.stdout.fileno(): stdout, proc.stderr.fileno(): stderr}
    status, next_disk_check = None, start
    with selectors.DefaultSelector() as selector:
        for fd in out:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and status is None:
            now = time.monotonic()
            remaining = start + wall_seconds - now
            if remaining <= 0:
                status = "timeout"
                break
            if watch and now >= next_disk_check:  # 4 looks a second: a 16 MB file takes longer
                next_disk_check = now + 0.25
                if _disk_bytes(watch[0]) > watch[1] * 1024 * 1024:
                    status = "disk_limit"
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
    # The pipes can close a moment before the process ends (coreutils' timeout closes its
    # stdio at exit): let it finish rather than kill it mid-exit and misreport a SIGKILL.
    while status is None and not _has_exited(proc.pid):
        if time.monotonic() >= start + wall_seconds:
            status = "timeout"
        time.sleep(0.002)
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
