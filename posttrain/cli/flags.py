"""Command-line plumbing: config dataclasses -> tyro's parser -> a config.

Every setting is one flag named after its config.json key (`--rl.sampling.top_p 0.9`), with
its field's comment as help; booleans take a value (`--env.cot false`), as in config.json.
Each RL algorithm and preference loss has a section of flags built from its own dataclass
(`--grpo.kl_coef 0.04`); the fields set there become `rl.algo_params`. Values come from the
command's defaults < a `--config FILE` < flags.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import tyro

from posttrain.cli.help_view import (
    HELP_ALL,
    env_fields_unread,
    help_note,
    help_registry,
    hidden_sections,
    shown_sections,
)
from posttrain.config import ConfigError, EnvConfig, RLConfig, TrainConfig, parse_stages
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


# ---------------------------------------------------------------------------------------
# algorithm sections: --grpo.kl_coef, --dpo.beta, ... -> rl.algo_params
# ---------------------------------------------------------------------------------------


def section_defaults(rl: RLConfig, where: str = "--config") -> dict[str, Any]:
    """Every registered RL algorithm's and preference loss's default instance, built as
    pipelines/build.py builds the one that runs: max_len (Dr.GRPO's divisor, DAPO's L_max)
    is the generation budget rl.sampling.max_new_tokens, and rl.algo's section starts from
    rl.algo_params (those of a --config file, `where` in an error), typed against its fields
    as it is read."""
    # imported here for start-up time: the algorithms import torch, which `posttrain --help` does not need
    from posttrain.algorithms import ALGORITHMS, make_algorithm
    from posttrain.algorithms.preference import PREFERENCE_LOSSES, make_preference_loss
    from posttrain.pipelines.algorithm_settings import algorithm_settings

    defaults = {name: make_algorithm(name, budget=rl.sampling.max_new_tokens) for name in ALGORITHMS}
    defaults |= {name: make_preference_loss(name) for name in PREFERENCE_LOSSES}
    if rl.algo in defaults and rl.algo_params:  # a --config file's (or the command's defaults')
        try:
            defaults[rl.algo] = algorithm_settings(rl)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
    return defaults


def section_fields(defaults: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """One unprefixed field holding a dataclass with a field per algorithm, so that each
    algorithm's hyperparameters are flags `--<algo>.<field>` with their comments as help."""
    spec = []
    for name, algo in defaults.items():
        doc = (type(algo).__doc__ or "").strip().split("\n")[0]
        about = f"--algo {name}: {doc}"
        spec.append((name, Annotated[type(algo), tyro.conf.arg(help=about)],
                     dataclasses.field(default_factory=lambda a=algo: a)))
    sections = dataclasses.make_dataclass("Algorithms", spec, kw_only=True)
    return [("algorithms", Annotated[sections, tyro.conf.arg(name="")], sections())]


def params_by_section(argv: list[str], parsed: Any, defaults: dict[str, Any], chosen: set[str]) -> dict[str, dict]:
    """The hyperparameters set in each section of the `chosen` algorithms, section by
    section: each field given as a flag or differing from its section's default. A flag of
    any other section is refused."""
    given = {flag[2:].partition(".") for flag in flags_given(argv)}
    sections: dict[str, dict[str, Any]] = {}
    for name, default in defaults.items():
        value = getattr(parsed.algorithms, name)
        changed = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                   if getattr(value, f.name) != getattr(default, f.name) or (name, ".", f.name) in given}
        if not changed:
            continue
        if name not in chosen:
            flags = [f"--{name}.{field}" for field in changed]
            raise ConfigError(f"{', '.join(flags)}: the {name} section is not allowed here: expected only flags of "
                              f"{' or '.join(f'--{c}.*' for c in sorted(chosen))} (set --algo {name} to train {name})")
        sections[name] = changed
    return sections


def section_params(argv: list[str], parsed: Any, defaults: dict[str, Any], chosen: set[str]) -> dict[str, Any]:
    """The hyperparameters set in the sections of the `chosen` algorithms, as one
    rl.algo_params (compare gives every row the same); a flag of any other section is refused."""
    params: dict[str, Any] = {}
    for name, changed in params_by_section(argv, parsed, defaults, chosen).items():
        for field, v in changed.items():
            if field in params and params[field] != v:
                raise ConfigError(f"--{name}.{field}={v!r} is not allowed: another section set {field}="
                                  f"{params[field]!r}, and every row of compare gets the same rl.algo_params")
            params[field] = v
    return params


def stages_with_sections(stages: str, sections: dict[str, dict[str, Any]]) -> str:
    """`stages` with each algorithm section's flags written into the brackets of every stage
    of that algorithm (`--dpo.nll_coef 1`: "dpo" -> "dpo[dpo.nll_coef=1]"), where the stage
    does not set the field itself: config.json then holds each stage's settings in one place."""
    items = []
    for _, kind, settings in parse_stages(stages):
        merged = dict(settings)
        for field, value in sections.get(kind, {}).items():
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            if any(c in text for c in ",[]="):
                raise ConfigError(f"--{kind}.{field}={value!r}: a stage setting cannot hold ',', '[', ']' or '='")
            merged.setdefault(f"{kind}.{field}", text)
        items.append(kind + (f"[{','.join(f'{k}={v}' for k, v in merged.items())}]" if merged else ""))
    return ",".join(items)


@dataclasses.dataclass
class ParsedTrain:
    """What parse_train read, kept until the chosen algorithm is known (compare picks it
    after parsing) and its section can become rl.algo_params."""

    cfg: TrainConfig  # defaults < --config < flags, rl.algo_params not yet from the sections
    args: Any  # everything parsed: the settings, the sections, extra fields (compare's --algos)
    argv: list[str]  # with the short flags expanded
    defaults: TrainConfig  # the command's defaults: TrainConfig() or rlhf_config()
    file: dict[str, Any]  # the --config file's data ({} without one)
    sections: dict[str, Any]  # each algorithm section's default instance

    def with_algo_params(self, cfg: TrainConfig, chosen: set[str]) -> TrainConfig:
        """cfg with rl.algo_params = the defaults' (while cfg keeps their algorithm) < --config's
        < the `chosen` sections' flags. The defaults' params belong to their algorithm: rlhf's
        PPO kl_coef is not another algorithm's."""
        start = self.cfg.rl.algo_params
        if "algo_params" not in self.file.get("rl", {}) and cfg.rl.algo != self.defaults.rl.algo:
            start = {}
        params = {**start, **section_params(self.argv, self.args, self.sections, chosen)}
        return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, algo_params=params))


def parse_train(argv: list[str], prog: str, summary: str, defaults: TrainConfig,
                extra: list[tuple[str, Any, Any]] = (), sections: str = "only the chosen algorithm's",
                also_shown: tuple[str, ...] = (), reads_algorithms: bool = True) -> ParsedTrain:
    """A TrainConfig from `defaults` < --config < flags, with one section of flags per
    algorithm; `extra` adds command-specific fields (compare's --algos). `--help` shows the
    sections the chosen algorithms and environment read (cli/help_view.py), and `also_shown`
    (rlhf's rl.rm); `--help-all` every one. A command that trains no algorithm (star) has
    reads_algorithms False: its --help shows no algorithm section."""
    argv = expand_short_flags(argv)
    asks_all = any(token in HELP_ALL for token in argv)
    argv = ["--help" if token in HELP_ALL else token for token in argv]
    base, file = from_file(TrainConfig, argv, base=defaults)
    algorithms = section_defaults(base.rl, f"config file {value_of(argv, '--config')!r}")
    text, registry, shown = description(summary, sections), BOOLEANS, algorithms
    if not asks_all and any(token in ("-h", "--help") for token in argv):
        chosen = [name for name in algorithms if reads_algorithms and name in chosen_algorithms(argv, base)]
        shown = {name: algorithms[name] for name in chosen}
        registry, note = help_for_choice(chosen, flag_value(argv, "--env.name") or base.env.name, also_shown)
        text += note
    fields = [config_flag(), *extra, ("settings", Annotated[TrainConfig, tyro.conf.arg(name="")], base),
              *section_fields(shown)]
    args = parse_flags(argv, prog, text, fields, registry)
    return ParsedTrain(args.settings, args, argv, defaults, file, algorithms)


def help_for_choice(algorithms: list[str], env_name: str, also_shown: tuple[str, ...]) -> tuple[Any, str]:
    """The parser registry that leaves out of --help what a run of `algorithms` on `env_name`
    does not read, and the note that names what it left out (cli/help_view.py)."""
    # imported here for start-up time; section_defaults has loaded the algorithms already
    from posttrain.algorithms.preference import PREFERENCE_LOSSES

    preference = any(name in PREFERENCE_LOSSES for name in algorithms)
    hidden, paths = hidden_sections(TrainConfig, shown_sections(env_name, preference, also_shown))
    unread = env_fields_unread(env_name)
    hidden[EnvConfig] = hidden.get(EnvConfig, set()) | set(unread)
    paths = [f"env.{name}" for name in unread] + paths
    return help_registry(hidden, [bool_rule]), help_note(paths, algorithms, f"--env.name {env_name}")


def flag_value(argv: list[str], flag: str) -> str | None:
    """value_of for a help request, which may be typed half-way (`--algo --help`): None where
    the flag has no value yet."""
    try:
        return value_of(argv, flag)
    except ConfigError:
        return None


def chosen_algorithms(argv: list[str], base: TrainConfig) -> set[str]:
    """The algorithms a command line chooses, for its --help: rl.algo, compare's --algos, and
    the kinds of --stages."""
    chosen = {flag_value(argv, "--rl.algo") or base.rl.algo}
    chosen |= {name.strip() for name in (flag_value(argv, "--algos") or "").split(",") if name.strip()}
    try:
        chosen |= {kind for _, kind, _ in parse_stages(flag_value(argv, "--stages") or base.stages)}
    except ConfigError:
        pass  # --stages that cannot be read are refused when the command runs; the help shows rl.algo's
    return chosen


def checked(cfg: Any, new_run: bool = True) -> Any:
    """Values, then the names and files only the library knows, then (for a new run) where
    its directory goes; before anything starts."""
    # imported here for start-up time: pipelines/ loads torch and every role
    from posttrain.pipelines.checks import check_config
    from posttrain.runs.rundir import check_run_location

    check_config(cfg)
    if new_run:  # a resumed run writes into its own directory, wherever out_dir points now
        check_run_location(cfg.out_dir, cfg.name)
    return cfg


def parse_simple(cls: type, argv: list[str], prog: str, summary: str) -> Any:
    """A command's settings that are not a TrainConfig (eval, bon, search, verify, prm, ...)
    from defaults < --config < flags, checked. Their --help shows every setting, as
    --help-all does."""
    refuse_moved_flags(argv)
    argv = ["--help" if token in HELP_ALL else token for token in argv]
    base, _ = from_file(cls, argv)
    fields = [config_flag(), ("settings", Annotated[cls, tyro.conf.arg(name="")], base)]
    return checked(parse_flags(argv, prog, description(summary), fields).settings)
