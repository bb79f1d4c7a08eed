"""docs/guides/first-task.md, as printed: its Python block writes the file the JSONL recipe trains
on (7,200 problems in the stated splits), and each command on the page (the JSONL and spell_backward
recipes, and the chain_sum try whose measurements it reports) passes every pre-run check. The training
itself is the page's measured numbers (minutes a seed), not a test."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "first-task.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)


def command_for(env_name: str) -> list[str]:
    """The page's one command that trains on --env.name `env_name`, as argv (shell quotes
    removed: the reasoning-gym task's settings are one quoted JSON argument)."""
    found = [shlex.split(block.replace("\\\n", " ")) for block in blocks("bash")]
    [argv] = [argv for argv in found if argv[argv.index("--env.name") + 1] == env_name]
    assert argv[:2] == ["posttrain", "train"]
    return argv


def dry_run(argv: list[str], cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "posttrain", *argv[1:], "--dry_run", "true"], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_the_jsonl_recipe_file_and_command_hold_as_printed(tmp_path, monkeypatch):
    [code] = blocks("python")
    monkeypatch.chdir(tmp_path)  # the block writes products3.jsonl where it runs
    exec(compile(code, str(GUIDE), "exec"), {"__name__": "__main__"})
    lines = (tmp_path / "products3.jsonl").read_text().splitlines()
    splits = [re.search(r'"split": "(\w+)"', line)[1] for line in lines]
    assert (len(lines), splits.count("train"), splits.count("validation"), splits.count("test")) == \
        (7200, 4986, 752, 1462)  # the counts the page states
    out = dry_run(command_for("jsonl"), tmp_path)
    assert "checked data: 500 held-out and 200 dev problems; 1000 SFT demonstrations" in out
    assert "longer than rl.sampling.max_new_tokens" not in out  # the budget fits every solution


def test_the_reasoning_gym_try_command_holds_as_printed(tmp_path):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'posttrain[tasks]')")
    out = dry_run(command_for("reasoning_gym:chain_sum"), tmp_path)
    assert "checked data: 500 held-out and 100 dev problems; 1000 SFT demonstrations, each with a solution" in out
    # the budget fits every worked solution the demonstrations hold, and the prompt with it fits the context
    assert "longer than rl.sampling.max_new_tokens" not in out
    assert re.search(r"the longest prompt \(114 tokens\) \+ rl.sampling.max_new_tokens \(60\) = 174 of the "
                     r"model's 176 positions", out), out


def test_the_spell_backward_recipe_command_holds_as_printed(tmp_path):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'posttrain[tasks]')")
    out = dry_run(command_for("reasoning_gym:spell_backward"), tmp_path)
    assert "checked data: 500 held-out and 100 dev problems; 1000 SFT demonstrations, each with a solution" in out
    # the page says the longest answer, tags and EOS, is 28 characters and fits the budget of 32
    assert "the longest answer the verifier reads, '<answer>ytixelprep</answer>', takes 28 characters" in out, out
    assert "within rl.sampling.max_new_tokens (32)" in out
