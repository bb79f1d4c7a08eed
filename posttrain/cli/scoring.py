"""The commands that score rather than train (Loop A and Loop B): `posttrain eval`, `bon`,
`search`, `verify`, `think`, `winrate` and `diff`. Each parses its settings (config/scoring.py), checks them,
and hands them to one job; the jobs are imported inside the command, for start-up time
(they load torch)."""

from __future__ import annotations

import argparse
import os
from typing import Annotated

import tyro

from posttrain.cli.flags import (checked, checked_parent, config_flag, description, flags_given, from_file,
                                 parent_flag, parse_flags, parse_simple, refuse_moved_flags, use_threads)
from posttrain.cli.help_view import HELP_ALL
from posttrain.config import ConfigError
from posttrain.config.files import moved_in_section
from posttrain.config.scoring import BonConfig, EvalConfig, SearchConfig, ThinkConfig, VerifyConfig, WinrateConfig


def cmd_eval(argv: list[str]) -> int:
    # parse_simple's steps, with the checkpoint's task chosen between parsing and the checks:
    # the split size is checked against the task that will be scored
    refuse_moved_flags(argv)
    argv = ["--help" if token in HELP_ALL else token for token in argv]
    base, file = from_file(EvalConfig, argv)
    fields = [config_flag(), parent_flag(), ("settings", Annotated[EvalConfig, tyro.conf.arg(name="")], base)]
    args = parse_flags(argv, "posttrain eval", description("Loop A: measure, nothing else"), fields)
    cfg, parent = args.settings, checked_parent(args.parent)
    source, note = "flags", ""
    if cfg.checkpoint and os.path.isdir(cfg.checkpoint):  # not a directory: checked() says so
        # imported here for start-up time: eval/ loads torch
        from posttrain.eval.loop_a import choose_task

        given = {flag.removeprefix("--env.") for flag in flags_given(argv) if flag.startswith("--env.")}
        # a file's env keys, an older file's where they are now: "arithmetic.level", as the flags name them
        for key, value in moved_in_section("env", file.get("env", {})).items():
            given |= {f"{key}.{inner}" for inner in value} if isinstance(value, dict) else {key}
        cfg, source, note = choose_task(cfg, given)
    cfg = checked(cfg)
    if note:
        print(note)
    use_threads(cfg.threads)
    # imported here for start-up time: eval/ loads torch
    if cfg.completions:
        from posttrain.eval.completions import run_eval_file

        run_eval_file(cfg.completions, cfg.spec_version, cfg.out_dir, cfg.name, parent)
    else:
        from posttrain.eval.loop_a import evaluate_checkpoint

        evaluate_checkpoint(cfg, source, parent)
    return 0


def cmd_bon(argv: list[str]) -> int:
    cfg = parse_simple(BonConfig, argv, "posttrain bon", "Loop B: best-of-N selection")
    # imported here for start-up time: search/ loads torch
    from posttrain.search.best_of_n import run_bon

    run_bon(cfg.pack, cfg.n, cfg.spec_version, cfg.out_dir, cfg.name, cfg.select_spec_version or None)
    return 0


def cmd_search(argv: list[str]) -> int:
    # the comparison is what `search` does; a bare --compare (the spelling the issue and the docs use) is accepted
    argv = [token for token in argv if token != "--compare"]
    cfg = parse_simple(SearchConfig, argv, "posttrain search", "Loop B: test-time search at fixed token budgets")
    use_threads(cfg.threads)
    # imported here for start-up time: search/ loads torch
    from posttrain.search.compare import run_search

    run_search(cfg)
    return 0


def cmd_verify(argv: list[str]) -> int:
    cfg = parse_simple(VerifyConfig, argv, "posttrain verify", "Loop B: generate, verify, revise, audited")
    use_threads(cfg.threads)
    # imported here for start-up time: search/ loads torch
    from posttrain.search.self_verify import run_verify

    run_verify(cfg)
    return 0


def cmd_think(argv: list[str]) -> int:
    cfg = parse_simple(ThinkConfig, argv, "posttrain think", "Loop B: /think, /no_think and thinking budgets of a "
                       "thinking-mode-fused checkpoint, accuracy against tokens")
    use_threads(cfg.threads)
    # imported here for start-up time: search/ loads torch
    from posttrain.search.thinking_curve import run_think

    run_think(cfg)
    return 0


def cmd_winrate(argv: list[str]) -> int:
    cfg = parse_simple(WinrateConfig, argv, "posttrain winrate", "Loop A: policy A against policy B on the same "
                       "prompts, one answer each, judged pairwise by a reward model, a local LLM judge or the "
                       "verifier; the win-rate with its CI, a length-controlled view, both sides' lengths and pass@1, "
                       "and the judge's agreement with the verifier")
    use_threads(cfg.threads)
    # imported here for start-up time: eval/ loads torch
    from posttrain.eval.head_to_head import run_winrate

    run_winrate(cfg)
    return 0


def cmd_diff(argv: list[str]) -> int:
    if "--force" in argv:
        raise ConfigError("--force was renamed --allow-different: it compares runs measured differently (another "
                          "spec, dataset, prompt template or sampling) and lists what differs beside the result")
    parser = argparse.ArgumentParser(
        prog="posttrain diff",
        description="paired comparison of two Loop A runs on the items they share: the bootstrap CI of A - B, its "
                    "verdict, and the noise rule's. Runs measured differently are refused, naming the difference.")
    parser.add_argument("run_a", metavar="RUN_A")
    parser.add_argument("run_b", metavar="RUN_B")
    parser.add_argument("--allow-different", "--allow_different", dest="allow_different", action="store_true",
                        help="compare even when the runs differ in scorer/spec version, dataset version, prompt "
                             "template or sampling settings; each difference is listed beside the result")
    args = parser.parse_args(argv)
    # imported here for start-up time: eval/ loads torch
    from posttrain.eval.comparison import compare_runs

    compare_runs(args.run_a, args.run_b, allow_different=args.allow_different)
    return 0
