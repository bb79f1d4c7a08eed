"""The static type checker that `make test` runs first (mypy, pinned in pyproject.toml's dev
extra and configured under [tool.mypy]) can fail: a planted error in a module that uses the
library band is reported, with its line and error code, and the same module without it passes.

The clean module doubles as the conformance check of the seams: the shipped tokenizers,
environments and policies are handed to functions typed with the protocols, so a class that
drifts from its protocol fails here by name; an engine is built from a policy and a tokenizer,
and a Trainer is typed by the model it trains, so a policy's loss handed to a reward model's
trainer (or the other way round) is refused before anything runs. Both runs use the project's own configuration
and cache (.cache/mypy, warm after `make test`'s own run: a few seconds each).
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CLEAN = '''\
from posttrain.config import SamplingParams
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.envs.tool_arithmetic import ToolArithmeticEnv
from posttrain.models.gpt_mini import GPTMini
from posttrain.models.hf import HFPolicy, HFTokenizer
from posttrain.models.policy import Policy
from posttrain.models.tokenizer import CharTokenizer
from posttrain.rewards.reward_model import RewardModel
from posttrain.rewards.reward_model_training import BradleyTerryLoss, PairBatch
from posttrain.roles.engines import Engine, make_engine
from posttrain.roles.trainer import Trainer, sft_loss
from posttrain.types import Environment, Example, RolloutBatch, Tokenizer


def prompt_ids(tokenizer: Tokenizer, example: Example) -> list[int]:
    return tokenizer.encode(example.prompt)


def first_prompt(env: Environment) -> Example:
    return env.sample("train", 1, seed=0)[0]


def as_tokenizers(char: CharTokenizer, hf: HFTokenizer) -> list[Tokenizer]:
    return [char, hf]


def as_environments(arithmetic: ArithmeticEnv, tools: ToolArithmeticEnv) -> list[Environment]:
    return [arithmetic, tools]


def as_policies(mini: GPTMini, hf: HFPolicy) -> list[Policy]:
    return [mini, hf]


def rollout_engine(policy: GPTMini, tokenizer: CharTokenizer) -> Engine:
    return make_engine(policy, tokenizer, SamplingParams())


def policy_update(trainer: Trainer[GPTMini], batch: RolloutBatch) -> dict[str, float]:
    return trainer.update(batch, sft_loss)


def reward_model_step(trainer: Trainer[RewardModel], pairs: PairBatch, rollouts: RolloutBatch) -> dict[str, float]:
    return trainer.step(pairs, BradleyTerryLoss())


def unannotated(tokenizer):
    return CharTokenizer().encode("17*19")


ids = prompt_ids(CharTokenizer(), first_prompt(ArithmeticEnv(level=1)))
'''

# each planted error: (the line replaced in CLEAN, its replacement, the error code mypy must report)
PLANTED = [
    # a str where the seam takes an Example
    ("ids = prompt_ids(CharTokenizer(), first_prompt(ArithmeticEnv(level=1)))",
     'ids = prompt_ids(CharTokenizer(), "17*19")', "arg-type"),
    # an object that is no Tokenizer (it has no encode, decode, ids)
    ("    return [char, hf]", "    return [char, hf, object()]", "list-item"),
    # inside a function with no annotations at all: caught because check_untyped_defs is on
    ('    return CharTokenizer().encode("17*19")', "    return CharTokenizer().encode(17 * 19)", "arg-type"),
    # an engine handed something that is no Tokenizer where the prompt layout comes from
    ("    return make_engine(policy, tokenizer, SamplingParams())",
     "    return make_engine(policy, object(), SamplingParams())", "arg-type"),
    # a reward model's loss handed to a policy's trainer: ModelLoss[RewardModel] is no ModelLoss[GPTMini]
    ("    return trainer.update(batch, sft_loss)", "    return trainer.step(batch, BradleyTerryLoss())", "arg-type"),
    # a policy update asked of a reward model's trainer: update takes a Trainer[Policy]
    ("    return trainer.step(pairs, BradleyTerryLoss())", "    return trainer.update(rollouts, sft_loss)", "misc"),
]


def mypy(path: Path) -> subprocess.CompletedProcess:
    """mypy on one file with the project's configuration, from the repository root (where it
    finds the posttrain package and its cache). The file's name must be new to that cache:
    mypy caches a module's errors by its name, and on a later run replays them for a file of
    the same name and content with the path of the first run (`unique_module`)."""
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def unique_module(directory: Path, stem: str) -> Path:
    """A module path whose name no earlier run gave to mypy's cache."""
    return directory / f"{stem}_{uuid.uuid4().hex}.py"


def test_the_checker_passes_the_clean_module(tmp_path):
    clean = unique_module(tmp_path, "seams_clean")
    clean.write_text(CLEAN)
    result = mypy(clean)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found in 1 source file" in result.stdout


def test_the_checker_reports_each_planted_error(tmp_path):
    planted = CLEAN
    lines = []
    for old, new, _ in PLANTED:
        assert planted.count(old) == 1, old
        planted = planted.replace(old, new)
        lines.append(planted.splitlines().index(new) + 1)
    path = unique_module(tmp_path, "seams_planted")
    path.write_text(planted)
    result = mypy(path)
    assert result.returncode == 1, result.stdout + result.stderr
    reported = re.findall(rf"^{re.escape(str(path))}:(\d+): error: .*\[([a-z-]+)\]$", result.stdout, flags=re.M)
    assert sorted((int(line), code) for line, code in reported) == sorted(
        (line, code) for line, (_, _, code) in zip(lines, PLANTED)), result.stdout
    assert f"Found {len(PLANTED)} errors in 1 file" in result.stdout


def test_make_test_runs_the_checker_before_pytest():
    recipe, in_test = [], False
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("test:"):
            in_test = True
        elif in_test and line.startswith("\t"):
            recipe.append(line.strip())
        elif in_test:
            break
    checker = [i for i, step in enumerate(recipe) if step.endswith("-m mypy")]
    tests = [i for i, step in enumerate(recipe) if "-m pytest" in step]
    assert checker and tests and checker[0] < tests[0], recipe
