"""The command line: one flag per setting, named as its config.json key, with its reason as
its help; an algorithm's hyperparameters as the flags of its own section; values from
defaults < --config < flags."""

import dataclasses
import json
import re
import subprocess
import sys
import typing

import pytest

from posttrain.algorithms import ALGORITHMS
from posttrain.algorithms.preference import PREFERENCE_LOSSES
from posttrain.cli import main
from posttrain.cli.training import train_config
from posttrain.config.commands import EquivalenceConfig, SystemsConfig
from posttrain.config import ConfigError, TrainConfig
from posttrain.config.files import to_dict
from posttrain.pipelines.build import make_algorithm
from posttrain.config.scoring import BonConfig, EvalConfig, WinrateConfig


@pytest.fixture(autouse=True)
def fixed_width(monkeypatch):
    # the parser lays out --help and its errors for the terminal (one column at 80): fix it
    monkeypatch.setenv("COLUMNS", "80")


def leaf_flags(cls: type, prefix: str = "") -> list[str]:
    """`--rl.sampling.top_p` and the like for every leaf field of a config dataclass."""
    hints = typing.get_type_hints(cls)
    flags = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            flags += leaf_flags(hints[f.name], f"{prefix}{f.name}.")
        else:
            flags.append(f"--{prefix}{f.name}")
    return flags


def help_entries(text: str) -> dict[str, str]:
    """{flag: its help text} from `--help` laid out in one column: an entry starts with two
    spaces and the flag; its help runs on, indented, until the next entry or section."""
    entries: dict[str, str] = {}
    flag = None
    for line in text.splitlines():
        if m := re.match(r"^  (--[\w.]+)(?: \S+)?(.*)$", line):
            flag = m.group(1)
            entries[flag] = m.group(2).strip()
        elif flag and re.match(r"^ {4,}\S", line):
            entries[flag] += " " + line.strip()
        else:
            flag = None
    return entries


def reason(help_text: str) -> str:
    return re.sub(r"\((default: .*|required)\)$", "", help_text).strip()


def help_of(capsys, command: str, *flags: str) -> str:
    assert main([command, *(flags or ["--help"])]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command, cls", [("train", TrainConfig), ("run", TrainConfig), ("compare", TrainConfig),
                                          ("rlhf", TrainConfig), ("eval", EvalConfig), ("bon", BonConfig),
                                          ("systems", SystemsConfig), ("winrate", WinrateConfig),
                                          ("equivalence", EquivalenceConfig)])
def test_help_shows_every_setting_with_its_reason(capsys, command, cls):
    # --help-all: a training command's --help shows the chosen algorithm's and environment's (below)
    entries = help_entries(help_of(capsys, command, "--help-all"))
    settings = [f for f in leaf_flags(cls) if f != "--rl.algo_params"]  # set through the sections instead
    if cls is TrainConfig:  # the walk reaches the nested sections
        assert {"--rl.sampling.top_p", "--rl.rm.pooling", "--dist.trainer_ranks"} <= set(settings)
    for flag in settings + ["--config"]:
        assert flag in entries, f"{flag} missing from `posttrain {command} --help`"
        # a reason is more than a default: a few words of its own (the shortest, "pairs per step")
        assert len(reason(entries[flag]).split()) >= 3, f"{flag}: {entries[flag]!r} gives no reason"
    assert "--rl.algo_params" not in entries  # one way to set an algorithm's hyperparameters: its section
    assert "--data" not in entries and "--env.no_cot" not in entries  # one flag per setting


# Algorithm fields whose comment gives no reason yet (posttrain/algorithms/): the day one
# gets its comment, it leaves this set.
WITHOUT_REASON: set[str] = set()  # every algorithm field says why it has its default


def test_help_has_a_section_per_algorithm_with_each_field_and_its_reason(capsys):
    text = help_of(capsys, "train", "--help-all")
    entries = help_entries(text)
    without = set()
    for name, cls in {**ALGORITHMS, **PREFERENCE_LOSSES}.items():
        assert f" {name} options" in text
        for f in dataclasses.fields(cls):
            if len(reason(entries[f"--{name}.{f.name}"]).split()) < 3:
                without.add(f"--{name}.{f.name}")
    assert without == WITHOUT_REASON
    # max_len is the generation budget, filled in as pipelines/build.py fills it
    assert entries["--dr_grpo.max_len"].endswith("(default: 48)")
    assert "--rl.algo grpo" not in entries and entries["--rl.algo"].endswith("(default: grpo)")


def test_section_flags_become_algo_params():
    assert train_config(["--grpo.kl_coef", "0.04"]).rl.algo_params == {"kl_coef": 0.04}
    cfg = train_config(["--algo", "dpo", "--dpo.beta", "0.2", "--dpo.nll_coef", "1"])
    assert (cfg.rl.algo, cfg.rl.algo_params) == ("dpo", {"beta": 0.2, "nll_coef": 1.0})
    assert train_config([]).rl.algo_params == {}  # nothing changed, nothing recorded
    # a flag given at its default is kept: the user said so
    assert train_config(["--grpo.clip_eps_high", "0.2"]).rl.algo_params == {"clip_eps_high": 0.2}


def test_max_len_defaults_to_the_generation_budget_of_the_run():
    cfg = train_config(["--algo", "dr_grpo", "--rl.sampling.max_new_tokens", "64"])
    assert cfg.rl.algo_params == {} and make_algorithm(cfg.rl).max_len == 64
    cfg = train_config(["--algo", "dr_grpo", "--rl.sampling.max_new_tokens", "64", "--dr_grpo.max_len", "40"])
    assert cfg.rl.algo_params == {"max_len": 40} and make_algorithm(cfg.rl).max_len == 40


def test_a_flag_of_another_section_is_refused(capsys, tmp_path):
    assert main(["train", "--dpo.beta", "0.1", "--out_dir", str(tmp_path)]) == 2  # even at dpo's default
    err = capsys.readouterr().err
    assert "--dpo.beta" in err and "--grpo.*" in err and "--algo dpo" in err
    assert main(["compare", "--algos", "grpo,dapo", "--ppo.kl_coef", "0.1", "--out_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--ppo.kl_coef" in err and "--dapo.*" in err and "--grpo.*" in err
    assert not any(tmp_path.iterdir())  # refused before anything started


def test_defaults_then_config_file_then_flags(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"seed": 5, "rl": {"optim": {"lr": 3e-4}, "steps": 7,
                                                  "algo_params": {"kl_coef": 0.02, "clip_eps_high": 0.28}}}))
    cfg = train_config(["--config", str(path), "--rl.steps", "9", "--grpo.kl_coef", "0.04"])
    assert (cfg.sft.steps, cfg.seed, cfg.rl.optim.lr, cfg.rl.steps) == (600, 5, 3e-4, 9)  # default, file, file, flag
    assert cfg.rl.algo_params == {"kl_coef": 0.04, "clip_eps_high": 0.28}  # the section's flag over the file's
    # back to the algorithm's own default, over the file's value
    assert train_config(["--config", str(path), "--grpo.kl_coef", "0.0"]).rl.algo_params["kl_coef"] == 0.0
    toml = tmp_path / "settings.toml"
    toml.write_text('[rl]\nalgo = "rloo"\n[rl.sampling]\ntop_p = 0.9\n')
    cfg = train_config(["--config", str(toml), "--rl.sampling.temperature", "0.7"])
    assert (cfg.rl.algo, cfg.rl.sampling.top_p, cfg.rl.sampling.temperature) == ("rloo", 0.9, 0.7)


def test_a_runs_config_json_reads_back_as_the_same_config(tmp_path):
    cfg = train_config(["--algo", "dapo", "--dapo.overlong_cache", "4", "--env.cot", "false", "--rl.optim.lr", "3e-5"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(to_dict(cfg)))
    assert train_config(["--config", str(path)]) == cfg


def test_booleans_short_forms_and_removed_flags(capsys):
    cfg = train_config(["--env.cot", "false", "--rl.kl.track", "false", "--algo", "rloo", "--steps", "3",
                        "--model", "gpt_mini", "--workers", "0", "--rl.preference.refresh_reference=false"])
    assert (cfg.env.cot, cfg.rl.kl.track, cfg.rl.algo, cfg.rl.steps) == (False, False, "rloo", 3)
    assert (cfg.model.name, cfg.dist.workers, cfg.rl.preference.refresh_reference) == ("gpt_mini", 0, False)
    for flag, value, instead in [("--data", "pairs.jsonl", "--rl.preference.pairs"), ("--lora-r", "8", "--model.lora_r"),
                                 ("--ray-address", "auto", "--dist.ray_address"),
                                 ("--rl.algo_params", '{"kl_coef": 0.04}', "the chosen algorithm's section")]:
        assert main(["train", flag, value]) == 2
        assert f"{flag} was removed; use {instead}" in capsys.readouterr().err


def test_rlhf_starts_from_ppo_with_a_kl_penalty_which_another_algorithm_drops():
    cfg = train_config([], "rlhf")
    assert (cfg.name, cfg.rl.algo, cfg.rl.algo_params) == ("rlhf", "ppo", {"kl_coef": 0.05})
    assert train_config(["--ppo.vf_coef", "1"], "rlhf").rl.algo_params == {"kl_coef": 0.05, "vf_coef": 1.0}
    assert train_config(["--ppo.kl_coef", "0"], "rlhf").rl.algo_params == {"kl_coef": 0.0}
    assert train_config(["--algo", "grpo"], "rlhf").rl.algo_params == {}  # PPO's kl_coef is not GRPO's
    assert train_config(["--algo", "grpo", "--grpo.kl_coef", "0.01"], "rlhf").rl.algo_params == {"kl_coef": 0.01}
    with pytest.raises(ConfigError, match="rlhf trains an RL algorithm"):
        train_config(["--algo", "dpo"], "rlhf")


def test_start_up_needs_no_torch():
    code = ("import contextlib, io, sys\n"
            "from posttrain.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['--help']) == 0 and main(['lessons', '--list']) == 0\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- --dry_run: every check, the resolved config, and nothing else ------------------------------


@pytest.mark.parametrize("command", ["train", "run", "rlhf"])
def test_a_dry_run_prints_the_resolved_config_and_creates_nothing(capsys, tmp_path, command):
    out_dir = tmp_path / "runs"
    assert main([command, "--dry_run", "true", "--rl.steps", "3", "--seed", "7", "--out_dir", str(out_dir)]) == 0
    printed = capsys.readouterr().out
    resolved = json.loads(printed[: printed.rindex("}") + 1])
    assert resolved["rl"]["steps"] == 3 and resolved["seed"] == 7
    assert resolved["rl"]["algo"] == ("ppo" if command == "rlhf" else "grpo")
    assert "every check passed" in printed and not out_dir.exists()


def test_a_dry_run_still_refuses_what_a_run_would(capsys, tmp_path):
    # the context check a run makes before SFT: the prompt plus the budget must fit the model
    assert main(["train", "--dry_run", "true", "--rl.sampling.max_new_tokens", "5000",
                 "--out_dir", str(tmp_path / "runs")]) == 2
    assert "rl.sampling.max_new_tokens=5000 is not allowed" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


# --- --threads: every command that computes with a model ------------------------------------------


@pytest.mark.parametrize("command", ["train", "run", "rlhf", "compare", "star", "eval", "search", "verify", "think",
                                     "winrate", "prm"])
def test_every_command_that_computes_takes_threads(capsys, command):
    entries = help_entries(help_of(capsys, command, "--help-all"))
    assert "torch intra-op threads" in entries["--threads"] and entries["--threads"].endswith("(default: 0)")


def test_a_scoring_command_sets_torch_threads_as_a_training_run_does(tmp_path, monkeypatch, capsys):
    import torch

    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    path = tmp_path / "completions.jsonl"
    path.write_text('{"id": "1", "prompt": "Q: 3+4\\n", "expected_answer": "7", "completion": "Final: 7"}\n')
    out = str(tmp_path / "runs")
    assert main(["eval", "--completions", str(path), "--out_dir", out, "--threads", "1"]) == 0
    assert main(["eval", "--completions", str(path), "--out_dir", out]) == 0  # 0: torch's default, left alone
    assert calls == [1]
    assert main(["eval", "--completions", str(path), "--out_dir", out, "--threads", "-1"]) == 2
    assert "threads=-1 is not allowed: expected an integer in [0, " in capsys.readouterr().err
