"""Each algorithm's range checks, read out of its `__post_init__` so that the command line can
run them without importing the class (torch): cli/write_section_schema.py calls
`section_checks(cls)` and writes what it returns into section_schema.json; cli/section_schema.py
runs them on the stand-in class (`passes`). The checks stay written once, in the class.

    section_checks(cls)   ReadChecks: each check as data, what could not be read, the files read

What is read: every `check_field(self, "field", CONDITION, ALLOWED)` that `__post_init__`
reaches, through `super().__post_init__()`, helper functions that take the instance
(`check_loss_fields(self)`) and `if CONDITION:` blocks (a guard). A CONDITION may compare
fields with each other and with constants (`0.0 <= self.clip_eps_low < 1.0`,
`self.kl_estimator in KL_ESTIMATORS`, `self.max_len > self.overlong_cache`), combine them with
and/or/not and ask isinstance; a module constant is stored as its value. ALLOWED may be an
f-string of constants and fields. A check written any other way (a message built from a local
variable, a bare `raise`) is not carried: the field is listed as unchecked, and the class
refuses such a value as before, once torch is loaded. Nothing here runs a line of the class.

A check is stored as {"field", "test", "when", "allowed"}: `test` and `when` (the guard, or
None) are expressions as nested lists, ["field", name], ["const", value], ["compare", left,
[[op, right], ...]], ["and", ...], ["or", ...], ["not", x], ["isinstance", x, [type names]];
`allowed` is a list of text and ["field", name] parts.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import textwrap
from typing import Any, Callable

# the comparison operators a check may use, by the name the file gives them
OPERATORS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
             ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str"}


class Unreadable(Exception):
    """A condition or message this module cannot store as data."""


def as_json(value: Any) -> Any:
    """A constant a check reads (a number, a string, a tuple or set or dict of them), as JSON."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [as_json(item) for item in value]
    if isinstance(value, (set, frozenset, dict)):  # membership only: keys, in a stable order
        return sorted(as_json(item) for item in value)
    raise Unreadable(f"the constant {value!r}")


@dataclasses.dataclass
class Scope:
    """Where a condition is read: the name the instance has there (`self`, `algo`), the
    locals that stand for a field (`loss_agg = getattr(algo, "loss_agg")`), other locals
    (unreadable), and the globals of the function's module."""

    cls: type
    instance: str
    globals: dict[str, Any]
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)
    opaque: set[str] = dataclasses.field(default_factory=set)

    def field_named(self, node: ast.expr) -> str | None:
        """The field `node` reads (`self.x`, `getattr(self, "x")`, an alias), or None."""
        fields = {f.name for f in dataclasses.fields(self.cls)}
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self.instance:
            return node.attr if node.attr in fields else None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) == 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == self.instance
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in fields):
            return node.args[1].value
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        return None

    def expression(self, node: ast.expr) -> list:
        """`node` as a nested list; Unreadable where it is not a field, a constant, a comparison,
        and/or/not or isinstance."""
        if (name := self.field_named(node)) is not None:
            return ["field", name]
        if isinstance(node, ast.Constant):
            return ["const", as_json(node.value)]
        if isinstance(node, (ast.Tuple, ast.List)) and all(isinstance(item, ast.Constant) for item in node.elts):
            return ["const", [as_json(item.value) for item in node.elts]]  # type: ignore[attr-defined]
        if isinstance(node, ast.Name) and node.id not in self.opaque and node.id in self.globals:
            return ["const", as_json(self.globals[node.id])]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self.instance:
            return ["const", as_json(getattr(self.cls, node.attr))]  # a class constant (REINFORCE.BASELINES)
        if isinstance(node, ast.Compare):
            ops = [[OPERATORS[type(op)], self.expression(right)] for op, right in zip(node.ops, node.comparators)]
            return ["compare", self.expression(node.left), ops]
        if isinstance(node, ast.BoolOp):
            return ["and" if isinstance(node.op, ast.And) else "or", *map(self.expression, node.values)]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ["not", self.expression(node.operand)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            names = [k.id for k in kinds if isinstance(k, ast.Name)
                     and self.globals.get(k.id, getattr(builtins, k.id, None)) in TYPE_NAMES]
            if len(names) != len(kinds):
                raise Unreadable(ast.unparse(node))
            return ["isinstance", self.expression(node.args[0]), names]
        raise Unreadable(ast.unparse(node))

    def message(self, node: ast.expr) -> list:
        """ALLOWED as parts: text, and ["field", name] where an f-string shows a field's value.
        A part of an f-string that reads no field is a constant's, rendered here."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if not isinstance(node, ast.JoinedStr):
            raise Unreadable(ast.unparse(node))
        parts: list = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(value.value)
            elif isinstance(value, ast.FormattedValue) and (name := self.field_named(value.value)) is not None:
                if value.conversion != -1 or value.format_spec is not None:
                    raise Unreadable(ast.unparse(value))
                parts.append(["field", name])
            elif isinstance(value, ast.FormattedValue):
                used = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
                fields_read = [n for n in ast.walk(value) if self.field_named(n) is not None]
                if used & (self.opaque | set(self.aliases)) or fields_read:
                    raise Unreadable(ast.unparse(value))
                # a constant of posttrain's own source ({list(KL_ESTIMATORS)}, {list(self.BASELINES)}: a
                # class constant), rendered now as the class renders it
                text = ast.unparse(ast.JoinedStr([value]))
                parts.append(eval(text, self.globals, {self.instance: self.cls}))  # noqa: S307
        return parts


@dataclasses.dataclass
class ReadChecks:
    """What section_checks read of a class: its checks in the order __post_init__ runs them,
    what could not be read (a field's name, or a statement's first line), and the files of
    every function read (section_schema.json hashes them: an edited check makes it stale)."""

    checks: list[dict] = dataclasses.field(default_factory=list)
    unchecked: list[str] = dataclasses.field(default_factory=list)
    files: set[str] = dataclasses.field(default_factory=set)


def function_body(function: Callable, read: ReadChecks) -> tuple[list[ast.stmt], str]:
    """The statements of `function` and the name of its first parameter (the instance)."""
    read.files.add(inspect.getsourcefile(function) or "")
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    definition = tree.body[0]
    assert isinstance(definition, ast.FunctionDef)
    return definition.body, definition.args.args[0].arg


def read_checks(statements: list[ast.stmt], scope: Scope, guard: list | None, owner: type, read: ReadChecks) -> None:
    """Add the checks `statements` make to `read`, and what cannot be read to read.unchecked.
    `owner`: the class whose __post_init__ this is (for super())."""
    for statement in statements:
        call = statement.value if isinstance(statement, ast.Expr) else None
        if isinstance(call, ast.Constant):
            continue  # a docstring
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "check_field":
            field = call.args[1].value if isinstance(call.args[1], ast.Constant) else "?"
            try:
                read.checks.append({"field": field, "test": scope.expression(call.args[2]), "when": guard,
                                    "allowed": scope.message(call.args[3])})
            except Unreadable:
                read.unchecked.append(field)
        elif (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__post_init__"
              and isinstance(call.func.value, ast.Call) and getattr(call.func.value.func, "id", "") == "super"):
            parent = next(base for base in scope.cls.__mro__[scope.cls.__mro__.index(owner) + 1:]
                          if "__post_init__" in vars(base))
            read_post_init(scope.cls, parent, read)
        elif (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and len(call.args) == 1
              and isinstance(call.args[0], ast.Name) and call.args[0].id == scope.instance
              and inspect.isfunction(helper := scope.globals.get(call.func.id))):
            body, instance = function_body(helper, read)
            read_checks(body, Scope(scope.cls, instance, helper.__globals__), guard, owner, read)
        elif isinstance(statement, ast.If) and not statement.orelse:
            try:
                test = scope.expression(statement.test)
            except Unreadable:
                read.unchecked.append(ast.unparse(statement).split("\n")[0])
                continue
            read_checks(statement.body, scope, test if guard is None else ["and", guard, test], owner, read)
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Name):
                if (name := scope.field_named(statement.value)) is not None:
                    scope.aliases[target.id] = name
                else:
                    scope.opaque.add(target.id)
            elif scope.field_named(target) is not None:
                # a field the class rewrites: the stand-in would check the value before that rewrite
                read.unchecked.append(ast.unparse(statement).split("\n")[0])
            # any other attribute the instance keeps (REINFORCE's running mean) is state, not a check
        else:
            read.unchecked.append(ast.unparse(statement).split("\n")[0])


def read_post_init(cls: type, owner: type, read: ReadChecks) -> None:
    """The checks of `owner.__post_init__`, run on an instance of `cls`."""
    function = vars(owner)["__post_init__"]
    body, instance = function_body(function, read)
    read_checks(body, Scope(cls, instance, function.__globals__), None, owner, read)


def section_checks(cls: type) -> ReadChecks:
    """The checks `cls()` runs in its __post_init__, in the order it runs them, as data."""
    read = ReadChecks()
    owner = next((base for base in cls.__mro__ if "__post_init__" in vars(base)), None)
    if owner is not None:
        read_post_init(cls, owner, read)
    return read
