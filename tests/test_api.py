"""The library from Python (#19, item 9): `import posttrain` is cheap and offers every public
name from one place; your own environment (an object or a class, with **kwargs or not) trains
through posttrain.train and is refused early, by name, when it lacks what the pipeline calls.
The guide's example (docs/guides/your-task.md, tests/test_python_example.py) runs the whole thing end to end."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import posttrain
from posttrain.config import ArithmeticConfig, ConfigError
from posttrain.envs import make_env
from posttrain.pipelines.api import own_environment
from posttrain.types import Example

INIT = Path(posttrain.__file__)


def test_import_posttrain_loads_no_torch():
    code = ("import sys, posttrain; posttrain.TrainConfig; posttrain.__version__; "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["False", "False"]


def test_every_public_name_resolves_and_is_imported_for_readers():
    for name, module in posttrain.PUBLIC.items():
        assert getattr(posttrain, name) is getattr(sys.modules[module], name)
    # the TYPE_CHECKING block (what editors and the layout test read) names exactly PUBLIC
    tree = ast.parse(INIT.read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If))
    imported = {(node.module, alias.name) for node in block.body for alias in node.names}
    assert imported == {(module, name) for name, module in posttrain.PUBLIC.items()}
    with pytest.raises(AttributeError, match="public names are: .*train"):
        posttrain.trian  # noqa: B018


class Countdown:
    """A tiny task written as a user would: say the number before n."""

    spec_version = "countdown-v1"

    def __init__(self, **settings):  # takes any setting, as a user's class may
        self.settings = settings

    def sample(self, split, n, seed=0):
        offset = {"train": 10, "dev": 40, "heldout": 70}[split]
        return [Example(f"{offset + (seed + i) % 30}-1=", str(offset + (seed + i) % 30 - 1)) for i in range(n)]

    fixed_set = sample

    def solution(self, example):
        return example.expected_answer

    def score(self, example, completion):
        return {"reward": float(completion.strip() == example.expected_answer), "details": {}}


def test_an_environment_declared_with_kwargs_is_accepted():
    env = make_env(Countdown, level=2, path="x")
    assert env.settings == {"level": 2, "path": "x"}
    # without **kwargs the check still names the setting the class does not take
    with pytest.raises(ValueError, match=r"environment 'Example' has no parameter\(s\) \['level'\]"):
        make_env(Example, prompt="p", expected_answer="1", level=2)


def test_a_class_is_built_from_the_configs_env_settings():
    cfg = posttrain.TrainConfig(env=posttrain.EnvConfig(arithmetic=ArithmeticConfig(level=2)))
    recorded, env = own_environment(cfg, Countdown)
    assert isinstance(env, Countdown) and env.settings == {"level": 2}
    assert recorded.env.name == f"python:{__name__}.Countdown" and recorded.name == "Countdown-grpo"


def test_an_environment_missing_a_method_is_refused_by_name(tmp_path):
    class NoScore:
        spec_version = "v1"

        def sample(self, split, n, seed=0):
            return []

        fixed_set = sample

    cfg = posttrain.TrainConfig(out_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"env=NoScore has no method\(s\) \['score', 'solution'\]"):
        posttrain.train(cfg, env=NoScore())
    without_sft = posttrain.TrainConfig(out_dir=str(tmp_path), sft=posttrain.SFTConfig(steps=0))
    with pytest.raises(ConfigError, match=r"has no method\(s\) \['score'\]"):
        posttrain.train(without_sft, env=NoScore())
    assert not any(tmp_path.iterdir())


def test_train_on_a_custom_environment_and_evaluate_its_checkpoint(tmp_path):
    cfg = posttrain.TrainConfig(
        out_dir=str(tmp_path), heldout_size=6, threads=1,
        model=posttrain.ModelConfig(dim=32, hidden_dim=64, n_layer=2),
        sft=posttrain.SFTConfig(steps=3, batch_size=4, num_examples=8),
        rl=posttrain.RLConfig(steps=2, prompts_per_step=2, samples_per_prompt=4, dev_size=4,
                              sampling=posttrain.SamplingParams(max_new_tokens=4)))
    result = posttrain.train(cfg, env=Countdown())
    assert result.run_dir.parent == tmp_path and result.run_dir.name.endswith("Countdown-grpo")
    assert result.before["n"] == result.after["n"] == 6
    assert result.summary["rl_steps"] == 2
    assert result.checkpoint == result.run_dir / "checkpoints" / "rl" / "step_000001"
    # evaluate() scores the checkpoint as the run did: the same held-out problems, the same pass@1
    again = posttrain.evaluate(result, env=Countdown, size=6)
    assert again["ci"]["n"] == 6 and again["pass@1"] == result.after["mean"]
    assert [e.example.prompt for e in again["episodes"]] == [e.prompt for e in Countdown().fixed_set("heldout", 6)]
    from_run_dir = posttrain.evaluate(result.run_dir, env=Countdown(), size=6)  # its newest weights: the same
    assert [e.completion for e in from_run_dir["episodes"]] == [e.completion for e in again["episodes"]]
    # a checkpoint of a Python environment cannot rebuild its task alone: evaluate says what to pass
    with pytest.raises(ConfigError, match="pass env="):
        posttrain.evaluate(result.checkpoint)
