"""docs/guides/first-task.md, as printed: its Python block writes the file the recipe trains on
(7,200 problems in the stated splits), and its command passes every pre-run check on that file.
The training itself is the page's measured table (minutes a seed), not a test."""

import re
import subprocess
import sys
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "first-task.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)


def test_the_recipe_file_and_command_hold_as_printed(tmp_path, monkeypatch):
    [code] = blocks("python")
    monkeypatch.chdir(tmp_path)  # the block writes products3.jsonl where it runs
    exec(compile(code, str(GUIDE), "exec"), {"__name__": "__main__"})
    lines = (tmp_path / "products3.jsonl").read_text().splitlines()
    splits = [re.search(r'"split": "(\w+)"', line)[1] for line in lines]
    assert (len(lines), splits.count("train"), splits.count("validation"), splits.count("test")) == \
        (7200, 4986, 752, 1462)  # the counts the page states
    [command] = blocks("bash")
    argv = command.replace("\\\n", " ").split()
    assert argv[:2] == ["posttrain", "train"]
    done = subprocess.run([sys.executable, "-m", "posttrain", *argv[1:], "--dry_run", "true"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "checked data: 500 held-out and 200 dev problems; 1000 SFT demonstrations" in done.stdout
    assert "longer than rl.sampling.max_new_tokens" not in done.stdout  # the budget fits every solution
