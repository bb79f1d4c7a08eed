"""Write cli/section_schema.json from the classes it describes (cli/section_schema.py reads it):

    python -m posttrain.cli.write_section_schema            rewrite it
    python -m posttrain.cli.write_section_schema --check    exit 1 if it differs from the classes

Rerun it after changing an algorithm's or a preference loss's fields or checks, adding one,
changing an environment's parameters, the demos or their options, or `posttrain check`'s
options, or merging branches that did; commit what it writes.

    live_schema()        the file's content, read from the classes (imports torch)
    section_entry(cls)   one section: its class's name, summary, fields and range checks
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import io
import json
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal

from posttrain.cli.section_checks import section_checks
from posttrain.cli.section_schema import (
    HELP_COLUMNS,
    PACKAGE_ROOT,
    SCHEMA_PATH,
    TYPES,
    WRITE_COMMAND,
    file_digest,
    parameters_taken,
)

# the modules of the sections' registries: an added algorithm changes one of these files
REGISTRY_MODULES = ("posttrain.algorithms", "posttrain.algorithms.preference")


def field_entry(cls: type, field: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """One field of a section: its name, type, whether None is allowed, its choices (a Literal),
    its default and the help text tyro's parser shows for it."""
    where = f"{cls.__name__}.{field.name}"
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
    if optional:
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        hint = inner[0] if len(inner) == 1 else hint
    choices = None
    if typing.get_origin(hint) is Literal:
        choices = list(typing.get_args(hint))
        hint = type(choices[0])
    names = {kind: name for name, kind in TYPES.items()}
    if hint not in names or (choices and any(type(choice) is not hint for choice in choices)):
        raise TypeError(f"{where}: the type {hint!r} has no flag in the schema; cli/section_schema.py reads "
                        f"{', '.join(TYPES)}, Literal[...] of one of them and X | None: add it to TYPES there")
    default = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
    try:
        json.dumps(default, allow_nan=False)
    except (TypeError, ValueError):
        raise TypeError(f"{where}: its default {default!r} cannot be written as JSON; give it a default of its "
                        "type (a number, a string, true/false or None)") from None
    # the function tyro's parser calls for a field's help (its docstring or the comment beside
    # it), so that the file holds the text the help showed
    from tyro._docstrings import get_field_docstring

    return {"name": field.name, "type": names[hint], "optional": optional, "choices": choices, "default": default,
            "help": get_field_docstring(cls, field.name, ())}


def section_entry(cls: type) -> dict[str, Any]:
    """A section: its class's name, the first line of its docstring, its fields in order, the
    range checks its __post_init__ makes and those that could not be read (cli/section_checks.py)."""
    hints = typing.get_type_hints(cls)
    read = section_checks(cls)
    return {"class": cls.__name__, "summary": (cls.__doc__ or "").strip().split("\n")[0],
            "fields": [field_entry(cls, f, hints[f.name]) for f in dataclasses.fields(cls) if f.init],
            "checks": read.checks, "unchecked": read.unchecked}


def source_hashes(classes: list[type]) -> dict[str, str]:
    """{file, named from the folder that holds posttrain/: its sha256} of every file that
    defines one of `classes` or a class they inherit from, or a function their checks call
    (check_loss_fields), and of the sections' registries."""
    files = {Path(inspect.getsourcefile(sys.modules[name]) or "") for name in REGISTRY_MODULES}
    for cls in classes:
        files |= {Path(inspect.getsourcefile(base) or "") for base in cls.__mro__
                  if base.__module__.startswith("posttrain.")}
        files |= {Path(name) for name in section_checks(cls).files}
    return {file.resolve().relative_to(PACKAGE_ROOT).as_posix(): file_digest(file) for file in sorted(files)}


def printed_help(command: Callable[[list[str]], int]) -> str:
    """What `command(["--help"])` prints (an argparse parser's help, then SystemExit), laid out
    HELP_COLUMNS wide whatever the terminal, so that the file is the same wherever it is written."""
    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)  # argparse reads the width from it
    try:
        with contextlib.redirect_stdout(out):
            command(["--help"])
    except SystemExit:
        pass
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return out.getvalue()


def live_schema() -> dict[str, Any]:
    """The file's content, read from the classes."""
    # imported here: these are the torch-importing classes the file exists to spare the command line
    from posttrain.algorithms import ALGORITHMS
    from posttrain.algorithms.preference import PREFERENCE_LOSSES
    from posttrain.envs import ENVIRONMENTS
    from posttrain.teach.check import main as check_main
    from posttrain.teach.demos import DEMOS

    sections = {**ALGORITHMS, **PREFERENCE_LOSSES}
    return {"written_by": WRITE_COMMAND + " (do not edit: rerun it)",
            "sources": source_hashes(list(sections.values())),
            "sections": {name: section_entry(cls) for name, cls in sections.items()},
            "environments": {family: parameters_taken(cls) for family, cls in ENVIRONMENTS.items()},
            "demos": list(DEMOS),
            # each demo's main parses its arguments first: --help prints and exits before any work
            "help": {"check": printed_help(check_main), **{f"demo {name}": printed_help(demo)
                                                           for name, demo in DEMOS.items()}}}


def schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=WRITE_COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file differs")
    args = parser.parse_args(argv)
    text = schema_text(live_schema())
    current = SCHEMA_PATH.read_text(encoding="utf-8") if SCHEMA_PATH.is_file() else ""
    if args.check:
        if current != text:
            print(f"{SCHEMA_PATH} is stale: rewrite it with `{WRITE_COMMAND}`", file=sys.stderr)
            return 1
        print(f"{SCHEMA_PATH} matches the classes")
        return 0
    SCHEMA_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}: {len(json.loads(text)['sections'])} sections"
          + (" (unchanged)" if current == text else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
