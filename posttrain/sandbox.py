"""Sandbox: run untrusted Python (a policy's code, an agent's tool call) in a separate,
limited process, and say how it ended.

    run_sandboxed(source) -> SandboxResult(status, exit_code, stdout, stderr, ...)

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
"""

from __future__ import annotations

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
