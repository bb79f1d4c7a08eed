"""No orphans (posttrain/guards/processes.py): a helper process dies with the process that started
it, even when that process is killed with SIGKILL and runs no cleanup at all. Checked on
the kernel's parent-death signal and on the watchdog fallback, on the race where the
parent is already gone, on the thread that starts a child (the kernel's "parent" is a
thread), and end to end on the math-verify worker in the middle of a comparison that never
ends, on the marimo server of `posttrain lessons`, and on Ray's local cluster. Processes are
found by the PIDs the killed process printed and read from /proc (Linux)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from posttrain.guards import processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; prctl is Linux")
ROOT = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 3.0  # prctl acts at once; the watchdog within WATCH_SECONDS; then reaping


def state(pid: int) -> str | None:
    """The process's state letter from /proc ("R", "S", "Z", ...), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rpartition(")")[2].split()[0]


def alive(pid: int) -> bool:
    return state(pid) not in (None, "Z", "X")  # a zombie has ended: only its exit status is left


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def descendants(pid: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def seconds_until_gone(pids: set[int], limit: float) -> float | None:
    """Seconds until none of `pids` is alive, or None if some still are after `limit`."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if not any(alive(pid) for pid in pids):
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def start_printing(code: str, lines: int, timeout: float = 60.0, **popen_kwargs) -> tuple[subprocess.Popen, list[str]]:
    """A Python process running `code`, and the first `lines` lines it prints."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT, **popen_kwargs)
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < lines and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line.strip())
    if len(out) < lines:
        proc.kill()
        pytest.fail(f"the process printed {out} and then {proc.wait()}")
    return proc, out


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --- the helper itself -------------------------------------------------------------------

CHILD = """
import os, sys, time
from posttrain.guards import processes
parent = int(sys.argv[1])
mechanism = processes.die_with_parent(parent, use_prctl=sys.argv[2] == "prctl")
print(mechanism, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("use_prctl", [True, False], ids=["prctl", "watchdog"])
def test_a_child_dies_within_seconds_of_its_parents_sigkill(use_prctl):
    # the middle process starts the child and prints both pids; the test kills the middle one
    middle = f"""
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}, str(os.getpid()), {"prctl" if use_prctl else "watchdog"!r}],
                         stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
child.wait()
"""
    parent, (line,) = start_printing(middle, 1)
    child_pid, mechanism = int(line.split()[0]), line.split()[1]
    assert mechanism == ("prctl" if use_prctl else "watchdog")
    assert alive(child_pid) and "die_with_parent" in cmdline(child_pid)
    parent.kill()
    parent.wait()
    took = seconds_until_gone({child_pid}, GONE_WITHIN_S)
    kill_all([child_pid])
    assert took is not None, f"the child outlived its parent by {GONE_WITHIN_S} s ({mechanism})"


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    # the race: the parent died before prctl; the child then has another parent than it was told
    code = "from posttrain.guards import processes; processes.die_with_parent(1); print('still here')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert (result.returncode, result.stdout) == (processes.EXIT_ORPHANED, "")
    wrapped = processes.command_dying_with_parent(["echo", "still here"])
    wrapped[wrapped.index("--") - 1] = "1"  # as if started by a parent that is now init
    result = subprocess.run(wrapped, capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stdout) == (processes.EXIT_ORPHANED, "")


@pytest.mark.parametrize("use_prctl", [True, False], ids=["prctl", "watchdog"])
def test_the_wrapper_runs_the_program_and_keeps_its_exit_code(use_prctl):
    program = [sys.executable, "-c", "import os, sys; print(os.getpid()); sys.exit(7)"]
    proc = subprocess.Popen(processes.command_dying_with_parent(program, use_prctl), stdout=subprocess.PIPE, text=True)
    printed = int(proc.stdout.readline())
    assert proc.wait(timeout=60) == 7
    # with prctl the wrapper becomes the program (exec: one process); without, it stays its parent
    assert (printed == proc.pid) is use_prctl


def test_a_child_started_from_a_short_lived_thread_outlives_the_thread():
    # The kernel sends the parent-death signal when the THREAD that forked the child ends.
    # spawn() forks from a thread that lives as long as the process; plain Popen does not.
    program = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"]
    argv = processes.command_dying_with_parent(program)
    started = {}

    def start_and_return(name, start):  # returns once the signal is set: the program runs
        started[name] = start(argv, stdout=subprocess.PIPE, text=True)
        assert started[name].stdout.readline() == "ready\n"

    for name, start in (("spawn", processes.spawn), ("popen", subprocess.Popen)):
        thread = threading.Thread(target=start_and_return, args=(name, start))
        thread.start()
        thread.join()
    time.sleep(0.5)
    try:
        assert started["spawn"].poll() is None  # still running after its thread returned
        assert started["popen"].wait(timeout=5) == -signal.SIGKILL  # killed when its thread ended
    finally:
        for proc in started.values():
            proc.kill()
            proc.wait()


# --- end to end: the math worker, the lessons server, Ray ---------------------------------

MATH_TRAINER = """
from posttrain.types import Example
from posttrain.verifiers import math_worker
from posttrain.verifiers.math_answer import MathAnswerSpec
spec = MathAnswerSpec(timeout_seconds=600)
assert spec(Example("p", "1"), "\\\\boxed{1}")["details"]["worker"] == "process"
print(math_worker._WORKER.proc.pid, flush=True)
spec(Example("p", "1"), "\\\\boxed{9^{9^{9^{9}}}}")  # a power tower: sympy never finishes
"""


def test_the_math_worker_dies_with_a_trainer_killed_mid_comparison():
    trainer, (line,) = start_printing(MATH_TRAINER, 1, timeout=120)
    worker = int(line)
    assert "math_worker.py" in cmdline(worker)
    start = cpu_ticks(worker)
    time.sleep(1.0)
    assert cpu_ticks(worker) - start > 5  # busy on the tower (100 ticks = a whole core for 1 s)
    trainer.kill()  # SIGKILL: no atexit, no finally; before the fix the worker ran on at 100%
    trainer.wait()
    took = seconds_until_gone({worker}, GONE_WITHIN_S)
    kill_all([worker])
    assert took is not None, "the math worker kept computing after its trainer was killed"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_lessons_server_dies_with_posttrain_lessons():
    pytest.importorskip("marimo")
    port = free_port()
    cli = subprocess.Popen([sys.executable, "-m", "posttrain", "lessons", "02", "--headless", "--port", str(port)],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers: set[int] = set()
    try:
        deadline = time.monotonic() + 60  # ~1.5 s here when idle
        while not serving(port) and time.monotonic() < deadline and cli.poll() is None:
            time.sleep(0.1)
        assert serving(port), f"marimo never served on port {port} (posttrain exited {cli.poll()})"
        servers = {pid for pid in descendants(cli.pid) if "marimo" in cmdline(pid)}
        assert len(servers) == 1
    finally:
        cli.kill()  # SIGKILL: before the fix marimo went on serving, for good
        cli.wait()
    took = seconds_until_gone(servers, GONE_WITHIN_S)
    # the server's main thread can end (its /proc state "Z") while its other threads still
    # hold the socket for a moment: the port going quiet is the check that counts
    deadline = time.monotonic() + GONE_WITHIN_S
    while serving(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    still_serving = serving(port)
    kill_all(servers)  # clean up whatever is left, after the verdict
    assert took is not None and not still_serving, "the marimo server outlived posttrain lessons"


RAY_DRIVER = """
import os, time, types
import ray
from posttrain.distributed.rollout_workers import connect
assert connect(types.SimpleNamespace(workers=1, ray_address="", num_cpus=1))  # we started it

@ray.remote
class Spinner:
    def pid(self):
        return os.getpid()
    def spin(self):
        while True:
            pass

spinner = Spinner.remote()
print(ray.get(spinner.pid.remote()), flush=True)
spinner.spin.remote()
time.sleep(600)
"""
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


# slow: a local Ray cluster's start-up; the other orphan checks are in make test
@pytest.mark.slow
def test_a_local_ray_cluster_after_its_driver_is_killed(ray_tmpdir):
    # What connect()'s docstring states, measured: everything but Ray's two idle agents is
    # gone within seconds; the agents wait out a fixed 60 s before they exit (not checked
    # here: a minute of test time), and burn no CPU meanwhile.
    pytest.importorskip("ray")
    env = dict(os.environ, RAY_TMPDIR=ray_tmpdir)
    driver, (line,) = start_printing(RAY_DRIVER, 1, timeout=180, env=env, stderr=subprocess.DEVNULL)
    actor = int(line)
    time.sleep(1.0)
    cluster = descendants(driver.pid)
    assert actor in cluster and len(cluster) >= 4  # GCS, raylet, agents, the actor, ...
    driver.kill()
    driver.wait()
    try:
        time.sleep(8.0)  # measured: 5 of 8 gone in 0.5 s, the spinning actor in ~4 s
        left = {pid for pid in cluster if alive(pid)}
        assert actor not in left
        assert all(cmdline(pid).startswith(RAY_AGENTS) for pid in left), [cmdline(pid) for pid in left]
        ticks = {pid: cpu_ticks(pid) for pid in left}
        time.sleep(1.0)
        assert all(cpu_ticks(pid) - ticks[pid] < 20 for pid in left if alive(pid))  # idle: < 20% of a core
    finally:
        kill_all(pid for pid in cluster if alive(pid))  # ours to clean up: do not wait out the minute
