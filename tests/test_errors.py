"""Every bad input gets a message that names what was wrong and what is allowed,
never a traceback from deep inside torch."""

import json

import pytest

from posttrain.cli import main
from posttrain.models import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer


@pytest.fixture(autouse=True)
def fixed_width(monkeypatch):
    # the parser wraps its messages to the terminal (at most 80 columns): fix it, so that
    # the needles below do not depend on the window the tests run in
    monkeypatch.setenv("COLUMNS", "80")


def fails_with(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    return err


def test_unknown_names_list_the_valid_ones(capsys, tmp_path):
    out = ["--out_dir", str(tmp_path)]
    fails_with(capsys, ["train", "--algo", "gpro", *out], "rl.algo='gpro'", "grpo")
    fails_with(capsys, ["train", "--model.name", "gpt5", *out], "model.name='gpt5'", "gpt_mini")
    fails_with(capsys, ["train", "--env.name", "chess", *out], "env.name='chess'", "arithmetic")
    fails_with(capsys, ["frobnicate"], "unknown command 'frobnicate'", "train")
    assert not any(tmp_path.iterdir())  # nothing was started


@pytest.mark.parametrize("flag, value, needles", [
    # type errors are the parser's, in its words: the flag, then the value it could not read
    ("--rl.optim.lr", "fast", ["--rl.optim.lr: could not convert", "to float: 'fast'"]),
    ("--rl.optim.lr", "-1", ["rl.optim.lr=-1.0", "positive"]),
    ("--rl.samples_per_prompt", "2.5", ["--rl.samples_per_prompt: invalid", "int()", "'2.5'"]),
    ("--rl.sampling.top_p", "1.5", ["rl.sampling.top_p=1.5", "(0, 1]"]),
    ("--env.cot", "maybe", ["'maybe'", "'--env.cot'", "'true'", "'false'"]),
    ("--env.arithmetic.level", "9", ["level", "9", "[1, 2, 3, 4, 5]"]),
    ("--grpo.clip_eps_low", "5", ["GRPO.clip_eps_low=5.0", "allowed"]),
    ("--grpo.kl_coeff", "0.1", ["--grpo.kl_coeff", "Perhaps you meant", "--grpo.kl_coef"]),
    ("--grpo.kl_coef", "kl=0.1", ["--grpo.kl_coef: could not convert", "'kl=0.1'"]),
    ("--model.n_head", "0", ["model.n_head=0", "positive"]),
    ("--rl.reward.terms", "vibes", ["rl.reward.terms='vibes'", "accuracy", "r1"]),
    ("--rl.kl.target", "0.01", ["rl.kl.target=0.01", "kl_coef"]),  # grpo's default kl_coef is 0
])
def test_malformed_values_name_field_value_and_what_is_allowed(capsys, tmp_path, flag, value, needles):
    fails_with(capsys, ["train", flag, value, "--out_dir", str(tmp_path)], *needles)


def test_config_file_errors(capsys, tmp_path):
    bad_key = tmp_path / "bad_key.json"
    bad_key.write_text(json.dumps({"rl": {"learning_rate": 1e-4}}))
    fails_with(capsys, ["train", "--config", str(bad_key)], "rl.learning_rate", "rl.optim.lr")
    bad_param = tmp_path / "bad_param.json"
    bad_param.write_text(json.dumps({"rl": {"algo_params": {"kl_coeff": 0.1}}}))
    fails_with(capsys, ["train", "--config", str(bad_param)], "rl.algo_params", "kl_coeff", "kl_coef=0.0")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    fails_with(capsys, ["train", "--config", str(broken)], "broken.json", "not valid JSON")
    fails_with(capsys, ["train", "--config", str(tmp_path / "missing.json")], "missing.json", "does not exist")


def test_checkpoint_of_a_different_shape(capsys, tmp_path):
    ckpt = tmp_path / "small"
    GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=2, n_head=2, hidden_dim=64, max_seq_len=96)).save_pretrained(ckpt, CharTokenizer())
    err = fails_with(capsys, ["train", "--init", str(ckpt), "--out_dir", str(tmp_path / "runs")],
                     "dim: checkpoint=32, expected=128", "n_layer: checkpoint=2, expected=4")
    assert "hidden_dim" in err
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made
    fails_with(capsys, ["train", "--init", str(tmp_path / "nope")], "init=", "no such checkpoint directory")
    fails_with(capsys, ["eval", "--checkpoint", str(tmp_path / "nope")], "no such directory")


def test_empty_or_unreadable_dataset_file(capsys, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    fails_with(capsys, ["train", "--env.name", "jsonl", "--env.path", str(empty)], "empty.jsonl", "no examples")
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b"\xff\xfe\x00binary")
    fails_with(capsys, ["train", "--env.name", "jsonl", "--env.path", str(garbage)], "garbage.jsonl, line 1",
               "not UTF-8 text")
    bad_line = tmp_path / "bad_line.jsonl"
    bad_line.write_text('{"prompt": "Q: 1+1\\n", "expected_answer": "2"}\n{"prompt": "Q: 2+2\\n"}\n')
    fails_with(capsys, ["train", "--env.name", "jsonl", "--env.path", str(bad_line)], "line 2", "expected_answer")
    fails_with(capsys, ["train", "--env.name", "jsonl", "--env.path", str(tmp_path / "absent.jsonl")], "absent.jsonl")
    fails_with(capsys, ["train", "--env.name", "jsonl"], "--env.path")


def test_resume_refuses_a_non_run_directory_and_extra_flags(capsys, tmp_path):
    fails_with(capsys, ["train", "--resume", str(tmp_path)], "not a run directory")
    (tmp_path / "config.json").write_text("{}")
    fails_with(capsys, ["train", "--resume", str(tmp_path), "--rl.optim.lr", "1e-3"], "--resume", "--rl.optim.lr")


def test_where_a_run_goes_is_checked_before_anything_starts(capsys, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for command in (["train"], ["bon"], ["compare", "--algos", "grpo"]):
        fails_with(capsys, [*command, "--out_dir", str(a_file)], f"out_dir='{a_file}' is a file, not a directory")
    fails_with(capsys, ["train", "--out_dir", str(a_file / "runs")], f"cannot be created: {a_file} is a file")
    for name in ("../../x", "/abs", "a/b"):
        fails_with(capsys, ["train", "--name", name, "--out_dir", str(tmp_path / "runs")],
                   f"name={name!r} is not allowed", "cannot contain '/', '\\' or '..'")
    fails_with(capsys, ["bon", "--name", "../x", "--out_dir", str(tmp_path / "runs")], "name='../x' is not allowed")
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"]  # no directory made, inside or out
