"""Tools (posttrain/envs/tools.py): the calculator's numbers and refusals, the registry's
schema check and failure policies (a raising tool, a hanging one), and the python tool's
sandbox: no file of the host, no network."""

import os
import pickle
import re
import socket
import time
import uuid

import pytest

from posttrain.envs.tools import (
    MAX_RESULT_DIGITS,
    REASONS,
    Tool,
    ToolCall,
    ToolRegistry,
    calculate,
    calculator_tool,
    python_tool,
)
from posttrain.guards.sandbox import run_sandboxed, weak_sandbox_refusal

# ---- the calculator ----------------------------------------------------------------------


@pytest.mark.parametrize("expression, value", [
    ("347*829", 287663), ("2**10", 1024), ("(12+7)**2", 361), ("7//2", 3), ("-7%3", 2), ("7/2", 3.5),
    ("-3**2", -9), (" 1 + 2 * 3 ", 7), ("2**-1", 0.5), ("0.1+0.2", 0.1 + 0.2), ("+5--5", 10),
])
def test_calculator_values(expression, value):
    assert calculate(expression) == value and type(calculate(expression)) is type(value)


@pytest.mark.parametrize("expression, reason", [
    ("__import__('os').system('touch /tmp/x')", "the calculator takes numbers"),
    ("x+1", "the calculator takes numbers"),
    ("'a'*3", "the calculator takes numbers"),
    ("True+1", "the calculator takes numbers"),
    ("(1).__class__", "the calculator takes numbers"),
    ("[1,2]", "the calculator takes numbers"),
    ("1/0", "division by zero"),
    ("5%0", "division by zero"),
    ("0**-1", "division by zero"),
    ("9**9**9", "beyond the calculator's limit of 1000"),
    ("2**999*2**999*2**999*2**999", f"more than {MAX_RESULT_DIGITS} digits"),
    ("3**999*3**999*3**999", f"more than {MAX_RESULT_DIGITS} digits"),
    ("10.0**400", "too large for a float"),
    ("1e308*10", "not a finite number"),
    ("(-8)**0.5", "complex number"),
    ("1+", "not an arithmetic expression"),
    ("1" * 201, "at most 200"),
    ("1\x00", "not an arithmetic expression"),
])
def test_calculator_refuses_with_the_reason(expression, reason):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=re.escape(reason)):
        calculate(expression)
    assert time.perf_counter() - start < 0.1  # a refused 9**9**9 costs nothing


def test_calculator_agrees_with_python_on_random_expressions():
    """Parity with an independent evaluator (Python itself, on expressions we generated)."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    leaf = st.integers(-999, 999).map(lambda n: f"({n})")
    expressions = st.recursive(leaf, lambda inner: st.tuples(inner, st.sampled_from("+ - * // %".split()), inner)
                               .map(lambda t: f"({t[0]}{t[1]}{t[2]})"), max_leaves=8)

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(expressions)
    def check(expression):
        try:
            expected = eval(expression)  # trusted: built above from integers and operators
        except ZeroDivisionError:
            with pytest.raises(ValueError, match="division by zero"):
                calculate(expression)
            return
        assert calculate(expression) == expected

    check()


# ---- the registry ------------------------------------------------------------------------


def test_schemas_are_the_openai_function_shape():
    registry = ToolRegistry([calculator_tool()])
    (schema,) = registry.schemas()
    assert schema["type"] == "function" and schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    assert registry.call(ToolCall("calculator", {"expression": "347*829"})).output == "287663"
    with pytest.raises(ValueError, match="already registered"):
        registry.register(calculator_tool())


@pytest.mark.parametrize("arguments, message", [
    ({}, "missing required argument(s) ['expression']"),
    ({"expression": 7}, "argument 'expression' of tool 'calculator' must be a JSON string, got 7"),
    ({"expression": "1", "extra": 1}, "unexpected argument(s) ['extra']"),
    ([1], "arguments must be a JSON object, got list"),
])
def test_bad_arguments_are_a_result_with_the_reason(arguments, message):
    result = ToolRegistry([calculator_tool()]).call(ToolCall("calculator", arguments))
    assert (result.ok, result.reason, result.ends_episode) == (False, "bad_arguments", False)
    assert message in result.error


def test_json_types_follow_json_not_python():
    def echo(n, flag=False):
        return str(n)

    tool = Tool("echo", "echo", {"type": "object", "properties": {"n": {"type": "integer"},
                                                                   "flag": {"type": "boolean"},
                                                                   "mode": {"enum": ["a", "b"]}}}, echo)
    registry = ToolRegistry([tool])
    assert registry.call(ToolCall("echo", {"n": 3})).output == "3"
    assert registry.call(ToolCall("echo", {"n": True})).reason == "bad_arguments"  # bool is not a JSON integer
    assert registry.call(ToolCall("echo", {"n": 3.0})).reason == "bad_arguments"
    assert registry.call(ToolCall("echo", {"n": 1, "flag": 1})).reason == "bad_arguments"
    assert "must be one of ['a', 'b']" in registry.call(ToolCall("echo", {"n": 1, "mode": "c"})).error


def test_unknown_tool():
    result = ToolRegistry([calculator_tool()]).call(ToolCall("search", {"q": "x"}))
    assert (result.ok, result.reason) == (False, "unknown_tool")
    assert result.error == "unknown tool 'search'; the tools are ['calculator']"


def broken(**_):
    raise KeyError("the index is gone")


@pytest.mark.parametrize("on_error, ends", [("continue", False), ("end", True)])
def test_a_raising_tool_continues_or_ends_per_its_policy(on_error, ends):
    tool = Tool("lookup", "d", {"type": "object", "properties": {}}, broken, on_error=on_error)
    result = ToolRegistry([tool]).call(ToolCall("lookup", {}))
    assert (result.ok, result.reason, result.ends_episode) == (False, "tool_error", ends)
    assert result.error == "KeyError: 'the index is gone'" == result.output


def test_a_tool_that_exits_is_an_error_not_the_end_of_the_run():
    def quit_(**_):
        raise SystemExit(3)

    result = ToolRegistry([Tool("quit", "d", {"type": "object", "properties": {}}, quit_)]).call(ToolCall("quit", {}))
    assert (result.ok, result.reason, result.error) == (False, "tool_error", "SystemExit: 3")


def test_call_never_raises_on_whatever_the_model_asks():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                               lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                           max_size=3), max_leaves=6)
    registry = ToolRegistry([calculator_tool()])

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(st.sampled_from(["calculator", "python", ""]) | st.text(max_size=10),
                      st.dictionaries(st.sampled_from(["expression", "x"]) | st.text(max_size=5), json_values,
                                      max_size=3) | json_values)
    def check(name, arguments):
        result = registry.call(ToolCall(name, arguments))
        assert result.reason in REASONS and result.ok == (result.reason == "ok") and isinstance(result.output, str)

    check()


def test_a_registry_pickles_without_its_thread_and_still_calls():
    registry = ToolRegistry([calculator_tool()])
    registry.call(ToolCall("calculator", {"expression": "1+1"}))  # its worker thread is running now
    copy = pickle.loads(pickle.dumps(registry))
    assert copy.call(ToolCall("calculator", {"expression": "6*7"})).output == "42"


def test_a_hanging_tool_times_out_within_its_limit_and_the_next_call_is_not_delayed():
    tool = Tool("slow", "d", {"type": "object", "properties": {}}, lambda: time.sleep(30), timeout_seconds=0.3,
                on_error="end")
    registry = ToolRegistry([tool, calculator_tool()])
    start = time.perf_counter()
    result = registry.call(ToolCall("slow", {}))
    elapsed = time.perf_counter() - start
    assert (result.reason, result.ends_episode) == ("tool_timeout", True)
    assert result.error == "tool 'slow' did not answer within 0.3 s"
    assert 0.3 <= elapsed < 0.8 and 0.3 <= result.seconds < 0.8
    start = time.perf_counter()  # the hung thread is abandoned: a fresh one serves the next call
    assert registry.call(ToolCall("calculator", {"expression": "6*7"})).output == "42"
    assert time.perf_counter() - start < 0.2


def test_tool_definitions_are_checked():
    with pytest.raises(ValueError, match="must be an identifier"):
        Tool("my tool", "d", {"type": "object", "properties": {}}, print)
    with pytest.raises(ValueError, match="on_error must be one of"):
        Tool("t", "d", {"type": "object", "properties": {}}, print, on_error="retry")
    with pytest.raises(ValueError, match="timeout_seconds must be > 0"):
        Tool("t", "d", {"type": "object", "properties": {}}, print, timeout_seconds=0)
    with pytest.raises(ValueError, match='"type": "object"'):
        Tool("t", "d", {"type": "string"}, print)
    with pytest.raises(ValueError, match=re.escape("required argument(s) ['q'] are not among its properties ['x']")):
        Tool("t", "d", {"type": "object", "properties": {"x": {}}, "required": ["q"]}, print)


def test_python_tool_is_refused_at_construction_without_a_strong_sandbox(monkeypatch):
    from posttrain.envs import tools

    monkeypatch.setattr(tools, "weak_sandbox_refusal", lambda allow: None if allow else "no namespaces here")
    with pytest.raises(ValueError, match="python tool: no namespaces here"):
        python_tool()
    assert python_tool(allow_weak_sandbox=True).name == "python"


def test_long_outputs_are_cut_and_non_text_outputs_are_json():
    registry = ToolRegistry([Tool("big", "d", {"type": "object", "properties": {}}, lambda: "x" * 10_000),
                             Tool("obj", "d", {"type": "object", "properties": {}}, lambda: {"a": [1, 2]})])
    assert len(registry.call(ToolCall("big", {})).output) == 2_000
    assert registry.call(ToolCall("obj", {})).output == '{"a": [1, 2]}'


# ---- the python tool: the sandbox ----------------------------------------------------------

needs_sandbox = pytest.mark.skipif(weak_sandbox_refusal(False) is not None,
                                   reason="no namespace sandbox here (posttrain/guards/sandbox.py)")


@pytest.fixture(scope="module")
def python():
    return ToolRegistry([python_tool(wall_seconds=2.0)])


def run(registry, code):
    return registry.call(ToolCall("python", {"code": code}))


@needs_sandbox
def test_python_tool_returns_stdout(python):
    python = pickle.loads(pickle.dumps(python))  # a partial, not a closure: it travels to Ray workers
    result = run(python, "print(sum(range(10)) * 3)")
    assert (result.ok, result.output) == (True, "135\n")
    failed = run(python, "raise SystemExit('no')")
    assert (failed.ok, failed.reason) == (False, "tool_error") and "status 'error'" in failed.error


@needs_sandbox
def test_python_tool_cannot_write_or_read_outside_its_sandbox(python, tmp_path):
    target = tmp_path / f"escape-{uuid.uuid4().hex}.txt"
    result = run(python, f"open({str(target)!r}, 'w').write('pwned')\nprint('wrote')")
    assert not result.ok and not target.exists()
    # /tmp inside the sandbox is its own scratch space, not the host's /tmp
    name = f"/tmp/posttrain-escape-{uuid.uuid4().hex}"
    inside = run(python, f"open({name!r}, 'w').write('x')\nprint(open({name!r}).read())")
    assert not os.path.exists(name) and (not inside.ok or inside.output == "x\n")
    leaked = run(python, f"print(open({__file__!r}).read())")  # the project checkout is not in its filesystem
    assert not leaked.ok and "FileNotFoundError" in leaked.error and "needs_sandbox" not in leaked.output
    # without the Python-level guard (what code that undoes it would get), the filesystem itself refuses
    raw = run_sandboxed("open('/usr/escape.txt', 'w')", python_guards=False, wall_seconds=3)
    assert raw.status == "error" and "Read-only file system" in raw.stderr


@needs_sandbox
def test_python_tool_cannot_reach_the_network(python):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
    try:
        result = run(python, code)
        assert not result.ok and "connected" not in result.output
        with pytest.raises(socket.timeout):
            server.accept()  # nothing ever knocked
    finally:
        server.close()
    # without the Python-level guard (what code that undoes it would get), the namespace has no network
    raw = run_sandboxed(code, python_guards=False, wall_seconds=3)
    assert raw.status == "error" and "Network is unreachable" in raw.stderr


@needs_sandbox
def test_python_tool_that_hangs_is_a_timeout():
    registry = ToolRegistry([python_tool(cpu_seconds=1, wall_seconds=1.0)])
    start = time.perf_counter()
    result = run(registry, "import time\ntime.sleep(30)")
    assert (result.ok, result.reason) == (False, "tool_timeout")
    assert "status" not in result.error and "timeout" in result.error
    assert time.perf_counter() - start < 3.0
