"""`posttrain` command line.

    posttrain run                      the main job: SFT → GRPO → held-out eval (Loop C)
    posttrain train --algo NAME ...    the same pipeline with any setting changed
    posttrain train --resume runs/ID   continue a killed run from its last checkpoint
    posttrain compare --algos a,b,c    several algorithms from one SFT checkpoint: one table, one plot
    posttrain compare --algos dpo --online_rounds 1,20
                                       offline against online DPO on the same budget
    posttrain rlhf                     SFT → reward model → PPO against it, proxy vs gold reward plotted
    posttrain eval --checkpoint DIR    held-out pass@1 of a checkpoint (Loop A)
    posttrain eval --completions FILE  score a file of completions, failures by reason (Loop A)
    posttrain bon [--pack bon --n 8]   best-of-N selection, pass@1 vs pass@N vs pass@k (Loop B)
    posttrain diff RUN_A RUN_B         paired bootstrap: is the difference real or noise?
    posttrain lessons [NN] [--edit]    the interactive lessons (marimo), served on localhost
    posttrain check NN                 test your solution to lesson NN's code exercise (exercises/)
    posttrain demo NAME                toy demos: bandit, two_step_mdp, kl_tradeoff, tokens, gridworld_ppo, sentiment_steering

Every setting is a flag named after its place in the config (`--rl.lr 3e-4`), and
`--config FILE` (JSON or TOML, e.g. a run's config.json) sets many at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import dataclasses
import json
import typing

from posttrain.config import BonConfig, ConfigError, EvalConfig, TrainConfig, from_dict, load_file, to_dict
from posttrain.pipelines.build import check_config, is_preference

TRAIN_SHORTCUTS = {"algo": "rl.algo", "steps": "rl.steps", "data": "rl.pairs", "model": "model.name", "lora-r": "model.lora_r", "workers": "dist.workers", "ray-address": "dist.ray_address"}


def _flat_fields(cls: type, prefix: str = "") -> dict[str, Any]:
    """{'rl.sampling.temperature': float, ...} for every leaf field of a config class."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out.update(_flat_fields(hint, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = hint
    return out


def add_config_flags(parser: argparse.ArgumentParser, cls: type, shortcuts: dict[str, str] | None = None) -> None:
    """One `--a.b.c VALUE` flag per leaf field, plus short aliases such as `--algo`."""
    defaults = to_dict(cls())
    for dotted, hint in _flat_fields(cls).items():
        value = defaults
        for part in dotted.split("."):
            value = value[part]
        type_name = getattr(hint, "__name__", str(hint))
        flags = [f"--{dotted}"] + [f"--{s}" for s, target in (shortcuts or {}).items() if target == dotted]
        parser.add_argument(*flags, dest=dotted, default=None, metavar=type_name.upper(), help=f"(default: {value!r})")


def resolve(cls: type, args: argparse.Namespace, base: dict[str, Any] | None = None) -> Any:
    """Defaults < file < flags, then validate."""
    data = json.loads(json.dumps(base or {}))
    for dotted in _flat_fields(cls):
        value = getattr(args, dotted, None)
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    config = from_dict(cls, data)
    check_config(config)
    return config


def _train_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="a JSON or TOML file of settings (flags override it)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue runs/<id> from its last checkpoint")
    add_config_flags(parser, TrainConfig, TRAIN_SHORTCUTS)
    return parser


def cmd_train(argv: list[str], command: str) -> int:
    from posttrain.runs.console import console
    from posttrain.pipelines.run import run_pipeline, start_run
    from posttrain.runs.rundir import RunDir

    parser = _train_parser(f"posttrain {command}", __doc__.split("\n")[0])
    args = parser.parse_args(argv)
    if args.resume:
        given = [a for a in argv if a.startswith("--") and a.split("=")[0] != "--resume"]
        if given:
            raise ConfigError(f"--resume continues a run with its saved config.json; drop {given} "
                              "(to change settings, start a new run with --config runs/<id>/config.json)")
        run = RunDir.open(args.resume)
        cfg = from_dict(TrainConfig, run.read_json("config.json"))
        check_config(cfg)
    else:
        cfg = resolve(TrainConfig, args, load_file(args.config) if args.config else None)
        run = start_run(cfg, command)
    summary = run_pipeline(cfg, run)
    console.print(f"\n[bold]done[/]: {run.path}/summary.md")
    console.print((run.path / "summary.md").read_text())
    return 0 if summary else 1


def cmd_compare(argv: list[str]) -> int:
    from posttrain.pipelines.compare import check_algos, compare

    parser = _train_parser("posttrain compare", "several algorithms from one SFT checkpoint")
    parser.add_argument("--algos", required=True, help="comma-separated algorithm names, e.g. grpo,rloo,dr_grpo")
    parser.add_argument("--online_rounds", metavar="N,N,...",
                        help="preference losses only: run each one once per round count on the same budget, "
                             "e.g. 1,20 for offline against 20 online rounds")
    args = parser.parse_args(argv)
    if args.resume:
        raise ConfigError("compare does not resume; rerun it (each algorithm's run directory can be resumed "
                          "on its own with `posttrain train --resume`)")
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    check_algos(algos)
    # the shared settings are checked as the first row will run them: its algorithm (so that
    # rl.algo_params are read as its fields) and, with --online_rounds, the most rounds
    if getattr(args, "rl.algo") is None:
        setattr(args, "rl.algo", algos[0])
    rounds = None
    if args.online_rounds is not None:
        if getattr(args, "rl.online_rounds") is not None:
            raise ConfigError("give --online_rounds (a list, one run per count) or --rl.online_rounds, not both")
        try:
            rounds = [int(n) for n in args.online_rounds.split(",")]
        except ValueError:
            raise ConfigError(f"--online_rounds {args.online_rounds!r}: give comma-separated round counts, "
                              "e.g. 1,20 (1 = offline)") from None
        if rounds and all(n > 0 for n in rounds):
            setattr(args, "rl.online_rounds", str(max(rounds)))
    cfg = resolve(TrainConfig, args, load_file(args.config) if args.config else None)
    compare(cfg, algos, rounds)
    return 0


# What `posttrain rlhf` changes from `posttrain train`'s defaults (flags and --config win).
RLHF_DEFAULTS: dict[str, Any] = {
    "name": "rlhf",
    # PPO with its value head, and a KL penalty in the reward: InstructGPT's setting
    "rl": {"algo": "ppo", "algo_params": {"kl_coef": 0.05}},
}


def merge(base: dict, over: dict) -> dict:
    """Nested dict `over` on top of `base`."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def cmd_rlhf(argv: list[str]) -> int:
    from posttrain.pipelines.rlhf import run_rlhf
    from posttrain.pipelines.run import start_run
    from posttrain.runs.console import console
    from posttrain.runs.rundir import RunDir

    parser = _train_parser("posttrain rlhf", "SFT → reward model from verifier-ranked pairs → PPO against it, "
                                              "with the verifier's gold reward logged alongside")
    args = parser.parse_args(argv)
    if args.resume:
        given = [a for a in argv if a.startswith("--") and a.split("=")[0] != "--resume"]
        if given:
            raise ConfigError(f"--resume continues a run with its saved config.json; drop {given}")
        run = RunDir.open(args.resume)
        cfg = from_dict(TrainConfig, run.read_json("config.json"))
        check_config(cfg)
    else:
        base = merge(RLHF_DEFAULTS, load_file(args.config) if args.config else {})
        if args.__dict__.get("rl.algo_params") is None and args.__dict__.get("rl.algo") not in (None, "ppo"):
            base["rl"].pop("algo_params")  # kl_coef is PPO's default here, not another algorithm's
        cfg = resolve(TrainConfig, args, base)
        if is_preference(cfg.rl):
            raise ConfigError(f"rl.algo={cfg.rl.algo!r} is not allowed: rlhf trains an RL algorithm against the "
                              "reward model; for preference losses use `posttrain train --algo dpo`")
        run = start_run(cfg, "rlhf")
    summary = run_rlhf(cfg, run)
    console.print(f"\n[bold]done[/]: {run.path}/summary.md")
    console.print((run.path / "summary.md").read_text())
    return 0 if summary else 1


def cmd_eval(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="posttrain eval", description="Loop A: measure, nothing else")
    parser.add_argument("--config", help="a JSON or TOML file of settings")
    add_config_flags(parser, EvalConfig)
    args = parser.parse_args(argv)
    cfg = resolve(EvalConfig, args, load_file(args.config) if args.config else None)
    if cfg.completions:
        from posttrain.eval.completions import run_eval_file

        run_eval_file(cfg.completions, cfg.spec_version, cfg.out_dir, cfg.name)
    else:
        from posttrain.eval.loop_a import evaluate_checkpoint

        evaluate_checkpoint(cfg)
    return 0


def cmd_bon(argv: list[str]) -> int:
    from posttrain.search.best_of_n import run_bon

    parser = argparse.ArgumentParser(prog="posttrain bon", description="Loop B: best-of-N selection")
    add_config_flags(parser, BonConfig)
    cfg = resolve(BonConfig, parser.parse_args(argv))
    run_bon(cfg.pack, cfg.n, cfg.spec_version, cfg.out_dir, cfg.name, cfg.select_spec_version or None)
    return 0


def cmd_diff(argv: list[str]) -> int:
    from posttrain.eval.completions import compare_runs

    parser = argparse.ArgumentParser(prog="posttrain diff", description="paired comparison of two Loop A runs")
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("--force", action="store_true", help="compare even when the spec versions differ")
    args = parser.parse_args(argv)
    compare_runs(args.run_a, args.run_b, force=args.force)
    return 0


def cmd_demo(argv: list[str]) -> int:
    from posttrain.teach.demos import DEMOS, run_demo

    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: posttrain demo NAME [options]; demos: {', '.join(DEMOS)} (NAME --help for options)")
        return 0
    return run_demo(argv[0], argv[1:])


def cmd_lessons(argv: list[str]) -> int:
    from posttrain.teach.lessons import main as lessons_main

    return lessons_main(argv)


def cmd_check(argv: list[str]) -> int:
    from posttrain.teach.check import main as check_main

    return check_main(argv)


COMMANDS = {
    "run": lambda argv: cmd_train(argv, "run"),
    "train": lambda argv: cmd_train(argv, "train"),
    "compare": cmd_compare,
    "rlhf": cmd_rlhf,
    "eval": cmd_eval,
    "bon": cmd_bon,
    "diff": cmd_diff,
    "demo": cmd_demo,
    "lessons": cmd_lessons,
    "check": cmd_check,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"posttrain: unknown command {name!r}; valid commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[name](rest)
    except (ValueError, FileNotFoundError) as error:
        # errors we raise on purpose carry a message meant for the user; a traceback would
        # bury it. POSTTRAIN_DEBUG=1 shows the traceback anyway.
        if os.environ.get("POSTTRAIN_DEBUG"):
            raise
        print(f"posttrain {name}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nposttrain {name}: interrupted; `posttrain train --resume runs/<id>` continues from the last checkpoint",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
