"""The code sandbox and its scorer: each attack ends within its limit, with a reason, and
leaves the host as it was. Every test that claims a block also shows the attack works
without it (a control), so the test can fail.

Tests marked `kernel` switch the Python prelude off (python_guards=False) to check the
kernel-level layer alone; they need the namespace sandbox and skip without it."""

import os
import secrets
import socket
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.guards import sandbox
from posttrain.guards.sandbox import (
    SANDBOX_UIDS,
    STATUSES,
    WORK_PREFIX,
    namespaces_available,
    run_sandboxed,
)
from posttrain.guards.sandbox_child import WORK
from posttrain.types import Example
from posttrain.verifiers.code import REASONS, SPECS, CodeTests, extract_code, score

HAVE_NAMESPACES = namespaces_available()
needs_namespaces = pytest.mark.skipif(not HAVE_NAMESPACES, reason="needs root + unshare")
# Both layers where the kernel one exists; the prelude alone otherwise.
GUARD_MODES = [True, pytest.param(False, marks=needs_namespaces, id="kernel")]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def weak_sandbox_where_no_other(monkeypatch):
    """Without namespaces (not root) the tests below exercise the prelude-only mode, as the
    user who passes --env.allow_weak_sandbox would; the refusal has its own test."""
    monkeypatch.setattr(sandbox, "_weak_permitted", not HAVE_NAMESPACES)

ADD = Example(
    prompt="Write add(a, b).",
    expected_answer="",
    id="add",
    meta={"tests": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(0, 0) == 0"]},
)
GOOD = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\n"


def sandbox_processes(grace: float = 2.0) -> list[int]:
    """PIDs on the host owned by a sandbox uid and still running, after waiting up to
    `grace` seconds for them to go (a killed namespace's last processes take a moment)."""
    deadline = time.monotonic() + grace
    while True:
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.stat(f"/proc/{entry}").st_uid in SANDBOX_UIDS:
                    found.append(int(entry))
            except FileNotFoundError:
                pass  # exited while we looked
        found = sorted(running(set(found)))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def running(pids: set[int]) -> set[int]:
    """The processes of `pids` still running (a zombie waiting for a reaper is not)."""
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(pid)
        except OSError:
            pass
    return alive


# ----------------------------------------------------------------------- scorer -------


@pytest.mark.parametrize(
    "completion, reward, reason",
    [
        (GOOD, 1.0, "ok"),
        ("def add(a, b): return a + b", 1.0, "ok"),  # no fence: the whole text is code
        ("def add(a, b): return a - b", 0.0, "wrong_answer"),
        ("def add(a, b: return a + b", 0.0, "syntax_error"),
        ("raise ValueError('boom')\ndef add(a, b): return a + b", 0.0, "runtime_error"),
        ("def plus(a, b): return a + b", 0.0, "test_error"),  # NameError: add
        ("   \n", 0.0, "no_code"),
        ("```python\n\n```", 0.0, "no_code"),
        # the exploit a naive "exit code 0" verifier pays for:
        ("import os\nos._exit(0)", 0.0, "exited_early"),
        ("import sys\nsys.exit(0)", 0.0, "runtime_error"),
        # a forged report without the nonce counts for nothing
        ('print(\'{"event": "done"}\')\nimport os\nos._exit(0)', 0.0, "exited_early"),
        ("x = bytearray(10**10)", 0.0, "memory_limit"),
        ("print('x' * 10**7)", 0.0, "output_limit"),
        ("import os\nos.close(1)\ndef add(a, b): return a + b", 0.0, "exited_early"),
    ],
)
def test_reasons(completion, reward, reason):
    result = score(ADD, completion)
    assert (result["reward"], result["details"]["reason"]) == (reward, reason), result
    assert result["details"]["reason"] in REASONS


def test_partial_credit_counts_tests_passed_before_a_timeout():
    # passes add(2, 3) and add(-1, 1), then loops forever on add(0, 0)
    slow_on_zero = "def add(a, b):\n    while a == 0: pass\n    return a + b"
    spec = CodeTests(partial=True, cpu_seconds=1, wall_seconds=3)
    result = spec(ADD, slow_on_zero)
    d = result["details"]
    assert d["reason"] == "timeout" and d["status"] == "cpu_limit"
    assert d["test_outcomes"] == ["pass", "pass", "not_run"]
    assert result["reward"] == pytest.approx(2 / 3)
    assert d["spec_version"] == "code/tests-partial-v1"
    wrong = spec(ADD, "def add(a, b): return a * b")  # 0*0 == 0 is the only pass
    assert wrong["reward"] == pytest.approx(1 / 3) and wrong["details"]["reason"] == "wrong_answer"


def test_fence_extraction():
    assert extract_code(GOOD) == ("def add(a, b):\n    return a + b\n", "fenced")
    draft_then_final = "```python\ndraft\n```\ntext\n```py\nfinal\n```"
    assert extract_code(draft_then_final) == ("final\n", "fenced")
    assert extract_code("```python\ncut off") == ("cut off", "fenced")  # truncated output
    assert extract_code("x = 1") == ("x = 1", "whole")
    start = time.perf_counter()
    extract_code("```python\n" + "`" * 1_000_000)  # no quadratic backtracking
    assert time.perf_counter() - start < 1.0


def test_bad_tests_and_non_text_score_zero_with_a_reason_that_says_what_to_fix():
    # once ValueError / TypeError; the contract now forbids raising, so the reason says it,
    # and loaders refuse such problems before a run starts (check_example)
    for meta, said in (({}, "meta['tests'] must be"), ({"tests": []}, "meta['tests'] must be"),
                       ({"tests": ["assert ("]}, "meta['tests'][0] does not compile"),
                       ({"tests": ["assert 1", 5]}, "meta['tests'] must be")):
        for spec in SPECS.values():
            result = spec(Example("p", "", meta=meta), GOOD)
            assert (result["reward"], result["details"]["reason"]) == (0.0, "bad_tests"), meta
            assert said in result["details"]["error"]
            assert said in spec.check_example(Example("p", "", meta=meta))
            assert result["details"]["status"] is None  # nothing ran in the sandbox
    assert SPECS["code/tests-v1"].check_example(ADD) is None
    result = score(ADD, b"def add(a, b): return a + b")
    assert (result["reward"], result["details"]["reason"]) == (0.0, "not_text")
    assert "decode the tokens" in result["details"]["error"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(max_size=80),  # any unicode, lone surrogates and NUL included
        st.text(alphabet="def add(a,b):\n return+-*/`python#'\"\\ 0123", max_size=80),
    )
)
def test_total_on_any_string(completion):
    result = score(ADD, completion)
    assert result["details"]["reason"] in REASONS
    assert 0.0 <= result["reward"] <= 1.0


@pytest.mark.parametrize(
    "completion",
    ["\x00def add(a, b): return a + b", "\ud800", "print('\\ud800')", "import os; os.abort()"],
)
def test_total_on_hostile_bytes(completion):
    result = score(ADD, completion)
    assert result["reward"] == 0.0 and result["details"]["reason"] in REASONS


# ----------------------------------------------------------------------- sandbox ------


def host_work_dirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(WORK_PREFIX)}


def test_runs_code_and_leaves_no_work_dir_on_the_host():
    before = host_work_dirs()
    code = "import os\nopen('x.txt', 'w').write('hi')\nprint(os.getcwd(), os.listdir('.'))"
    result = run_sandboxed(code)
    assert result.status == "ok" and result.status in STATUSES
    if HAVE_NAMESPACES:  # a tmpfs inside the namespace: nothing on the host at any time
        assert result.stdout.strip() == f"{WORK} ['x.txt']" and not os.path.exists(WORK)
    weak = run_sandboxed(code, isolation="prelude-only", allow_weak_sandbox=True)
    workdir = weak.stdout.split()[0]
    assert weak.status == "ok" and os.path.basename(workdir).startswith(f"{WORK_PREFIX}{os.getpid()}-")
    assert not os.path.exists(workdir) and host_work_dirs() - before == set()


@pytest.mark.parametrize("guards", GUARD_MODES)
def test_cannot_write_outside_its_temp_dir(guards):
    name = f"posttrain_escape_{secrets.token_hex(8)}"
    for attack in (f"open('/usr/{name}', 'w').write('pwned')",
                   f"import os\nos.close(os.open('/etc/{name}', os.O_CREAT | os.O_WRONLY))",
                   f"import pathlib\npathlib.Path('/usr/lib/{name}').write_text('pwned')"):
        result = run_sandboxed(attack, python_guards=guards)
        assert result.status == "error", (attack, result)
        assert ("PermissionError" if guards else "Read-only file system") in result.stderr
    # the sandbox's /tmp is its own: a file written there never reaches the host's
    result = run_sandboxed(f"open('/tmp/{name}', 'w').write('x')", python_guards=guards)
    assert result.status == ("ok" if HAVE_NAMESPACES else "error")  # the prelude's guard stops it
    assert not os.path.exists(f"/tmp/{name}") and not os.path.exists(f"/usr/{name}")


@pytest.mark.parametrize("guards", GUARD_MODES)
def test_cannot_reach_the_network(guards):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        listener.settimeout(0.5)
        # control: the listener does accept a connection from the host
        with socket.create_connection(("127.0.0.1", port)):
            listener.accept()[0].close()
        attack = f"import socket\nsocket.socket().connect(('127.0.0.1', {port}))"
        result = run_sandboxed(attack, python_guards=guards)
        assert result.status == "error", result
        assert ("network is blocked" if guards else "Network is unreachable") in result.stderr
        with pytest.raises(socket.timeout):
            listener.accept()


def test_parent_environment_is_not_visible(monkeypatch):
    secret = "s3cr3t-" + secrets.token_hex(8)
    monkeypatch.setenv("POSTTRAIN_SECRET", secret)
    result = run_sandboxed(
        "import os\nprint(dict(os.environ))\nprint(open('/proc/self/environ').read())"
    )
    assert result.status == "ok", result
    assert "LANG" in result.stdout  # control: the whitelist did arrive
    assert secret not in result.stdout and "POSTTRAIN_SECRET" not in result.stdout


@pytest.mark.parametrize("guards", GUARD_MODES)
def test_fork_bomb_ends_and_leaves_no_process(guards):
    before = len([p for p in os.listdir("/proc") if p.isdigit()])
    start = time.monotonic()
    result = run_sandboxed("import os\nwhile True:\n    os.fork()", python_guards=guards,
                           wall_seconds=3)  # fmt: skip
    assert time.monotonic() - start < 5
    assert result.status in ("error", "timeout", "cpu_limit"), result
    assert sandbox_processes() == []
    after = len([p for p in os.listdir("/proc") if p.isdigit()])
    assert after <= before + 3  # slack for unrelated processes on the host


@needs_namespaces
def test_escaped_grandchild_dies_with_the_run():
    # setsid() leaves the process group, so killpg misses it; the PID namespace does not
    attack = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
    result = run_sandboxed(attack, python_guards=False)
    assert result.status == "ok"
    assert sandbox_processes() == []


def test_infinite_loop_hits_the_cpu_limit():
    result = run_sandboxed("while True:\n    pass", cpu_seconds=1, wall_seconds=4)
    assert result.status == "cpu_limit" and result.wall_seconds < 3, result


def test_sleeping_hits_the_wall_clock_limit():
    result = run_sandboxed("import time\ntime.sleep(60)", wall_seconds=1)
    assert result.status == "timeout" and result.wall_seconds < 2, result


@pytest.mark.parametrize(
    "bomb", ["x = bytearray(10**10)", "x = []\nwhile True:\n    x.append(bytearray(10**6))"]
)
def test_memory_bombs_hit_the_memory_limit(bomb):
    result = run_sandboxed(bomb, memory_mb=256)
    assert result.status == "memory_limit", result


def test_megabytes_of_output_are_cut_and_killed():
    result = run_sandboxed("while True:\n    print('x' * 10**6)", max_output_bytes=10_000)
    assert result.status == "output_limit"
    assert len(result.stdout) == 10_000 and result.wall_seconds < 2


@pytest.mark.parametrize(
    "source, status, exit_code",
    [
        ("import os\nos._exit(7)", "error", 7),
        ("import os\nos.close(1)\nos.close(2)", "ok", 0),
        ("import os\nos.abort()", "killed", None),
    ],
)
def test_odd_endings(source, status, exit_code):
    result = run_sandboxed(source)
    assert result.status == status, result
    if exit_code is not None:
        assert result.exit_code == exit_code


def test_prelude_only_mode_still_blocks_the_easy_attacks(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_SECRET", "hunter2")
    target = f"/tmp/posttrain_escape_{secrets.token_hex(8)}"
    checks = {
        f"open({target!r}, 'w')": "PermissionError",
        "import socket\nsocket.socket()": "network is blocked",
        "import subprocess\nsubprocess.run(['true'])": "starting processes is blocked",
        "import os\nos.fork()": "starting processes is blocked",
    }
    for attack, message in checks.items():
        result = run_sandboxed(attack, isolation="prelude-only", allow_weak_sandbox=True)
        assert result.isolation == "prelude-only"
        assert result.status == "error" and message in result.stderr, (attack, result)
    assert not os.path.exists(target)
    env = run_sandboxed("import os\nprint(dict(os.environ))", isolation="prelude-only", allow_weak_sandbox=True)
    assert "hunter2" not in env.stdout and "LANG" in env.stdout
