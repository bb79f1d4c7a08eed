"""The commands that train (Loop C): `posttrain run`, `train`, `compare`, `rlhf`, `star` and
`prm`, and what they share: the TrainConfig a command line makes (train_config: flags and
--config, each algorithm section's flags as rl.algo_params, --stages), the saved config of
`--resume RUN_DIR` (resumed_config), and `--dry_run`, which checks it all and stops. Each
command parses and checks its settings, then hands them to one job in pipelines/; the jobs
are imported inside the command, for start-up time (they load torch and every role).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

import tyro

from posttrain.cli.flags import (checked, checked_parent, flags_given, parent_flag, parse_simple, use_threads,
                                 value_of)
from posttrain.cli.train_flags import params_by_section, parse_train, stages_with_sections
from posttrain.config.commands import PrmConfig, StarConfig
from posttrain.config import ConfigError, TrainConfig, parse_stages, rlhf_config
from posttrain.config.files import from_dict, to_dict
from posttrain.config.type_checks import check_types


RESUME_HELP = ("RUN_DIR: continue runs/<id> from its last checkpoint with its saved config.json (no other flag; to "
               "change settings, start a new run with --config runs/<id>/config.json); '' = a new run")


def resumed_config(argv: list[str]) -> tuple[TrainConfig, Any] | None:
    """The saved config and run of `--resume RUN_DIR`, or None without --resume."""
    run_dir = value_of(argv, "--resume")
    if run_dir is None:
        return None
    given = [flag for flag in flags_given(argv) if flag != "--resume"]
    if given:
        raise ConfigError(f"--resume continues a run with its saved config.json; drop {given} "
                          "(to change settings, start a new run with --config runs/<id>/config.json)")
    # imported here for start-up time (runs/ loads torch for checkpoints)
    from posttrain.runs.rundir import RunDir

    run = RunDir.resume(run_dir)  # refused while another process writes it
    return checked(from_dict(TrainConfig, run.read_json("config.json")), new_run=False), run


SUMMARIES = {
    "run": "the main job: SFT → GRPO → held-out eval (Loop C)",
    "train": "SFT → RL or a preference loss → held-out eval (Loop C), any setting changed",
    "rlhf": "SFT → reward model from verifier-ranked pairs → PPO against it, with the verifier's gold reward "
            "logged alongside",
}


def train_config(argv: list[str], command: str = "train") -> TrainConfig:
    """The checked TrainConfig `posttrain COMMAND ARGV` runs (command: run, train or rlhf;
    rlhf starts from config.rlhf_config() and refuses a preference loss)."""
    resume = ("resume", Annotated[str, tyro.conf.arg(metavar="RUN_DIR", help=RESUME_HELP)], "")
    dry_run = ("dry_run", Annotated[bool, tyro.conf.arg(help=DRY_RUN_HELP)], False)
    defaults = rlhf_config() if command == "rlhf" else TrainConfig()
    parsed = parse_train(argv, f"posttrain {command}", SUMMARIES[command], defaults, [resume, dry_run, parent_flag()],
                         also_shown=("rl.rm",) if command == "rlhf" else ())
    algo = parsed.cfg.rl.algo
    if command == "rlhf":
        # imported here for start-up time: the algorithms import torch
        from posttrain.algorithms.preference import PREFERENCE_LOSSES

        if algo in PREFERENCE_LOSSES:
            raise ConfigError(f"rl.algo={algo!r} is not allowed: rlhf trains an RL algorithm against the "
                              "reward model; for preference losses use `posttrain train --algo dpo`")
        from posttrain.envs import make_env
        from posttrain.roles.environment import is_multi_turn

        try:
            env = make_env(parsed.cfg.env.name, **parsed.cfg.env.kwargs())
        except (ValueError, FileNotFoundError):
            env = None  # check_config (below) says what is wrong with it
        if env is not None and is_multi_turn(env):
            raise ConfigError(f"env.name={parsed.cfg.env.name!r} is a multi-turn environment: rlhf's reward model "
                              "learns from single completions; train on it with `posttrain run` (its own reward)")
    refuse_stages(parsed.cfg, command)
    if parsed.cfg.stages:  # each algorithm section's flags go to the stages of that algorithm
        kinds = {kind for _, kind, _ in parse_stages(parsed.cfg.stages)}
        sections = params_by_section(parsed.argv, parsed.algorithms, parsed.sections, kinds)
        return checked(dataclasses.replace(parsed.cfg, stages=stages_with_sections(parsed.cfg.stages, sections)))
    return checked(parsed.with_algo_params(parsed.cfg, {algo}))


def refuse_stages(cfg: TrainConfig, command: str) -> None:
    """--stages belongs to `run` and `train`; the other training commands lay out their own stages."""
    if cfg.stages and command not in ("run", "train"):
        raise ConfigError(f"stages={cfg.stages!r} is not allowed with `posttrain {command}`, which runs its own "
                          "stages: use `posttrain train --stages ...`")


DRY_RUN_HELP = ("true: check every setting, the data, the model and its context length as a run would, print the "
                "resolved config.json, and stop: no run directory, no work")


def is_dry_run(argv: list[str]) -> bool:
    """--dry_run true (or --dry-run true), once the parser has accepted its value."""
    return "true" in (value_of(argv, "--dry_run"), value_of(argv, "--dry-run"))


def dry_run_report(cfg: TrainConfig, command: str) -> int:
    """What --dry_run prints: the config the run would save, then what the checks (already
    passed) found: the model a name resolved to, data sizes, sequence lengths."""
    from posttrain.pipelines.checks import check_config  # imported here for start-up time, as in checked()

    print(json.dumps(to_dict(cfg), indent=2))
    for found in check_config(cfg):  # passed once already; run again for its findings, as cheap as that was
        print(f"checked {found}")
    print(f"posttrain {command}: every check passed; a run would start from the settings above "
          f"in {cfg.out_dir}/ (nothing was created: --dry_run)")
    return 0


def cmd_train(argv: list[str], command: str) -> int:
    resumed = resumed_config(argv)
    cfg = resumed[0] if resumed else train_config(argv, command)
    if not resumed and is_dry_run(argv):
        return dry_run_report(cfg, command)
    # imported here for start-up time: pipelines/ loads torch and every role, which --help does not need
    from posttrain.pipelines.run import run_pipeline, start_run
    from posttrain.pipelines.stages import run_stages
    from posttrain.runs.console import console

    run = resumed[1] if resumed else start_run(cfg, command, parent=checked_parent(value_of(argv, "--parent") or ""))
    with run, run.resumable(f"posttrain {command} --resume {run.path}"):  # holds the run's lock to the end
        summary = (run_stages if cfg.stages else run_pipeline)(cfg, run)
    console.print(f"\n[bold]done[/]: {run.path}/summary.md")
    console.print((run.path / "summary.md").read_text(), markup=False)  # a stage's [settings] are text
    return 0 if summary else 1


def cmd_compare(argv: list[str]) -> int:
    if "--resume" in flags_given(argv):
        raise ConfigError("compare does not resume; rerun it (each algorithm's run directory can be resumed "
                          "on its own with `posttrain train --resume`)")
    extra = [("algos", Annotated[str, tyro.conf.arg(metavar="A,B,...", help=(
                  "the algorithms to compare, comma-separated (grpo,rloo,dr_grpo); each trains from the same SFT "
                  "checkpoint with the same settings and rl.algo_params, so only the loss differs"))], ""),
             ("online_rounds", Annotated[str, tyro.conf.arg(metavar="N,N,...", help=(
                  "preference losses only: run each one once per round count on the same budget, e.g. 1,20 for "
                  "offline against 20 online rounds; '' = one run each, with rl.preference.online_rounds"))], ""),
             ("row", Annotated[tuple[str, ...], tyro.conf.UseAppendAction, tyro.conf.arg(
                  metavar="NAME:KEY=VALUE,...", help=(
                      "one row of the comparison, instead of --algos; give it once per row. The row is the shared "
                      "settings (flags, --config) with its own on top: config.json keys (rl.optim.lr=2e-4, seed=1, "
                      "init=CHECKPOINT) or its algorithm's hyperparameters (grpo.clip_eps_high=0.28); e.g. --row "
                      "grpo --row clip_higher:grpo.clip_eps_high=0.28 --row lite:rl.algo=lite_ppo"))], ()),
             ("rows", Annotated[str, tyro.conf.arg(metavar="NAME", help=(
                  "a named set of rows, before any --row: 'progressive' is REINFORCE built up to PPO one change "
                  "per row (vanilla, + baseline, + group std, + batch std, + PPO's minibatches and clip)"))], ""),
             ("allow_different", Annotated[bool, tyro.conf.arg(help=(
                  "run rows that change what held-out pass@1 measures (env.*, heldout_size) anyway, with those "
                  "settings listed beside the table; refused by default (the locked-room rule)"))], False)]
    parsed = parse_train(argv, "posttrain compare", "several algorithms, or rows of any settings, from one SFT "
                         "checkpoint", TrainConfig(), extra,
                         sections="those of the algorithms in --algos (or the rows'), and every row gets them")
    # imported here for start-up time: pipelines/ loads torch and every role, which --help does not need
    from posttrain.pipelines.compare import check_algos, compare
    from posttrain.pipelines.compare_rows import check_rows_measure_alike, parse_rows, row_algorithms

    cfg = parsed.cfg
    refuse_stages(cfg, "compare")
    given = flags_given(parsed.argv)
    if parsed.args.row or parsed.args.rows:
        if parsed.args.algos or parsed.args.online_rounds:
            raise ConfigError("give --algos (one row per algorithm) or --row (one row per setting), not both; an "
                              "algorithm is a row's setting too: --row dapo:rl.algo=dapo")
        rows = parse_rows(list(parsed.args.row), parsed.args.rows)
        differences = check_rows_measure_alike(rows, parsed.args.allow_different)
        cfg = checked(parsed.with_algo_params(cfg, row_algorithms(rows, cfg)))
        compare(cfg, rows=rows, differences=differences)
        return 0
    algos = [a.strip() for a in parsed.args.algos.split(",") if a.strip()]
    if not algos:
        raise ConfigError("give --algos A,B,... (one row per algorithm) or --row NAME:KEY=VALUE,... (once per row)")
    check_algos(algos)
    # the shared settings are checked as the first row will run them: its algorithm (so that
    # rl.algo_params are read as its fields) and, with --online_rounds, the most rounds
    if "--rl.algo" not in given:
        cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, algo=algos[0]))
    rounds = None
    if parsed.args.online_rounds:
        if "--rl.preference.online_rounds" in given:
            raise ConfigError("give --online_rounds (a list, one run per count) or --rl.preference.online_rounds, "
                              "not both")
        try:
            rounds = [int(n) for n in parsed.args.online_rounds.split(",")]
        except ValueError:
            raise ConfigError(f"--online_rounds {parsed.args.online_rounds!r}: give comma-separated round counts, "
                              "e.g. 1,20 (1 = offline)") from None
        if rounds and all(n > 0 for n in rounds):
            preference = dataclasses.replace(cfg.rl.preference, online_rounds=max(rounds))
            cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, preference=preference))
    cfg = checked(parsed.with_algo_params(cfg, {*algos, cfg.rl.algo}))
    compare(cfg, algos, rounds)
    return 0


def cmd_rlhf(argv: list[str]) -> int:
    resumed = resumed_config(argv)
    cfg = resumed[0] if resumed else train_config(argv, "rlhf")
    if not resumed and is_dry_run(argv):
        return dry_run_report(cfg, "rlhf")
    # imported here for start-up time: pipelines/ loads torch and every role, which --help does not need
    from posttrain.pipelines.rlhf import run_rlhf
    from posttrain.pipelines.run import start_run
    from posttrain.runs.console import console

    run = resumed[1] if resumed else start_run(cfg, "rlhf", parent=checked_parent(value_of(argv, "--parent") or ""))
    with run, run.resumable(f"posttrain rlhf --resume {run.path}"):  # holds the run's lock to the end
        summary = run_rlhf(cfg, run)
    console.print(f"\n[bold]done[/]: {run.path}/summary.md")
    console.print((run.path / "summary.md").read_text())
    return 0 if summary else 1


def cmd_star(argv: list[str]) -> int:
    resumed = resumed_config(argv)
    if resumed:
        cfg, run = resumed
        saved = run.read_json("star.json")
        if saved is None:
            raise ConfigError(f"{run.path} has no star.json: it is not a `posttrain star` run; resume it with the "
                              "command that made it")
        star = from_dict(StarConfig, saved)
    else:
        star_section = ("star", Annotated[StarConfig, tyro.conf.arg(help="the STaR iterations")], StarConfig())
        resume = ("resume", Annotated[str, tyro.conf.arg(metavar="RUN_DIR", help=RESUME_HELP)], "")
        parsed = parse_train(argv, "posttrain star", "STaR / rejection-sampling fine-tuning (expert iteration) "
                             "from --init or from SFT: sample K per prompt, keep what the verifier passes, fine-tune "
                             "on it, repeat", TrainConfig(), [star_section, resume, parent_flag()],
                             sections="none of them (star fine-tunes with the SFT loss)", reads_algorithms=False)
        star = parsed.args.star  # its values checked by parse_train, before torch
        refuse_stages(parsed.cfg, "star")
        cfg = parsed.with_algo_params(parsed.cfg, set())  # refuses any --<algo>.* flag: nothing here reads it
        cfg = checked(dataclasses.replace(cfg, name=cfg.name or f"{cfg.env.name}-star"))
    # imported here for start-up time: pipelines/ loads torch and every role, which --help does not need
    from posttrain.pipelines.run import start_run
    from posttrain.pipelines.star import check_star, run_star
    from posttrain.runs.console import console

    check_star(cfg, checked_star(star))
    if not resumed:
        run = start_run(cfg, "star", parent=checked_parent(value_of(argv, "--parent") or ""))
    with run, run.resumable(f"posttrain star --resume {run.path}"):  # holds the run's lock to the end
        run_star(cfg, star, run)
    console.print(f"\n[bold]done[/]: {run.path}/summary.md")
    console.print((run.path / "summary.md").read_text())
    return 0


def checked_star(star: StarConfig) -> StarConfig:
    """`star` once its types and values are checked (a resumed run's star.json too)."""
    check_types(star, "star.")
    star.validate()
    return star


def cmd_prm(argv: list[str]) -> int:
    cfg = parse_simple(PrmConfig, argv, "posttrain prm", "an outcome or process reward model, trained and measured")
    use_threads(cfg.threads)
    # imported here for start-up time: pipelines/ loads torch
    from posttrain.pipelines.prm import run_prm

    run_prm(cfg)
    return 0
