"""Command-line plumbing: config dataclasses -> tyro's parser -> a config.

Every setting is one flag named after its config.json key (`--rl.sampling.top_p 0.9`), with
its field's comment as help; booleans take a value (`--env.cot false`), as in config.json.
Values come from the command's defaults < a `--config FILE` < flags. The training commands'
TrainConfig, with a section of flags per algorithm (`--grpo.kl_coef 0.04`), is read by
cli/train_flags.py on top of this.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import tyro

from posttrain.cli.help_view import HELP_ALL
from posttrain.config import ConfigError
from posttrain.config.type_checks import check_types
from posttrain.config.files import MOVED, from_dict, load_file

# The short forms users type for the four settings they change most; each is the setting's
# own word. Every other setting has exactly one flag, its config.json key.
SHORT_FLAGS = {"--algo": "--rl.algo", "--steps": "--rl.steps", "--model": "--model.name", "--workers": "--dist.workers"}


# Flags that were removed: the message says what replaced them (as config.RENAMED does for keys).
REMOVED_FLAGS = {
    "--data": "--rl.preference.pairs",
    "--lora-r": "--model.lora_r",
    "--ray-address": "--dist.ray_address",
    "--rl.algo_params": "the chosen algorithm's section, e.g. --grpo.kl_coef 0.04 or --dpo.beta 0.2",
}


# Booleans take a value, `--env.cot false`, spelled as in config.json: one flag per setting
# (no --env.no_cot twin), so a run's config.json reads back as the flags that made it.
def bool_rule(info: tyro.constructors.PrimitiveTypeInfo) -> tyro.constructors.PrimitiveConstructorSpec | None:
    if info.type is not bool:
        return None
    return tyro.constructors.PrimitiveConstructorSpec(
        nargs=1, metavar="{true,false}", choices=("true", "false"), instance_from_str=lambda args: args[0] == "true",
        is_instance=lambda x: isinstance(x, bool), str_from_instance=lambda x: ["true" if x else "false"])


BOOLEANS = tyro.constructors.ConstructorRegistry()
BOOLEANS.primitive_rule(bool_rule)


def parse_flags(argv: list[str], prog: str, description: str, fields: list[tuple[str, Any, Any]],
                registry: tyro.constructors.ConstructorRegistry = BOOLEANS) -> Any:
    """Parse `argv` into a dataclass of `fields` (name, type, default instance or
    dataclasses.MISSING for a required flag). A field typed `Annotated[X,
    tyro.conf.arg(name="")]` adds X's settings without a prefix (`--rl.optim.lr`, not
    `--settings.rl.optim.lr`). tyro prints --help or what was wrong and raises SystemExit;
    `registry` (cli/help_view.py's) may leave sections out of that help."""
    spec = [(name, kind, dataclasses.field() if default is dataclasses.MISSING else
             dataclasses.field(default_factory=lambda d=default: d)) for name, kind, default in fields]
    args_type = dataclasses.make_dataclass("Args", spec, kw_only=True)
    return tyro.cli(args_type, args=argv, prog=prog, description=description, use_underscores=True,
                    config=(tyro.conf.FlagConversionOff,), registry=registry)


def flags_given(argv: list[str]) -> list[str]:
    """The flags in `argv`, in order: `--rl.optim.lr 3e-4` and `--rl.optim.lr=3e-4` both give "--rl.optim.lr",
    and `--grpo.kl-coef`, which the parser also accepts, gives "--grpo.kl_coef"."""
    return ["--" + token[2:].split("=")[0].replace("-", "_") for token in argv if token.startswith("--")]


def value_of(argv: list[str], flag: str) -> str | None:
    """The value `argv` gives `flag` (the last one, as a parser would keep), or None."""
    value = None
    for i, token in enumerate(argv):
        if token == flag:
            if i + 1 == len(argv) or argv[i + 1].startswith("--"):
                raise ConfigError(f"{flag} needs a value")
            value = argv[i + 1]
        elif token.startswith(flag + "="):
            value = token[len(flag) + 1:]
    return value


def refuse_moved_flags(argv: list[str]) -> None:
    """A setting that moved into a section (config/files.py MOVED) is refused by its old flag,
    with the new one: a config file's old key still loads, but flags are typed anew."""
    for flag in flags_given(argv):
        if flag[2:] in MOVED:
            raise ConfigError(f"{flag} moved: use --{MOVED[flag[2:]]} (the settings are grouped by concern now; a "
                              "config file, such as an older run's config.json, is read with its old keys)")


def expand_short_flags(argv: list[str]) -> list[str]:
    """`--algo grpo` -> `--rl.algo grpo`; a removed or moved flag is refused with its replacement."""
    removed = {"--" + flag[2:].replace("-", "_"): (flag, new) for flag, new in REMOVED_FLAGS.items()}
    for flag in flags_given(argv):
        if flag in removed:
            raise ConfigError("{} was removed; use {}".format(*removed[flag]))
    refuse_moved_flags(argv)
    out = []
    for token in argv:
        flag, eq, value = token.partition("=")
        out.append(SHORT_FLAGS[flag] + eq + value if flag in SHORT_FLAGS else token)
    return out


def from_file(cls: type, argv: list[str], base: Any = None) -> tuple[Any, dict]:
    """`base` (default: cls's defaults) with the --config file's values on top, and the file's data."""
    path = value_of(argv, "--config")
    if not path:
        return from_dict(cls, {}, base=base), {}
    data = load_file(path)
    try:  # the defaults are well typed, so a wrong type here is the file's: name it
        cfg = from_dict(cls, data, base=base)
        check_types(cfg)
    except ConfigError as error:
        raise ConfigError(f"config file {path!r}: {error}") from None
    return cfg, data


def config_flag() -> tuple[str, Any, str]:
    return ("config", Annotated[str, tyro.conf.arg(
        metavar="FILE", help="a JSON or TOML file of settings, e.g. a run's config.json: its values replace the "
                             "defaults, and flags replace its values; '' = defaults only")], "")


def parent_flag() -> tuple[str, Any, str]:
    return ("parent", Annotated[str, tyro.conf.arg(
        metavar="RUN_DIR", help="the run this one changes (runs/<id>): meta.json records the settings that differ "
                                "from its config.json, and more than one is warned about (change one thing at a "
                                "time); '' = no parent")], "")


def checked_parent(parent: str) -> str:
    """`parent` once it is known to be a run directory (runs/lineage.py), before anything runs."""
    if parent:
        # imported here for start-up time: runs/ loads torch for checkpoints
        from posttrain.runs.lineage import read_parent

        read_parent(parent)
    return parent


def description(summary: str, sections: str = "") -> str:
    """The text above the flags: what the command does, where values come from, and (with
    `sections`, which of them may be set) the short forms and the algorithm sections. Its
    paragraphs are parted by blank lines: the parser joins single line breaks."""
    text = f"{summary}. Values: defaults < --config FILE < flags."
    if sections:
        text += ("\n\nShort forms: " + ", ".join(f"{s} = {f}" for s, f in SHORT_FLAGS.items()) + ". An algorithm's "
                 f"hyperparameters are the flags of its section (--grpo.kl_coef 0.04): set {sections}; those "
                 "changed from its defaults become rl.algo_params.")
    return text


def checked(cfg: Any, new_run: bool = True) -> Any:
    """Values, then the names and files only the library knows, then (for a new run) where
    its directory goes; before anything starts."""
    # the types and values need no torch: a bad value is answered before it loads (check_config
    # checks them again, first, for callers that come to it directly)
    check_types(cfg)
    cfg.validate()
    # imported here for start-up time: pipelines/ loads torch and every role
    from posttrain.pipelines.checks import check_config
    from posttrain.runs.rundir import check_run_location

    check_config(cfg)
    if new_run:  # a resumed run writes into its own directory, wherever out_dir points now
        check_run_location(cfg.out_dir, cfg.name)
    return cfg


def use_threads(threads: int) -> None:
    """A command's --threads, applied as a training run applies its own (models/device.py)."""
    # imported here for start-up time: models/ loads torch, which only a command about to compute needs
    from posttrain.models.device import use_threads as apply

    apply(threads)


def parse_settings(cls: type, argv: list[str], prog: str, summary: str) -> Any:
    """A command's settings from defaults < --config < flags, their types and values checked
    (cfg.validate()): for a command that makes no run directory and needs no library check
    (systems, equivalence). Its --help shows every setting, as --help-all does."""
    refuse_moved_flags(argv)
    argv = ["--help" if token in HELP_ALL else token for token in argv]
    base, _ = from_file(cls, argv)
    fields = [config_flag(), ("settings", Annotated[cls, tyro.conf.arg(name="")], base)]
    cfg = parse_flags(argv, prog, description(summary), fields).settings
    check_types(cfg)
    cfg.validate()
    return cfg


def parse_simple(cls: type, argv: list[str], prog: str, summary: str) -> Any:
    """A command's settings that are not a TrainConfig (eval, bon, search, verify, prm, ...)
    from defaults < --config < flags, checked (parse_settings, then the names and files only
    the library knows, and where the run directory goes)."""
    return checked(parse_settings(cls, argv, prog, summary))