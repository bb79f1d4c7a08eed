"""What `--help` shows of a training command: the settings a run of the chosen algorithm and
environment reads, not every setting of every algorithm and task (1,168 lines before it
chose). `--help-all` shows everything; every flag parses either way.

    HELP_ALL                        the flags that ask for every section
    shown_sections(...)             the dotted sections `--help` shows for a choice
    hidden_sections(cls, shown)     {section class: its section fields left out}, and their paths
    env_fields_unread(env_name)     the shared env settings the chosen environment does not take
    help_note(...)                  the paragraph that names what the help left out
    help_registry(hidden)           a parser registry that leaves those fields out of the help

Shown always: the run's own settings (seed, init, device, ...), the policy (`model`), the task
(`env`: the shared settings the chosen `--env.name` takes, and its own section), the RL
stage's top (`rl`: algo, steps, prompts and samples per step) and its optimizer (`rl.optim`),
and the sections of the chosen algorithms (`--grpo.*`). The rest is named at the top of the
help, one flag away: sft and dist, which a run changes rarely once set, the RL sections of
other concerns, and the sections a choice turns on (`rl.preference` with a preference loss,
`rl.rm` with rlhf).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import tyro

from posttrain.cli.section_schema import environment_parameters
from posttrain.config import EnvConfig

HELP_ALL = ("--help-all", "--help_all")

# the sections every training command's --help shows (dotted config.json keys)
ALWAYS_SHOWN = ("model", "env", "rl", "rl.optim")


def shown_sections(env_name: str, preference: bool, also: tuple[str, ...] = ()) -> set[str]:
    """The dotted sections `--help` shows for a run of env.name `env_name` and an algorithm
    that is a preference loss or not; `also`: the ones a command reads on top (rlhf: rl.rm)."""
    section = EnvConfig(name=env_name).section()
    return {*ALWAYS_SHOWN, *((f"env.{section}",) if section else ()), *(("rl.preference",) if preference else ()),
            *also}


def hidden_sections(cls: type, shown: set[str], prefix: str = "") -> tuple[dict[type, set[str]], list[str]]:
    """The section fields of `cls` (and of the shown sections inside it) that are not in
    `shown`: {class: field names} for help_registry, and their dotted paths, in order."""
    hidden: dict[type, set[str]] = {}
    paths: list[str] = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if not dataclasses.is_dataclass(hints[field.name]):
            continue
        path = prefix + field.name
        if path in shown:
            inner, inner_paths = hidden_sections(hints[field.name], shown, path + ".")
            hidden.update(inner)
            paths += inner_paths
        else:
            hidden.setdefault(cls, set()).add(field.name)
            paths.append(path)
    return hidden, paths


def env_fields_unread(env_name: str) -> list[str]:
    """The settings of env's top (path, columns, cot, ...) that the environment `env_name` does
    not take, read from the parameters of its class as make_env passes them (kept in
    cli/section_schema.json, so that --help needs no torch); none for a name it does not know
    (the run refuses it) or a class that takes any setting."""
    taken = environment_parameters().get(env_name.partition(":")[0], None)  # the family: env_family's rule
    if taken is None:
        return []
    hints = typing.get_type_hints(EnvConfig)
    return [f.name for f in dataclasses.fields(EnvConfig)
            if not dataclasses.is_dataclass(hints[f.name]) and f.name not in taken and f.name != "name"]


def help_registry(hidden: dict[type, set[str]], primitive_rules: list[Any]) -> tyro.constructors.ConstructorRegistry:
    """A registry with `primitive_rules` (cli/flags.py's booleans) whose dataclasses leave the
    `hidden` fields out of the help: tyro builds each as usual (help text from the field
    comments), and the hidden ones are marked tyro.conf.Suppress."""
    registry = tyro.constructors.ConstructorRegistry()
    for rule in primitive_rules:
        registry.primitive_rule(rule)
    building: set[type] = set()  # the class whose usual spec is being asked for, below

    @registry.struct_rule
    def leave_out(info: tyro.constructors.StructTypeInfo) -> tyro.constructors.StructConstructorSpec | None:
        names = hidden.get(info.type)
        if not names or info.type in building:
            return None
        building.add(info.type)
        try:  # the spec tyro would build without this rule
            spec = tyro.constructors.ConstructorRegistry.get_struct_spec(info)
        finally:
            building.discard(info.type)
        if not isinstance(spec, tyro.constructors.StructConstructorSpec):
            return None
        fields = tuple(dataclasses.replace(f, type=tyro.conf.Suppress[f.type]) if f.name in names else f
                       for f in spec.fields)
        return dataclasses.replace(spec, fields=fields)

    return registry


def help_note(paths: list[str], algorithms: list[str], environment: str) -> str:
    """The paragraph above the flags that says what this help leaves out and how to see it."""
    algorithms_text = f"--algo {' and '.join(algorithms)}" if algorithms else "this command"
    return (f"\n\nShown: what {algorithms_text} on {environment} reads. --help-all shows every section, also "
            f"{', '.join(paths)}, and the other algorithms' (--algo NAME --help: NAME's).")
