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

from posttrain.config import (BonConfig, ConfigError, EvalConfig, TrainConfig, add_config_flags, from_dict, load_file,
                              resolve)

TRAIN_SHORTCUTS = {"algo": "rl.algo", "steps": "rl.steps", "data": "rl.pairs", "model": "model.name", "lora-r": "model.lora_r", "workers": "dist.workers", "ray-address": "dist.ray_address"}


def _train_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="a JSON or TOML file of settings (flags override it)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue runs/<id> from its last checkpoint")
    add_config_flags(parser, TrainConfig, TRAIN_SHORTCUTS)
    return parser


def cmd_train(argv: list[str], command: str) -> int:
    from posttrain.roles.controller import console, run_pipeline, start_run
    from posttrain.eval.rundir import RunDir

    parser = _train_parser(f"posttrain {command}", __doc__.split("\n")[0])
    args = parser.parse_args(argv)
    if args.resume:
        given = [a for a in argv if a.startswith("--") and a.split("=")[0] != "--resume"]
        if given:
            raise ConfigError(f"--resume continues a run with its saved config.json; drop {given} "
                              "(to change settings, start a new run with --config runs/<id>/config.json)")
        run = RunDir.open(args.resume)
        cfg = from_dict(TrainConfig, run.read_json("config.json"))
        cfg.validate()
    else:
        cfg = resolve(TrainConfig, args, load_file(args.config) if args.config else None)
        run = start_run(cfg, command)
    summary = run_pipeline(cfg, run)
    console.print(f"\n[bold]done[/]: {run.path}/summary.md")
    console.print((run.path / "summary.md").read_text())
    return 0 if summary else 1


def cmd_compare(argv: list[str]) -> int:
    from posttrain.compare import check_algos, compare

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


def cmd_rlhf(argv: list[str]) -> int:
    from posttrain.rlhf import main as rlhf_main

    return rlhf_main(argv)


def standalone(algo: str, steps: int = 60) -> int:
    """`python -m posttrain.algorithms.NAME`: a short run of one algorithm, printing
    held-out pass@1 before and after RL."""
    return main(["train", "--algo", algo, "--rl.steps", str(steps), "--name", f"{algo}-standalone"] + sys.argv[1:])


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
    from posttrain.eval.loop_b import run_bon

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
    from posttrain.demos import DEMOS, run_demo

    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: posttrain demo NAME [options]; demos: {', '.join(DEMOS)} (NAME --help for options)")
        return 0
    return run_demo(argv[0], argv[1:])


def cmd_lessons(argv: list[str]) -> int:
    from posttrain.lessons import main as lessons_main

    return lessons_main(argv)


def cmd_check(argv: list[str]) -> int:
    from posttrain.check import main as check_main

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
