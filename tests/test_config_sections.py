"""Settings grouped by concern, help by choice: rl's sections and env's per-environment ones,
`--help` showing what the chosen algorithm and environment read (`--help-all` everything),
algorithm settings typed when a config is read, and run directories written before the
settings moved (tests/fixtures/run_before_sections, made by the code of 16ad2eb) loading with
--config and resuming."""

import dataclasses
import inspect
import json
import math
import shutil
import typing
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.cli.training import train_config
from posttrain.config import ENV_SECTIONS, ConfigError, EnvConfig, RLConfig, TrainConfig
from posttrain.config.files import MOVED, from_dict, to_dict, upgraded
from posttrain.envs import ENVIRONMENTS
from posttrain.pipelines.checks import check_config
from posttrain.pipelines.stage_plan import stage_plan
from posttrain.runs.checkpoints import read_task
from posttrain.runs.lineage import parent_record, read_parent
from tests.test_cli import help_entries, leaf_flags

OLD_RUN = Path(__file__).parent / "fixtures" / "run_before_sections"


@pytest.fixture(autouse=True)
def fixed_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # the parser lays out --help for the terminal: one column at 80


def help_text(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


# --- the sections ---------------------------------------------------------------------------


def leaves(cls: type, prefix: str = "") -> set[str]:
    hints = typing.get_type_hints(cls)
    out = set()
    for f in dataclasses.fields(cls):
        inner = hints[f.name]
        out |= leaves(inner, f"{prefix}{f.name}.") if dataclasses.is_dataclass(inner) else {prefix + f.name}
    return out


def test_every_moved_key_has_one_new_place_and_is_gone_from_the_old_one():
    now = leaves(TrainConfig)
    # 29 of rl's 40 fields, 11 of env's 18, and dist.tis_cap into rl.mismatch
    assert len(MOVED) == 41 and len(set(MOVED.values())) == 41
    assert set(MOVED.values()) <= now
    assert not set(MOVED) & now  # rl.reward is a section now: its text is rl.reward.terms
    assert len(dataclasses.fields(RLConfig)) == 19  # 8 settings of its own and 11 sections


def test_each_environment_section_holds_only_settings_its_environment_takes():
    for section in ENV_SECTIONS:
        parameters = inspect.signature(ENVIRONMENTS[section]).parameters
        fields = {f.name for f in dataclasses.fields(getattr(EnvConfig(), section))}
        assert fields <= set(parameters), (section, fields - set(parameters))
    # a section's settings reach its environment, and only its own
    env = EnvConfig(name="reasoning_gym:chain_sum", reasoning_gym=dataclasses.replace(
        EnvConfig().reasoning_gym, pool_size=500), cot=False)
    assert env.kwargs() == {"pool_size": 500, "cot": False}
    assert EnvConfig(name="arithmetic_think", arithmetic_think=dataclasses.replace(
        EnvConfig().arithmetic_think, level=2)).arithmetic_level() == 2


def test_a_setting_in_another_environments_section_is_refused_by_name():
    env = EnvConfig(arithmetic=dataclasses.replace(EnvConfig().arithmetic, level=2), name="tool_arithmetic")
    with pytest.raises(ConfigError, match=r"env.arithmetic.level=2 is not allowed: expected its default 3 with "
                                          r"env.name='tool_arithmetic': only env.name arithmetic reads"):
        TrainConfig(env=env).validate()


# --- help by choice -------------------------------------------------------------------------


def test_help_for_grpo_fits_in_250_lines_and_shows_what_a_grpo_run_reads(capsys):
    text = help_text(capsys, "train", "--algo", "grpo", "--help")
    lines = text.splitlines()
    assert len(lines) <= 250, len(lines)  # the bound (1,168 before: every section of every choice)
    # at 80 columns a long paragraph takes several rows of the terminal: those count too
    assert sum(max(1, math.ceil(len(line) / 80)) for line in lines) <= 250
    entries = help_entries(text)
    for flag in ("--rl.algo", "--rl.steps", "--rl.optim.lr", "--grpo.kl_coef", "--grpo.clip_eps_high", "--model.name",
                 "--env.name", "--env.arithmetic.level", "--seed", "--init", "--stages"):
        assert flag in entries, flag
    for flag in ("--dapo.clip_eps_high", "--dpo.beta", "--rl.rm.path", "--rl.curation.pool_size", "--dist.workers",
                 "--env.reasoning_gym.pool_size", "--env.path", "--rl.preference.pairs", "--sft.steps"):
        assert flag not in entries, flag
    # what is left out is named, one flag away
    assert "--help-all shows every section, also" in text
    for section in ("sft", "dist", "rl.kl", "rl.reward", "rl.rm", "rl.curation", "env.reasoning_gym"):
        assert f" {section}," in text, section


def test_help_follows_the_chosen_algorithm_environment_and_command(capsys):
    dpo = help_entries(help_text(capsys, "train", "--algo", "dpo", "--help"))
    assert {"--dpo.beta", "--rl.preference.pairs"} <= set(dpo) and "--grpo.kl_coef" not in dpo
    gym = help_entries(help_text(capsys, "train", "--env.name", "reasoning_gym:chain_sum", "--help"))
    assert "--env.reasoning_gym.task_config" in gym and "--env.arithmetic.level" not in gym
    assert "--env.spec_version" in gym and "--env.cot" not in gym  # reasoning-gym takes a verifier, no cot
    files = help_entries(help_text(capsys, "train", "--env.name", "jsonl", "--help"))
    assert {"--env.path", "--env.columns", "--env.heldout_path", "--env.cot"} <= set(files)
    compare = help_entries(help_text(capsys, "compare", "--algos", "grpo,dapo", "--help"))
    assert {"--grpo.kl_coef", "--dapo.overlong_cache"} <= set(compare) and "--rloo.kl_coef" not in compare
    assert "--rl.rm.path" in help_entries(help_text(capsys, "rlhf", "--help"))  # rlhf trains a reward model
    star = help_text(capsys, "star", "--help")
    assert "--star.iterations" in help_entries(star) and "grpo options" not in star  # star trains no algorithm


def test_help_all_shows_every_flag_and_every_flag_parses_whatever_help_shows(capsys):
    entries = help_entries(help_text(capsys, "train", "--help-all"))
    assert set(leaf_flags(TrainConfig)) - {"--rl.algo_params"} <= set(entries)
    assert help_text(capsys, "train", "--help_all") == help_text(capsys, "train", "--help-all")
    cfg = train_config(["--rl.rm.pooling", "mean", "--rl.mismatch.cap", "3", "--rl.kl.track", "false"])
    assert (cfg.rl.rm.pooling, cfg.rl.mismatch.cap, cfg.rl.kl.track) == ("mean", 3.0, False)


def test_an_old_flag_is_refused_with_its_new_name(capsys, tmp_path):
    for old, new in [("--rl.lr", "--rl.optim.lr"), ("--env.level", "--env.arithmetic.level"),
                     ("--rl.reward", "--rl.reward.terms"), ("--rl.on_alert", "--rl.alerts.action"),
                     ("--dist.tis_cap", "--rl.mismatch.cap")]:
        assert main(["train", old, "1", "--out_dir", str(tmp_path)]) == 2
        assert f"{old} moved: use {new}" in capsys.readouterr().err
    assert main(["eval", "--env.level", "2", "--completions", "x"]) == 2
    assert "--env.level moved: use --env.arithmetic.level" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


# --- algorithm settings typed when a config is read -------------------------------------------


@pytest.mark.parametrize("params, needles", [
    ({"kl_coeff": 0.1}, ["rl.algo_params.kl_coeff=0.1 is not allowed", "grpo has no setting 'kl_coeff'",
                         "did you mean kl_coef?", "clip_eps_low=0.2", "kl_coef=0.0"]),
    ({"kl_coef": True}, ["rl.algo_params.kl_coef=True is not allowed: expected a finite number", "--grpo.kl_coef"]),
    ({"kl_coef": "0.1"}, ["rl.algo_params.kl_coef='0.1' is not allowed: expected a finite number"]),
    ({"max_len": 2.5}, ["rl.algo_params.max_len=2.5 is not allowed: expected an integer or null"]),
])
def test_a_typo_or_a_wrong_type_in_an_algorithm_setting_is_refused_when_the_config_is_read(
        capsys, tmp_path, params, needles):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"rl": {"algo_params": params}}))
    assert main(["train", "--config", str(path), "--dry_run", "true"]) == 2
    err = capsys.readouterr().err
    assert f"config file {str(path)!r}" in err and "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    with pytest.raises(ConfigError, match="rl.algo_params"):  # the Python API: check_config, before any model
        check_config(TrainConfig(rl=RLConfig(algo_params=params)))


def test_a_resumed_run_with_a_bad_algorithm_setting_is_refused_before_it_loads(capsys, tmp_path):
    run = shutil.copytree(OLD_RUN, tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["rl"]["algo_params"] = {"kl_coef": 0.01, "clip_eps": 0.3}
    (run / "config.json").write_text(json.dumps(config))
    assert main(["train", "--resume", str(run)]) == 2
    assert "rl.algo_params.clip_eps=0.3 is not allowed: grpo has no setting 'clip_eps'" in capsys.readouterr().err
    assert not (run / "checkpoints" / "rl" / "step_000003").exists()  # nothing ran


# --- run directories written before the settings moved ------------------------------------------


def test_an_old_runs_config_json_loads_with_every_value_at_its_new_place(capsys, tmp_path):
    old = json.loads((OLD_RUN / "config.json").read_text())
    assert old["rl"]["lr"] == 2e-4 and old["env"]["level"] == 2  # the layout before the move
    cfg = train_config(["--config", str(OLD_RUN / "config.json")])
    assert (cfg.rl.optim.lr, cfg.rl.optim.warmup_steps, cfg.env.arithmetic.level) == (2e-4, 1, 2)
    assert (cfg.rl.kl.track_rows, cfg.rl.reward.length_penalty, cfg.rl.reward.length_free) == (8, 0.01, 5)
    assert (cfg.rl.reward.terms, cfg.rl.alerts.action, cfg.rl.algo_params) == ("accuracy", "warn", {"kl_coef": 0.01})
    assert to_dict(cfg) == upgraded(old) and "lr" not in to_dict(cfg)["rl"]
    assert main(["train", "--config", str(OLD_RUN / "config.json"), "--dry_run", "true",
                 "--out_dir", str(tmp_path)]) == 0
    assert "every check passed" in capsys.readouterr().out
    # the task its checkpoints record reads the same way (posttrain eval, winrate, search)
    assert read_task(OLD_RUN / "checkpoints" / "rl" / "step_000001").env.arithmetic.level == 2
    # an old parent differs from today's run only where a setting really changed
    child = to_dict(dataclasses.replace(cfg, seed=1))
    assert parent_record(OLD_RUN, read_parent(OLD_RUN), child)["changed"] == ["seed"]


def test_an_old_config_files_env_keys_ask_eval_for_a_task_as_todays_do(capsys, tmp_path):
    checkpoint = OLD_RUN / "checkpoints" / "rl" / "step_000001"  # trained on level 2
    (tmp_path / "level3.json").write_text('{"env": {"level": 3}}')  # the key before it moved
    assert main(["eval", "--checkpoint", str(checkpoint), "--size", "4", "--config", str(tmp_path / "level3.json"),
                 "--out_dir", str(tmp_path / "runs")]) == 0
    assert ("warning: the checkpoint was trained on env.arithmetic.level=2; scoring on env.arithmetic.level=3 as "
            "asked") in capsys.readouterr().out


def test_old_keys_in_a_stage_or_a_file_are_read_where_they_are_now():
    cfg = from_dict(TrainConfig, {"stages": "sft,grpo[rl.lr=3e-5,rl.track_kl=false]", "env": {"level": 2}})
    grpo = stage_plan(cfg)[1].cfg
    assert (grpo.rl.optim.lr, grpo.rl.kl.track, grpo.env.arithmetic.level) == (3e-5, False, 2)
    think = from_dict(EnvConfig, {"name": "arithmetic_think", "level": 2, "think_mode": "think"})
    assert (think.arithmetic_think.level, think.arithmetic.level, think.arithmetic_think.think_mode) == (2, 3, "think")
    assert from_dict(RLConfig, {"reward": "r1", "reward_timeout": 3}).reward.terms == "r1"
    with pytest.raises(ConfigError, match="rl.lr and rl.optim.lr are one setting"):
        from_dict(TrainConfig, {"rl": {"lr": 1e-4, "optim": {"lr": 2e-4}}})


def test_an_old_run_directory_resumes_where_it_was_killed(tmp_path):
    """The fixture was killed after RL step 2 of 4 (checkpoint rl/step_000001); resumed, it
    trains steps 2 and 3 with its own rl.lr of 2e-4: cosine from 2e-4 to 0.1 × 2e-4 after one
    warmup step, lr(s) = 2e-5 + 1.8e-4 · ½(1 + cos(π s / 3)), i.e. 6.5e-5 and 2e-5."""
    run = shutil.copytree(OLD_RUN, tmp_path / "run")
    assert main(["train", "--resume", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert [r["step"] for r in rl] == [0, 1, 2, 3]
    assert [r["lr"] for r in rl[2:]] == pytest.approx([6.5e-5, 2e-5])
    assert all(r["kl"] >= 0 for r in rl)  # grpo's kl_coef 0.01 (its rl.algo_params) puts a KL term in the loss
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_stage"] == "rl" and summary["rl"]["n"] == 8
    assert json.loads((run / "config.json").read_text()) == json.loads((OLD_RUN / "config.json").read_text())
