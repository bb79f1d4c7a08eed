"""What the command line knows of the classes that import torch, written down so that `--help`
and a refused flag need none of them: each algorithm's and preference loss's section of flags
(`--grpo.kl_coef`: every field's name, type, default, help text and choices), the parameters
each environment takes (which shared env settings `--help` leaves out) and the demos' names.

    python -m posttrain.cli.section_schema --write    rewrite section_schema.json from the classes
    python -m posttrain.cli.section_schema --check    say whether it is up to date (exit 1 if not)

    committed_schema()           the committed section_schema.json, or None while it is stale
    live_schema()                the same, read from the classes themselves (imports torch)
    stand_in_sections(schema, rl) each section's default instance, as a torch-free stand-in class
    environment_parameters()     {environment family: the parameters its class takes, or None for any}
    demo_names()                 the names `posttrain demo` runs

Importing the algorithms costs about two seconds (torch) of a command line that otherwise
answers in a fraction of one. A stand-in is a plain dataclass with the same name, fields,
types, defaults and help as its algorithm's class, so the parser that reads it prints the
same help and refuses the same typo'd flag or wrongly typed value with the same message; what
it lacks is the class's own range checks (__post_init__), which the real class runs once the
command goes on and torch is loaded anyway (cli/train_flags.py).

The file records a hash of every source file it was read from. Where one differs (someone
edited an algorithm and has not rerun the writer), committed_schema() is None and the command
line reads the classes as before: a stale schema makes an answer slow, never wrong.
tests/test_section_schema.py fails until the writer is rerun, with the command that does it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import inspect
import json
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from posttrain.config import RLConfig
from posttrain.config.rl import PREFERENCE_LOSS_NAMES, RL_ALGORITHM_NAMES
from posttrain.config.type_checks import is_kind

SCHEMA_PATH = Path(__file__).with_name("section_schema.json")
WRITE_COMMAND = "python -m posttrain.cli.section_schema --write"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds posttrain/: sources are named from it

# The field types a section may have, by the name the schema writes; `X | None` and
# Literal[...] of them too. Another type needs a line here and in field_type().
TYPES: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str}

# the modules whose registries the schema copies: an added entry changes these files
REGISTRY_MODULES = ("posttrain.algorithms", "posttrain.algorithms.preference", "posttrain.envs",
                    "posttrain.teach.demos")


# --- reading the classes (the writer's side: imports torch) -----------------------------------


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
        raise TypeError(f"{where}: the type {hint!r} has no flag in the schema; section_schema.py reads "
                        f"{', '.join(TYPES)}, Literal[...] of one of them and X | None: add it to TYPES there")
    default = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
    try:
        json.dumps(default, allow_nan=False)
    except (TypeError, ValueError):
        raise TypeError(f"{where}: its default {default!r} cannot be written as JSON; give it a default of its "
                        "type (a number, a string, true/false or None)") from None
    # the function tyro's parser calls for a field's help (its docstring or the comment beside
    # it), so that the schema holds the text the help showed
    from tyro._docstrings import get_field_docstring

    return {"name": field.name, "type": names[hint], "optional": optional, "choices": choices, "default": default,
            "help": get_field_docstring(cls, field.name, ())}


def section_entry(cls: type) -> dict[str, Any]:
    """A section: its class's name, the first line of its docstring and its fields, in order."""
    hints = typing.get_type_hints(cls)
    return {"class": cls.__name__, "summary": (cls.__doc__ or "").strip().split("\n")[0],
            "fields": [field_entry(cls, f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]}


def parameters_taken(env_class: type) -> list[str] | None:
    """The keyword parameters an environment's class takes (make_env passes the env settings
    by name), or None for one that takes any."""
    parameters = inspect.signature(env_class).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return list(parameters)


def source_hashes(classes: list[type]) -> dict[str, str]:
    """{file, named from the folder that holds posttrain/: its sha256} of every file that
    defines one of `classes` or a class they inherit from, and of the registries' modules."""
    files = {Path(inspect.getsourcefile(sys.modules[name]) or "") for name in REGISTRY_MODULES}
    for cls in classes:
        files |= {Path(inspect.getsourcefile(base) or "") for base in cls.__mro__
                  if base.__module__.startswith("posttrain.")}
    return {file.resolve().relative_to(PACKAGE_ROOT).as_posix(): hashlib.sha256(file.read_bytes()).hexdigest()
            for file in sorted(files)}


def live_schema() -> dict[str, Any]:
    """The schema read from the classes: what --write writes and the test compares."""
    from posttrain.algorithms import ALGORITHMS
    from posttrain.algorithms.preference import PREFERENCE_LOSSES
    from posttrain.envs import ENVIRONMENTS
    from posttrain.teach.demos import DEMOS

    sections = {**ALGORITHMS, **PREFERENCE_LOSSES}
    return {"written_by": WRITE_COMMAND + " (do not edit: rerun it)",
            "sources": source_hashes([*sections.values(), *ENVIRONMENTS.values()]),
            "sections": {name: section_entry(cls) for name, cls in sections.items()},
            "environments": {family: parameters_taken(cls) for family, cls in ENVIRONMENTS.items()},
            "demos": list(DEMOS)}


def schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=1, ensure_ascii=False) + "\n"


# --- reading the file (the command line's side: no torch) -------------------------------------


def stale_sources(schema: dict[str, Any]) -> list[str]:
    """The files the schema was read from that have changed since (or gone)."""
    changed = []
    for name, digest in schema["sources"].items():
        path = PACKAGE_ROOT / name
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            changed.append(name)
    return changed


@functools.lru_cache(maxsize=1)
def committed_schema() -> dict[str, Any] | None:
    """section_schema.json while every file it was read from is unchanged and it has a section
    for every algorithm name config/rl.py knows; None otherwise, and the caller reads the classes."""
    try:
        schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # missing (an install without package data) or broken: the classes answer instead
    if stale_sources(schema) or tuple(schema["sections"]) != RL_ALGORITHM_NAMES + PREFERENCE_LOSS_NAMES:
        return None
    return schema


def field_type(entry: dict[str, Any]) -> Any:
    """The annotation a field entry stands for: float, int | None, Literal['a', 'b'], ..."""
    kind: Any = Literal[tuple(entry["choices"])] if entry["choices"] else TYPES[entry["type"]]
    return kind | None if entry["optional"] else kind


def fits(entry: dict[str, Any], value: Any) -> bool:
    """Whether `value` (from a --config file's rl.algo_params) is a value of the field, as
    pipelines/algorithm_settings.py types it."""
    if value is None:
        return entry["optional"]
    return is_kind(value, TYPES[entry["type"]]) and (not entry["choices"] or value in entry["choices"])


def stand_in_class(section: dict[str, Any]) -> type:
    """A plain dataclass with a section's name, fields, types, defaults and help: the parser
    builds the same flags from it as from the algorithm's class."""
    fields = [(f["name"], Annotated[field_type(f), tyro.conf.arg(help=f["help"])], dataclasses.field(default=f["default"]))
              for f in section["fields"]]
    cls = dataclasses.make_dataclass(section["class"], fields)
    cls.__doc__ = section["summary"]  # section_fields() heads the section with it
    return cls


def stand_in_sections(schema: dict[str, Any], rl: RLConfig) -> dict[str, Any] | None:
    """Each section's default instance as cli/train_flags.section_defaults builds it from the
    classes, out of stand-ins: max_len is the generation budget (make_algorithm's rule) and
    rl.algo's section starts from rl.algo_params. None where those params hold a name or a
    value its fields do not take: the classes then say what is wrong, as before."""
    defaults = {}
    for name, section in schema["sections"].items():
        fields = {f["name"]: f for f in section["fields"]}
        values = {"max_len": rl.sampling.max_new_tokens} if name in RL_ALGORITHM_NAMES and "max_len" in fields else {}
        if name == rl.algo:
            if not all(key in fields and fits(fields[key], value) for key, value in rl.algo_params.items()):
                return None
            values |= rl.algo_params
        defaults[name] = stand_in_class(section)(**values)
    return defaults


def environment_parameters() -> dict[str, list[str] | None]:
    """{environment family: the parameters its class takes, None for any}, from the schema
    or, while it is stale, from the classes (posttrain.envs imports torch)."""
    schema = committed_schema()
    if schema:
        return schema["environments"]
    from posttrain.envs import ENVIRONMENTS

    return {family: parameters_taken(cls) for family, cls in ENVIRONMENTS.items()}


def demo_names() -> list[str]:
    """The demos `posttrain demo NAME` runs, from the schema or, while it is stale, their registry."""
    schema = committed_schema()
    if schema:
        return schema["demos"]
    from posttrain.teach.demos import DEMOS

    return list(DEMOS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posttrain.cli.section_schema",
                                     description="Rewrite or check posttrain/cli/section_schema.json, the algorithm "
                                                 "sections, environments and demos the command line reads without "
                                                 "torch. Rerun --write after changing an algorithm's fields, adding "
                                                 "one, or merging branches that did.")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="read the classes and write the file")
    action.add_argument("--check", action="store_true", help="exit 1 if the file differs from the classes")
    args = parser.parse_args(argv)
    text = schema_text(live_schema())
    if args.write:
        SCHEMA_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {SCHEMA_PATH} ({len(json.loads(text)['sections'])} sections)")
        return 0
    current = SCHEMA_PATH.read_text(encoding="utf-8") if SCHEMA_PATH.is_file() else ""
    if current != text:
        print(f"{SCHEMA_PATH} is stale: rewrite it with `{WRITE_COMMAND}`", file=sys.stderr)
        return 1
    print(f"{SCHEMA_PATH} matches the classes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
