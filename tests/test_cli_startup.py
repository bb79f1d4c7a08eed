"""A command line that answers at once: a training command's typo'd flag, misspelt algorithm
section, value of the wrong type or out of range, and unknown algorithm are refused before
torch is imported (the algorithms' sections need it, about two seconds); the algorithm names
the command line reads without torch are the registries' own. How fast is measured, not
tested: benchmarks/cli_startup.py."""

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


def test_an_algorithm_sections_own_typo_is_still_refused_with_the_flag_it_meant(capsys):
    # a flag of a known section is the section's parser's (it needs the algorithm: torch), which suggests
    assert main(["train", "--grpo.kl_coeff", "0.1"]) == 2
    err = " ".join(capsys.readouterr().err.replace("│", " ").split())
    assert "Unrecognized options: --grpo.kl_coeff" in err and "--grpo.kl_coef FLOAT" in err
    assert main(["train", "--grpo.kl_coef", "x"]) == 2
    assert "Error parsing --grpo.kl_coef" in " ".join(capsys.readouterr().err.replace("│", " ").split())


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
