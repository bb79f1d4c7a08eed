"""A command line that answers at once: `--help` of every command (`check` and `demo NAME`
included), and a training command's typo'd flag, misspelt algorithm section, typo'd or wrongly
typed flag inside a section, value of the wrong type or out of range (a setting's or a
section's), and unknown algorithm, are answered before torch is imported (the algorithms import
it, about two seconds): the settings are parsed first, and the sections, their range checks and
the help of the parsers that sit beside torch come from cli/section_schema.json
(test_section_schema.py holds it to the classes). The algorithm names the command line reads
without torch are the registries' own. How fast is measured, not tested: benchmarks/cli_startup.py."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from posttrain.algorithms import ALGORITHMS
from posttrain.algorithms.preference import PREFERENCE_LOSSES
from posttrain.cli import main
from posttrain.cli.train_flags import split_section_flags
from posttrain.config import ConfigError, RLConfig, TrainConfig
from posttrain.config.rl import PREFERENCE_LOSS_NAMES, RL_ALGORITHM_NAMES

# (argv, what the one answer must say); each refused with exit status 2
REFUSED_WITHOUT_TORCH = [
    (["train", "--rl.stepz", "3"], ["Unrecognized options: --rl.stepz", "--rl.steps INT"]),
    (["run", "--seeed", "3"], ["Unrecognized options: --seeed", "--seed INT"]),
    (["train", "--foo.bar", "1"], ["Unrecognized options: --foo.bar"]),
    (["train", "--grpoo.kl_coef", "0.1"], ["--grpoo.kl_coef: there is no section 'grpoo'",
                                            "did you mean --grpo.kl_coef?"]),
    (["compare", "--algos", "grpo,dapo", "--dr-grpoo.max_len", "9"], ["did you mean --dr_grpo.max_len?"]),
    (["train", "--rl.steps", "x"], ["Error parsing --rl.steps", "'x'", "--rl.steps INT"]),
    (["train", "--env.cot", "maybe"], ["--env.cot", "true", "false"]),
    (["train", "--rl.steps", "-1"], ["rl.steps=-1 is not allowed: expected an integer >= 0"]),
    (["rlhf", "--rl.optim.lr", "nan"], ["rl.optim.lr=nan is not allowed", "a finite number"]),
    (["train", "--algo", "grop"], ["rl.algo='grop' is not allowed: expected one of", "'grpo'", "'dpo'"]),
    (["star", "--threads", "100000"], ["threads=100000 is not allowed"]),
    # inside a section: the flag it meant, with its help, as the class's own parser suggested it
    (["train", "--grpo.kl_coeff", "0.1"], ["Unrecognized options: --grpo.kl_coeff", "Perhaps you meant:",
                                           "--grpo.kl_coef FLOAT", "GRPO uses β = 0.04 (Sec. 4.2)", "(default: 0.0)"]),
    (["train", "--grpo.clip_eps", "abc"], ["Unrecognized options: --grpo.clip_eps", "--grpo.clip_eps_low FLOAT",
                                           "--grpo.clip_eps_high FLOAT"]),
    (["train", "--grpo.kl_coef", "x"], ["Error parsing --grpo.kl_coef", "'x'", "--grpo.kl_coef FLOAT"]),
    (["train", "--grpo.overlong_filter", "maybe"], ["invalid choice 'maybe' for argument '--grpo.overlong_filter'"]),
    (["rlhf", "--ppo.kl_coeff", "0.1"], ["Unrecognized options: --ppo.kl_coeff", "--ppo.kl_coef FLOAT"]),
    (["train", "--algo", "dpo", "--dpo.bta", "0.3"], ["Unrecognized options: --dpo.bta", "--dpo.beta FLOAT"]),
    # a value of the right type out of a section's range: the class's check, carried by the schema
    (["train", "--grpo.clip_eps_low", "2"], ["GRPO.clip_eps_low=2.0 is invalid; allowed: 0 <= value < 1"]),
    (["train", "--algo", "dpo", "--dpo.beta", "-1"], ["DPO.beta=-1.0 is invalid; allowed: a number > 0"]),
    (["rlhf", "--ppo.gamma", "2"], ["PPO.gamma=2.0 is invalid; allowed: a number in [0, 1]"]),
    (["train", "--grpo.loss_agg", "token-sum"], ["GRPO.loss_agg='token-sum' is invalid; allowed: one of",
                                                 "'seq-mean-token-sum-norm'"]),
    (["compare", "--algos", "grpo,dapo", "--dapo.overlong_cache", "8", "--dapo.max_len", "4"],
     ["DAPO.max_len=4 is invalid; allowed: an int > overlong_cache=8"]),
    # the other commands' values, checked before their jobs (which load torch) are imported
    (["star", "--star.iterations", "-1"], ["star.iterations=-1 is not allowed: expected a positive integer"]),
    (["bon", "--n", "-1"], ["n=-1 is not allowed: expected a positive integer"]),
]

# (argv, a line its help must hold); every one answered with exit status 0
HELP_WITHOUT_TORCH = [
    (["--help"], "posttrain train --algo NAME"),
    (["train", "--help"], "--grpo.kl_coef FLOAT"),
    (["train", "--algo", "grpo", "--help"], "--grpo.clip_eps_high FLOAT"),
    (["train", "--algo", "dpo", "--help"], "--dpo.beta FLOAT"),
    (["train", "--env.name", "jsonl", "--help"], "--env.path STR"),
    (["train", "--help-all"], "--simpo.gamma FLOAT"),
    (["run", "--help"], "--grpo.kl_coef FLOAT"),
    (["rlhf", "--help"], "--ppo.kl_coef FLOAT"),
    (["compare", "--algos", "grpo,dapo", "--help"], "--dapo.overlong_cache INT"),
    (["star", "--help"], "--star.iterations INT"),
    *[([command, "--help"], f"posttrain {command}") for command in
      ("eval", "bon", "search", "verify", "think", "winrate", "prm", "diff", "doctor", "export", "systems", "demo",
       "lessons")],
    # parsers that sit beside torch (teach/check.py, teach/demos/): their help as the schema recorded it
    (["check", "--help"], "usage: posttrain check [-h] [--list] [exercise]"),
    (["check", "09", "-h"], "--list list the exercises and exit"),
    (["demo", "bandit", "--help"], "usage: posttrain demo bandit"),
    (["demo", "gridworld_ppo", "-h"], "--out-dir OUT_DIR parent folder of the run directory"),
    (["demo", "sentiment_steering", "--help"], "usage: posttrain demo sentiment_steering"),
]


def test_a_typo_or_a_bad_value_is_refused_before_torch_is_imported():
    # one fresh interpreter, each command line in turn, torch checked absent after each answer
    code = ("import contextlib, io, json, sys\n"
            "from posttrain.cli import main\n"
            "answers = []\n"
            f"for argv in {json.dumps([argv for argv, _ in REFUSED_WITHOUT_TORCH])}:\n"
            "    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
            "        status = main(argv)\n"
            "    answers.append([status, err.getvalue(), 'torch' in sys.modules])\n"
            "print(json.dumps(answers))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "COLUMNS": "200"})
    answers = json.loads(done.stdout)
    for (argv, needles), (status, err, torch_loaded) in zip(REFUSED_WITHOUT_TORCH, answers):
        assert status == 2, (argv, err)
        assert not torch_loaded, f"{argv} imported torch before refusing it"
        flat = " ".join(err.replace("│", " ").split())
        for needle in needles:
            assert needle in flat, f"{argv}: {needle!r} not in {flat!r}"


def test_help_is_answered_before_torch_is_imported():
    code = ("import contextlib, io, json, sys\n"
            "from posttrain.cli import main\n"
            "answers = []\n"
            f"for argv in {json.dumps([argv for argv, _ in HELP_WITHOUT_TORCH])}:\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
            "        status = main(argv)\n"
            "    answers.append([status, out.getvalue(), 'torch' in sys.modules])\n"
            "print(json.dumps(answers))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "COLUMNS": "200"})
    for (argv, needle), (status, out, torch_loaded) in zip(HELP_WITHOUT_TORCH, json.loads(done.stdout)):
        assert status == 0, (argv, out[-500:])
        assert not torch_loaded, f"{argv} imported torch to answer"
        assert needle in " ".join(out.replace("│", " ").split()), (argv, needle)


@pytest.mark.parametrize("argv", [["train", "--algo", "grpo", "--help"], ["train", "--grpo.kl_coeff", "0.1"],
                                  ["train", "--grpo.clip_eps_low", "-1"], ["demo", "bandit", "--help"]])
def test_python_importtime_lists_no_torch(argv):
    # the acceptance check as a user would run it: every module the process imported, no torch among them
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "posttrain", *argv], capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200"})
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:") and "|" in line]
    assert "posttrain.cli.section_schema" in imported and "tyro" in imported  # the log is what it says
    assert done.returncode == (0 if "--help" in argv else 2)
    assert not [name for name in imported if name == "torch" or name.startswith("torch.")]


def test_a_check_the_schema_cannot_carry_is_still_made_by_its_class(capsys):
    # adv_norm's message is built from a local variable (cli/section_checks.py cannot read it):
    # the stand-in lets the value through and the class refuses it, with torch, in its own words
    assert main(["train", "--grpo.adv_norm", "zscore"]) == 2
    err = " ".join(capsys.readouterr().err.replace("│", " ").split())
    assert "GRPO.adv_norm='zscore' is invalid; allowed: one of" in err


def test_the_names_read_without_torch_are_the_registries():
    assert RL_ALGORITHM_NAMES == tuple(ALGORITHMS)
    assert PREFERENCE_LOSS_NAMES == tuple(PREFERENCE_LOSSES)
    # a section's flags are unprefixed (--grpo.kl_coef): no algorithm may share a name with a setting
    settings = {field.name for field in dataclasses.fields(TrainConfig)}
    assert not settings & set(RL_ALGORITHM_NAMES + PREFERENCE_LOSS_NAMES)


def test_every_registered_name_is_an_algo_the_settings_accept():
    for name in RL_ALGORITHM_NAMES + PREFERENCE_LOSS_NAMES:
        RLConfig(algo=name).validate()
    with pytest.raises(ConfigError, match=r"rl.algo='sft' is not allowed"):
        RLConfig(algo="sft").validate()


def test_the_command_line_is_split_between_the_settings_and_the_algorithm_sections():
    argv = ["--rl.steps", "3", "--grpo.kl_coef=0.1", "--dr-grpo.max_len", "40", "--env.cot", "false",
            "--dpo.beta", "-0.5", "--grpoo.kl_coef", "1", "--row", "clip:grpo.clip_eps_high=0.28"]
    settings, sections = split_section_flags(argv)
    assert settings == ["--rl.steps", "3", "--env.cot", "false", "--grpoo.kl_coef", "1",
                        "--row", "clip:grpo.clip_eps_high=0.28"]  # a row's settings are a value, not a flag
    assert sections == ["--grpo.kl_coef=0.1", "--dr-grpo.max_len", "40", "--dpo.beta", "-0.5"]
    assert split_section_flags(["stray", "--seed", "1"]) == (["stray", "--seed", "1"], [])  # refused as today
