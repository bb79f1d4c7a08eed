"""code/tests-v2's replay (posttrain/verifiers/code_replay.py): a test the parent cannot split
runs in a sandbox run that never holds the solution, on the solution's answers; what it
cannot replay it withholds. Each forgery below has a control: the same completion paid
under code/tests-v1, where the test ran beside the solution."""

import math

import pytest

from posttrain.types import Example
from posttrain.verifiers.code import REASONS, SPECS, score
from posttrain.verifiers.code_probes import module_bindings
from posttrain.verifiers.code_replay import describe_verdicts, replay_plan, verdict_counts
from posttrain.verifiers.code_values import decode, literal_source
from tests.test_code_sandbox import weak_sandbox_where_no_other  # noqa: F401  (autouse)

V1, V2 = SPECS["code/tests-v1"], SPECS["code/tests-v2"]


def problem(*tests: str, **meta) -> Example:
    return Example("p", "", meta={"tests": list(tests), **meta})


def test_a_value_crosses_as_source_that_rebuilds_it_exactly():
    values = [None, True, -7, 2**20000, -(2**20000), 0.1, -0.0, math.inf, -math.inf, 1 + 2j, "é'\"\ud800", b"\x00",
              [], (), (1,), set(), {1, 2}, frozenset(), frozenset({3}), {}, {"a": [1, {2: (3,)}]}]  # fmt: skip
    for value in values:
        rebuilt = eval(compile(literal_source(value), "value", "eval"), {"__builtins__": {}, "frozenset": frozenset,
                                                                        "complex": complex})  # fmt: skip
        assert type(rebuilt) is type(value) and rebuilt == value, value
        assert literal_source(rebuilt) == literal_source(value)  # -0.0 stays -0.0
    assert math.isnan(eval(literal_source(math.nan)))  # (1e999-1e999): no name for the sandbox to rebind
    assert "2**" not in literal_source(2**20000) and literal_source(2**20000).startswith("0x")  # decimal would not compile
    assert decode(["l", [["i", "-a"], ["s", "6869"]]]) == [-10, "hi"]
    for hostile in (object(), type("L", (list,), {})(), [[[]]] * 1 + [lambda: 0]):
        with pytest.raises(TypeError):
            literal_source(hostile)


def test_which_names_a_solution_binds_is_read_off_its_text():
    code = ("import math as m, os.path\nfrom x import y as z\ndef f(): \n    global g\n    local = 1\n"
            "class C: pass\nfor i in range(3): pass\nif True:\n    w = [k for k in ()]\n")
    assert module_bindings(code) == {"m", "os", "z", "f", "g", "C", "i", "w"}  # not local, not k
    assert module_bindings("from math import *") is None and module_bindings("def (") is None


def test_loops_helpers_and_random_inputs_are_replayed_and_judged_on_answers():
    tests = ["import random\nfor _ in range(20):\n    x = random.randint(0, 1000)\n    assert sq(x) == x * x",
             "xs = [sq(i) for i in range(5)]\nassert xs == [0, 1, 4, 9, 16]",
             "assert isinstance(sq(3), int)"]
    example = problem(*tests)
    right = V2(example, "import random\ndef sq(x):\n    random.random()  # its own draws change no question\n"
                        "    return x * x\n")
    assert right["reward"] == 1.0 and right["details"]["test_verdicts"] == ["replay"] * 3, right["details"]
    wrong = V2(example, "def sq(x):\n    return x * x if x < 500 else 0\n")
    assert wrong["reward"] == 0.0 and wrong["details"]["test_outcomes"] == ["fail", "pass", "pass"]
    assert wrong["details"]["reason"] == "wrong_answer"
    forged = V2(example, "class Int(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
                         "def sq(x):\n    return Int(0)\n")
    assert forged["reward"] == 0.0 and forged["details"]["test_outcomes"] == ["not_plain"] * 3


def test_the_tests_library_cannot_be_patched_from_the_solution():
    example = problem("import random\nfor _ in range(5):\n    x = random.randint(1, 100)\n    assert inc(x) == x + 1")
    cheat = "import random\nrandom.randint = lambda a, b: 1\ndef inc(x):\n    return 2\n"
    assert V1(example, cheat)["reward"] == 1.0  # control: beside the solution, the test drew only 1s
    assert V2(example, cheat)["reward"] == 0.0


def test_questions_that_depend_on_answers_take_rounds_and_too_many_are_withheld():
    shallow = problem("x = add(1, 1)\ny = add(x, x)\nassert add(y, y) == 8")
    assert V2(shallow, "def add(a, b): return a + b")["reward"] == 1.0
    assert V2(shallow, "def add(a, b): return a * b")["reward"] == 0.0  # 1, 1, 1
    deep = problem("x = 0\nfor _ in range(10):\n    x = add(x, 1)\nassert x == 10")
    result = V2(deep, "def add(a, b): return a + b")
    assert (result["reward"], result["details"]["reason"]) == (0.0, "withheld")
    assert result["details"]["test_verdicts"] == ["withheld"] and "after 5 replays" in result["details"]["error"]


def test_an_argument_that_is_not_plain_data_is_withheld():
    example = problem("f = lambda v: v + 1\nassert apply(f, 2) == 3", "assert apply(abs, -2) == 2")
    result = V2(example, "def apply(g, x): return g(x)")
    assert result["details"]["test_outcomes"] == ["withheld", "pass"] and result["reward"] == 0.0
    assert "not plain data" in result["details"]["error"] and "withheld" in REASONS
    assert SPECS["code/tests-partial-v2"](example, "def apply(g, x): return g(x)")["reward"] == 0.5


def test_a_builtin_the_solution_rebinds_is_the_builtin_when_the_entry_point_is_named():
    loop = "for xs in ([1, 2], [3]):\n    assert total(xs) == sum(xs)"
    cheat = "def sum(xs): return 0\ndef total(xs): return 0\n"
    assert V1(problem(loop), cheat)["reward"] == 1.0  # control: the test's sum was the solution's
    assert V2(problem(loop, entry_point="total"), cheat)["reward"] == 0.0  # the real sum: 3 != 0
    without = V2(problem(loop), cheat)["details"]  # which sum the test means cannot be told: withheld
    assert without["test_outcomes"] == ["withheld"] and "sum, a builtin's name" in without["error"]
    # the parent's path too: a probe rooted at the solution's `abs` would pick the verdict
    parent = problem("assert abs(area(2) - 12.566) < 1e-3")
    assert V1(parent, "def abs(x): return 0\ndef area(r): return 1")["reward"] == 1.0  # control
    assert V2(parent, "def abs(x): return 0\ndef area(r): return 1")["reward"] == 0.0
    named = problem("assert abs(area(2) - 12.566) < 1e-3", entry_point="area")
    for area, paid in (("return 1", 0.0), ("return 3.14159265 * r * r", 1.0)):
        result = V2(named, f"def abs(x): return 0\ndef area(r): {area}")
        assert result["reward"] == paid and result["details"]["verdict"] == "parent"
    # beside a probe rather than inside it: the solution's sorted would compute the expected value
    beside, cheat = "assert f([3, 1, 2]) == sorted([3, 1, 2])", "def sorted(xs): return 0\ndef f(xs): return 0\n"
    assert V1(problem(beside), cheat)["reward"] == 1.0  # control
    assert V2(problem(beside), cheat)["details"]["test_outcomes"] == ["withheld"]
    assert V2(problem(beside, entry_point="f"), cheat)["details"]["reason"] == "wrong_answer"
    # a test of the solution's own `sorted` still asks the solution's, however it was defined
    own = problem("assert sorted([3, 1, 2]) == [1, 2, 3]")
    assert V2(own, "exec('def sorted(xs): return xs')")["reward"] == 0.0
    # the price of not guessing: a local `sum` reads as one the solution binds, so a test that
    # wraps its function in sum() is withheld unless the entry point is named
    local = "def f(x):\n    sum = 0\n    for i in range(x):\n        sum += i\n    return [sum, 2]\n"
    assert V2(problem("assert sum(f(2)) == 3"), local)["details"]["reason"] == "withheld"
    assert V2(problem("assert sum(f(2)) == 3", entry_point="f"), local)["reward"] == 1.0


def test_helpers_in_test_setup_are_the_datasets_not_the_solutions():
    setup = "def encode(s):\n    return s[1:] + s[:1]\n"
    example = problem("for s in ('abc', 'hello'):\n    assert decode(encode(s)) == s", test_setup=setup)
    right = "def encode(s):\n    return s[1:] + s[:1]\ndef decode(s):\n    return s[-1:] + s[:-1]\n"
    swapped = "def encode(s):\n    return s\ndef decode(s):\n    return s\n"
    assert V2(example, right)["reward"] == 1.0
    assert V2(example, swapped)["reward"] == 0.0
    # control: v1 ran the test in the solution's namespace, where `encode` was the solution's
    assert V1(problem(example.meta["tests"][0]), swapped)["reward"] == 1.0
    assert replay_plan(example.meta["tests"], (0,), swapped, setup, None).stubs == ("decode",)


def test_exceptions_come_back_as_the_builtin_kind():
    example = problem("for b in (0, 0.0):\n    try:\n        div(1, b)\n        assert False\n"
                      "    except ZeroDivisionError:\n        pass")
    assert V2(example, "def div(a, b): return a / b")["reward"] == 1.0
    assert V2(example, "def div(a, b): return 0")["details"]["reason"] == "wrong_answer"
    assert V2(example, "def div(a, b): raise SystemExit(0)")["details"]["reason"] == "test_error"


def test_bad_replay_inputs_are_a_dataset_bug():
    for meta, said in (({"entry_point": "not a name"}, "meta['entry_point']"),
                       ({"test_setup": "def ("}, "meta['test_setup'] does not compile"), ({"test_setup": 3}, "a str")):
        example = problem("assert f(1) == 1", **meta)
        result = V2(example, "def f(x): return x")
        assert (result["reward"], result["details"]["reason"]) == (0.0, "bad_tests") and said in result["details"]["error"]
        assert said in V2.check_example(example)
        assert V1(example, "def f(x): return x")["reward"] == 1.0  # v1 reads neither key


def test_the_verdicts_are_counted_for_a_console():
    details = [score(problem("assert f(1) == 1", "for i in range(2):\n    assert f(i) == i"), "def f(x): return x")
               ["details"], score(problem("assert f(1) == 1"), "def f(x): return x", "code/tests-v1")["details"],
               {"reason": "ok"}]  # fmt: skip
    counts = verdict_counts(details)
    assert counts == {"sandbox": 0, "withheld": 0, "replay": 1, "parent": 2}
    assert describe_verdicts(counts) == ("test verdicts: 2 judged by the trainer, 1 replayed without the solution, "
                                         "0 computed inside the solution's sandbox (forgeable), 0 withheld "
                                         "(earned nothing)")
    assert verdict_counts([{"reason": "ok"}]) == {}  # no code verifier: nothing to say
