"""Where a user's reward function lives: `MODULE:NAME` imported as `python -m` would find it
(the current directory first), `PATH.py:NAME` loaded from a file, or `python:MODULE.NAME`, a
function handed over from Python (posttrain.train(reward_funcs=[fn])) that no import reaches;
with errors that say which term failed, how, and at which line of the user's file.

Importing runs the module's own code, which can do anything: raise, call sys.exit() (a
script's `args = parser.parse_args()` at module level does), wait on the network or on
input(). Whatever it raises, SystemExit and KeyboardInterrupt included, becomes a
ValueError naming the term, the file and the line, and the import runs in a worker thread
under IMPORT_TIMEOUT, so a module that never finishes importing is named instead of
hanging the command (with rl.reward.timeout=0, which asks for the main thread, it runs
there without a limit).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Any, Callable, Collection

from posttrain.guards.timed_calls import CallThread, FunctionTimeout, call_here, raised
from posttrain.verifiers.contract import shown

# seconds a reward module may take to import. Importing torch and transformers takes 3.4 s
# on this repository's 2-core machine (measured, files cached), several times that from a
# cold or network disk; a module still importing after a minute is waiting on something
# (the network, a lock, input()) and would wait as long at every start
IMPORT_TIMEOUT = 60.0

GIVEN_PREFIX = "python:"
# The functions posttrain.train(reward_funcs=...) was handed that no import path reaches (a
# lambda, a closure, a function of the running script or notebook, whose `__main__` is another
# module in any other process), by the name rl.reward.terms gives them. config.json records the
# name; a process that was not handed the object (a --resume from the command line) is told so.
GIVEN: dict[str, Callable[..., Any]] = {}


def source_of(fn: Callable[..., Any], taken: Collection[str] = ()) -> str:
    """The name rl.reward.terms gives `fn`: MODULE:NAME when importing it finds this very
    object (a function at the top of an importable module), else python:MODULE.NAME, kept in
    GIVEN for this process (with #2, #3 ... after a name in `taken`: two lambdas)."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not callable(fn) or not module or not name:
        raise ValueError(f"reward_funcs: {shown(fn)} is not a function; pass functions (or 'MODULE:FUNCTION' "
                         "strings)")
    written = f"{module}:{name}"
    if module != "__main__" and re.fullmatch(r"[A-Za-z_][\w.]*", name):
        try:
            if import_source(written) is fn:
                return written
        except ValueError:
            pass
    given, count = f"{GIVEN_PREFIX}{module}.{name}", 1
    while (given if count == 1 else f"{given}#{count}") in taken:
        count += 1
    given = given if count == 1 else f"{given}#{count}"
    GIVEN[given] = fn  # the newest object under a name wins: a notebook cell run again redefines it
    return given


def import_source(source: str, main_thread: bool = False) -> Any:
    """The object `MODULE:NAME` or `PATH.py:NAME` names (NAME may be dotted: Class.method), or
    the function handed over from Python under `python:MODULE.NAME`. The module is imported in
    a worker thread under IMPORT_TIMEOUT, or with `main_thread` in this thread without a limit
    (for a module that installs signal handlers)."""
    if source.startswith(GIVEN_PREFIX):
        if source not in GIVEN:
            raise ValueError(f"term {source!r} is a function that was handed to posttrain.train(reward_funcs=...) in "
                             "another process, which no import can reach: pass it again from Python, or move it "
                             "to a module and write MODULE:FUNCTION")
        return GIVEN[source]
    where, _, attr = source.rpartition(":")
    if not where or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", attr):
        raise ValueError(f"term {source!r}: write MODULE:FUNCTION or PATH.py:FUNCTION (a Python name after the ':')")
    if where.endswith(".py") or "/" in where or os.sep in where:
        module = import_file(source, where, main_thread)
    else:
        module = import_module(source, where, main_thread)
    found = module
    for part in attr.split("."):
        if not hasattr(found, part):
            callables = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
            raise ValueError(f"term {source!r}: {where} has no {attr!r}; it defines {callables or 'no functions'}")
        found = getattr(found, part)
    return found


def import_module(source: str, name: str, main_thread: bool = False) -> Any:
    # the current directory first, as `python -m` and `python script.py` would have it; the
    # `posttrain` console script's own sys.path starts at its bin/ directory instead
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        return run_import(lambda: importlib.import_module(name), main_thread)
    except ModuleNotFoundError as error:
        if error.name != name.split(".")[0] and error.name != name:
            raise ValueError(f"term {source!r}: importing {name} failed: {error}{where_raised(error)}") from None
        raise ValueError(f"term {source!r}: there is no module {name!r} in the current directory ({here}) or on "
                         f"sys.path; write a file path instead (./{name.replace('.', '/')}.py:FUNCTION), or run "
                         "from the directory that holds it") from None
    except FunctionTimeout:
        raise ValueError(f"term {source!r}: importing {name} did not finish within {IMPORT_TIMEOUT:g} s"
                         f"{IMPORT_HANG_HINT}") from None
    except Exception as error:  # the module itself failed (SystemExit too): its error, where it happened
        raise ValueError(f"term {source!r}: importing {name} raised {failure(error)}") from None
    except KeyboardInterrupt as error:  # in this thread (main_thread): a Ctrl-C, or the module's own
        raise KeyboardInterrupt(f"while term {source!r} was importing {name}{where_raised(error)}") from None
    finally:
        if added:
            sys.path.remove(here)


def import_file(source: str, where: str, main_thread: bool = False) -> Any:
    path = Path(where).expanduser()
    if not path.is_file():
        raise ValueError(f"term {source!r}: no such file {where!r} (relative to {os.getcwd()}); "
                         "give the path of a .py file, then ':' and the function's name")
    path = path.resolve()
    # registered under a name of its path, so that loading it again (the pre-run check, then
    # the run) runs its code once, and so that dataclasses and pickle can find it
    name = "_posttrain_reward_" + hashlib.sha256(str(path).encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # no loader for its suffix: not Python source
        raise ValueError(f"term {source!r}: {where!r} is not a Python file; give the path of a .py file, "
                         "then ':' and the function's name")
    module, loader = importlib.util.module_from_spec(spec), spec.loader
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))  # its sibling files import, as under `python path.py`
    try:
        run_import(lambda: loader.exec_module(module), main_thread)
    except FunctionTimeout:
        sys.modules.pop(name, None)  # a later try runs the file again, rather than take the half-run module
        raise ValueError(f"term {source!r}: running {path} did not finish within {IMPORT_TIMEOUT:g} s"
                         f"{IMPORT_HANG_HINT}") from None
    except Exception as error:  # SystemExit too: the module's failure, where it happened
        sys.modules.pop(name, None)
        raise ValueError(f"term {source!r}: running {path} raised {failure(error)}") from None
    except KeyboardInterrupt as error:  # in this thread (main_thread): a Ctrl-C, or the module's own
        sys.modules.pop(name, None)
        raise KeyboardInterrupt(f"while term {source!r} was running {path}{where_raised(error)}") from None
    finally:
        sys.path.remove(str(path.parent))
    return module


IMPORT_HANG_HINT = ("; a module's top level runs at import: move what waits (a download, a server, input(), a "
                    "long computation) into the function or behind `if __name__ == '__main__':`")


def run_import(load: Callable[[], Any], main_thread: bool) -> Any:
    """load() in a worker thread under IMPORT_TIMEOUT, or in this thread (timed_calls.call_here)."""
    return call_here(load, {}) if main_thread else CallThread().call(load, {}, IMPORT_TIMEOUT)


def failure(error: BaseException) -> str:
    """'SystemExit(2) (my_rewards.py, line 4, in <module>)': what a user's code raised, and
    where; `error` may be a RaisedBaseException, whose original is named."""
    error = raised(error)
    hint = ""
    if isinstance(error, SyntaxError) and "unicode error" in str(error.msg):
        hint = "; save the file as UTF-8, or declare its encoding on its first line: # -*- coding: latin-1 -*-"
    elif isinstance(error, SystemExit):
        hint = ("; it called sys.exit() or exit() (argparse's parse_args() does, reading posttrain's own command "
                "line), which must not end a run: raise an exception instead, or move that code under "
                "`if __name__ == '__main__':`")
    return f"{described(error)}{where_raised(error)}{hint}"


def described(error: BaseException) -> str:
    """'ZeroDivisionError: division by zero', 'SystemExit(0)', 'KeyboardInterrupt'."""
    if isinstance(error, SystemExit):
        return f"SystemExit({error.code!r})"
    try:  # a SyntaxError's str repeats the file and line that where_raised gives
        text = error.msg if isinstance(error, SyntaxError) else str(error)
    except Exception:  # a hostile __str__
        text = ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def where_raised(error: BaseException) -> str:
    """' (file.py, line 12, in fn)' (raised_at in brackets), or '' without a traceback."""
    at = raised_at(error)
    return f" ({at})" if at else ""


def raised_at(error: BaseException) -> str:
    """'file.py, line 12, in fn': the innermost frame of the error's traceback, then the
    innermost frame of the user's own code when that is another one (argparse raised the
    SystemExit, the user's line called parse_args()); '' without a traceback."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{Path(error.filename).name}, line {error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    innermost = frames[-1]
    where = f"{Path(innermost.filename).name}, line {innermost.lineno}, in {innermost.name}"
    own = next((frame for frame in reversed(frames) if is_users(frame.filename)), None)
    if own is not None and own is not innermost:
        where += f", called from {Path(own.filename).name}, line {own.lineno}, in {own.name}"
    return where


# what is not the user's code: Python's own library, installed packages, posttrain itself
NOT_USERS = tuple({Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")}
                  | {Path(__file__).resolve().parents[1]})


def is_users(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return False
    path = Path(filename).resolve()
    return not any(path.is_relative_to(other) for other in NOT_USERS)
