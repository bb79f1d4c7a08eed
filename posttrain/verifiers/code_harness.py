"""The programs the code verifier runs inside the sandbox, after the sandbox's prelude
(posttrain/guards/sandbox_child.py). Both print `<nonce> [event, ...]` lines on stdout; the parent
(posttrain/verifiers/code.py) reads them with code_probes.read_reports.

Nothing here is a defence. The solution runs in the same interpreter and may rewrite all of
it: PROBE_HARNESS gains it nothing, because no expected value is in that process (code.py's
docstring); HARNESS, the weaker path, it can forge.
"""

# Runs in the sandbox after the prelude. Prints `nonce [event, ...]` lines, values hex-coded
# by hand. Nothing here is a defence: the solution may rewrite all of it, and gains nothing,
# because no expected value is in this process (module docstring). Names are bound before
# the solution runs only so that an honest solution that shadows a builtin is still heard.
PROBE_HARNESS = r'''
def _probe(solution, setup, probes, nonce):
    import os
    write, exit_now, kind_of, hex_int, hex_float = os.write, os._exit, type, int.__format__, float.hex
    encode_str, join, items, enumerate_, compile_, exec_, eval_ = (
        str.encode, str.join, dict.items, enumerate, compile, exec, eval)
    TAGS = {list: "l", tuple: "t", set: "S", frozenset: "F"}

    def report(*fields):
        data = encode_str("\n" + nonce + " [" + join(",", fields) + "]\n")
        while data:
            data = data[write(1, data):]

    def text(value):
        return '"' + encode_str(value, "utf-8", "surrogatepass").hex() + '"'

    def describe(error):
        try:
            name, message = kind_of(error).__name__, str(error)
            return text((name + ": " + message)[:300] if message else name)
        except BaseException:
            return text("an exception whose name or message raised")

    def encode(value, depth):
        kind = kind_of(value)
        if depth > 64:
            raise ValueError("nested more than 64 deep")
        if value is None:
            return '["n"]'
        if kind is bool:
            return '["b",1]' if value is True else '["b",0]'
        if kind is int:
            return '["i","' + hex_int(value, "x") + '"]'
        if kind is float:
            return '["f","' + hex_float(value) + '"]'
        if kind is complex:
            return '["c","' + hex_float(value.real) + '","' + hex_float(value.imag) + '"]'
        if kind is str:
            return '["s",' + text(value) + "]"
        if kind is bytes:
            return '["y","' + bytes.hex(value) + '"]'
        if kind is list or kind is tuple or kind is set or kind is frozenset:
            return '["' + TAGS[kind] + '",[' + join(",", [encode(x, depth + 1) for x in value]) + "]]"
        if kind is dict:
            pairs = ["[" + encode(k, depth + 1) + "," + encode(v, depth + 1) + "]" for k, v in items(value)]
            return '["d",[' + join(",", pairs) + "]]"
        raise TypeError(kind)

    try:
        code = compile_(solution, "solution.py", "exec")
    except MemoryError:
        raise
    except BaseException as error:  # SyntaxError, ValueError (null bytes), RecursionError
        report('"syntax_error"', describe(error))
        exit_now(0)
    # __name__ is not "__main__": an `if __name__ == "__main__":` block reading stdin
    # would otherwise run and fail on the empty stdin.
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec_(code, namespace)
    except MemoryError:
        raise
    except BaseException as error:  # SystemExit too: exiting is not passing
        report('"runtime_error"', describe(error))
        exit_now(0)
    try:
        for statement in setup:
            exec_(statement, namespace)
    except BaseException as error:
        report('"setup_error"', describe(error))
        exit_now(0)
    for index, probe in enumerate_(probes):
        try:
            value = eval_(compile_(probe, "probe_%d" % index, "eval"), namespace)
        except MemoryError:
            raise
        except BaseException as error:
            report('"raised"', "%d" % index, '"assert"' if kind_of(error) is AssertionError else '"error"',
                   describe(error))
            continue
        try:
            encoded = encode(value, 0)
        except MemoryError:
            raise
        except BaseException as error:
            what = "a value nested more than 64 deep" if kind_of(error) is ValueError else None
            try:
                what = what or "an object of type " + kind_of(value).__qualname__
            except BaseException:
                what = "an object"
            report('"not_plain"', "%d" % index, text((probe + " returned " + what)[:300]))
            continue
        report('"value"', "%d" % index, encoded)
    exit_now(0)  # skip atexit hooks and non-daemon threads the code may have left
'''

# The weaker path: runs whole tests in the solution's namespace and reports each outcome
# with the nonce. The solution can find the nonce and forge these reports.
HARNESS = r'''
def _harness(solution, tests, nonce):
    import json, os
    dumps, write, exit_now, compile_, exec_, enumerate_ = json.dumps, os.write, os._exit, compile, exec, enumerate

    def report(*event):
        write(1, ("\n" + nonce + " " + dumps(event) + "\n").encode())

    def describe(error):
        try:
            message = str(error)
        except BaseException:
            message = ""  # a hostile __str__ must not break the report
        name = type(error).__name__
        return (name + ": " + message)[:300] if message else name

    try:
        code = compile_(solution, "solution.py", "exec")
    except MemoryError:
        raise
    except BaseException as error:
        report("syntax_error", describe(error))
        exit_now(0)
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec_(code, namespace)
    except MemoryError:
        raise
    except BaseException as error:
        report("runtime_error", describe(error))
        exit_now(0)
    for index, test in enumerate_(tests):
        try:
            exec_(compile_(test, "test_%d.py" % index, "exec"), namespace)
            report("test", index, "pass", None)
        except MemoryError:
            raise
        except AssertionError as error:
            report("test", index, "fail", describe(error))
        except BaseException as error:
            report("test", index, "error", describe(error))
    exit_now(0)
'''
