"""Where a user's reward function lives: `MODULE:NAME` imported as `python -m` would find it
(the current directory first), `PATH.py:NAME` loaded from a file, or `python:MODULE.NAME`, a
function handed over from Python (posttrain.train(reward_funcs=[fn])) that no import reaches;
with errors that say which term failed, how, and at which line of the user's file."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Collection

from posttrain.verifiers.contract import shown

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


def import_source(source: str) -> Any:
    """The object `MODULE:NAME` or `PATH.py:NAME` names (NAME may be dotted: Class.method),
    or the function handed over from Python under `python:MODULE.NAME`."""
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
        module = import_file(source, where)
    else:
        module = import_module(source, where)
    found = module
    for part in attr.split("."):
        if not hasattr(found, part):
            callables = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
            raise ValueError(f"term {source!r}: {where} has no {attr!r}; it defines {callables or 'no functions'}")
        found = getattr(found, part)
    return found


def import_module(source: str, name: str) -> Any:
    # the current directory first, as `python -m` and `python script.py` would have it; the
    # `posttrain` console script's own sys.path starts at its bin/ directory instead
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name.split(".")[0] and error.name != name:
            raise ValueError(f"term {source!r}: importing {name} failed: {error}{where_raised(error)}") from None
        raise ValueError(f"term {source!r}: there is no module {name!r} in the current directory ({here}) or on "
                         f"sys.path; write a file path instead (./{name.replace('.', '/')}.py:FUNCTION), or run "
                         "from the directory that holds it") from None
    except Exception as error:  # the module itself failed: its error, where it happened
        raise ValueError(f"term {source!r}: importing {name} raised {type(error).__name__}: {error}"
                         f"{where_raised(error)}") from None
    finally:
        if added:
            sys.path.remove(here)


def import_file(source: str, where: str) -> Any:
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
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))  # its sibling files import, as under `python path.py`
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise ValueError(f"term {source!r}: running {path} raised {type(error).__name__}: {error}"
                         f"{where_raised(error)}") from None
    finally:
        sys.path.remove(str(path.parent))
    return module


def where_raised(error: BaseException) -> str:
    """' (file.py, line 12)': the innermost frame of the error's traceback, else ''."""
    frames = traceback.extract_tb(error.__traceback__)
    if isinstance(error, SyntaxError) and error.filename:
        return f" ({Path(error.filename).name}, line {error.lineno})"
    return f" ({Path(frames[-1].filename).name}, line {frames[-1].lineno})" if frames else ""
