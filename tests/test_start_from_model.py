"""Starting from what the user has (#19, item 8): RL straight from a plain transformers model
with no demonstrations (`--sft.steps 0`, or `--init` of any model directory), model names
found in the local Hugging Face cache without the network, --dry_run refusing a generation
budget the model's positions cannot hold, and no empty run folder left by a failed start.

The model is a tiny random Llama saved by transformers itself, with a character-level
tokenizer built by `tokenizers` (not posttrain's CharTokenizer: posttrain must treat the
directory as a model it never wrote)."""

import json
import os
import socket
import string
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # belt and braces: the tests below also refuse every socket

from safetensors.torch import load_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

import posttrain.pipelines.run as run_module  # noqa: E402
from posttrain.cli import main  # noqa: E402
from posttrain.models.model_dirs import resolve_model_dir  # noqa: E402

CHARS = string.printable  # every character an arithmetic or JSONL prompt holds


def save_tiny_llama(directory: Path, positions: int = 128) -> Path:
    """A 2-layer random Llama and a one-token-per-character tokenizer, as save_pretrained writes them."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # every character its own token
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=positions,
                         bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test: a cache lookup must read the disk only."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def problems_without_solutions(tmp_path_factory) -> Path:
    """60 sums with their answers and no meta.solution: nothing SFT could imitate."""
    path = tmp_path_factory.mktemp("data") / "sums.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "expected_answer": a + b}) + "\n"
                            for a in range(6) for b in range(10)))
    return path


# settings that make a run of two RL steps on the tiny model take a few seconds; a budget of 10, the
# least the arithmetic task's answer lines need ("Final: 45" and EOS: a shorter one is refused)
SMALL = ["--rl.steps", "2", "--rl.prompts_per_step", "2", "--rl.samples_per_prompt", "4",
         "--rl.sampling.max_new_tokens", "10", "--heldout_size", "3", "--rl.dev_size", "3", "--threads", "1"]


@pytest.fixture(scope="module")
def digit_reward(tmp_path_factory) -> str:
    """A reward a random model earns unevenly (the share of digits it writes), so that GRPO's
    groups have variance and RL has a gradient; the verifier alone would pay 0 everywhere."""
    path = tmp_path_factory.mktemp("reward") / "digits.py"
    path.write_text("def digits(prompts, completions, **columns):\n"
                    "    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]\n")
    return f"{path}:digits"


def run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir()) if out.exists() else []


def changed_tensors(before: Path, after: Path) -> int:
    """How many tensors differ between two model directories' weights."""
    old, new = load_file(before / "model.safetensors"), load_file(after / "model.safetensors")
    return sum(not torch.equal(old[name], new[name]) for name in old if name in new)


def test_rl_from_a_plain_transformers_model_needs_no_demonstrations(tiny_llama, problems_without_solutions,
                                                                     digit_reward, tmp_path, no_network):
    out = tmp_path / "runs"
    assert main(["train", "--model.name", str(tiny_llama), "--sft.steps", "0", "--env.name", "jsonl",
                 "--env.path", str(problems_without_solutions), "--out_dir", str(out), "--rl.reward.terms", digit_reward,
                 *SMALL]) == 0
    [run] = run_dirs(out)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if m["stage"] == "rl"] == [0, 1]
    assert not [m for m in metrics if m["stage"] == "sft"]  # no SFT step ran
    assert all(m["grad_norm"] > 0 and 0 < m["reward_mean"] < 1 for m in metrics)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sft"]["n"] == summary["rl"]["n"] == 3
    assert json.loads((run / "meta.json").read_text())["model_dir"] == str(tiny_llama)
    # RL started from the model's own directory: no copy of it in the run
    assert not (run / "checkpoints" / "init").exists()
    assert changed_tensors(tiny_llama, run / "checkpoints" / "rl" / "step_000001") > 0


def test_init_accepts_a_plain_model_directory(tiny_llama, digit_reward, tmp_path, no_network):
    # the default model.name is gpt_mini: the directory is still read as the transformers model it is
    out = tmp_path / "runs"
    assert main(["train", "--init", str(tiny_llama), "--out_dir", str(out), "--rl.reward.terms", digit_reward,
                 *SMALL]) == 0
    [run] = run_dirs(out)
    record = json.loads((run / "checkpoints" / "rl" / "step_000001" / "posttrain_policy.json").read_text())
    assert record["kind"] == "transformers"
    assert changed_tensors(tiny_llama, run / "checkpoints" / "rl" / "step_000001") > 0


def fake_hub_cache(root: Path, repo_id: str, source: Path) -> Path:
    """The Hugging Face hub cache layout: models--ORG--NAME/refs/main naming a snapshot folder."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_a_hub_name_resolves_from_the_local_cache_without_the_network(tiny_llama, tmp_path, monkeypatch,
                                                                        no_network, capsys):
    snapshot = fake_hub_cache(tmp_path / "hub", "tiny-org/tiny-llama", tiny_llama)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_model_dir("tiny-org/tiny-llama") == snapshot
    out = tmp_path / "runs"
    assert main(["train", "--model.name", "tiny-org/tiny-llama", "--sft.steps", "0", "--dry_run", "true",
                 "--out_dir", str(out), *SMALL]) == 0
    assert '"name": "tiny-org/tiny-llama"' in capsys.readouterr().out
    assert not out.exists()


def test_a_name_not_in_the_cache_says_so_and_how_to_get_it(tmp_path, monkeypatch, no_network, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hub"))
    with pytest.raises(ValueError) as error:
        resolve_model_dir("tiny-org/absent")
    message = str(error.value)
    assert "not in the local Hugging Face cache" in message and str(tmp_path / "empty_hub") in message
    assert "hf download tiny-org/absent" in message
    assert main(["train", "--model.name", "tiny-org/absent", "--dry_run", "true"]) == 2
    assert "model.name='tiny-org/absent' is not allowed" in capsys.readouterr().err


def test_a_dry_run_refuses_a_budget_the_model_cannot_hold(tmp_path, no_network, capsys):
    short = save_tiny_llama(tmp_path / "short", positions=16)
    out = tmp_path / "runs"
    assert main(["train", "--model.name", str(short), "--sft.steps", "0", "--dry_run", "true",
                 "--rl.sampling.max_new_tokens", "12", "--out_dir", str(out)]) == 2
    err = capsys.readouterr().err
    # the longest arithmetic prompt is longer than 4 tokens: it cannot fit with 12 new ones in 16 positions
    assert "rl.sampling.max_new_tokens=12 is not allowed" in err and "model's 16 positions" in err
    assert not out.exists()


def test_a_run_that_fails_before_its_first_step_leaves_no_folder(tmp_path, monkeypatch, capsys):
    def broken(model_cfg):
        raise ValueError("the model would not load")
    monkeypatch.setattr(run_module, "make_policy", broken)
    out = tmp_path / "runs"
    assert main(["train", "--sft.steps", "2", "--out_dir", str(out), *SMALL]) == 2
    assert "the model would not load" in capsys.readouterr().err
    assert run_dirs(out) == []


def test_a_run_that_fails_after_real_work_keeps_it(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("the held-out evaluation failed")
    monkeypatch.setattr(run_module, "evaluate_and_log", broken)  # after SFT's steps, before RL
    out = tmp_path / "runs"
    assert main(["train", "--sft.steps", "2", "--sft.batch_size", "4", "--model.dim", "32",
                 "--model.hidden_dim", "64", "--out_dir", str(out), *SMALL]) == 2
    [run] = run_dirs(out)
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert (run / "checkpoints" / "sft" / "step_000001").is_dir()  # resumable from here


def test_a_dry_run_shows_what_its_checks_found(tiny_llama, tmp_path, monkeypatch, no_network, capsys):
    snapshot = fake_hub_cache(tmp_path / "hub", "tiny-org/tiny-llama", tiny_llama)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["train", "--model.name", "tiny-org/tiny-llama", "--sft.steps", "0", "--dry_run", "true",
                 "--rl.sampling.max_new_tokens", "20", "--heldout_size", "7", "--rl.dev_size", "5",
                 "--out_dir", str(tmp_path / "runs")]) == 0
    printed = capsys.readouterr().out
    assert f"checked model: model.name='tiny-org/tiny-llama' is {snapshot}" in printed
    assert "checked data: 7 held-out and 5 dev problems; no SFT (sft.steps 0)" in printed
    # one token a character: the longest level-3 prompt of the arithmetic task, and the budget asked for
    [line] = [line for line in printed.splitlines() if line.startswith("checked sequence length")]
    longest = int(line.split("longest prompt (")[1].split(" tokens")[0])
    assert longest > 10 and f"+ rl.sampling.max_new_tokens (20) = {longest + 20} of the model's 128 positions" in line


def test_lora_follows_the_model_init_loads(tiny_llama, tmp_path, capsys):
    # a transformers model from --init takes LoRA although model.name is gpt_mini's default
    assert main(["train", "--init", str(tiny_llama), "--model.lora_r", "4", "--dry_run", "true", *SMALL]) == 0
    from posttrain.config import ModelConfig
    from posttrain.models import CharTokenizer, GPTMini, gpt_mini_config

    checkpoint = tmp_path / "gpt_mini"
    GPTMini(gpt_mini_config(ModelConfig())).save_pretrained(checkpoint, CharTokenizer())
    capsys.readouterr()
    assert main(["train", "--init", str(checkpoint), "--model.lora_r", "4", "--dry_run", "true", *SMALL]) == 2
    assert "model.lora_r=4 is not allowed: expected 0 with init=" in capsys.readouterr().err
