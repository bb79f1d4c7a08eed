"""Tools an agent can call: a registry of named, schema-described Python callables, each
run under a time limit, and two built-in tools (a calculator and a sandboxed Python).

    registry = ToolRegistry([calculator_tool(), python_tool()])
    registry.schemas()                                   # what a chat template's `tools=` takes
    registry.call(ToolCall("calculator", {"expression": "347*829"}))
        -> ToolResult(name="calculator", ok=True, output="287663", reason="ok", ...)

`ToolRegistry.call` never raises: whatever the model asked for (an unknown tool, arguments
that do not fit the schema) and whatever the tool did (raised, even SystemExit or
KeyboardInterrupt, which in the tool's worker thread can only be its own; hung; printed megabytes),
the answer is a ToolResult whose `reason` is one of REASONS and whose `error` says what
happened. A failed call carries its tool's policy, `on_error`:

    "continue"  the episode goes on; the model reads the error as the observation and may
                try again (a tool that can fail in ordinary use: bad arithmetic, a typo);
    "end"       the episode ends with reward 0 and the reason in its details (a tool whose
                failure means the trajectory is worthless, or a budget you do not want
                the policy to learn to burn).

A hung tool cannot be stopped from Python (a thread cannot be killed): the call is
abandoned after `timeout_seconds` and the registry moves to a fresh worker thread
(posttrain/guards/timed_calls.py). Tools that run untrusted code must bound themselves: the
python tool runs in posttrain/guards/sandbox.py, whose process is killed at its wall limit.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import operator
import time
from dataclasses import dataclass
from typing import Any, Callable

from posttrain.guards.sandbox import STATUSES, run_sandboxed, weak_sandbox_refusal
from posttrain.guards.timed_calls import CallThread, FunctionTimeout, raised
from posttrain.rewards.function_source import raised_at

REASONS: dict[str, str] = {
    "ok": "the tool ran and returned its output",
    "unknown_tool": "no tool of that name is registered",
    "bad_arguments": "the arguments do not fit the tool's JSON schema (missing, unexpected or wrongly typed)",
    "tool_error": "the tool raised an exception (for the calculator: an expression it refuses)",
    "tool_timeout": "the tool did not answer within its timeout_seconds and was abandoned",
}
ON_ERROR = ("continue", "end")
MAX_OUTPUT_CHARS = 2_000  # an observation is context the model must read: cut longer outputs


class ToolTimedOut(Exception):
    """Raised by a tool that enforces its own time limit (the python tool's sandbox kills
    the program at its wall clock): reported as tool_timeout, like a call the registry abandons."""


# JSON-schema type name -> the Python types json.loads produces for it (bool is not a number)
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: a tool name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ToolResult:
    """How one call ended. `output` is what the model reads next (the tool's result, or the
    error message when not ok); `ends_episode` applies the tool's on_error policy."""

    name: str
    ok: bool
    output: str
    reason: str  # one of REASONS
    error: str = ""  # what went wrong, for the details and the error observation
    seconds: float = 0.0
    ends_episode: bool = False
    where: str = ""  # where a tool that raised raised: "my_tools.py, line 7, in lookup"

    def details(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "reason": self.reason, "error": self.error,
                "seconds": round(self.seconds, 4), "ends_episode": self.ends_episode,
                **({"where": self.where} if self.where else {})}


@dataclass
class Tool:
    """A function the model may call. `parameters` is a JSON schema of an object (the
    OpenAI/Hermes function-calling shape); `function` takes those arguments as keywords
    and returns the text the model reads."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any]
    timeout_seconds: float = 5.0  # wall clock per call; past it the call is abandoned
    on_error: str = "continue"  # "continue" or "end" (module docstring)

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"tool name {self.name!r} must be an identifier (letters, digits, _), "
                             "as chat templates and the compact call format expect")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"tool {self.name!r}: on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        if not self.timeout_seconds > 0:
            raise ValueError(f"tool {self.name!r}: timeout_seconds must be > 0, got {self.timeout_seconds!r}")
        if self.parameters.get("type") != "object" or not isinstance(self.parameters.get("properties", {}), dict):
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON schema with \"type\": \"object\" "
                             f"and a \"properties\" object, got {self.parameters!r}")
        undeclared = sorted(set(self.parameters.get("required", [])) - set(self.parameters.get("properties", {})))
        if undeclared:
            raise ValueError(f"tool {self.name!r}: required argument(s) {undeclared} are not among its properties "
                             f"{sorted(self.parameters.get('properties', {}))}; declare or unrequire them")

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema, the shape `tokenizer.apply_chat_template(tools=...)` takes."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def single_string_argument(self) -> str | None:
        """The name of this tool's one string parameter, or None when it has another shape
        (the compact call format `name: text` only fits such tools)."""
        properties = self.parameters.get("properties", {})
        if len(properties) == 1:
            (key, spec), = properties.items()
            if spec.get("type") == "string":
                return key
        return None


def check_arguments(tool: Tool, arguments: Any) -> tuple[str, str] | None:
    """(kind, message) when `arguments` do not fit the tool's schema, kind "missing_argument"
    or "bad_arguments"; None when they fit. A light check of what models get wrong (required
    keys, unknown keys, JSON types, enums), not all of JSON Schema: jsonschema would be one
    more dependency for the same answers here."""
    if not isinstance(arguments, dict):
        return "bad_arguments", f"arguments must be a JSON object, got {type(arguments).__name__}"
    properties = tool.parameters.get("properties", {})
    missing = [key for key in tool.parameters.get("required", []) if key not in arguments]
    if missing:
        return "missing_argument", f"missing required argument(s) {missing} of tool {tool.name!r}"
    unexpected = sorted(set(arguments) - set(properties))
    if unexpected and tool.parameters.get("additionalProperties", True) is False:
        return "bad_arguments", (f"unexpected argument(s) {unexpected} of tool {tool.name!r}; "
                                 f"it takes {sorted(properties)}")
    for key, value in arguments.items():
        spec = properties.get(key, {})
        types = JSON_TYPES.get(spec.get("type", ""))
        wrong_bool = isinstance(value, bool) and bool not in (types or ())
        if types is not None and (not isinstance(value, types) or wrong_bool):
            return "bad_arguments", (f"argument {key!r} of tool {tool.name!r} must be a JSON {spec['type']}, "
                                     f"got {json.dumps(value)[:80]}")
        if "enum" in spec and value not in spec["enum"]:
            return "bad_arguments", (f"argument {key!r} of tool {tool.name!r} must be one of {spec['enum']}, "
                                     f"got {value!r}")
    return None


class ToolRegistry:
    """The tools one environment offers, by name."""

    def __init__(self, tools: list[Tool] | None = None):
        self.tools: dict[str, Tool] = {}
        self._worker: CallThread | None = None  # started at the first call
        for tool in tools or []:
            self.register(tool)

    def register(self, tool: Tool) -> Tool:
        if tool.name in self.tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered; give the new one another name")
        self.tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def names(self) -> list[str]:
        return list(self.tools)

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self.tools.values()]

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call; never raises (module docstring)."""
        tool = self.tools.get(call.name)
        if tool is None:
            error = f"unknown tool {call.name!r}; the tools are {self.names()}"
            return ToolResult(call.name, False, error, "unknown_tool", error)
        problem = check_arguments(tool, call.arguments)
        if problem:  # missing or not: to the registry, arguments that do not fit
            return self._failed(tool, "bad_arguments", problem[1], 0.0)
        if self._worker is None or self._worker.busy:  # busy: the last call on it hung; never queue behind it
            self._worker = CallThread()
        start = time.perf_counter()
        try:
            output = self._worker.call(tool.function, dict(call.arguments), tool.timeout_seconds)
        except FunctionTimeout:
            return self._failed(tool, "tool_timeout", f"tool {tool.name!r} did not answer within "
                                f"{tool.timeout_seconds:g} s", time.perf_counter() - start)
        except ToolTimedOut as error:
            return self._failed(tool, "tool_timeout", str(error), time.perf_counter() - start)
        except Exception as error:  # the tool's own failure is data for the episode, not a crash
            # SystemExit, KeyboardInterrupt and other BaseExceptions too: raised in the worker
            # thread, each is the tool's (a RaisedBaseException), never a Ctrl-C of this run
            own = raised(error)
            message = f"{type(own).__name__}: {own}"[:MAX_OUTPUT_CHARS]
            failed = self._failed(tool, "tool_error", message, time.perf_counter() - start)
            failed.where = raised_at(own)  # for the details, not for the model to read
            return failed
        text = output if isinstance(output, str) else json.dumps(output, default=str)
        return ToolResult(tool.name, True, text[:MAX_OUTPUT_CHARS], "ok", seconds=time.perf_counter() - start)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its worker thread (to a Ray worker or a subprocess), which
        starts its own at its first call."""
        return {**self.__dict__, "_worker": None}

    @staticmethod
    def _failed(tool: Tool, reason: str, error: str, seconds: float) -> ToolResult:
        return ToolResult(tool.name, False, error, reason, error, seconds, ends_episode=tool.on_error == "end")


# --- the calculator: arithmetic by walking the syntax tree, never eval -------------------------

MAX_EXPRESSION_CHARS = 200  # also keeps ast.parse far from its recursion limit on nested brackets
MAX_RESULT_DIGITS = 1_000  # any integer the calculator builds, including intermediate ones
MAX_EXPONENT = 1_000

BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_BITS = int(MAX_RESULT_DIGITS * math.log2(10))


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression of int and float literals with + - * / // % **
    and brackets (Python's meaning of each: / gives a float, // floors). Raises ValueError
    with the reason for anything else (names, calls, attributes, strings) and for results
    past the limits: a `9**9**9` would otherwise take minutes and gigabytes."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is {len(expression)} characters; the calculator takes at most "
                         f"{MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in the text
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    # an int or a float literal: not a bool (an int subclass), a complex, a str
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        if isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_BITS + 1:
                raise ValueError(f"the product would have more than {MAX_RESULT_DIGITS} digits")
        try:
            return _checked(BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        except OverflowError:
            raise ValueError("the result is too large for a float") from None
    raise ValueError(f"the calculator takes numbers, + - * / // % ** and brackets; not {ast.unparse(node)!r}")


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent {exponent} is beyond the calculator's limit of {MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if exponent * math.log2(abs(base)) > MAX_BITS:
            raise ValueError(f"{base}**{exponent} would have more than {MAX_RESULT_DIGITS} digits")
    if base == 0 and exponent < 0:
        raise ValueError("division by zero (0 to a negative power)")


def _checked(value: int | float | complex) -> int | float:
    if isinstance(value, complex):  # a negative number to a fractional power
        raise ValueError("the result is a complex number; the calculator works with real numbers")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not a finite number")
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise ValueError(f"the result has more than {MAX_RESULT_DIGITS} digits")
    return value


def calculator(expression: str) -> str:
    return str(calculate(expression))


def calculator_tool(timeout_seconds: float = 1.0, on_error: str = "continue") -> Tool:
    """The calculator as a Tool: one string argument `expression`, the result as text. Its
    errors (bad syntax, division by zero) continue the episode by default: the model can
    read the reason and fix its call."""
    return Tool(
        name="calculator",
        description="Evaluate an arithmetic expression: numbers, + - * / // % ** and brackets.",
        parameters={"type": "object", "properties": {"expression": {"type": "string", "description":
                    "e.g. 347*829 or (12+7)**2"}}, "required": ["expression"], "additionalProperties": False},
        function=calculator,
        timeout_seconds=timeout_seconds, on_error=on_error)


# --- python: the model's code in posttrain/guards/sandbox.py -----------------------------------------


def run_python(code: str, *, cpu_seconds: int, wall_seconds: float, memory_mb: int,
               allow_weak_sandbox: bool | None) -> str:
    """The python tool's function: the program's stdout, or an exception saying how it ended."""
    result = run_sandboxed(code, cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=memory_mb,
                           max_output_bytes=MAX_OUTPUT_CHARS, allow_weak_sandbox=allow_weak_sandbox)
    if result.status in ("timeout", "cpu_limit"):
        raise ToolTimedOut(f"the program used up its time ({result.status}: {STATUSES[result.status]})")
    if result.status != "ok":  # the ToolRegistry turns the exception into a tool_error result
        raise RuntimeError(f"the program ended with status {result.status!r}: "
                           f"{result.stderr.strip()[-500:] or 'no error output'}")
    return result.stdout


def python_tool(cpu_seconds: int = 2, wall_seconds: float = 5.0, memory_mb: int = 256,
                allow_weak_sandbox: bool | None = None, on_error: str = "continue") -> Tool:
    """Run the model's code in the sandbox; its stdout is the result. The process has no
    network and sees no file of the host outside its own scratch directory (namespace mode,
    posttrain/guards/sandbox.py). Refused at construction where only the weak sandbox exists and
    the caller did not opt in, so a run fails before its first step, not at its first call."""
    refusal = weak_sandbox_refusal(allow_weak_sandbox)
    if refusal:
        raise ValueError(f"python tool: {refusal}")
    # a partial of a module-level function, not a closure: the tool pickles (Ray workers)
    run = functools.partial(run_python, cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=memory_mb,
                            allow_weak_sandbox=allow_weak_sandbox)
    return Tool(
        name="python",
        description="Run a Python program in a sandbox (no network, no files outside it); "
                    "what it prints is the result.",
        parameters={"type": "object", "properties": {"code": {"type": "string", "description":
                    "a complete program; print the values you want back"}}, "required": ["code"],
                    "additionalProperties": False},
        function=run, timeout_seconds=wall_seconds + 3.0,  # the sandbox kills at wall_seconds; this is a backstop
        on_error=on_error)

