"""The code verifier's verdict, computed in the trusted parent (posttrain/verifiers/code.py
runs it; read that module's docstring for the threat model).

Each test is parsed with `ast`. An assert is split into PROBES, the parts only the solution
can compute (`add(2, 3)`, `candidate([1, 2])`), and a JUDGE, everything else: comparisons,
`and`/`or`/`not`, literals, `+ - * / // %`, indexing, and a few pure builtins (`abs`,
`round`, `len`, `sorted`, ...). The sandbox evaluates only the probes and prints each value
as plain data; the parent decodes it into fresh objects of exact types and evaluates the
judge on them itself.

    assert add(2, 3) == 5                  probe add(2, 3)        judge _p0 == 5
    assert abs(area(2) - 12.566) < 1e-3    probe area(2)          judge abs(_p0 - 12.566) < 1e-3
    assert not is_prime(8)                 probe is_prime(8)      judge not _p0
    def check(candidate): assert candidate(1) == 2 ... check(f)     (HumanEval) as assert f(1) == 2

A test is judged by the parent only when every statement is such an assert (imports, a
docstring, a literal METADATA and HumanEval's `def check(candidate)` + `check(name)` are
allowed around them) and every probe is the solution's own value: a call of a name the
solution defines, not of a builtin or a library the test imported. Anything else (loops,
helper variables, `all(f(i) == i for i in ...)`, `isinstance(f(x), int)`) would put part of
the verdict back in the sandbox: code/tests-v2 replays such a test without the solution
(code_replay.py), code/tests-v1 ran it whole beside the solution (code.py).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import operator
import re
from typing import Any, Callable, TypeGuard

# The judge's builtins: pure, and cheap on values that fit in the sandbox's output limit.
JUDGE_CALLS = {f.__name__: f for f in (abs, all, any, bool, float, frozenset, int, len, list,
                                       max, min, repr, round, set, sorted, str, sum, tuple)}  # fmt: skip
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not}  # fmt: skip
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.Not: operator.not_, ast.USub: operator.neg,
                                                          ast.UAdd: operator.pos}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}  # fmt: skip
_NUMBERS = (bool, int, float, complex)
MAX_JUDGE_ITEMS = 10**6  # `[0] * _p0` may not build more than this: the judge runs in the trainer
# Where the verdict lives: in a sandbox-free test, in the judge; "everything counts"
_VERDICT_LOGIC = (ast.Compare, ast.BoolOp, ast.Lambda, ast.IfExp, ast.NamedExpr, ast.ListComp,
                  ast.SetComp, ast.DictComp, ast.GeneratorExp)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Check:
    """One assert of test `test`: the judge (an expression over `_p<k>` and `_l<k>` names),
    its literals, and the global indices of its probes (`_p<k>` is probes[k])."""

    test: int
    judge: ast.expr
    literals: dict
    probes: tuple[int, ...]
    source: str  # the assert, for messages
    probe_sources: tuple[str, ...]  # what each probe computes, for messages


@dataclasses.dataclass(frozen=True)
class Plan:
    checks: tuple[Check, ...]  # every assert of the tests the parent judges
    probes: tuple[str, ...]  # expression sources, in the order the sandbox evaluates them
    setup: tuple[str, ...]  # the tests' imports, run after the solution, before the probes
    sandbox_tests: tuple[int, ...]  # tests that run whole in the sandbox (weaker)


def _defined_by(code: str, name: str) -> bool:
    """Whether the solution may bind `name` (def, class, assignment, import as): then a
    test's `sorted(...)` means the solution's, and the judge must not use the builtin."""
    pattern = rf"\b(def|class|import|as)\s+{name}\b|(?<![\w.]){name}\s*(=(?!=)|:=)"
    return re.search(pattern, code) is not None


@functools.lru_cache(maxsize=1024)  # a problem's header, scored K times per step
def module_bindings(code: str) -> frozenset[str] | None:
    """The names `code` binds in its own module as written: def, class, import, a target at
    top level (not inside a function, class or comprehension), a `global` name; or None
    when that cannot be read off the text (it does not parse, or it has `import *`). A name
    bound otherwise (`globals()[...] = `, `builtins.abs = `) changes only the sandbox's
    namespace, which neither the judge nor the replay reads."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    names: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Global):
            names.update(node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar, ast.ExceptHandler)) and node.name:
            names.add(node.name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)  # its body is its own scope, but `global` there binds ours
            stack += [n for n in ast.walk(node) if isinstance(n, ast.Global)]
        elif not isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            stack += ast.iter_child_nodes(node)
    return frozenset(names)


def plan_for(tests: list[str], code: str, entry_point: str | None = None, strict: bool = False) -> Plan:
    """Split `tests` (each compiles: checked by the caller) into parent-judged checks and
    tests for the sandbox. `code` matters only through which builtin names it rebinds.

    strict (code/tests-v2): a builtin's name in a test is the solution's only when it is
    `entry_point`, or, with no entry point, when the solution may bind it (solution_binds);
    and a test does not split when such a name meets another name of the solution's, inside
    a probe (`abs(area(2) - 12.5)`) or beside it (`f(x) == sorted(x)`): the solution's own
    `abs` or `sorted` would pick the verdict. Not strict (code/tests-v1): any binding the
    `_defined_by` pattern finds, and no such rule."""
    used = {name for name in JUDGE_CALLS if any(name in test for test in tests)}
    if not strict:
        return _plan(tuple(tests), frozenset(n for n in used if _defined_by(code, n)), False)
    shadowed = used & {entry_point} if entry_point is not None else solution_binds(code, used)
    return _plan(tuple(tests), frozenset(shadowed), True)


def solution_binds(code: str, names: set[str] | frozenset[str]) -> set[str]:
    """Those of `names` the solution may bind in its module: as written (module_bindings)
    or wherever `_defined_by`'s pattern finds them (a `def sorted` in a string it execs, a
    local `sum = 0` too: more names than it binds is the safe side, code/tests-v2 then
    withholds a test that mixes them with its other names rather than guess)."""
    bound = module_bindings(code) or frozenset()
    return {n for n in names if n in bound or _defined_by(code, n)}


@functools.lru_cache(maxsize=4096)  # the same problem is scored K times per step
def _plan(tests: tuple[str, ...], shadowed: frozenset[str], strict: bool) -> Plan:
    checks: list[Check] = []
    probes: list[str] = []
    setup: list[str] = []
    sandbox_tests: list[int] = []
    for index, test in enumerate(tests):
        found = _split_test(test, index, len(probes), shadowed, strict)
        if found is None:
            sandbox_tests.append(index)
            continue
        test_checks, test_probes, imports = found
        checks += test_checks
        probes += test_probes
        setup += [s for s in imports if s not in setup]
    return Plan(tuple(checks), tuple(probes), tuple(setup), tuple(sandbox_tests))


def _split_test(test: str, index: int, first_probe: int, shadowed: frozenset[str], strict: bool):
    """(checks, probe sources, import sources) for a test the parent can judge, else None."""
    tree = ast.parse(test)
    asserts: list[ast.Assert] = []
    imports: list[ast.Import | ast.ImportFrom] = []
    checkers: dict[str, ast.FunctionDef] = {}
    literal_names: set[str] = set()
    for statement in tree.body:
        if isinstance(statement, ast.Assert):
            asserts.append(statement)
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            imports.append(statement)
        elif isinstance(statement, ast.Pass) or _is_docstring(statement):
            continue
        elif (isinstance(statement, ast.Assign) and len(statement.targets) == 1
              and isinstance(statement.targets[0], ast.Name) and _literal(statement.value)[0]):
            literal_names.add(statement.targets[0].id)  # METADATA = {...}: unused by asserts
        elif _is_checker(statement):
            checkers[statement.name] = statement
        elif (call := _checker_call(statement, checkers)) is not None:
            checker_name, argument = call
            checker = checkers.pop(checker_name)  # each checker runs once
            rename = _Rename(checker.args.args[0].arg, argument)
            asserts += [rename.visit(s) for s in checker.body if isinstance(s, ast.Assert)]
        else:
            return None
    if not asserts or checkers:  # nothing to judge, or a checker defined but never called
        return None
    library = (set(dir(builtins)) - shadowed) | {a.asname or a.name.split(".")[0]
                                                 for s in imports for a in s.names}  # fmt: skip
    checks: list[Check] = []
    probes: list[str] = []
    roots: set[str] = set()
    for statement in asserts:
        split = _Splitter(library, shadowed, first_probe + len(probes), strict)
        judge = split.visit(statement.test)
        names = {n.id for n in ast.walk(statement.test) if isinstance(n, ast.Name)}
        if not split.sound or names & literal_names:
            return None
        checks.append(Check(index, judge, split.literals, tuple(split.indices), ast.unparse(statement),
                            tuple(split.probes)))
        probes += split.probes
        roots |= split.roots
    if strict and roots & shadowed and roots - shadowed:
        return None  # `f(x) == sorted(x)` with the solution's own sorted: it would pick the expected value
    return checks, probes, [ast.unparse(s) for s in imports]


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
        and isinstance(statement.value.value, str)


def _is_checker(statement: ast.stmt) -> TypeGuard[ast.FunctionDef]:
    """`def check(candidate):` whose body is asserts only (a docstring and pass allowed)."""
    return (isinstance(statement, ast.FunctionDef) and not statement.decorator_list
            and len(statement.args.args) == 1 and not statement.args.defaults
            and not (statement.args.vararg or statement.args.kwarg or statement.args.kwonlyargs
                     or statement.args.posonlyargs)
            and all(isinstance(s, (ast.Assert, ast.Pass)) or _is_docstring(s) for s in statement.body))  # fmt: skip


def _checker_call(statement: ast.stmt, checkers: dict[str, ast.FunctionDef]) -> tuple[str, str] | None:
    """(checker, argument) of `check(some_name)` for a checker defined above, else None."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in checkers
            and len(call.args) == 1 and isinstance(call.args[0], ast.Name) and not call.keywords):  # fmt: skip
        return call.func.id, call.args[0].id
    return None


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(self.new if node.id == self.old else node.id, node.ctx), node)


def _literal(node) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


class _Splitter:
    """Rewrites an assert's test into the judge, collecting probes on the way."""

    def __init__(self, library: set[str], shadowed: frozenset[str], first_probe: int, strict: bool):
        self.library, self.shadowed, self.strict = library, shadowed, strict
        self.probes: list[str] = []  # the probes' sources, `_p<k>` in the judge
        self.indices: list[int] = []  # their indices among all the plan's probes
        self.literals: dict[str, Any] = {}  # `_l<k>` -> the literal's value
        self.first_probe, self.sound = first_probe, True
        self.roots: set[str] = set()  # the names the probes are values of

    def name(self, prefix: str, k: int):
        return ast.Name(f"{prefix}{k}", ast.Load())

    def visit(self, node):
        is_literal, value = _literal(node)
        if is_literal:
            self.literals[f"_l{len(self.literals)}"] = value
            return self.name("_l", len(self.literals) - 1)
        if isinstance(node, ast.Compare) and all(
                not isinstance(op, (ast.Is, ast.IsNot)) or _singleton(a) or _singleton(b)
                for op, a, b in zip(node.ops, [node.left, *node.comparators], node.comparators)):  # fmt: skip
            return ast.Compare(self.visit(node.left), node.ops, [self.visit(c) for c in node.comparators])
        if isinstance(node, ast.BoolOp):
            return ast.BoolOp(node.op, [self.visit(v) for v in node.values])
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return ast.UnaryOp(node.op, self.visit(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return ast.BinOp(self.visit(node.left), node.op, self.visit(node.right))
        if isinstance(node, (ast.List, ast.Tuple)) and not any(isinstance(e, ast.Starred) for e in node.elts):
            return type(node)([self.visit(e) for e in node.elts], ast.Load())
        if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
            return ast.Subscript(self.visit(node.value), self.visit(node.slice), ast.Load())
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in JUDGE_CALLS
                and node.func.id not in self.shadowed and not node.keywords
                and not any(isinstance(a, ast.Starred) for a in node.args)):  # fmt: skip
            return ast.Call(node.func, [self.visit(a) for a in node.args], [])
        return self.probe(node)

    def probe(self, node):
        """`node` becomes a probe; it is sound when it is the solution's own value, with no
        comparison or library call of the test's inside it but in the inputs it passes."""
        self.sound = self.sound and self._solution_value(node)
        self.probes.append(ast.unparse(node))
        self.indices.append(self.first_probe + len(self.probes) - 1)
        return self.name("_p", len(self.probes) - 1)

    def _solution_value(self, node) -> bool:
        base = node
        while isinstance(base, (ast.Call, ast.Attribute, ast.Subscript)):
            base = base.func if isinstance(base, ast.Call) else base.value
        if not isinstance(base, ast.Name) or base.id in self.library:
            return False  # a literal's method, a builtin, a module the test imported
        self.roots.add(base.id)
        if self.strict and base.id in self.shadowed:  # the solution's `abs`: its inputs hold no other name of its
            bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
            bound |= {a.arg for n in ast.walk(node) if isinstance(n, ast.Lambda) for a in ast.walk(n.args)
                      if isinstance(a, ast.arg)}
            if any(isinstance(n, ast.Name) and n is not base and n.id not in self.library | bound
                   for n in ast.walk(node)):
                return False
        # the path from the probe down to the solution's name must hold no verdict logic;
        # arguments of calls are inputs and may hold anything
        inputs = {id(n) for c in ast.walk(node) if isinstance(c, ast.Call)
                  for a in [*c.args, *(k.value for k in c.keywords)] for n in ast.walk(a)}  # fmt: skip
        return not any(isinstance(n, _VERDICT_LOGIC) and id(n) not in inputs for n in ast.walk(node))


def _singleton(node) -> bool:
    """None, True, False or ...: the only right-hand sides `is` means the same for in the
    judge, whose values are fresh copies."""
    return isinstance(node, ast.Constant) and any(node.value is v for v in (None, True, False, ...))


# ------------------------------------------------------------------ the judge ----------


def judge(check: Check, values: dict[int, object]):
    """Evaluate `check` on the decoded probe values: (passed, error or None)."""
    env = dict(check.literals)
    env.update({f"_p{k}": values[index] for k, index in enumerate(check.probes)})
    try:
        passed = bool(_evaluate(check.judge, env))
    except Exception as error:  # noqa: BLE001  (TypeError, ZeroDivisionError, ...: the test raised; never us)
        return None, f"{type(error).__name__}: {error}"[:300]
    got = ", ".join(f"{source} = {repr(values[i])[:80]}" for source, i in zip(check.probe_sources, check.probes))
    return passed, None if passed else f"failed: {check.source} ({got})"[:300]


def _evaluate(node, env: dict[str, Any]):
    kind = type(node)
    if kind is ast.Name:
        return env[node.id]
    if kind is ast.Compare:
        left = _evaluate(node.left, env)
        for op, comparator in zip(node.ops, node.comparators):
            right = _evaluate(comparator, env)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if kind is ast.BoolOp:
        want = type(node.op) is ast.Or  # `or` stops at the first true value, `and` at a false one
        for value_node in node.values:
            value = _evaluate(value_node, env)
            if bool(value) == want:
                return value
        return value
    if kind is ast.UnaryOp:
        return _UNARY[type(node.op)](_evaluate(node.operand, env))
    if kind is ast.BinOp:
        left, right = _evaluate(node.left, env), _evaluate(node.right, env)
        _check_size(type(node.op), left, right)
        return _BINARY[type(node.op)](left, right)
    if kind in (ast.List, ast.Tuple):
        return (list if kind is ast.List else tuple)(_evaluate(e, env) for e in node.elts)
    if kind is ast.Subscript:
        return _evaluate(node.value, env)[_evaluate(node.slice, env)]
    if kind is ast.Call:
        args = [_evaluate(a, env) for a in node.args]
        if node.func.id == "round" and len(args) == 2 and not (type(args[1]) is int and abs(args[1]) <= 1000):
            raise ValueError("round(x, n) with n beyond 1000: refused in the judge")
        if node.func.id == "sum" and not all(type(v) in _NUMBERS for a in args[:1] for v in a):
            raise TypeError("sum() in the judge adds numbers only (adding lists is quadratic)")
        return JUDGE_CALLS[node.func.id](*args)
    raise TypeError(f"the judge cannot evaluate {kind.__name__}")


def _check_size(op, left, right) -> None:
    """Refuse operations whose cost a reported value could blow up in the trainer."""
    if op is ast.Mult:
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and type(n) in (int, bool) \
                    and len(seq) * max(n, 0) > MAX_JUDGE_ITEMS:
                raise ValueError(f"a sequence of {len(seq)} items times {n}: refused in the judge")
    elif op is not ast.Add and op is not ast.Sub and not (type(left) in _NUMBERS and type(right) in _NUMBERS):
        raise TypeError("/, // and % are judged on numbers only")  # % on a str formats it
