"""`posttrain` command line.

    posttrain run                      the main job: SFT → GRPO → held-out eval (Loop C)
    posttrain train --algo NAME ...    the same pipeline with any setting changed
    posttrain train --resume runs/ID   continue a killed run from its last checkpoint
    posttrain train --stages sft,dpo,grpo  stages in one run, each from the one before's checkpoint, evaluated after each
    posttrain compare --algos a,b,c    several algorithms from one SFT checkpoint: one table, one plot
    posttrain compare --algos dpo --online_rounds 1,20
                                       offline against online DPO on the same budget
    posttrain compare --row grpo --row lite:rl.algo=lite_ppo --row clip:grpo.clip_eps_high=0.28
                                       rows of any settings from one SFT checkpoint: an ablation in one command
    posttrain star --init CKPT         STaR / rejection-sampling fine-tuning: sample, keep verified, fine-tune, repeat
    posttrain rlhf                     SFT → reward model → PPO against it, proxy vs gold reward plotted
    posttrain eval --checkpoint DIR    held-out pass@1 of a checkpoint (Loop A)
    posttrain eval --completions FILE  score a file of completions, failures by reason (Loop A)
    posttrain bon [--pack bon --n 8]   best-of-N selection, pass@1 vs pass@N vs pass@k (Loop B)
    posttrain prm [--kind prm|orm]     a process (per-step) or outcome reward model: labels, training,
                                       held-out step accuracy and calibration with CIs
    posttrain equivalence              Kimi k1.5's answer-equivalence judge at toy scale: trained, and measured
                                       against the rule alone and rule-then-judge (--rl.rm.path DIR uses it)
    posttrain search --checkpoint DIR  test-time search side by side at fixed token budgets (--prm, --orm DIR)
    posttrain verify --checkpoint DIR  generate, verify, revise; each step verifier audited against the truth
    posttrain think --checkpoint DIR   /think, /no_think and thinking budgets of a fused model: accuracy vs tokens
    posttrain winrate --a A --b B --judge.rm DIR
                                       A against B on the same prompts, judged pairwise (a reward model,
                                       --judge.llm MODEL or --judge.verifier true): win-rate with its CI,
                                       length-controlled, and the judge's agreement with the verifier
    posttrain diff RUN_A RUN_B         paired bootstrap: is the difference real or noise?
    posttrain doctor RUN               why a run is not learning: each cause, the setting to change, the numbers
    posttrain export RUN_OR_CKPT OUT   a plain transformers model (LoRA merged, system prompt in the chat template)
    posttrain export-config --to verl --config runs/ID/config.json
                                       a run's settings as TRL's config, OpenRLHF's command or verl's overrides
    posttrain systems [--model M --gpus N --gpu h100-80gb] [--run RUN_DIR]
                                       does model M fit on the cluster for an RL job, where will a step's time
                                       go; with --run, where a run's time went (time/* metrics)
    posttrain lessons [NN] [--edit]    the interactive lessons (marimo), served on localhost
    posttrain check NN                 test your solution to lesson NN's code exercise (exercises/)
    posttrain demo NAME                toy demos: bandit, two_step_mdp, kl_tradeoff, tokens, gridworld_ppo, sentiment_steering

Every setting is a flag named after its key in a run's config.json (`--rl.optim.lr 3e-4`,
`--rl.sampling.top_p 0.9`, `--env.cot false`), with its reason as its help text:
`posttrain train --help` shows the settings of the chosen --algo and --env.name, `--help-all`
every one. An algorithm's own hyperparameters are the flags of its section
(`--grpo.kl_coef 0.04`, `--dpo.beta 0.2`). `--config FILE` (JSON or TOML, e.g. a run's
config.json) sets many at once: defaults < --config < flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from posttrain.cli.doctor import cmd_doctor
from posttrain.cli.equivalence import cmd_equivalence
from posttrain.cli.export_config import cmd_export_config
from posttrain.cli.scoring import cmd_bon, cmd_diff, cmd_eval, cmd_search, cmd_think, cmd_verify, cmd_winrate
from posttrain.cli.section_schema import demo_names, recorded_help
from posttrain.cli.systems import cmd_systems
from posttrain.cli.training import cmd_compare, cmd_prm, cmd_rlhf, cmd_star, cmd_train
from posttrain.files import DISK_FULL, DiskFullError
from posttrain.runs.console import print_warnings_once


def cmd_export(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="posttrain export",
        description="Write a checkpoint as a plain transformers model directory that AutoModelForCausalLM and "
                    "AutoTokenizer load with no posttrain and no peft: LoRA adapters merged into the weights, the "
                    "trained system prompt as the chat template's default system turn, gpt_mini as a Llama with "
                    "its character tokenizer.")
    parser.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                        help="a run directory (its last trained stage's latest checkpoint is exported) or a "
                             "checkpoint directory (runs/<id>/checkpoints/<stage>/step_N)")
    parser.add_argument("out", metavar="OUT", help="the directory to write; it must not exist or be empty")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT even if it holds files")
    args = parser.parse_args(argv)
    # imported here for start-up time: models/ loads torch and transformers
    from posttrain.models.export import export_checkpoint, exported_size
    from posttrain.runs.checkpoints import final_checkpoint

    checkpoint, chosen = final_checkpoint(args.source)
    print(f"exporting {checkpoint} ({chosen})")
    record = export_checkpoint(checkpoint, args.out, overwrite=args.overwrite)
    notes = [f"{record['parameters']:,} parameters", f"{exported_size(args.out) / 1e6:.1f} MB"]
    if record["lora_merged"]:
        notes.append(f"LoRA r={record['lora_merged']} merged into its base {record['lora_base']}")
    if record["system_prompt"]:
        notes.append(f"system prompt {record['system_prompt']!r} as the chat template's default")
    print(f"wrote {args.out} ({record['kind']}; {'; '.join(notes)})\n"
          f"load it with AutoModelForCausalLM.from_pretrained({str(args.out)!r}) and AutoTokenizer.from_pretrained")
    return 0


def asks_help(argv: list[str]) -> bool:
    return any(token in ("-h", "--help") for token in argv)


def cmd_demo(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):  # the names as cli/section_schema.json keeps them: no torch
        print(f"usage: posttrain demo NAME [options]; demos: {', '.join(demo_names())} (NAME --help for options)")
        return 0
    if asks_help(argv[1:]) and (text := recorded_help(f"demo {argv[0]}")):
        print(text, end="")  # the demo's own parser's help, as the schema recorded it: no torch
        return 0
    # imported here for start-up time: the demos load torch
    from posttrain.teach.demos import run_demo

    return run_demo(argv[0], argv[1:])


def cmd_lessons(argv: list[str]) -> int:
    # imported here for start-up time: `posttrain lessons --list` needs none of the other commands
    from posttrain.teach.lessons import main as lessons_main

    return lessons_main(argv)


def cmd_check(argv: list[str]) -> int:
    if asks_help(argv) and (text := recorded_help("check")):
        print(text, end="")  # the checker's parser's help, as the schema recorded it: no torch
        return 0
    # imported here for start-up time: the checker loads torch
    from posttrain.teach.check import main as check_main

    return check_main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": lambda argv: cmd_train(argv, "run"),
    "train": lambda argv: cmd_train(argv, "train"),
    "compare": cmd_compare,
    "rlhf": cmd_rlhf,
    "star": cmd_star,
    "eval": cmd_eval,
    "bon": cmd_bon,
    "search": cmd_search,
    "verify": cmd_verify,
    "think": cmd_think,
    "winrate": cmd_winrate,
    "prm": cmd_prm,
    "equivalence": cmd_equivalence,
    "diff": cmd_diff,
    "doctor": cmd_doctor,
    "export": cmd_export,
    "export-config": cmd_export_config,
    "systems": cmd_systems,
    "demo": cmd_demo,
    "lessons": cmd_lessons,
    "check": cmd_check,
}


def main(argv: list[str] | None = None) -> int:
    print_warnings_once()
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
    except SystemExit as stop:
        # the parser printed --help (0) or what was wrong with a flag (2); any other code
        # that exits (a judge's model, a library a command called) is named, never status 0
        import traceback  # here, not at the top: only an exit reads a traceback, and start-up time counts

        origin = traceback.extract_tb(stop.__traceback__)[-1] if stop.__traceback__ else None
        if origin is None or os.path.basename(origin.filename) == "argparse.py" \
                or f"{os.sep}tyro{os.sep}" in origin.filename:
            return stop.code if isinstance(stop.code, int) else 2
        print(f"posttrain {name}: error: SystemExit({stop.code!r}) was raised at {os.path.basename(origin.filename)}, "
              f"line {origin.lineno}, in {origin.name}: code the command called asked the process to stop "
              "(sys.exit(), exit(), argparse's parse_args()); it must raise an exception instead", file=sys.stderr)
        return stop.code if isinstance(stop.code, int) and stop.code else 1
    except (ValueError, FileNotFoundError) as error:
        # errors we raise on purpose carry a message meant for the user; a traceback would
        # bury it. POSTTRAIN_DEBUG=1 shows the traceback anyway.
        if os.environ.get("POSTTRAIN_DEBUG"):
            raise
        print(f"posttrain {name}: error: {error}", *getattr(error, "__notes__", []), sep="\n", file=sys.stderr)
        return 2
    except OSError as error:
        if error.errno not in DISK_FULL or os.environ.get("POSTTRAIN_DEBUG"):
            raise
        # a DiskFullError names the file and, for a run, how to resume; a bare ENOSPC gets the generic advice
        full = error if isinstance(error, DiskFullError) else DiskFullError(error.errno, error.filename)
        print(f"posttrain {name}: error: {full}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        # a run's interrupt carries the command that resumes it (RunDir.resumable), and says
        # what was running when it names that (a reward function in this thread)
        where = f" {interrupt}" if str(interrupt) else ""
        print(f"\nposttrain {name}: interrupted{where}", *getattr(interrupt, "__notes__", []), sep="\n",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
