"""Every setting, config file and data file that cannot work is refused before anything is
made (issue 17, parts 6 and 7): one line naming the setting or file and what is allowed,
no traceback, and no run directory."""

import dataclasses
import json
import os

import pytest
import torch

from posttrain.algorithms import ALGORITHMS, make_algorithm
from posttrain.cli import main
from posttrain.config import (ConfigError, KLConfig, ModelConfig, OptimConfig, PreferenceConfig, RLConfig, SFTConfig,
                              TrainConfig)
from posttrain.config.type_checks import check_types
from posttrain.envs import make_env
from posttrain.pipelines.checks import check_config
from posttrain.config.scoring import EvalConfig
from tests.test_algorithm_registry import random_batch


def refused(capsys, tmp_path, argv, *needles):
    """`posttrain ARGV --out_dir tmp/runs` exits 2 with one line holding every needle, and
    makes no run directory."""
    assert main([*argv, "--out_dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    assert not (tmp_path / "runs").exists()
    return err


# --- settings: type, finiteness, range ------------------------------------------------------


@pytest.mark.parametrize("flags, needles", [
    (["--threads", "99999"], ["threads=99999", f"[0, {4 * os.cpu_count()}]"]),
    (["--threads", "-1"], ["threads=-1"]),
    (["--rl.optim.lr", "inf"], ["rl.optim.lr=inf", "a finite number"]),
    (["--rl.optim.lr", "nan"], ["rl.optim.lr=nan", "a finite number"]),
    (["--rl.sampling.temperature", "inf"], ["rl.sampling.temperature=inf", "a finite number"]),
    (["--rl.mismatch.cap", "inf"], ["rl.mismatch.cap=inf", "a finite number"]),
    (["--sft.warmup_steps", "-5"], ["sft.warmup_steps=-5", "an integer >= 0"]),
    (["--rl.optim.warmup_steps", "-1"], ["rl.optim.warmup_steps=-1", "an integer >= 0"]),
    (["--sft.weight_decay", "-1"], ["sft.weight_decay=-1.0", "a number >= 0"]),
    (["--rl.optim.weight_decay", "-0.5"], ["rl.optim.weight_decay=-0.5", "a number >= 0"]),
    (["--model.n_head", "3"], ["model.n_head=3", "a divisor of model.dim=128"]),
    (["--model.dim", "12", "--model.n_head", "4"], ["model.n_head=4", "even heads", "RoPE"]),  # head_dim 3
    (["--grpo.kl_coef", "inf"], ["rl.algo_params.kl_coef=inf", "a finite number"]),
])
def test_a_bad_setting_is_refused_before_a_run_directory_exists(capsys, tmp_path, flags, needles):
    refused(capsys, tmp_path, ["train", *flags], *needles)


def test_the_type_pass_refuses_bools_fractions_non_finite_numbers_and_non_text():
    cases = [(TrainConfig(rl=RLConfig(steps=True)), "rl.steps=True is not allowed: expected an integer"),
             (TrainConfig(sft=SFTConfig(steps=2.0)), "sft.steps=2.0 is not allowed: expected an integer"),
             (TrainConfig(rl=RLConfig(optim=OptimConfig(lr=float("inf")))), "rl.optim.lr=inf is not allowed: expected a finite number"),
             (TrainConfig(rl=RLConfig(optim=OptimConfig(lr=10**400))), "rl.optim.lr=1000"),  # an int no float can hold
             (TrainConfig(rl=RLConfig(algo_params={"kl_coef": float("nan")})), "rl.algo_params.kl_coef=nan"),
             (TrainConfig(name=None), "name=None is not allowed: expected a string"),
             (TrainConfig(model=ModelConfig(dim=True)), "model.dim=True"),
             (TrainConfig(rl=RLConfig(kl=KLConfig(track=1))), "rl.kl.track=1 is not allowed: expected true or false"),
             (EvalConfig(completions="x", size=1.5), "size=1.5 is not allowed: expected an integer")]
    for cfg, message in cases:
        with pytest.raises(ConfigError) as error:
            check_types(cfg)
        assert str(error.value).startswith(message), str(error.value)
    check_types(TrainConfig(rl=RLConfig(optim=OptimConfig(lr=1))))  # an integer is a number: lr 1 is 1.0


def test_threads_are_bounded_by_the_machine():
    most = 4 * os.cpu_count()
    TrainConfig(threads=most).validate()
    with pytest.raises(ConfigError, match=rf"threads={most + 1} is not allowed: expected an integer in \[0, {most}\]"):
        TrainConfig(threads=most + 1).validate()


# --- config files ------------------------------------------------------------------------------


@pytest.mark.parametrize("name, text, needles", [
    ("list.json", "[1, 2]", ["list.json", "holds [1, 2], not an object of settings"]),
    ("string.json", '"rl.optim.lr=3"', ["string.json", "not an object of settings"]),
    ("overflow.json", '{"rl": {"steps": 1e400}}', ["overflow.json", "rl.steps=inf", "finite"]),
    ("nan.json", '{"sft": {"lr": NaN}}', ["nan.json", "sft.lr=nan", "finite"]),
    ("inf.toml", "[rl.optim]\nlr = inf\n", ["inf.toml", "rl.optim.lr=inf", "finite"]),
    ("settings.yaml", "rl:\n  lr: 0.001\n", ["settings.yaml", "YAML is not supported; use JSON or TOML"]),
    ("settings.yml", "{}", ["settings.yml", "YAML is not supported"]),
    ("broken.toml", "[rl\n", ["broken.toml", "is not valid TOML"]),
    ("unknown.json", '{"stepz": 3}', ["unknown.json", "unknown setting(s) ['stepz']"]),
    ("bool.json", '{"rl": {"steps": true}}', ["bool.json", "rl.steps=True is not allowed: expected an integer"]),
    ("float.json", '{"rl": {"steps": 2.0}}', ["float.json", "rl.steps=2.0 is not allowed: expected an integer"]),
    ("null.json", '{"name": null}', ["null.json", "name=None is not allowed: expected a string"]),
])
def test_a_config_file_that_cannot_work_is_refused_naming_it(capsys, tmp_path, name, text, needles):
    (tmp_path / name).write_text(text)
    refused(capsys, tmp_path, ["train", "--config", str(tmp_path / name)], *needles)


# --- what the run will ask of the data, asked before it starts --------------------------------


@pytest.mark.parametrize("flags, needles", [
    (["--env.arithmetic.level", "1"], ["heldout_size=500", "holds only 7"]),
    (["--env.arithmetic.level", "1", "--heldout_size", "7"], ["rl.dev_size=200", "holds only 3"]),
    (["--env.arithmetic.level", "1", "--heldout_size", "7", "--rl.dev_size", "3"], ["sft.num_examples=150", "holds only 90"]),
    (["--env.arithmetic.level", "2", "--heldout_size", "104"], ["heldout_size=104", "holds only 103"]),
    # prompt "Q: 1+2+3+4+5\n" is 13 characters + BOS: 96 - 14 = 82 positions are left
    (["--rl.sampling.max_new_tokens", "83"], ["rl.sampling.max_new_tokens=83", "at most 82", "96 positions"]),
    (["--model.max_seq_len", "40", "--rl.sampling.max_new_tokens", "8"],
     ["sft.num_examples", "demonstration", "more than the model's 40 positions", "raise model.max_seq_len"]),
])
def test_splits_and_context_are_checked_before_a_run_directory_exists(capsys, tmp_path, flags, needles):
    refused(capsys, tmp_path, ["train", *flags], *needles)


def test_the_largest_generation_budget_that_fits_is_accepted():
    cfg = TrainConfig()
    check_config(dataclasses.replace(cfg, rl=dataclasses.replace(
        cfg.rl, sampling=dataclasses.replace(cfg.rl.sampling, max_new_tokens=82))))


def test_eval_checks_its_split_size_before_loading_the_checkpoint(capsys, tmp_path):
    (tmp_path / "ckpt").mkdir()  # empty: the split is checked first
    refused(capsys, tmp_path, ["eval", "--checkpoint", str(tmp_path / "ckpt"), "--env.arithmetic.level", "1", "--split", "dev",
                               "--size", "4"], "size=4 is not allowed", "holds only 3")


def test_a_model_directory_without_a_model_is_refused(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    refused(capsys, tmp_path, ["train", "--model", str(tmp_path / "empty")], "model.name=", "is empty")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("weights to come")
    refused(capsys, tmp_path, ["train", "--model", str(tmp_path / "notes")], "has no config.json")
    (tmp_path / "sft").mkdir()  # a run's stage folder: the error names the checkpoint to pass instead
    (tmp_path / "sft" / "latest").write_text("step_000599")
    refused(capsys, tmp_path, ["train", "--model", str(tmp_path / "sft")], "checkpoint folder",
            str(tmp_path / "sft" / "step_000599"))
    (tmp_path / "sft" / "step_000599").mkdir()  # its `latest` pointer passed in place of the step it names
    refused(capsys, tmp_path, ["train", "--init", str(tmp_path / "sft" / "latest")], "is a file, not a model directory",
            f"pass that directory, {tmp_path / 'sft' / 'step_000599'}")
    (tmp_path / "weights.safetensors").write_text("")  # any other file: what to pass instead
    refused(capsys, tmp_path, ["train", "--init", str(tmp_path / "weights.safetensors")], "is a file",
            "the directory that holds config.json")
    (tmp_path / "config_only").mkdir()
    (tmp_path / "config_only" / "config.json").write_text('{"max_position_embeddings": 64}')
    refused(capsys, tmp_path, ["train", "--model", str(tmp_path / "config_only")], "has no weights")


def test_a_transformers_model_context_is_read_from_its_config(capsys, tmp_path):
    from posttrain.models import CharTokenizer, GPTMini, GPTMiniConfig

    model = tmp_path / "tiny_llama"
    GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=1, n_head=2, hidden_dim=64, max_seq_len=64)).save_pretrained(
        model, CharTokenizer())
    refused(capsys, tmp_path, ["train", "--model", str(model), "--rl.sampling.max_new_tokens", "51"],
            "rl.sampling.max_new_tokens=51", "at most 50", "64 positions", "longer-context model")


# --- settings under which RL cannot learn -----------------------------------------------------


def test_declared_group_baselines_are_the_ones_whose_advantages_vanish_with_one_sample():
    """needs_groups is a declaration; the math decides: with one sample per prompt, exactly
    the algorithms that declare it give every token advantage 0."""
    declared = {name: make_algorithm(name, budget=16).needs_groups for name in ALGORITHMS}
    assert declared == {"reinforce": False, "rloo": True, "ppo": False, "reinforce_pp": False, "grpo": True,
                        "dr_grpo": True, "prime": True, "dapo": True, "gspo": True, "cispo": True, "kimi": True,
                        "lite_ppo": True, "sapo": True, "gmpo": True, "dppo_tv": True, "dppo_kl": True,
                        "opd": False}
    algos = [make_algorithm(name, budget=16) for name in ALGORITHMS] + [make_algorithm("reinforce", baseline="group_mean"),
                                                                         make_algorithm("grpo", adv_norm="batch-mean-batch-std")]
    assert algos[-2].needs_groups and not algos[-1].needs_groups
    for algo in algos:
        alone = algo.compute_advantages(random_batch(K=1))["advantages"]
        grouped = type(algo)(**{f.name: getattr(algo, f.name) for f in dataclasses.fields(algo)}).compute_advantages(
            random_batch(K=3))["advantages"]
        assert bool(torch.all(alone == 0)) == algo.needs_groups, algo.name
        assert bool(torch.any(grouped != 0)), algo.name  # mixed groups do teach


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo"])
def test_a_group_baseline_with_one_sample_per_prompt_is_refused(capsys, tmp_path, algo):
    refused(capsys, tmp_path, ["train", "--algo", algo, "--rl.samples_per_prompt", "1"],
            "rl.samples_per_prompt=1 is not allowed", f"rl.algo='{algo}'", "every advantage is 0")


def test_cannot_learn_refusals_name_the_setting_and_what_to_use(capsys, tmp_path):
    refused(capsys, tmp_path, ["train", "--algo", "reinforce", "--reinforce.baseline", "group_mean",
                               "--rl.samples_per_prompt", "1"], "rl.samples_per_prompt=1", "'group_mean'")
    refused(capsys, tmp_path, ["train", "--algo", "dpo", "--rl.samples_per_prompt", "1"],
            "rl.samples_per_prompt=1", "one sample makes no pair", "rl.preference.pairs FILE")
    for algo in ("grpo", "ppo", "dpo"):
        refused(capsys, tmp_path, ["train", "--algo", algo, "--rl.sampling.temperature", "0"],
                "rl.sampling.temperature=0.0 is not allowed", "greedily", "use 1.0")


def test_settings_that_can_still_learn_are_accepted(tmp_path):
    def cfg(**rl):
        return TrainConfig(rl=dataclasses.replace(RLConfig(), **rl))

    check_config(cfg(algo="ppo", samples_per_prompt=1))  # a critic is its baseline
    check_config(cfg(algo="reinforce", samples_per_prompt=1))  # the running mean of earlier batches
    check_config(cfg(algo="grpo", steps=0, samples_per_prompt=1))  # nothing is trained
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "Q: 1+2\n", "chosen": "Final: 3", "rejected": "Final: 4"}) + "\n")
    check_config(cfg(algo="dpo", samples_per_prompt=1, preference=PreferenceConfig(pairs=str(pairs))))  # the file holds the pairs


# --- data that cannot work: refused at load ---------------------------------------------------


def write(path, rows):
    path.write_text("".join(row if isinstance(row, str) else json.dumps(row) + "\n" for row in rows))
    return str(path)


def problem(a, **meta):
    return {"prompt": f"Q: {a}+{a}\n", "expected_answer": 2 * a, "meta": meta}


def test_a_reference_solution_the_verifier_rejects_is_refused_naming_file_line_and_reason(tmp_path):
    path = write(tmp_path / "p.jsonl", [problem(1, solution="1+1=2\nFinal: 2"), problem(2, solution="2+2=5\nFinal: 5")])
    with pytest.raises(ValueError) as error:
        make_env("jsonl", path=path)
    assert str(error.value).startswith("{}, line 2: meta.solution '2+2=5\\nFinal: 5' scores 0, not 1, under "
                                       "final_int/cot-v1 (reason 'wrong_answer', parsed '5')".format(path))
    assert "SFT would teach a wrong answer" in str(error.value)
    path = write(tmp_path / "m.jsonl", [{"prompt": "Half of 1?", "expected_answer": "\\frac{1}{2}",
                                         "meta": {"solution": "\\boxed{0.4}"}}])
    with pytest.raises(ValueError, match=r"m.jsonl, line 1: meta.solution '\\\\boxed\{0.4\}' scores 0, not 1, under "
                                         r"math/boxed-or-final-v2 \(reason 'wrong_answer'"):
        make_env("math", path=path)
    path = write(tmp_path / "n.jsonl", [problem(1, solution=2)])
    with pytest.raises(ValueError, match=r"n.jsonl, line 1: meta.solution must be a str"):
        make_env("jsonl", path=path)


def test_a_reference_program_that_fails_its_tests_is_refused(tmp_path):
    row = {"prompt": "add", "expected_answer": "", "meta": {"tests": ["assert add(2, 3) == 5"]}}
    right = {**row, "meta": {**row["meta"], "solution": "def add(a, b):\n    return a + b"}}
    wrong = {**row, "prompt": "add again", "meta": {**row["meta"], "solution": "def add(a, b):\n    return a - b"}}
    path = write(tmp_path / "c.jsonl", [right, wrong])
    with pytest.raises(ValueError, match=r"c.jsonl, line 2: meta.solution .* under code/tests-v2 \(reason 'wrong_answer'"):
        make_env("code", path=path)


def test_a_file_is_checked_again_once_it_changes(tmp_path):
    path = write(tmp_path / "p.jsonl", [problem(a, solution=f"{a}+{a}={2 * a}\nFinal: {2 * a}") for a in range(3)])
    make_env("jsonl", path=path)
    write(tmp_path / "p.jsonl", [problem(a, solution=f"{a}+{a}={2 * a}\nFinal: {2 * a + 10}") for a in range(3)])
    with pytest.raises(ValueError, match="line 1: meta.solution"):
        make_env("jsonl", path=path)


def test_one_prompt_with_two_answers_is_refused_naming_both_lines(tmp_path):
    rows = [problem(1), "\n", problem(2), {**problem(1), "expected_answer": 3}]
    with pytest.raises(ValueError) as error:
        make_env("jsonl", path=write(tmp_path / "p.jsonl", rows))
    assert "p.jsonl, line 4: prompt 'Q: 1+1\\n' is also on line 1 with expected_answer '2', here '3'" in str(error.value)
    tests = [{"prompt": "add", "expected_answer": "", "meta": {"tests": [t]}}
             for t in ("assert add(2, 3) == 5", "assert add(2, 3) == 6")]
    with pytest.raises(ValueError, match=r"line 2: prompt 'add' is also on line 1 with meta.tests"):
        make_env("code", path=write(tmp_path / "c.jsonl", tests))


def test_an_exact_repeat_is_kept_once_with_a_warning(tmp_path):
    rows = [problem(a) for a in range(40)] + [problem(3), {**problem(5), "expected_answer": "10"}]
    with pytest.warns(UserWarning, match=r"2 row\(s\) repeat an earlier problem exactly"):
        env = make_env("jsonl", path=write(tmp_path / "p.jsonl", rows))
    assert {split: len(rows) for split, rows in env.by_split.items()} == {"train": 29, "dev": 6, "heldout": 5}


def test_bad_data_and_small_files_are_refused_by_the_cli(capsys, tmp_path):
    wrong = write(tmp_path / "wrong.jsonl", [problem(1, solution="1+1=3\nFinal: 3")])
    refused(capsys, tmp_path, ["train", "--env.name", "jsonl", "--env.path", wrong], "wrong.jsonl, line 1:", "scores 0")
    forty = write(tmp_path / "forty.jsonl", [problem(a, solution=f"{a}+{a}={2 * a}\nFinal: {2 * a}") for a in range(40)])
    jsonl = ["train", "--env.name", "jsonl", "--env.path", forty]
    refused(capsys, tmp_path, jsonl, "heldout_size=500 is not allowed: expected at most 5")
    refused(capsys, tmp_path, [*jsonl, "--heldout_size", "5"], "rl.dev_size=200", "at most 6")
    refused(capsys, tmp_path, [*jsonl, "--heldout_size", "5", "--rl.dev_size", "6"], "sft.num_examples=150", "at most 29")
    no_demos = write(tmp_path / "no_demos.jsonl", [problem(a) for a in range(40)])
    refused(capsys, tmp_path, ["train", "--env.name", "jsonl", "--env.path", no_demos, "--heldout_size", "5",
                               "--rl.dev_size", "6", "--sft.num_examples", "29"], "no meta.solution", "--init")
    check_config(TrainConfig(env=dataclasses.replace(TrainConfig().env, name="jsonl", path=forty), heldout_size=5,
                             rl=RLConfig(dev_size=6), sft=SFTConfig(num_examples=29)))
