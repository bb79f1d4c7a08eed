"""What the console prints on every command's behalf: posttrain's own warnings once each, as
one line without the source line Python adds."""

import json
import os
import subprocess
import sys

WARN_TWICE = ("import json, warnings\n"
              "from posttrain.runs.console import print_warnings_once\n"
              "from posttrain.envs import make_env\n"
              "print_warnings_once()\n"
              "make_env('jsonl', path={path!r})\n"
              "warnings.filterwarnings('ignore', message='unrelated')  # as torch's import does: Python forgets\n"
              "make_env('jsonl', path={path!r})  # the run loads the file the checks loaded\n"
              "warnings.warn('a UserWarning of someone else', UserWarning)\n")


def test_a_warning_of_posttrains_prints_once_as_one_line(tmp_path):
    rows = [{"prompt": f"Q: {a}+{b}\n", "answer": str(a + b)} for a in range(20) for b in range(10)]
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows + rows[:3]))
    done = subprocess.run([sys.executable, "-c", WARN_TWICE.format(path=str(path))], capture_output=True, text=True,
                          check=True, env={**os.environ, "COLUMNS": "300"})
    assert done.stdout == (f"warning {path}: 3 row(s) repeat an earlier problem exactly (same prompt and answer); "
                           "each problem is kept once, in the most held-out split it is in\n")
    # another library's warning prints as Python prints it, with its place
    assert "UserWarning: a UserWarning of someone else" in done.stderr and "jsonl_file" not in done.stderr
