"""The sandbox's child process: its command line (the lifeline that ends it with the
trainer, the namespaces, the interpreter) and what runs in it before any untrusted byte:
the Python prelude (limits, then guards) and, in namespace mode, the setup that builds its
narrow filesystem view and drops its privileges. The parent side (modes, supervision,
classification) is posttrain/guards/sandbox.py; read that module's docstring first.

The prelude and the setup are plain strings passed on the child's command line, so what
runs in the child is exactly this text, and nothing of the parent's interpreter state
crosses over.
"""

from __future__ import annotations

import os
import shutil
import sys

# The child sees only these variables: no tokens, keys or proxies leak from the parent.
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # sbin: unshare and friends live there on some systems
# The outer `timeout` fires this long after the wall limit the parent enforces: it only
# matters when the parent is gone, so it must never race the parent's own kill.
LIFELINE_GRACE_SECONDS = 2

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

# The work directory as the sandboxed code sees it (its cwd, HOME and TMPDIR; /tmp links
# here). A path no host needs, so a test can tell the two apart.
WORK = "/sandbox"

# Runs as root inside the new namespaces (`python -I -S -c NAMESPACE_SETUP <uid> <disk_mb>
# <n> <dir 1> .. <dir n> <python> <args>`), then becomes the sandbox uid and execs the
# prelude's interpreter. It builds a new root on a tmpfs that shadows /tmp in this mount
# namespace only (the host's /tmp is untouched):
#   /usr, /etc and the n extra directories (the interpreter's prefix when it lives
#     elsewhere): read-only binds, nosuid, nodev; bin, sbin, lib*: the host's links or binds;
#   /dev: null, zero, random, urandom only; /proc: this PID namespace's own;
#   /sandbox: a fresh tmpfs of <disk_mb> MB owned by the uid (the disk quota), and /tmp a
#     link to it. Nothing else: not /home, /root, /work, /srv, /opt, the host's /tmp.
# The tmpfs lives in memory and dies with the namespace, so no file of the run can outlive
# it on the host. Any failure exits 125 (the parent's probe reports it). Python and ctypes
# rather than a shell script of mount(8) calls: one process instead of ~25 (measured: the
# shell version cost ~34 ms a run, this ~6 ms).
NAMESPACE_SETUP = r"""
import ctypes, os, sys
try:
    uid, disk_mb, n = map(int, sys.argv[1:4])
    binds, command = sys.argv[4:4 + n], sys.argv[4 + n:]
    libc = ctypes.CDLL(None, use_errno=True)
    BIND, REMOUNT, RDONLY, NOSUID, NODEV, NOEXEC = 4096, 32, 1, 2, 4, 8  # <sys/mount.h>
    PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38  # <linux/prctl.h>

    def mount(source, target, fstype=None, flags=0, data=None):
        if libc.mount(source.encode(), target.encode(), fstype and fstype.encode(), flags,
                      data and data.encode()) != 0:
            raise OSError(ctypes.get_errno(), f"mount {source} on {target}")

    def bind_readonly(path):
        os.makedirs("." + path, exist_ok=True)
        mount(path, "." + path, flags=BIND)
        mount(path, "." + path, flags=BIND | REMOUNT | RDONLY | NOSUID | NODEV)

    mount("sandbox-root", "/tmp", "tmpfs", NOSUID | NODEV, "size=1m,nr_inodes=512,mode=755")
    os.chdir("/tmp")
    for path in ["/usr", "/etc", *binds]:
        bind_readonly(path)
    for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink("/" + link):
            os.symlink(os.readlink("/" + link), link)
        elif os.path.isdir("/" + link):
            bind_readonly("/" + link)
    for directory in ("dev", "proc", "sandbox"):
        os.mkdir(directory)
    for node in ("null", "zero", "random", "urandom"):
        open("dev/" + node, "w").close()
        mount("/dev/" + node, "dev/" + node, flags=BIND)
    mount("proc", "proc", "proc", NOSUID | NODEV | NOEXEC)
    mount("sandbox-work", "sandbox", "tmpfs", NOSUID | NODEV,
          f"size={disk_mb}m,nr_inodes=4096,mode=700,uid={uid},gid={uid}")
    os.symlink("sandbox", "tmp")
    mount("/tmp", "/tmp", flags=BIND | REMOUNT | RDONLY | NOSUID | NODEV)
    os.chroot("/tmp")
    os.chdir("/sandbox")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # all uids nonzero: the kernel drops every capability
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    # again after the uid switch, which cleared unshare's --kill-child signal: without it
    # this process, PID 1 of the namespace, would outlive a killed unshare
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    os.execv(command[0], command)
except BaseException as error:
    os.write(2, f"posttrain sandbox setup failed: {error!r}\n".encode())
    os._exit(125)
"""


def lifeline(wall_seconds: float) -> list[str]:
    """The command prefix that ends the child with us (module docstring, "No orphans")."""
    setpriv = shutil.which("setpriv", path=SAFE_PATH)
    timeout = shutil.which("timeout", path=SAFE_PATH)
    dies_with_parent = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
    wall = [timeout, "-s", "KILL", f"{wall_seconds + LIFELINE_GRACE_SECONDS:g}"] if timeout else []
    return dies_with_parent + wall + (dies_with_parent if wall else [])


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


def namespace_python() -> str | None:
    """The interpreter the sandbox uid can run, as a real path (the chroot has no venv
    links): ours if it is world-executable, else the system python3 (a pyenv or conda under
    /root is not), so versions may differ."""
    for candidate in (sys.executable, shutil.which("python3", path=SAFE_PATH)):
        if candidate and _world_executable(candidate):
            return os.path.realpath(candidate)
    return None


def namespace_command(uid: int, disk_mb: int) -> list[str]:
    """unshare's fresh namespaces around NAMESPACE_SETUP, which then execs the prelude's
    interpreter (append the prelude's arguments) as `uid` with a `disk_mb` work tmpfs."""
    python = namespace_python() or "/usr/bin/python3"
    prefix = os.path.dirname(os.path.dirname(python))  # /opt/py/bin/python3 -> /opt/py
    shown = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
    binds = [] if prefix == "/" or any(prefix == d or prefix.startswith(d + "/") for d in shown) else [prefix]
    return [
        shutil.which("unshare", path=SAFE_PATH) or "unshare", "--net", "--pid", "--fork",
        "--kill-child", "--mount", "--ipc", "--uts", "--", python, "-I", "-S", "-c", NAMESPACE_SETUP,
        str(uid), str(disk_mb), str(len(binds)), *binds, python,
    ]  # fmt: skip
