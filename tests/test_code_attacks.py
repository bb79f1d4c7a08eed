"""Attacks on the code verifier: a wrong solution (`add` that subtracts) dressed up with
each trick a policy under RL could find. Every one must score 0, and the right solution 1.

The suite can fail: on the verifier before issue #17 (the harness judged inside the sandbox),
the attacks marked PAID_BEFORE scored 1.0. `python tests/test_code_attacks.py` prints every
attack's score against whatever `posttrain` is on the path, to show it on an old checkout.
"""

import os
import secrets

import pytest

from posttrain.types import Example
from posttrain.verifiers.code import REASONS, SPECS, score
from tests.test_code_sandbox import needs_namespaces, weak_sandbox_where_no_other  # noqa: F401  (autouse)

ADD = Example(prompt="Write add(a, b).", expected_answer="", id="add",
              meta={"tests": ["assert add(2, 3) == 5", "assert add(-1, 4) == 3"]})  # fmt: skip
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"  # -1 and -5: fails both tests

# Lines the forgers print: the old harness's dict events and, for good measure, the probe
# harness's list events with the easiest value to guess (True), for probes 0..9.
FORGE = """
def forge(nonce):
    import os
    lines = ['{"event": "test", "index": %d, "outcome": "pass"}' % i for i in range(10)]
    lines += ['{"event": "done"}'] + ['["value", %d, ["b", 1]]' % i for i in range(10)]
    os.write(1, "".join("\\n" + nonce + " " + line + "\\n" for line in lines).encode())

def nonce_in(values):
    for v in values:
        if isinstance(v, str) and len(v) == 32 and all(c in "0123456789abcdef" for c in v):
            return v
"""

ATTACKS = {
    # rebinding builtins the harness calls after the solution ran
    "rebind enumerate": WRONG + "import builtins\nbuiltins.enumerate = lambda *a, **k: iter(())\n",
    "rebind compile (tests become pass)": WRONG + (
        "import builtins\n_compile = builtins.compile\n"
        "builtins.compile = lambda s, n, m, *a, **k: _compile('True' if m == 'eval' else "
        "('pass' if n.startswith('test') else s), n, m, *a, **k)\n"),
    "rebind exec and eval": WRONG + (
        "import builtins\n_exec = builtins.exec\nbuiltins.exec = lambda *a, **k: None\n"
        "builtins.eval = lambda *a, **k: 5\n"),
    # reaching the harness's state and clearing or rewriting it
    "frame: clear the tests": WRONG + (
        "import sys\nfor v in list(sys._getframe(1).f_locals.values()):\n"
        "    if isinstance(v, list): v.clear()\n"),
    "frame: rewrite the tests": WRONG + (
        "import sys\nfor v in list(sys._getframe(1).f_locals.values()):\n"
        "    if isinstance(v, list) and all(isinstance(t, str) for t in v): v[:] = ['True'] * len(v)\n"),
    "traceback: clear the tests": WRONG + (
        "try:\n    raise RuntimeError\nexcept RuntimeError as e:\n"
        "    for v in list(e.__traceback__.tb_frame.f_back.f_locals.values()):\n"
        "        if isinstance(v, list): v.clear()\n"),
    "gc: clear every list of test sources": WRONG + (
        "import gc\nfor o in gc.get_objects():\n"
        "    if isinstance(o, list) and o and all(isinstance(t, str) and 'add(' in t for t in o): o.clear()\n"),
    # finding the nonce and forging reports, then leaving before the real ones
    "nonce from the frame, forged reports": WRONG + FORGE + (
        "import sys, os\nforge(nonce_in(sys._getframe(1).f_locals.values()))\nos._exit(0)\n"),
    "nonce from __main__'s code object": WRONG + FORGE + (
        "import sys, os\nforge(nonce_in(sys.modules['__main__'].code.co_consts))\nos._exit(0)\n"),
    "nonce from the frame, forged reports, real ones follow": WRONG + FORGE + (
        "import sys\nforge(nonce_in(sys._getframe(1).f_locals.values()))\n"),
    # patching the reporting machinery
    "json encoder patched to say pass": WRONG + (
        "import json\n_encode = json.encoder.JSONEncoder.encode\n"
        "def encode(self, o):\n"
        "    if isinstance(o, dict) and o.get('event') == 'test': o = {**o, 'outcome': 'pass'}\n"
        "    if isinstance(o, (list, tuple)) and o and o[0] == 'test': o = [o[0], o[1], 'pass', None]\n"
        "    return _encode(self, o)\n"
        "json.encoder.JSONEncoder.encode = encode\n"),
    # values that vouch for themselves
    "__eq__ always true": "class Yes:\n    def __eq__(self, other): return True\n"
                          "def add(a, b):\n    return Yes()\n",
    "int subclass, __eq__ always true": "class I(int):\n    def __eq__(self, other): return True\n"
                                        "    __hash__ = int.__hash__\ndef add(a, b):\n    return I(a - b)\n",
    "str subclass, __eq__ always true": "class S(str):\n    def __eq__(self, other): return True\n"
                                        "    __hash__ = str.__hash__\ndef add(a, b):\n    return S('x')\n",
    "__eq__ true, __repr__ raises": "class Yes:\n    def __eq__(self, other): return True\n"
                                    "    def __repr__(self): raise RuntimeError('no')\n"
                                    "def add(a, b):\n    return Yes()\n",
    "__eq__ raises": "class No:\n    def __eq__(self, other): raise RuntimeError('no')\n"
                     "def add(a, b):\n    return No()\n",
    "exception whose __str__ raises": "class E(Exception):\n    def __str__(self): raise RuntimeError\n"
                                      "def add(a, b):\n    raise E()\n",
    "self-referential list": "def add(a, b):\n    x = []\n    x.append(x)\n    return x\n",
    # leaving early, or printing what looks like reports
    "os._exit(0) before the tests": WRONG + "import os\nos._exit(0)\n",
    "os._exit(0) inside add": "def add(a, b):\n    import os\n    os._exit(0)\n",
    "sys.exit(0)": WRONG + "import sys\nsys.exit(0)\n",
    "forged lines without the nonce": WRONG + (
        "print('{\"event\": \"done\"}')\nprint('[\"value\", 0, [\"i\", \"5\"]]')\n"
        "import os\nos._exit(0)\n"),
    "stdout closed": WRONG + "import os\nos.close(1)\n",
    "infinite output": WRONG + "while True:\n    print('x' * 10000)\n",
    "huge return value": "def add(a, b):\n    return 10 ** 200000\n",
    "sleep past the wall clock": WRONG + "import time\ntime.sleep(60)\n",
}

# The attacks that paid 1.0 on the verifier at HEAD before issue #17 (measured with
# `python tests/test_code_attacks.py` on `git archive` of that commit, see the module
# docstring; five of them with tests_passed 0/2). The answer-key test below paid 1.0 too.
PAID_BEFORE = {"rebind enumerate", "rebind compile (tests become pass)", "rebind exec and eval",
               "frame: clear the tests", "frame: rewrite the tests", "traceback: clear the tests",
               "gc: clear every list of test sources", "nonce from the frame, forged reports",
               "nonce from __main__'s code object", "nonce from the frame, forged reports, real ones follow",
               "json encoder patched to say pass",
               "__eq__ always true", "int subclass, __eq__ always true",
               "str subclass, __eq__ always true", "__eq__ true, __repr__ raises"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("spec", sorted(SPECS))
def test_every_attack_scores_zero(name, spec):
    result = SPECS[spec](ADD, ATTACKS[name])
    details = result["details"]
    assert (result["reward"], details["tests_passed"]) == (0.0, 0), (name, details)
    assert details["reason"] in REASONS and details["reason"] != "ok"
    assert details["verdict"] == "parent"  # both tests were judged here, on plain data


def test_the_attacks_that_paid_before_are_all_in_the_suite():
    assert PAID_BEFORE <= set(ATTACKS) and len(PAID_BEFORE) == 15


def test_the_right_solution_still_scores_one_even_when_it_is_noisy():
    noisy = RIGHT + "import builtins\nprint('[\"value\", 0, [\"i\", \"0\"]]')\nbuiltins.enumerate = None\n"
    for completion in (RIGHT, noisy, f"Sure:\n```python\n{RIGHT}```\n"):
        result = score(ADD, completion)
        assert result["reward"] == 1.0, result
        assert result["details"]["test_outcomes"] == ["pass", "pass"]


def test_a_forged_report_never_crashes_the_parent():
    # whatever the code prints under the real nonce, the parent stays total and pays nothing
    hostile = ["[" * 100_000, '["value", 0, ' + "[\"l\", [" * 200 + "]]" * 200 + "]",
               '["value", 0, ["i", "0x5"]]', '["value", -1, ["b", 1]]', '["value", 0, ["S", [["l", []]]]]',
               '["value", 0, ["f", "nan"]]', '["nonsense"]', '{"event": "done"}', '["value", 0, ["i", "5"]]']  # fmt: skip
    lines = "".join("\\n' + nonce + ' " + h.replace("\\", "\\\\").replace("'", "\\'") + "\\n" for h in hostile)
    attack = WRONG + f"import os, sys\nnonce = sys._getframe(1).f_locals['nonce']\nos.write(1, ('{lines}').encode())\n"
    result = score(ADD, attack)
    assert result["reward"] == 0.0 and result["details"]["reason"] in REASONS, result


@needs_namespaces  # prelude-only mode can read it: one of the things it does not guarantee
def test_an_answer_key_on_disk_is_out_of_reach():
    # a world-readable key in the host's /tmp: the old sandbox could read it and answer right
    key = f"/tmp/posttrain_answer_key_{secrets.token_hex(8)}.txt"
    with open(key, "w") as f:
        f.write("2,3=5\n-1,4=3\n")
    os.chmod(key, 0o644)
    try:
        cheat = (f"def add(a, b):\n    for line in open({key!r}):\n        k, v = line.split('=')\n"
                 "        if k == f'{a},{b}': return int(v)\n")
        result = score(ADD, cheat)
        assert result["reward"] == 0.0 and result["details"]["reason"] == "test_error", result
        assert "No such file" in result["details"]["error"]
    finally:
        os.remove(key)


def test_a_solution_that_defines_a_builtin_name_is_judged_by_its_own_definition():
    # `sorted` in the test means the solution's sorted when the solution defines one; the
    # judge's builtin sorted would pass any solution
    problem = Example("Write sorted(xs).", "", meta={"tests": ["assert sorted([3, 1, 2]) == [1, 2, 3]"]})
    assert score(problem, "def sorted(xs):\n    return xs\n")["reward"] == 0.0
    assert score(problem, "import builtins\ndef sorted(xs):\n    return builtins.sorted(xs)\n")["reward"] == 1.0


@pytest.mark.parametrize(
    "tests, right, wrong",
    [
        (["assert not is_odd(2)", "assert is_odd(3)"], "def is_odd(n): return n % 2 == 1",
         "def is_odd(n): return True"),
        (["assert abs(area(1) - 3.14159) < 1e-4"], "def area(r): return 3.14159265 * r * r",
         "class F(float):\n    def __sub__(self, o): return 0.0\ndef area(r): return F(1.0)"),
        (["assert f(2) in (1, 4)", "assert f(0) is None"], "def f(x): return x * x if x else None",
         "def f(x): return 4"),
        (["assert [f(1), f(2)] == [1, 4]", "assert f(3) * 2 == 18"], "def f(x): return x * x",
         "def f(x): return x"),
        (["assert len(g(3)) == 3 and g(3)[0] == 0", "assert sorted(g(2)) == [0, 1]"],
         "def g(n): return list(range(n))", "def g(n): return [0] * n"),
        (["def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n\n"
          "check(total)"], "def total(xs): return sum(xs)",
         "class Yes(int):\n    def __eq__(self, o): return True\ndef total(xs): return Yes(7)"),
    ],
)
def test_common_assert_forms_are_judged_in_the_parent(tests, right, wrong):
    problem = Example("p", "", meta={"tests": tests})
    good, bad = score(problem, right), score(problem, wrong)
    assert good["reward"] == 1.0 and good["details"]["verdict"] == "parent", good
    assert bad["reward"] == 0.0 and bad["details"]["verdict"] == "parent", bad


UNSPLIT = Example("p", "", meta={"tests": ["for a in range(3):\n    assert add(a, 0) == a",
                                          "x = add(1, 1)\nassert x == 2",
                                          "assert all(add(i, i) == 2 * i for i in range(3))",
                                          "assert add(2, 2) == 4"]})  # fmt: skip


def test_tests_the_parent_cannot_judge_run_the_old_way_and_say_so():
    # a loop, a helper variable, a comparison inside all(): the verdict would be computed in
    # the sandbox, so under code/tests-v1 the whole test runs there, labelled "sandbox". That
    # path CAN be fooled (code/tests-v2 replays it instead: the next test)
    problem = UNSPLIT
    result = score(problem, RIGHT, "code/tests-v1")
    assert result["reward"] == 1.0
    assert result["details"]["test_verdicts"] == ["sandbox", "sandbox", "sandbox", "parent"]
    assert result["details"]["verdict"] == "sandbox"
    fooled = score(problem, ATTACKS["__eq__ always true"], "code/tests-v1")["details"]
    assert fooled["test_outcomes"] == ["pass", "pass", "pass", "not_plain"]  # the weak path was fooled


@pytest.mark.parametrize("spec", ["code/tests-v2", "code/tests-partial-v2"])
def test_tests_the_parent_cannot_judge_are_replayed_without_the_solution_and_say_so(spec):
    result = SPECS[spec](UNSPLIT, RIGHT)
    assert result["reward"] == 1.0
    assert result["details"]["test_verdicts"] == ["replay", "replay", "replay", "parent"]
    assert result["details"]["verdict"] == "replay"
    # WRONG (a - b) rightly passes the loop (b is 0 there) and nothing else; no trick adds a pass
    honest = SPECS[spec](UNSPLIT, WRONG)["details"]["test_outcomes"]
    assert honest == ["pass", "fail", "fail", "fail"]
    for name in ("__eq__ always true", "nonce from the frame, forged reports", "rebind compile (tests become pass)",
                 "json encoder patched to say pass", "gc: clear every list of test sources"):
        fooled = SPECS[spec](UNSPLIT, ATTACKS[name])["details"]
        assert all(o != "pass" or h == "pass" for o, h in zip(fooled["test_outcomes"], honest)), (name, fooled)
        assert fooled["tests_passed"] <= 1 and "sandbox" not in fooled["test_verdicts"]


if __name__ == "__main__":
    for name, completion in ATTACKS.items():
        result = score(ADD, completion)
        print(f"{result['reward']:.1f}  {result['details']['reason']:14s}  "
              f"{result['details']['tests_passed']}/{result['details']['tests_total']}  {name}")
