"""The sandbox's modes and its lifecycle around the trainer: the weak mode is refused unless
someone opts in, the trainer is hidden from its children, killing the trainer leaves no
sandbox behind, and in namespace mode the filesystem view is narrow and the disk bounded.
Each test has a control that shows what it checks could happen, so it can fail."""

import json
import os
import secrets
import shutil
import subprocess
import sys
import time

import pytest

from posttrain.guards import sandbox
from posttrain.config import EnvConfig
from posttrain.envs import make_env
from posttrain.guards.sandbox import run_sandboxed
from posttrain.verifiers.code import score
from tests.test_code_sandbox import (
    ADD,
    GOOD,
    HAVE_NAMESPACES,
    REPO,
    host_work_dirs,
    needs_namespaces,
    running,
    weak_sandbox_where_no_other,  # noqa: F401  (an autouse fixture)
)


@needs_namespaces
def test_the_filesystem_view_holds_no_project_data_or_host_tmp():
    key = f"/tmp/posttrain_answer_key_{secrets.token_hex(8)}"
    with open(key, "w") as f:
        f.write("42")
    os.chmod(key, 0o644)  # world-readable: only the narrow view keeps it out
    hidden = [REPO, key, "/work", "/root", "/home", "/opt", "/srv", "/var", "/mnt"]
    code = (f"import os\nprint(sorted(os.listdir('/')))\nprint([p for p in {hidden!r} if os.path.exists(p)])\n"
            "print(os.path.exists('/usr/lib'), os.listdir('/dev'))")
    try:
        assert all(os.path.exists(p) for p in (REPO, key, "/work"))  # control: they are on the host
        result = run_sandboxed(code, python_guards=False)
    finally:
        os.remove(key)
    listing, visible, usr = result.stdout.splitlines()
    assert set(eval(listing)) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sandbox", "sbin",
                                  "tmp", "usr"}, listing
    assert visible == "[]" and usr.startswith("True") and sorted(eval(usr[5:])) == ["null", "random", "urandom",
                                                                                   "zero"]


def test_disk_quota_stops_a_run_that_fills_its_directory():
    fill = "for i in range(8):\n    open(f'f{i}', 'wb').write(b'x' * 10**7)\nimport time\ntime.sleep(2)"
    if HAVE_NAMESPACES:
        result = run_sandboxed(fill, max_disk_mb=32)  # 80 MB of files, 16 MB each allowed
        assert result.status == "error" and "No space left on device" in result.stderr, result
        assert run_sandboxed(fill.replace("range(8)", "range(2)"), max_disk_mb=32).status == "ok"  # control
    weak = run_sandboxed(fill, max_disk_mb=32, isolation="prelude-only", allow_weak_sandbox=True)
    assert weak.status == "disk_limit" and weak.wall_seconds < 2, weak


def test_the_weak_mode_is_refused_unless_someone_opts_in(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "_namespace_problem", lambda: "no namespace sandbox: not root (euid 1000)")
    monkeypatch.setattr(sandbox, "_weak_permitted", False)
    result = run_sandboxed("print('ran')")
    assert (result.status, result.stdout, result.isolation) == ("refused", "", "none")
    for hint in ("not root (euid 1000)", "unshare and setpriv", "--env.allow_weak_sandbox true", "allow_weak_sandbox=True"):
        assert hint in result.stderr
    assert run_sandboxed("print('ran')", allow_weak_sandbox=True).stdout == "ran\n"  # control
    scored = score(ADD, GOOD)
    assert (scored["reward"], scored["details"]["reason"]) == (0.0, "sandbox_refused")
    assert "--env.allow_weak_sandbox" in scored["details"]["error"]
    # the code environment refuses when it is built, before any work; the opt-in is the setting
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps({"prompt": "Write add.", "expected_answer": "", "meta": ADD.meta}) + "\n")
    with pytest.raises(ValueError, match="environment 'code': refusing .* not root"):
        make_env("code", path=str(problems))
    env = make_env("code", **EnvConfig(name="code", path=str(problems), allow_weak_sandbox=True).kwargs())
    example = env.by_split[next(s for s, rows in env.by_split.items() if rows)][0]
    assert env.score(example, GOOD)["details"]["isolation"] == "prelude-only"
    assert env.score(example, GOOD)["reward"] == 1.0


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become nobody")
def test_a_real_non_root_user_is_refused_and_cannot_read_the_trainers_environment():
    # nobody runs the system python on this checkout's sandbox module (stdlib only)
    secret = "s3cr3t-" + secrets.token_hex(8)
    spy = ("import os\npid = os.getppid()\nwhile pid > 1:\n    try:\n        print(open(f'/proc/{pid}/environ').read())\n"
           "    except OSError as e:\n        print(type(e).__name__)\n"
           "    pid = int([l for l in open(f'/proc/{pid}/status') if l.startswith('PPid')][0].split()[1])\n")
    script = (f"import sys\nsys.path.insert(0, {REPO!r})\nfrom posttrain.guards import sandbox\n"
              "refused = sandbox.run_sandboxed('print(1)')\nprint(refused.status, 'not root (euid 65534)' in refused.stderr)\n"
              "limits = dict(cpu_seconds=2, wall_seconds=5, memory_mb=256, max_output_bytes=64000, max_file_mb=1,\n"
              "              max_disk_mb=8, max_processes=8, python_guards=True)\n"
              f"before = sandbox._run({spy!r}, isolation='prelude-only', **limits)  # the trainer still dumpable\n"
              f"after = sandbox.run_sandboxed({spy!r}, allow_weak_sandbox=True)\n"
              f"print({secret!r} in before.stdout, {secret!r} in after.stdout, 'PermissionError' in after.stdout)\n")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script],
                         env={"PATH": "/usr/bin:/bin", "POSTTRAIN_SECRET": secret}, cwd="/", capture_output=True,
                         text=True, timeout=60, check=False)  # fmt: skip
    assert out.stdout.split() == ["refused", "True", "True", "False", "True"], out


def test_the_trainer_becomes_undumpable_when_untrusted_code_first_runs():
    code = ("import ctypes\nfrom posttrain.guards.sandbox import run_sandboxed\nlibc = ctypes.CDLL(None)\n"
            "print(libc.prctl(3, 0, 0, 0, 0))\nrun_sandboxed('pass', allow_weak_sandbox=True)\nprint(libc.prctl(3, 0, 0, 0, 0))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert out.stdout.split() == ["1", "0"], out  # PR_GET_DUMPABLE: import alone changes nothing


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""  # exited while we looked


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        except OSError:
            pass  # exited while we looked
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


@pytest.mark.parametrize("isolation", [pytest.param("namespaces", marks=needs_namespaces), "prelude-only"])
def test_killing_the_trainer_leaves_no_sandbox_process_or_work_dir(isolation):
    before = host_work_dirs()
    trainer = subprocess.Popen([sys.executable, "-c", "import sys\nfrom posttrain.guards.sandbox import run_sandboxed\n"
                                "run_sandboxed('import time\\ntime.sleep(30)', wall_seconds=20, isolation=sys.argv[1],"
                                " allow_weak_sandbox=True)", isolation], cwd=REPO)  # fmt: skip
    deadline = time.monotonic() + 20
    while not any(b"RLIMIT_CPU" in cmdline(p) for p in running(descendants(trainer.pid))):  # the prelude runs
        assert time.monotonic() < deadline and trainer.poll() is None, "the sandboxed program never started"
        time.sleep(0.05)
    time.sleep(0.3)  # into its sleep
    sandboxed = descendants(trainer.pid)
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 5
    while running(sandboxed) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(sandboxed) == set(), [cmdline(p)[:80] for p in running(sandboxed)]
    left = host_work_dirs() - before
    if isolation == "namespaces":
        assert left == set()  # its files were a tmpfs in the namespace
    else:  # the dead trainer's directory goes with the next run in any process
        assert [d.split("-")[2] for d in left] == [str(trainer.pid)]
        run_sandboxed("pass", isolation="prelude-only", allow_weak_sandbox=True)
        assert host_work_dirs() - before == set()
