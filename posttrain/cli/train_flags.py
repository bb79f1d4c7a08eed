"""The training commands' command line (run, train, rlhf, compare, star): a TrainConfig from
defaults < --config < flags, and a section of flags per RL algorithm and preference loss
(`--grpo.kl_coef 0.04`, `--dpo.beta 0.2`), built from each one's own dataclass; the fields set
there become rl.algo_params.

    parse_train(argv, ...)          the settings, then the sections: a ParsedTrain
    ParsedTrain.with_algo_params    the chosen algorithms' sections as rl.algo_params
    params_by_section(...)          each section's flags apart (--stages gives them to its stages)
    stages_with_sections(...)       those written into the brackets of --stages

The settings are parsed, and their values checked, before the sections are built: the
algorithms import torch (about two seconds), and a typo'd flag, a bad value or an unknown
section is answered without it. The sections' flags are then parsed against torch-free
stand-ins of the classes (cli/section_schema.py), so a typo'd or wrongly typed section flag is
answered without it too, and again against the classes, which check their ranges. `--help`
builds one parser of both, the chosen algorithms' sections only (cli/help_view.py), from the
stand-ins.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Annotated, Any

import tyro

from posttrain.cli.flags import (
    BOOLEANS,
    bool_rule,
    config_flag,
    description,
    expand_short_flags,
    flags_given,
    from_file,
    parse_flags,
    value_of,
)
from posttrain.cli.help_view import (
    HELP_ALL,
    env_fields_unread,
    help_note,
    help_registry,
    hidden_sections,
    shown_sections,
)
from posttrain.cli.section_schema import committed_schema, stand_in_sections
from posttrain.config import ConfigError, EnvConfig, RLConfig, TrainConfig, parse_stages
from posttrain.config.rl import PREFERENCE_LOSS_NAMES, RL_ALGORITHM_NAMES
from posttrain.config.type_checks import check_types


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


def torch_free_sections(rl: RLConfig) -> dict[str, Any] | None:
    """section_defaults without torch: each section's default instance of a stand-in class
    (cli/section_schema.py), whose flags, help and type errors are its class's. None while the
    schema is stale or rl.algo_params hold what only the classes can say is wrong."""
    schema = committed_schema()
    return stand_in_sections(schema, rl) if schema else None


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


def params_by_section(argv: list[str], algorithms: Any, defaults: dict[str, Any], chosen: set[str]) -> dict[str, dict]:
    """The hyperparameters set in each section of the `chosen` algorithms (`algorithms`: the
    sections as the flags left them), section by section: each field given as a flag or
    differing from its section's default. A flag of any other section is refused."""
    given = {flag[2:].partition(".") for flag in flags_given(argv)}
    sections: dict[str, dict[str, Any]] = {}
    for name, default in defaults.items():
        value = getattr(algorithms, name)
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


def section_params(argv: list[str], algorithms: Any, defaults: dict[str, Any], chosen: set[str]) -> dict[str, Any]:
    """The hyperparameters set in the sections of the `chosen` algorithms, as one
    rl.algo_params (compare gives every row the same); a flag of any other section is refused."""
    params: dict[str, Any] = {}
    for name, changed in params_by_section(argv, algorithms, defaults, chosen).items():
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
    args: Any  # the settings and the command's extra fields (compare's --algos), as parsed
    algorithms: Any  # the algorithm sections as parsed: a field per algorithm, each its dataclass
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
        params = {**start, **section_params(self.argv, self.algorithms, self.sections, chosen)}
        return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, algo_params=params))


def parse_train(argv: list[str], prog: str, summary: str, defaults: TrainConfig,
                extra: list[tuple[str, Any, Any]] = (), sections: str = "only the chosen algorithm's",
                also_shown: tuple[str, ...] = (), reads_algorithms: bool = True) -> ParsedTrain:
    """A TrainConfig from `defaults` < --config < flags, with one section of flags per
    algorithm; `extra` adds command-specific fields (compare's --algos). `--help` shows the
    sections the chosen algorithms and environment read (cli/help_view.py), and `also_shown`
    (rlhf's rl.rm); `--help-all` every one. A command that trains no algorithm (star) has
    reads_algorithms False: its --help shows no algorithm section.

    The settings are parsed and their values checked before the algorithm sections are built:
    the algorithms import torch (seconds), and a typo'd flag or a bad value is answered at once;
    so is one of a section, read first from the stand-ins (torch_free_sections)."""
    argv = expand_short_flags(argv)
    asks_all = any(token in HELP_ALL for token in argv)
    argv = ["--help" if token in HELP_ALL else token for token in argv]
    base, file = from_file(TrainConfig, argv, base=defaults)
    text = description(summary, sections)
    settings = [config_flag(), *extra, ("settings", Annotated[TrainConfig, tyro.conf.arg(name="")], base)]
    where = f"config file {value_of(argv, '--config')!r}"
    if any(token in ("-h", "--help") for token in argv):  # one parser: the help lists settings and sections
        algorithms = torch_free_sections(base.rl) or section_defaults(base.rl, where)
        registry, shown = BOOLEANS, algorithms
        if not asks_all:
            chosen = [name for name in algorithms if reads_algorithms and name in chosen_algorithms(argv, base)]
            shown = {name: algorithms[name] for name in chosen}
            registry, note = help_for_choice(chosen, flag_value(argv, "--env.name") or base.env.name, also_shown)
            text += note
        parse_flags(argv, prog, text, [*settings, *section_fields(shown)], registry)  # prints it, SystemExit
    settings_argv, sections_argv = split_section_flags(argv)
    refuse_misspelt_sections(settings_argv, {name for name, _, _ in settings})
    args = parse_flags(settings_argv, prog, text, settings)
    # their types and values, as check_config begins (checked() checks again, with what only the library knows)
    check_types(args.settings)
    args.settings.validate()
    for name, _, _ in extra:  # a command's own section (star's --star.*) is checked as early
        if dataclasses.is_dataclass(section := getattr(args, name)):
            check_types(section, f"{name}.")
            section.validate()  # type: ignore[union-attr]
    if sections_argv and (stand_ins := torch_free_sections(base.rl)):
        # a typo'd flag or a wrongly typed value of a section, refused as the classes would, before torch
        parse_flags(sections_argv, prog, text, section_fields(stand_ins))
    algorithms = section_defaults(base.rl, where)  # torch from here on: the classes check their own ranges
    parsed_sections = parse_flags(sections_argv, prog, text, section_fields(algorithms)).algorithms
    return ParsedTrain(args.settings, args, parsed_sections, argv, defaults, file, algorithms)


def split_section_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """`argv` as two command lines: the settings' (every flag but an algorithm section's, with
    the values after it) and the algorithm sections' (`--grpo.kl_coef 0.04`: a flag whose first
    part is a name rl.algo takes, config/rl.py). A flag of neither kind stays with the settings,
    whose parser refuses it."""
    names = set(RL_ALGORITHM_NAMES + PREFERENCE_LOSS_NAMES)
    settings: list[str] = []
    sections: list[str] = []
    current = settings  # a value goes where the flag before it went
    for token in argv:
        if token.startswith("--"):
            section = token[2:].partition("=")[0].partition(".")[0].replace("-", "_")
            current = sections if section in names else settings
        current.append(token)
    return settings, sections


def refuse_misspelt_sections(argv: list[str], fields: set[str]) -> None:
    """A flag whose first part is no section of the settings but close to an algorithm's name
    (`--grpoo.kl_coef`) is refused with the flag it likely meant: the settings' parser, which
    sees it, would suggest only the settings' own flags. `fields`: the parser's top fields."""
    known = fields | {field.name for field in dataclasses.fields(TrainConfig)}
    algorithms = RL_ALGORITHM_NAMES + PREFERENCE_LOSS_NAMES
    for flag in flags_given(argv):
        section, dot, rest = flag[2:].partition(".")
        if not dot or section in known:
            continue
        match = difflib.get_close_matches(section, [*known, *algorithms], n=1)
        if match and match[0] in algorithms:
            raise ConfigError(f"{flag}: there is no section {section!r}; did you mean --{match[0]}.{rest}? (the "
                              f"{match[0]} algorithm's hyperparameters are the flags --{match[0]}.*)")


def help_for_choice(algorithms: list[str], env_name: str, also_shown: tuple[str, ...]) -> tuple[Any, str]:
    """The parser registry that leaves out of --help what a run of `algorithms` on `env_name`
    does not read, and the note that names what it left out (cli/help_view.py)."""
    preference = any(name in PREFERENCE_LOSS_NAMES for name in algorithms)
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
