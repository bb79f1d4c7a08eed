"""reference/cli.md, made when the site is built from the parsers the commands build themselves
(a MkDocs hook, mkdocs.yml `hooks:`), so it cannot drift from `--help`.

Each command of `posttrain` (posttrain/cli/__init__.py COMMANDS) is called as `--help-all` would
call it, with tyro.cli and argparse's parse_args stood in for: where cli/flags.py hands tyro its
dataclass of settings, tyro's own argparse rendering of that dataclass is kept instead of parsed
(tyro.extras.get_parser, the same arguments: the same flags, sections and help text that tyro reads
from the config fields' comments); the plain argparse commands (diff, export, lessons, check, the
demos) hand over their parser the same way. Each parser's flags are then written as tables, one
per section: the flag, its type, its default and its help.

The training commands share TrainConfig: `posttrain train` is written whole, and run, rlhf,
compare and star as what they add to it or set otherwise.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
import warnings
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference/cli.md"
FULL = "train"  # the training command written whole; the others of TRAINING are written as changes to it
TRAINING = ("run", "rlhf", "compare", "star")
DEFAULT = re.compile(r"^(?P<help>.*?)\s*\(default: (?P<default>.*)\)$", re.S)  # the suffix tyro adds to a help


@dataclass
class Flag:
    names: list[str]  # its option strings, the canonical one first ("--rl.optim.lr"); a positional's metavar
    kind: str  # "FLOAT", "{true,false}", "RUN_DIR", "" for a switch that takes no value
    default: str  # as --help shows it; "" for none
    help: str


@dataclass
class Section:
    title: str  # the dotted section ("rl.optim"), or "" for the command's own flags
    about: str
    flags: list[Flag] = field(default_factory=list)


@dataclass
class Command:
    name: str  # "train", "demo bandit"
    description: str
    sections: list[Section]

    def flags(self) -> dict[str, tuple[str, Flag]]:
        return {flag.names[0]: (section.title, flag) for section in self.sections for flag in section.flags}


class Built(Exception):
    """Carries the parser a command built out of the command, before it parses anything."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def parser_of(call, argv: list[str]) -> argparse.ArgumentParser:  # type: ignore[no-untyped-def]
    """The parser `call(argv)` builds: tyro's for cli/flags.py's parse_flags, or its own argparse one."""
    import tyro
    import tyro.extras

    get_parser = getattr(tyro.extras, "get_parser", None)  # marked deprecated in tyro 1.x; its one public door
    if get_parser is None:
        raise RuntimeError(f"tyro {tyro.__version__} has no tyro.extras.get_parser, which the CLI reference reads the "
                           "commands' flags from (docs/hooks/cli_reference.py): pin tyro below this version in "
                           "pyproject.toml, or read the flags from tyro's new interface there")

    def tyro_parser(f, *, args=None, **settings):  # type: ignore[no-untyped-def]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            raise Built(get_parser(f, **settings))

    def argparse_parser(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise Built(self)

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(tyro, "cli", tyro_parser))
        stack.enter_context(mock.patch.object(argparse.ArgumentParser, "parse_args", argparse_parser))
        try:
            call(argv)
        except Built as built:
            return built.parser
    raise RuntimeError(f"{call} returned without building a parser for {argv}: the CLI reference cannot list its "
                       "flags (docs/hooks/cli_reference.py expects every command to parse its argv first)")


def kind_of(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.metavar and action.option_strings:  # a positional's metavar is its name, shown already
        return " ".join(action.metavar) if isinstance(action.metavar, tuple) else str(action.metavar)
    if action.choices:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return getattr(action.type, "__name__", "str").upper()


def flag_of(parser: argparse.ArgumentParser, action: argparse.Action) -> Flag:
    try:  # argparse's own expansion of %(default)s and %%
        text = argparse.HelpFormatter(parser.prog)._expand_help(action)
    except (KeyError, TypeError, ValueError):
        text = action.help or ""
    default = ""
    match = DEFAULT.match(text)
    if match:  # tyro writes the default into the help
        text, default = match["help"], match["default"]
    elif isinstance(action, argparse.BooleanOptionalAction):  # --x / --no-x: which one holds without either
        default = action.option_strings[0] if action.default else f"--no-{action.option_strings[0][2:]}"
    elif action.default not in (None, argparse.SUPPRESS, False) and action.nargs != 0 and action.option_strings:
        default = repr(action.default) if isinstance(action.default, str) else str(action.default)
    # the long form first, "--x" before its "--no-x", a project's underscores before a second spelling's dashes
    names = sorted(action.option_strings, key=lambda s: (not s.startswith("--"), s.startswith("--no-"), "-" in s[2:], s))
    names = names or [str(action.metavar or action.dest).upper()]  # a positional: its name, as usage shows it
    return Flag(names, kind_of(action), default, " ".join(text.split()))


def command_of(name: str, parser: argparse.ArgumentParser) -> Command:
    sections = []
    for group in parser._action_groups:  # argparse keeps its sections here; tyro makes one per config section
        title = group.title or ""
        title = "" if title in ("options", "optional arguments", "positional arguments") else title.removesuffix(
            " options")
        flags = [flag_of(parser, a) for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if not flags:
            continue
        if sections and sections[-1].title == title:  # positionals and the options, both the command's own
            sections[-1].flags += flags
        else:
            sections.append(Section(title, " ".join((group.description or "").split()), flags))
    return Command(name, parser.description or "", sections)


def commands() -> list[Command]:
    """Every command, and every demo, with the flags its parser has when --help-all is asked."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the checkout being built, not another installed posttrain
    from posttrain.cli import COMMANDS
    from posttrain.teach.demos import DEMOS

    found = []
    for name, call in COMMANDS.items():
        if name == "demo":
            found += [command_of(f"demo {demo}", parser_of(call, [demo, "--help-all"])) for demo in DEMOS]
        else:
            found.append(command_of(name, parser_of(call, ["--help-all"])))
    return found


def prose(text: str) -> str:
    """Help text as HTML: escaped, `code` spans kept."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def anchor(command: str, text: str = "") -> str:
    base = command.replace(" ", "-")
    return f"{base}-{text.lstrip('-')}" if text else base


def table(command: str, flags: list[Flag]) -> list[str]:
    """A section's flags as a table: the flag whole on one line (nowrap), its type and default under it."""
    rows = ["<table>", "<thead><tr><th>flag, type, default</th><th>what it does</th></tr></thead>", "<tbody>"]
    for flag in flags:
        names = "<br>".join(f"<code>{html.escape(n)}</code>" for n in flag.names)
        kind = f"<code>{html.escape(flag.kind)}</code>" if flag.kind else "a switch, no value"
        default = f" · default <code>{html.escape(flag.default)}</code>" if flag.default else ""
        rows.append(f'<tr id="{anchor(command, flag.names[0])}"><td style="white-space: nowrap">{names}<br>'
                    f"<small>{kind}{default}</small></td><td>{prose(flag.help)}</td></tr>")
    return rows + ["</tbody>", "</table>", ""]


def description(command: Command) -> list[str]:
    return [f"<p>{prose(' '.join(part.split()))}</p>" for part in command.description.split("\n\n") if part.strip()]


def section_heading(command: Command, section: Section, level: str) -> list[str]:
    title = f"`{section.title}`" if section.title else f"the flags of `posttrain {command.name}`"
    lines = [f"{level} {title} {{#{anchor(command.name, section.title or 'flags')}}}", ""]
    return lines + ([f"<p>{prose(section.about)}</p>", ""] if section.about else [])


def whole(command: Command) -> list[str]:
    lines = [f"## posttrain {command.name} {{#{anchor(command.name)}}}", "", *description(command), ""]
    for section in command.sections:
        lines += section_heading(command, section, "###") + table(command.name, section.flags)
    return lines


def as_changes(command: Command, full: Command) -> list[str]:
    """A training command as what it adds to `full` (train) or sets otherwise."""
    base = full.flags()
    lines = [f"## posttrain {command.name} {{#{anchor(command.name)}}}", "", *description(command), "",
             f"<p>Every flag of <a href=\"#{anchor(full.name)}\"><code>posttrain {full.name}</code></a>"]
    own = [flag for section in command.sections for flag in section.flags if flag.names[0] not in base]
    changed = [flag for section in command.sections for flag in section.flags
               if flag.names[0] in base and (flag.default, flag.kind) != (base[flag.names[0]][1].default,
                                                                          base[flag.names[0]][1].kind)]
    missing = sorted(set(base) - set(command.flags()))
    lines[-1] += (", except " + ", ".join(f"<code>{html.escape(n)}</code>" for n in missing) if missing else "")
    lines[-1] += (", and the flags below: its own, and those it sets otherwise.</p>" if own or changed
                  else ", with the same defaults.</p>")
    lines.append("")
    if own:
        lines += [f"### its own flags {{#{anchor(command.name, 'flags')}}}", ""] + table(command.name, own)
    if changed:
        lines += [f"### set otherwise than by `train` {{#{anchor(command.name, 'defaults')}}}", ""]
        lines += table(command.name, changed)
    return lines


def page(found: list[Command]) -> str:
    full = next(c for c in found if c.name == FULL)
    lines = ["# Command-line reference", "",
             "Every setting of every command: its flag, type, default and help. This page is made when the site "
             "is built, from the parsers the commands build themselves (`docs/hooks/cli_reference.py`), so it "
             "says what `posttrain COMMAND --help-all` says. Every setting is a flag named after its key in a "
             "run's `config.json`; `--config FILE` sets many at once (defaults < `--config` < flags).", "",
             "| command | what it does |", "|---|---|"]
    for command in found:
        summary = " ".join(command.description.split("\n\n")[0].split()).split(". ")[0].rstrip(".")
        lines.append(f"| [`posttrain {command.name}`](#{anchor(command.name)}) | {prose(summary).replace('|', '&#124;')} |")
    lines.append("")
    for command in found:
        lines += as_changes(command, full) if command.name in TRAINING else whole(command)
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, PAGE, content=page(commands())))
    return files
