"""`posttrain export-config`: each peer's output is checked against that peer's own parser or
schema, never against our idea of it.

    OpenRLHF  the command is parsed by an argparse parser rebuilt from OpenRLHF 0.11.0's own
              flag list (tests/fixtures/peers/openrlhf_train_ppo_ray.json: action, type,
              nargs, choices of every flag), then the parsed values are compared with the run's
    verl      every override key is a key path of verl's composed PPO trainer config, its value
              of that key's type, and every named estimator, loss mode, aggregation and KL
              estimator one verl registers (tests/fixtures/peers/verl_ppo_trainer.json)
    TRL       trl.GRPOConfig / RLOOConfig / DPOConfig are built from the keywords, where TRL is
              installed (`make peers-test`); skipped with the reason otherwise

The fixtures are written from the peers' sources by tests/fixtures/peers/write_peer_fixtures.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.config import ConfigError, RLConfig, TrainConfig
from posttrain.config.files import to_dict
from posttrain.runs.peer_openrlhf import command_words

FIXTURES = Path(__file__).parent / "fixtures" / "peers"
OPENRLHF = json.loads((FIXTURES / "openrlhf_train_ppo_ray.json").read_text(encoding="utf-8"))
VERL = json.loads((FIXTURES / "verl_ppo_trainer.json").read_text(encoding="utf-8"))
# what OpenRLHF aggregates each algorithm's loss as (no flag changes it): the flag that matches
OPENRLHF_AGG = {"grpo": "token-mean", "dr_grpo": "token-mean", "rloo": "token-mean", "gspo": "seq-mean-token-mean"}


def export(capsys: pytest.CaptureFixture[str], peer: str, *flags: str) -> dict:
    """`posttrain export-config --to PEER --format json FLAGS` as the object it prints."""
    assert main(["export-config", "--to", peer, "--format", "json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def refusal(capsys: pytest.CaptureFixture[str], peer: str, *flags: str) -> str:
    """What `posttrain export-config` says on stderr when it refuses (status 2)."""
    assert main(["export-config", "--to", peer, *flags]) == 2
    return capsys.readouterr().err


def openrlhf_parser() -> argparse.ArgumentParser:
    """OpenRLHF's parser as its flag list defines it: the same actions, types, nargs, choices."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    types = {"int": int, "float": float, "str": str, None: None}
    for flag, spec in OPENRLHF["flags"].items():
        options = {key: spec[key] for key in ("action", "nargs", "choices") if spec[key] is not None}
        if spec["type"]:
            options["type"] = types[spec["type"]]
        parser.add_argument(flag, **options)
    return parser


def parse_openrlhf(flags: dict) -> dict:
    """The exported flags, parsed by OpenRLHF's parser: {"actor.adam.lr": 0.0003, ...}."""
    namespace, unknown = openrlhf_parser().parse_known_args(command_words(flags))
    assert unknown == [], f"flags OpenRLHF {OPENRLHF['version']} does not define: {unknown}"
    return vars(namespace)


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "ppo"])
def test_openrlhf_command_parses_with_its_parser(capsys, algo):
    agg = [f"--{algo}.loss_agg", OPENRLHF_AGG[algo]] if algo in OPENRLHF_AGG else []
    out = export(capsys, "openrlhf", "--algo", algo, "--rl.optim.lr", "3e-6", "--rl.update.minibatches", "2", *agg)
    args = parse_openrlhf(out["settings"])
    assert args["actor.adam.lr"] == 3e-6
    assert args["rollout.n_samples_per_prompt"] == 8 and args["rollout.batch_size"] == 32
    assert args["train.batch_size"] == 32 * 8 // 2  # completions per optimizer step
    assert args["data.max_samples"] == 200 * 32  # posttrain's 200 steps of 32 prompts, one episode
    assert args["rollout.max_new_tokens"] == 48 and args["train.seed"] == 0
    estimator = {"grpo": "group_norm", "dapo": "group_norm", "gspo": "group_norm", "dr_grpo": "dr_grpo",
                 "rloo": "rloo", "reinforce_pp": "reinforce", "ppo": "gae"}[algo]
    assert args["algo.advantage.estimator"] == estimator
    # the text is the same command: its words, past the comments, parse to the same values
    words = shlex.split(" ".join(line for line in out["text"].splitlines() if not line.startswith("#"))
                        .replace("\\", ""))
    assert words[:3] == ["python", "-m", "openrlhf.cli.train_ppo_ray"]
    assert vars(openrlhf_parser().parse_args(words[3:])) == args


def test_openrlhf_carries_clip_higher_kl_and_dynamic_sampling(capsys):
    out = export(capsys, "openrlhf", "--algo", "dapo", "--dapo.kl_coef", "0.001", "--rl.kl.target", "0")
    args = parse_openrlhf(out["settings"])
    assert args["actor.eps_clip_low_high"] == [0.2, 0.28]  # DAPO's clip-higher
    assert args["algo.kl.use_loss"] is True and args["algo.kl.init_coef"] == 0.001
    assert args["algo.kl.estimator"] == "k3"
    assert args["algo.dynamic_filtering_enable"] is True
    assert args["reward.overlong_buffer_len"] == 10.0
    ppo = parse_openrlhf(export(capsys, "openrlhf", "--algo", "ppo", "--ppo.kl_coef", "0.05")["settings"])
    assert ppo["algo.kl.use_loss"] is False and ppo["algo.kl.init_coef"] == 0.05  # in the reward, as PPO's
    assert ppo["algo.kl.estimator"] == "k1" and ppo["algo.advantage.lambd"] == 0.95


def test_openrlhf_refuses_an_aggregation_it_has_no_switch_for(capsys):
    err = refusal(capsys, "openrlhf", "--algo", "grpo")
    assert "grpo.loss_agg='seq-mean-token-mean' cannot be carried to openrlhf" in err
    assert "set --grpo.loss_agg token-mean" in err
    err = refusal(capsys, "openrlhf", "--algo", "dpo")
    assert "rl.algo='dpo' cannot be carried to openrlhf" in err and "export to trl" in err


def verl_overrides(out: dict) -> dict:
    """Every override checked against verl's composed config and registered names."""
    keys, names = VERL["keys"], VERL["names"]
    kinds = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,), "list": (list,),
             "NoneType": (int, float, str, bool)}
    for key, value in out["settings"].items():
        assert key in keys, f"{key} is no key of verl {VERL['version']}'s ppo_trainer config"
        # a float setting whose YAML default is written whole (top_p: 1) reads as an int there
        whole_float = keys[key] == "int" and isinstance(value, float) and value.is_integer()
        assert isinstance(value, kinds[keys[key]]) or whole_float, f"{key}={value!r}: verl's default is a {keys[key]}"
    settings = out["settings"]
    assert settings["algorithm.adv_estimator"] in names["adv_estimator"]
    assert settings["actor_rollout_ref.actor.loss_agg_mode"] in names["loss_agg_mode"]
    assert settings.get("actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla") in names["policy_loss.loss_mode"]
    for key in ("actor_rollout_ref.actor.kl_loss_type", "algorithm.kl_penalty"):
        assert settings.get(key, "kl") in names["kl_estimator"]
    return settings


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "ppo"])
def test_verl_overrides_are_keys_of_its_config(capsys, algo):
    out = export(capsys, "verl", "--algo", algo, "--rl.optim.lr", "1e-6", "--rl.update.minibatches", "4",
                 "--rl.samples_per_prompt", "16", "--seed", "7")
    settings = verl_overrides(out)
    assert settings["actor_rollout_ref.actor.optim.lr"] == 1e-6
    assert settings["actor_rollout_ref.rollout.n"] == 16 and settings["data.train_batch_size"] == 32
    assert settings["actor_rollout_ref.actor.ppo_mini_batch_size"] == 8  # prompts: 32 prompts in 4 minibatches
    assert settings["trainer.total_training_steps"] == 200 and settings["data.seed"] == 7
    for line in out["text"].splitlines()[1:]:
        if not line.startswith("#") and "=" in line:  # each override line is key=value, as Hydra reads it
            key = line.strip().rstrip("\\").strip().partition("=")[0]
            assert key in VERL["keys"]


def test_verl_carries_the_variants_as_verl_names_them(capsys):
    dr = verl_overrides(export(capsys, "verl", "--algo", "dr_grpo"))
    assert dr["algorithm.norm_adv_by_std_in_grpo"] is False
    assert dr["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-sum-norm"
    gspo = verl_overrides(export(capsys, "verl", "--algo", "gspo"))
    assert gspo["actor_rollout_ref.actor.policy_loss.loss_mode"] == "gspo"
    assert gspo["actor_rollout_ref.actor.clip_ratio_low"] == 3e-4 and gspo["actor_rollout_ref.actor.clip_ratio_high"] == 4e-4
    grpo = verl_overrides(export(capsys, "verl", "--algo", "grpo", "--grpo.kl_coef", "0.04"))
    assert grpo["actor_rollout_ref.actor.use_kl_loss"] is True and grpo["actor_rollout_ref.actor.kl_loss_coef"] == 0.04
    assert grpo["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"  # k3
    rpp = verl_overrides(export(capsys, "verl", "--algo", "reinforce_pp", "--rl.kl.target", "0.1"))
    assert rpp["algorithm.use_kl_in_reward"] is True and rpp["algorithm.kl_penalty"] == "kl"  # k1, in the reward
    assert rpp["algorithm.kl_ctrl.type"] == "adaptive" and rpp["algorithm.kl_ctrl.target_kl"] == 0.1


def test_verl_refuses_what_it_cannot_express(capsys):
    err = refusal(capsys, "verl", "--algo", "grpo", "--grpo.adv_norm", "batch-mean-batch-std")
    assert "grpo.adv_norm='batch-mean-batch-std' cannot be carried to verl" in err
    assert "set --grpo.adv_norm group or none" in err
    assert "rl.algo='kto' cannot be carried to verl" in refusal(capsys, "verl", "--algo", "kto")


def test_unmapped_settings_are_listed_never_dropped(capsys):
    out = export(capsys, "trl", "--algo", "dapo", "--rl.entropy.cov", "clip_cov", "--env.arithmetic.level", "4")
    assert "dapo.overlong_cache=10" in out["unmapped"] and "dapo.dynamic_sampling=True" in out["unmapped"]
    assert "rl.entropy.cov='clip_cov'" in out["unmapped"] and "env.arithmetic.level=4" in out["unmapped"]
    assert "#   rl.entropy.cov='clip_cov'" in out["text"].splitlines()
    # what is mapped is not listed, and settings left at posttrain's defaults are not noise
    assert not [item for item in out["unmapped"] if item.startswith(("rl.optim.", "rl.samples_per_prompt"))]
    assert "rl.eval_every=25" not in out["unmapped"]


def test_trl_keywords_follow_the_run(capsys):
    out = export(capsys, "trl", "--algo", "dr_grpo", "--rl.update.minibatches", "2", "--rl.update.micro_batch_size",
                 "32", "--rl.update.epochs", "2", "--rl.optim.final_lr_fraction", "1")
    kw = out["settings"]
    assert out["entry"] == "GRPOConfig" and kw["loss_type"] == "dr_grpo" and kw["scale_rewards"] == "none"
    # 256 completions a step, 2 minibatches of 128, each 4 micro-batches of 32: one generation per 8 optimizer steps
    assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"], kw["steps_per_generation"]) == (32, 4, 8)
    assert kw["num_iterations"] == 2 and kw["lr_scheduler_type"] == "constant_with_warmup"
    gspo = export(capsys, "trl", "--algo", "gspo")["settings"]
    assert gspo["importance_sampling_level"] == "sequence" and (gspo["epsilon"], gspo["epsilon_high"]) == (3e-4, 4e-4)
    err = refusal(capsys, "trl", "--algo", "reinforce_pp")
    assert "rl.algo='reinforce_pp' cannot be carried to trl" in err and "export to openrlhf or verl" in err
    err = refusal(capsys, "trl", "--algo", "grpo", "--grpo.kl_coef", "0.1", "--grpo.kl_estimator", "k1")
    assert "grpo.kl_estimator='k1' cannot be carried to trl: TRL's KL term is the k3 estimator" in err


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "dpo"])
def test_trl_builds_its_config_from_the_keywords(capsys, tmp_path, algo):
    trl = pytest.importorskip("trl", reason="TRL is not installed here: `make peers-test` runs this with TRL 1.16")
    out = export(capsys, "trl", "--algo", algo, "--rl.optim.lr", "2e-6", "--rl.update.minibatches", "4")
    config_class = getattr(trl, out["entry"])
    config = config_class(output_dir=str(tmp_path), **out["settings"])
    assert config.learning_rate == 2e-6 and config.max_steps == 200 and config.seed == 0
    if algo != "dpo":
        assert config.num_generations == 8 and config.max_completion_length == 48
        assert config.per_device_train_batch_size * config.steps_per_generation == 32 * 8  # one rollout batch
        assert config.generation_batch_size == 32 * 8  # what TRL derives: a step's prompts × samples
    else:
        assert config.loss_type == ["sigmoid"] and config.beta == 0.1


def test_trl_builds_dpo_with_its_nll_term(capsys, tmp_path):
    trl = pytest.importorskip("trl", reason="TRL is not installed here: `make peers-test` runs this with TRL 1.16")
    out = export(capsys, "trl", "--algo", "dpo", "--dpo.nll_coef", "1", "--dpo.beta", "0.2")
    config = trl.DPOConfig(output_dir=str(tmp_path), **out["settings"])
    assert (config.loss_type, config.loss_weights, config.beta) == (["sigmoid", "sft"], [1.0, 1.0], 0.2)


def test_export_reads_a_runs_config_json(capsys, tmp_path):
    cfg = TrainConfig(seed=3, rl=RLConfig(algo="gspo", algo_params={"clip_eps_high": 5e-4}))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(to_dict(cfg)), encoding="utf-8")
    out = export(capsys, "verl", "--config", str(path))
    assert out["settings"]["actor_rollout_ref.actor.clip_ratio_high"] == 5e-4
    assert out["settings"]["data.seed"] == 3
    with pytest.raises(ConfigError, match="stages='sft,grpo' cannot be exported"):
        from posttrain.runs.peer_configs import export_config

        export_config(TrainConfig(stages="sft,grpo"), {}, "verl")


def test_help_is_answered_without_torch():
    # the flags come from the torch-free section schema, as `posttrain train --help`'s do
    code = ("import contextlib, io, sys\n"
            "from posttrain.cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    status = main(['export-config', '--help'])\n"
            "print(status, 'torch' in sys.modules, '--to' in out.getvalue())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.stdout.split() == ["0", "False", "True"]
