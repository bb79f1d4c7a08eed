"""What the command line knows of the classes that import torch, read from a file so that
`--help` and a refused flag need none of them: each algorithm's and preference loss's section
of flags (`--grpo.kl_coef`: every field's name, type, default, help text, choices and range
checks), the parameters each environment takes (which shared env settings `--help` leaves out),
the demos' names, and the --help that `posttrain check` and each `posttrain demo NAME` print
(their parsers sit beside code that needs torch). cli/write_section_schema.py writes the file from the classes:

    python -m posttrain.cli.write_section_schema     after changing or adding an algorithm

    committed_schema()            section_schema.json, or None while its sections are stale
    stand_in_sections(schema, rl) each section's default instance, of a torch-free stand-in class
    refusal(section, instance)    what the class's range checks say of an instance, or None
    environment_parameters()      {environment family: the parameters its class takes, or None for any}
    demo_names()                  the names `posttrain demo` runs
    recorded_help(command)        the --help of "check" or "demo NAME", or None

Importing the algorithms costs about two seconds (torch) of a command line that otherwise
answers in a fraction of one. A stand-in is a plain dataclass with the same name, fields,
types, defaults and help as its algorithm's class, so the parser that reads it prints the
same help and refuses the same typo'd flag or wrongly typed value with the same message. Its
__post_init__ runs the class's range checks, read out of the class's own __post_init__ into
the file as data (cli/section_checks.py), with the class's message: a value of the right type
out of range is refused without torch too. A check that could not be read (a section's
"unchecked") is the class's alone, which runs once the command goes on and torch is loaded
anyway (cli/train_flags.py).

The file records a hash of every file the sections were read from (each algorithm's module,
those it inherits from, the registries). Where one differs (someone edited an algorithm and
has not rerun the writer), committed_schema() is None and the command line reads the classes
as before: a stale section makes an answer slow, never wrong. The environments, demos and
recorded help are not hashed: a stale entry there would only show or hide a line of --help, and
their files change more often than their signatures. tests/test_section_schema.py fails while any of it
differs from the classes, with the command that rewrites it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import operator
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from posttrain.config import RLConfig
from posttrain.config.rl import PREFERENCE_LOSS_NAMES, RL_ALGORITHM_NAMES
from posttrain.config.type_checks import is_kind

SCHEMA_PATH = Path(__file__).with_name("section_schema.json")
WRITE_COMMAND = "python -m posttrain.cli.write_section_schema"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds posttrain/: sources are named from it

HELP_COLUMNS = 100  # the width the recorded --help is laid out at, whatever the terminal of whoever wrote it

# The field types a section may have, by the name the file gives them; `X | None` and
# Literal[...] of them too (cli/write_section_schema.py refuses any other).
TYPES: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str}


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale_sources(schema: dict[str, Any]) -> list[str]:
    """The files the sections were read from that have changed since (or gone)."""
    return [name for name, digest in schema["sources"].items()
            if not (PACKAGE_ROOT / name).is_file() or file_digest(PACKAGE_ROOT / name) != digest]


@functools.lru_cache(maxsize=1)
def schema_file() -> dict[str, Any] | None:
    """section_schema.json as written, or None where it is missing (an install without its
    package data) or unreadable: the classes answer instead."""
    try:
        return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def committed_schema() -> dict[str, Any] | None:
    """section_schema.json while every file its sections were read from is unchanged and it has
    a section for every algorithm name config/rl.py knows; None otherwise: read the classes."""
    schema = schema_file()
    if schema is None or stale_sources(schema):
        return None
    return schema if tuple(schema["sections"]) == RL_ALGORITHM_NAMES + PREFERENCE_LOSS_NAMES else None


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


# the comparisons a check may make, by the name section_checks.OPERATORS gives them
COMPARISONS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
               "!=": operator.ne, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
               "is": operator.is_, "is not": operator.is_not}


def evaluate(expression: list, values: dict[str, Any]) -> Any:
    """A check's test or guard, as cli/section_checks.py stores it, on a section's `values`."""
    head, *rest = expression
    if head == "field":
        return values[rest[0]]
    if head == "const":
        return rest[0]
    if head == "and":
        return all(evaluate(part, values) for part in rest)
    if head == "or":
        return any(evaluate(part, values) for part in rest)
    if head == "not":
        return not evaluate(rest[0], values)
    if head == "isinstance":
        return isinstance(evaluate(rest[0], values), tuple(TYPES[name] for name in rest[1]))
    left = evaluate(rest[0], values)  # "compare": a chain, as Python reads `0 <= x < 1`
    for name, operand in rest[1]:
        right = evaluate(operand, values)
        if not COMPARISONS[name](left, right):
            return False
        left = right
    return True


def refusal(section: dict[str, Any], values: dict[str, Any]) -> str | None:
    """What the first of the section's checks that `values` fail says, in the words of
    algorithms/contract.check_field; None where every check the file carries passes."""
    for check in section["checks"]:
        if (check["when"] is None or evaluate(check["when"], values)) and not evaluate(check["test"], values):
            allowed = "".join(part if isinstance(part, str) else str(values[part[1]]) for part in check["allowed"])
            return f"{section['class']}.{check['field']}={values[check['field']]!r} is invalid; allowed: {allowed}"
    return None


def stand_in_class(section: dict[str, Any]) -> type:
    """A plain dataclass with a section's name, fields, types, defaults and help: the parser
    builds the same flags from it as from the algorithm's class, and its __post_init__ refuses
    what the class's checks refuse, with the class's ValueError (the parser shows it)."""
    fields = [(f["name"], Annotated[field_type(f), tyro.conf.arg(help=f["help"])],
               dataclasses.field(default=f["default"])) for f in section["fields"]]

    def __post_init__(self: Any) -> None:
        message = refusal(section, {f["name"]: getattr(self, f["name"]) for f in section["fields"]})
        if message:
            raise ValueError(message)

    cls = dataclasses.make_dataclass(section["class"], fields, namespace={"__post_init__": __post_init__})
    cls.__doc__ = section["summary"]  # section_fields() heads the section with it
    return cls


def stand_in_sections(schema: dict[str, Any], rl: RLConfig) -> dict[str, Any] | None:
    """Each section's default instance as cli/train_flags.section_defaults builds it from the
    classes, out of stand-ins: max_len is the generation budget (make_algorithm's rule) and
    rl.algo's section starts from rl.algo_params. None where those params hold a name or a
    value its fields do not take, or one out of its range: the classes then say what is wrong,
    as before, naming the --config file."""
    defaults = {}
    for name, section in schema["sections"].items():
        fields = {f["name"]: f for f in section["fields"]}
        values = {"max_len": rl.sampling.max_new_tokens} if name in RL_ALGORITHM_NAMES and "max_len" in fields else {}
        if name == rl.algo:
            if not all(key in fields and fits(fields[key], value) for key, value in rl.algo_params.items()):
                return None
            values |= rl.algo_params
        try:
            defaults[name] = stand_in_class(section)(**values)
        except ValueError:
            return None
    return defaults


def parameters_taken(env_class: type) -> list[str] | None:
    """The keyword parameters an environment's class takes (make_env passes the env settings
    by name), or None for one that takes any."""
    parameters = inspect.signature(env_class).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return list(parameters)


def environment_parameters() -> dict[str, list[str] | None]:
    """{environment family: the parameters its class takes, None for any}, from the file or,
    without one, from the classes (posttrain.envs imports torch)."""
    schema = schema_file()
    if schema:
        return schema["environments"]
    from posttrain.envs import ENVIRONMENTS

    return {family: parameters_taken(cls) for family, cls in ENVIRONMENTS.items()}


def demo_names() -> list[str]:
    """The demos `posttrain demo NAME` runs, from the file or, without one, their registry."""
    schema = schema_file()
    if schema:
        return schema["demos"]
    from posttrain.teach.demos import DEMOS

    return list(DEMOS)


def recorded_help(command: str) -> str | None:
    """What `posttrain COMMAND --help` prints, for "check" and "demo NAME" (a name the demos
    have), as the file recorded it; None without the file or for a command it does not hold."""
    schema = schema_file()
    return schema["help"].get(command) if schema and "help" in schema else None
