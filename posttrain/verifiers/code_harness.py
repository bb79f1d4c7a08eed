"""The programs the code verifier runs inside the sandbox, after the sandbox's prelude
(posttrain/guards/sandbox_child.py). All three print `<nonce> [event, ...]` lines on stdout;
the parent (posttrain/verifiers/code.py) reads them with code_values.read_reports.

    PROBE_HARNESS    the solution, then the probes: what only it can compute, as plain data
    HARNESS          code/tests-v1's weaker path: whole tests beside the solution (forgeable)
    REPLAY_HARNESS   code/tests-v2's replay: whole tests, never beside the solution

Nothing in the first two is a defence. The solution runs in the same interpreter and may
rewrite all of it: PROBE_HARNESS gains it nothing, because no expected value is in that
process (code.py's docstring); HARNESS, the weaker path, it can forge. REPLAY_HARNESS runs
only the tests' own code and the solution's answers as literals (code_replay.py), so its
reports are as trustworthy as the tests.
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

# The replay (code_replay.py): tests the parent cannot split, run in a process that never
# holds the solution. `stubs` are the solution's names: a call with plain arguments looks
# its key up in `answers` (key -> ("value", a function returning a fresh copy) | ("raised",
# builtin exception name, message) | ("not_plain", message)); a call not answered yet is
# reported as a question and returns an Unknown, and the test's verdict waits ("pending").
# The asserts come rewritten (code_replay.tolerant) so that, while a test is pending, a
# failing one does not stop it before it has asked everything it can.
REPLAY_HARNESS = r'''
def _replay(setup, tests, stubs, answers, nonce):
    import builtins, json, os, random

    def report(*event):
        data = ("\n" + nonce + " " + json.dumps(event) + "\n").encode()
        while data:
            data = data[os.write(1, data):]

    def describe(error):
        message = str(error)
        return (type(error).__name__ + ": " + message)[:300] if message else type(error).__name__

    class Pending(Exception):
        pass

    class NotPlain(BaseException):  # BaseException: a test's `except Exception` cannot swallow it
        pass

    class Withheld(BaseException):
        pass

    class Unknown:  # an answer not in yet: any use of it is Pending
        def refuse(self, *args):
            raise Pending("a value the solution has not been asked for yet")
        __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = __len__ = refuse
        __iter__ = __contains__ = __getitem__ = __float__ = __int__ = __index__ = __call__ = __getattr__ = refuse

    TAGS = {list: "l", tuple: "t", set: "S", frozenset: "F"}

    def encode(value, depth):  # code_values.decode's format; sets sorted, so a key is the same in every round
        kind = type(value)
        if kind is Unknown:
            raise Pending()
        if depth > 64:
            raise TypeError("a value nested more than 64 deep")
        if value is None:
            return ["n"]
        if kind is bool:
            return ["b", int(value)]
        if kind is int:
            return ["i", format(value, "x")]
        if kind is float:
            return ["f", value.hex()]
        if kind is complex:
            return ["c", value.real.hex(), value.imag.hex()]
        if kind is str:
            return ["s", value.encode("utf-8", "surrogatepass").hex()]
        if kind is bytes:
            return ["y", value.hex()]
        if kind in TAGS:
            items = [encode(item, depth + 1) for item in value]
            return [TAGS[kind], sorted(items, key=json.dumps) if kind is set or kind is frozenset else items]
        if kind is dict:
            return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
        raise TypeError("an object of type " + kind.__qualname__)

    asked = set()

    def stub(name, state):
        def call(*args, **kwargs):
            try:
                key = json.dumps([name, [encode(a, 0) for a in args], [[k, encode(v, 0)] for k, v in kwargs.items()]])
            except Pending:  # an argument built from an answer not in yet: asked in a later round
                state["pending"] = True
                return Unknown()
            except (TypeError, RecursionError) as error:
                raise Withheld(name + "() was passed " + str(error) + ", not plain data: the solution "
                               "cannot be asked that from another process")
            answer = answers.get(key)
            if answer is None:
                state["pending"] = True
                if key not in asked:
                    asked.add(key)
                    report("question", key)
                return Unknown()
            if answer[0] == "value":
                return answer[1]()
            if answer[0] == "not_plain":
                raise NotPlain(answer[1])
            kind = getattr(builtins, answer[1], None)
            raise (kind if isinstance(kind, type) and issubclass(kind, Exception) else RuntimeError)(answer[2])
        call.__name__ = call.__qualname__ = name
        return call

    setup_code = compile(setup, "test_setup.py", "exec")
    for index, source in enumerate(tests):
        state = {"pending": False}
        namespace = {"__name__": "__test__", "__builtins__": builtins}
        try:
            exec(setup_code, namespace)
        except BaseException as error:
            report("test", index, "error", "the tests' setup raised " + describe(error))
            continue
        namespace.update({name: stub(name, state) for name in stubs})
        namespace["__posttrain_pending__"] = lambda state=state: state["pending"]
        random.seed(0)  # the same random inputs in every round: what one asked, the next finds
        try:
            exec(compile(source, "test_%d.py" % index, "exec"), namespace)
            outcome, message = "pass", None
        except Withheld as error:
            outcome, message = "withheld", str(error)
        except NotPlain as error:
            outcome, message = "not_plain", str(error)
        except AssertionError as error:
            outcome, message = "fail", describe(error)
        except BaseException as error:
            outcome, message = "error", describe(error)
        if state["pending"] and outcome not in ("withheld", "not_plain"):
            outcome, message = "pending", None
        report("test", index, outcome, message)
    os._exit(0)
'''
