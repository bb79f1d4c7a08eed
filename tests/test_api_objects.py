"""posttrain.train takes Python objects as a TRL user hands them over (#39, item 6): reward
functions as callables, rows as a list of dicts or a datasets.Dataset, a model as a name, a
directory or a transformers object; each becomes the setting that names it, so config.json
still says what ran, and every wrong object is refused by name before a run starts."""

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

import posttrain  # noqa: E402
from posttrain.config import ConfigError  # noqa: E402
from posttrain.pipelines.api import rows_file, with_datasets, with_model, with_reward_funcs  # noqa: E402
from posttrain.rewards.function_source import GIVEN, import_source  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

# 60 sums in TRL's conventions: a prompt, the answer under `answer`, the demonstration as `completion`
ROWS = [{"prompt": f"{a}+{b}=", "answer": a + b, "completion": f"{a}+{b}={a + b}\nFinal: {a + b}"}
        for a in range(6) for b in range(10)]


def shortness(completions, **columns):
    """TRL's signature: shorter completions earn more (a reward a random policy earns unevenly)."""
    return [1.0 - min(len(text), 20) / 20 for text in completions]


def small_config(out: Path) -> posttrain.TrainConfig:
    return posttrain.TrainConfig(
        out_dir=str(out), heldout_size=4, threads=1,
        model=posttrain.ModelConfig(dim=32, hidden_dim=64, n_layer=2),
        sft=posttrain.SFTConfig(steps=3, batch_size=4, num_examples=8),
        rl=posttrain.RLConfig(steps=2, prompts_per_step=2, samples_per_prompt=4, dev_size=3,
                              sampling=posttrain.SamplingParams(max_new_tokens=12)))


def test_train_with_a_plain_function_and_a_list_of_dicts(tmp_path):
    result = posttrain.train(small_config(tmp_path), reward_funcs=[shortness], train_dataset=ROWS)
    config = json.loads((result.run_dir / "config.json").read_text())
    # the function is named by where an import finds it; the rows by the file they were written to
    name = f"{__name__}:shortness"  # the module as pytest imported it (tests.test_api_objects)
    assert config["rl"]["reward"]["terms"] == name
    data = Path(config["env"]["path"])
    assert config["env"]["name"] == "jsonl" and data.parent == tmp_path / "datasets"
    assert [json.loads(line) for line in data.read_text().splitlines()] == ROWS
    assert result.summary["rl_steps"] == 2
    # rows without ids are named by their prompts, so before and after pair problem by problem
    assert result.summary["rl_vs_sft"]["n_shared"] == 4
    # every training sample's reward is the function's value on its completion, and nothing else
    samples = [json.loads(line) for line in (result.run_dir / "samples.jsonl").read_text().splitlines()]
    rl = [s for s in samples if s.get("stage", "rl") == "rl" and "components" in s.get("details", {})]
    assert len(rl) >= 8
    for sample in rl:
        assert sample["details"]["components"] == {name: shortness([sample["completion"]])[0]}
        assert sample["reward"] == pytest.approx(shortness([sample["completion"]])[0])


def test_a_dataset_object_is_the_same_rows_in_the_same_file(tmp_path):
    datasets = pytest.importorskip("datasets")
    from_list = rows_file(str(tmp_path), ROWS, "train_dataset")
    from_dataset = rows_file(str(tmp_path), datasets.Dataset.from_list(ROWS), "train_dataset")
    assert from_list == from_dataset and len(list((tmp_path / "datasets").iterdir())) == 1
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS)})
    with pytest.raises(ConfigError, match=r"dataset of splits \['test', 'train'\]: pass one of them"):
        rows_file(str(tmp_path), splits, "train_dataset")


def test_held_out_rows_are_the_held_out_file(tmp_path):
    cfg = with_datasets(small_config(tmp_path), ROWS[:50], ROWS[50:])
    assert [json.loads(line) for line in Path(cfg.env.heldout_path).read_text().splitlines()] == ROWS[50:]
    assert cfg.env.path != cfg.env.heldout_path
    math_cfg = with_datasets(posttrain.TrainConfig(out_dir=str(tmp_path), env=posttrain.EnvConfig(name="math")),
                             ROWS, None)
    assert math_cfg.env.name == "math"  # a file task keeps its verifier


def test_functions_no_import_reaches_are_named_for_this_process():
    GIVEN.clear()
    first, second = (lambda completions, **kw: [1.0]), (lambda completions, **kw: [0.0])
    cfg = with_reward_funcs(posttrain.TrainConfig(), [first, second, "accuracy"], [0.5, 2, 1])
    lam = f"python:{__name__}.test_functions_no_import_reaches_are_named_for_this_process.<locals>.<lambda>"
    assert cfg.rl.reward.terms == f"0.5*{lam} + 2*{lam}#2 + accuracy"
    assert import_source(lam) is first and import_source(f"{lam}#2") is second
    GIVEN.clear()  # another process (a --resume from the command line) was never handed them
    with pytest.raises(ValueError, match="handed to posttrain.train.*in another process.*pass it again"):
        import_source(lam)


@pytest.mark.parametrize("kwargs, message", [
    ({"reward_funcs": []}, "reward_funcs is empty"),
    ({"reward_funcs": [shortness], "reward_weights": [1, 2]}, "2 weights for 1 reward_funcs"),
    ({"reward_funcs": [shortness], "reward_weights": [float("nan")]}, "nan is not a finite number"),
    ({"reward_funcs": [42]}, "42 is not a function"),
    ({"train_dataset": [{"prompt": "1+1=", "answer": 2}, "2+2="]}, r"train_dataset\[1\] is a str, not a dict"),
    ({"train_dataset": [{"prompt": "1+1=", "answer": {2}}]}, r"train_dataset\[0\] cannot be written as JSON"),
    ({"train_dataset": "sums.jsonl"}, "is a path: set config.env.path"),
    ({"train_dataset": []}, "train_dataset has no rows"),
    ({"eval_dataset": ROWS}, "eval_dataset without train_dataset"),
    ({"train_dataset": ROWS, "env": object()}, "train_dataset and env= both give the task"),
    ({"model": 3.5}, "model is a float: pass a model name"),
    ({"processing_class": object()}, "processing_class is the tokenizer of a model object"),
])
def test_a_wrong_object_is_refused_by_name_before_anything_starts(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        posttrain.train(small_config(tmp_path), **kwargs)
    assert [p.name for p in tmp_path.iterdir() if p.name != "datasets"] == []  # no run directory


def test_reward_funcs_and_configured_terms_are_one_or_the_other(tmp_path):
    cfg = small_config(tmp_path)
    cfg.rl.reward.terms = "r1"
    with pytest.raises(ConfigError, match="reward_funcs and config.rl.reward.terms='r1' both give the reward"):
        posttrain.train(cfg, reward_funcs=[shortness])
    generated = posttrain.TrainConfig(env=posttrain.EnvConfig(name="reasoning_gym:gcd"))
    with pytest.raises(ConfigError, match="generates its own problems and reads no rows"):
        with_datasets(generated, ROWS, None)


def test_a_transformers_model_object_is_saved_once_by_its_content(tmp_path):
    from tests.test_start_from_model import save_tiny_llama
    from transformers import AutoTokenizer, LlamaForCausalLM

    source = save_tiny_llama(tmp_path / "source")
    model, tokenizer = LlamaForCausalLM.from_pretrained(source), AutoTokenizer.from_pretrained(source)
    cfg = with_model(posttrain.TrainConfig(out_dir=str(tmp_path / "runs")), model, tokenizer)
    saved = Path(cfg.model.name)
    assert saved.parent == tmp_path / "runs" / "models" and (saved / "config.json").is_file()
    assert (saved / "tokenizer.json").is_file()
    again = with_model(posttrain.TrainConfig(out_dir=str(tmp_path / "runs")), model, tokenizer)
    assert again.model.name == cfg.model.name and len(list(saved.parent.iterdir())) == 1  # no staging left over
    named = with_model(posttrain.TrainConfig(), source, None)
    assert named.model.name == str(source)
    with pytest.raises(ConfigError, match="needs its tokenizer: pass processing_class="):
        with_model(posttrain.TrainConfig(out_dir=str(tmp_path / "runs")), model, None)


GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "your-task.md"


def test_the_guides_example_runs_as_printed(tmp_path, monkeypatch, capsys):
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index("## Functions, rows and a model, as TRL takes them\n")
    [code] = re.findall(r"```python\n(.*?)```", text[start:text.index("\n## ", start + 1)], flags=re.S)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}  # as `python example.py` runs it
    exec(compile(code, str(GUIDE), "exec"), namespace)
    result = namespace["result"]
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["rl"]["reward"]["terms"] == "python:__main__.correct"  # a script's function: this process only
    assert config["env"]["path"].startswith("runs/datasets/") and result.summary["rl_steps"] == 20
    assert result.before["n"] == result.after["n"] == 60
    printed = f"held-out pass@1 {result.before['mean']:.2f} after SFT, {result.after['mean']:.2f} after GRPO"
    assert printed in capsys.readouterr().out
    # the function's column: `answer` arrived as a list, and paid exactly the completions that end in it
    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(row.get("reward/python:__main__.correct", 0) > 0 for row in metrics)
