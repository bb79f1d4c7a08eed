"""What the console prints on every command's behalf: a stage's progress as plain lines where
the output is not a terminal (a pipe, a log file), a live bar where it is; and posttrain's own
warnings once each, as one line without the source line Python adds."""

import json
import os
import pty
import subprocess
import sys

from posttrain.runs.console import PlainProgress, console

# a stage of `steps` steps advanced with its metrics, in a fresh interpreter whose stdout is a pipe or a terminal
STAGE = ("from posttrain.runs.console import step_progress\n"
         "with step_progress('rl', 3, 0) as advance:\n"
         "    for step in range(3):\n"
         "        advance(f'reward 0.{step}')\n")


def test_plain_progress_prints_the_first_step_then_one_line_every_few_seconds_and_the_last():
    now = [100.0]
    progress = PlainProgress("rl", 20, 0, every=5.0, clock=lambda: now[0])
    with console.capture() as captured:
        for step in range(20):
            now[0] += 2.0  # a step takes 2 s
            progress.advance(f"reward {step / 20:.2f}")
    lines = captured.get().splitlines()
    # after step 1 (2 s), then each line at least 5 s after the one before: steps 4, 7, ..., 19, and the last
    assert [line.split()[2] for line in lines] == ["1/20", "4/20", "7/20", "10/20", "13/20", "16/20", "19/20", "20/20"]
    assert lines[0] == "rl step 1/20 (5%), 0:00:02 elapsed, 0:00:38 left: reward 0.00"
    assert lines[3] == "rl step 10/20 (50%), 0:00:20 elapsed, 0:00:20 left: reward 0.45"
    assert lines[-1] == "rl step 20/20 (100%), 0:00:40 elapsed, 0:00:00 left: reward 0.95"


def test_a_resumed_stage_counts_from_where_it_resumed():
    now = [0.0]
    progress = PlainProgress("sft", 100, 60, clock=lambda: now[0])
    with console.capture() as captured:
        now[0] = 3.0  # step 61 took 3 s: 39 more take 117 s
        progress.advance("")
    assert captured.get() == "sft step 61/100 (61%), 0:00:03 elapsed, 0:01:57 left\n"


def test_a_stage_stopped_early_still_shows_its_last_step():
    now = [0.0]
    progress = PlainProgress("rl", 200, 0, every=5.0, clock=lambda: now[0])
    with console.capture() as captured:
        for step in range(3):  # stopped after step 3 of 200 (an alert), 1 s a step
            now[0] += 1.0
            progress.advance(f"reward 0.{step}")
        progress.finish()
        progress.finish()  # nothing left to show
    lines = captured.get().splitlines()
    assert [line.split(":")[0] for line in lines] == ["rl step 1/200 (0%), 0", "rl step 3/200 (2%), 0"]


def test_progress_into_a_pipe_is_plain_lines():
    done = subprocess.run([sys.executable, "-c", STAGE], capture_output=True, text=True, check=True,
                          env={**os.environ, "TERM": "xterm-256color"})
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["rl step 1/3 (33%), 0", "rl step 3/3 (100%), 0"]
    assert lines[-1].endswith("left: reward 0.2")
    assert "\x1b[" not in done.stdout and "━" not in done.stdout  # no escape codes, no bar


def test_progress_on_a_terminal_is_the_live_bar():
    leader, follower = pty.openpty()
    env = {key: value for key, value in os.environ.items() if key not in ("NO_COLOR", "TERM", "CI")}
    done = subprocess.run([sys.executable, "-c", STAGE], stdout=follower, stderr=subprocess.PIPE,
                          env={**env, "TERM": "xterm-256color", "COLUMNS": "100"}, check=True)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: everything was read
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    text = shown.decode()
    assert done.returncode == 0 and "━" in text and "3/3" in text and "rl step" not in text


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
