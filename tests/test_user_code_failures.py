"""User code cannot take a run down (issue #39, item 8).

Whatever a reward function, a reward module's import or a tool raises, SystemExit and
KeyboardInterrupt included, is named with the function, file and line; the command exits
non-zero and the run directory resumes, with the command that resumes it (the real
directory, not a placeholder). A Ctrl-C of posttrain's own wait stays an interrupt. A
reward value that is not a finite float is named with its function. A kill -9 at any point
leaves a run that resumes or a directory the next run sweeps. `--init RUN_DIR` names the
checkpoint to pass; export names OUT in its errors and exports the newest complete step
when the one it read is pruned under it; a data file that is not UTF-8 is named by line.
"""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from posttrain.cli import COMMANDS, main
from posttrain.config import ConfigError, RLConfig, RewardConfig
from posttrain.envs import make_env
from posttrain.envs.dataset_files import read_rows
from posttrain.envs.tools import Tool, ToolCall, ToolRegistry
from posttrain.models import CharTokenizer, GPTMini, GPTMiniConfig, read_model_dir
from posttrain.models.export import export_checkpoint
from posttrain.models.model_dirs import resolve_model_dir
from posttrain.pipelines.build import make_reward
from posttrain.pipelines.checks import check_rl
from posttrain.rewards import function_source
from posttrain.rewards.stack import Accuracy, RewardStack
from posttrain.rewards.user_function import RewardFunctionError
from posttrain.runs.checkpoints import complete_checkpoints, remove_checkpoint
from posttrain.runs.rundir import ExitInsideRun, RunDir, RunDirError, sweep_unstarted
from posttrain.types import Example

SCORE = make_env("arithmetic").score
E = Example(prompt="Q: 2+3\n", expected_answer="5", id="x1", meta={"level": 1})
RIGHT = "2+3=5\nFinal: 5"

TINY = [  # tests/test_user_reward.py's tiny run
    "--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
    "--sft.num_examples", "16", "--sft.steps", "6", "--sft.batch_size", "8", "--sft.warmup_steps", "2",
    "--rl.prompts_per_step", "2", "--rl.samples_per_prompt", "2", "--rl.eval_every", "5", "--rl.dev_size", "8",
    "--heldout_size", "8", "--checkpoint_every", "2", "--rl.steps", "2",
]

# a reward file whose `fn` stops in each way a user's code can, on the line RAISING_LINE
STOPS = {
    "sys_exit_0": "import sys\nsys.exit(0)",
    "exit_2": "raise SystemExit(2)",
    "keyboard_interrupt": "raise KeyboardInterrupt",
    "generator_exit": "raise GeneratorExit('closed')",
    "own_base_exception": "raise Abort('gave up')",
}
RAISING_LINE = 6


def reward_file(directory: Path, body: str, name: str = "stops.py") -> Path:
    """A reward module whose fn runs `body` (its last line is line RAISING_LINE)."""
    lines = body.split("\n")
    indented = "\n".join("    " + line for line in lines)
    padding = "\n" * (RAISING_LINE - 4 - len(lines))  # blank lines before the def, so the body ends on RAISING_LINE
    path = directory / name
    path.write_text(f"class Abort(BaseException):\n    pass\n{padding}\ndef fn(example, completion):\n{indented}\n")
    assert path.read_text().splitlines()[RAISING_LINE - 1].strip() == lines[-1]
    return path


def reward(spec: str, timeout: float):
    return make_reward(RLConfig(reward=RewardConfig(terms=spec, timeout=timeout)), SCORE)


# --- a reward function that exits or raises a BaseException --------------------------------


@pytest.mark.parametrize("stop", STOPS)
def test_a_function_that_exits_is_named_with_its_file_and_line_in_the_worker_thread(tmp_path, stop):
    path = reward_file(tmp_path, STOPS[stop])
    with pytest.raises(RewardFunctionError) as caught:  # before: SystemExit etc. went through, the run ended
        reward(f"accuracy + {path}:fn", timeout=2.0)(E, RIGHT)
    message = str(caught.value)
    for needle in [f"reward function {path}:fn", f"stops.py, line {RAISING_LINE}, in fn", "'Q: 2+3\\n'", "--resume"]:
        assert needle in message, (needle, message)
    assert ("SystemExit(0)" in message) == (stop == "sys_exit_0")


@pytest.mark.parametrize("stop", [s for s in STOPS if s != "keyboard_interrupt"])
def test_a_function_that_exits_in_the_training_thread_is_named_too(tmp_path, stop):
    path = reward_file(tmp_path, STOPS[stop])
    with pytest.raises(RewardFunctionError, match=f"stops.py, line {RAISING_LINE}, in fn"):
        reward(f"{path}:fn", timeout=0)(E, RIGHT)  # timeout 0: called in this thread


def test_a_keyboard_interrupt_in_the_training_thread_stays_an_interrupt_that_names_the_function(tmp_path):
    # in the training thread it may be the user's Ctrl-C: not a failure of the function, but said where it landed
    path = reward_file(tmp_path, STOPS["keyboard_interrupt"])
    with pytest.raises(KeyboardInterrupt, match=rf"while reward function {path}:fn ran \(stops.py, line 6, in fn\)"):
        reward(f"{path}:fn", timeout=0)(E, RIGHT)


def send_ctrl_c_in(seconds: float) -> threading.Timer:
    """A real SIGINT to this process, as a Ctrl-C at the terminal sends, while the main thread waits.
    Python's own Ctrl-C handler is put back first: in a full `make test` an earlier test in the same
    worker left SIGINT handled otherwise (these two passed alone and failed there, twice, on
    2026-12-02), and what is tested is posttrain's wait under the handler a user's process has."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_a_ctrl_c_while_waiting_for_a_reward_function_stays_an_interrupt(tmp_path):
    path = tmp_path / "slow.py"
    path.write_text("import time\n\ndef fn(example, completion):\n    time.sleep(3)\n    return 1.0\n")
    score = reward(f"{path}:fn", timeout=10.0)
    send_ctrl_c_in(0.3)
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):  # not a RewardFunctionError blaming the function
        score(E, RIGHT)
    assert time.perf_counter() - start < 2.0


# --- values that are not finite floats ------------------------------------------------------


def test_a_value_too_large_for_a_float_is_named_with_its_function(tmp_path):
    path = tmp_path / "big.py"
    path.write_text("import fractions\n\ndef huge(example, completion):\n    return 10**400\n\n"
                    "def third(example, completion):\n    return fractions.Fraction(1, 3)\n")
    with pytest.raises(RewardFunctionError) as caught:  # before: a bare OverflowError from float()
        reward(f"{path}:huge", timeout=1.0)(E, RIGHT)
    assert f"reward function {path}:huge" in str(caught.value)
    assert "returned a int that does not convert to a float (OverflowError" in str(caught.value)
    assert reward(f"{path}:third", timeout=1.0)(E, RIGHT)["reward"] == pytest.approx(1 / 3)  # a Real converts


class NaNTerm:
    name, spec = "my_term", "my_term(v1)"

    def __call__(self, example, completion, scored):
        return math.inf


def test_a_python_reward_term_that_returns_inf_is_named():
    stack = RewardStack([(1.0, Accuracy()), (0.5, NaNTerm())])
    with pytest.raises(ValueError, match=r"reward term my_term\(v1\) returned inf; a term returns a finite float"):
        stack.wrap(SCORE)(E, RIGHT)


# --- a reward module's import ---------------------------------------------------------------


def test_a_module_that_parses_the_command_line_at_import_is_named_at_its_line(tmp_path, capsys):
    path = tmp_path / "script_rewards.py"
    path.write_text("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--data', required=True)\n"
                    "args = parser.parse_args()\n\ndef fn(example, completion):\n    return 1.0\n")
    with pytest.raises(ConfigError) as caught:  # before: SystemExit(2) left the process with argparse's usage
        check_rl(RLConfig(reward=RewardConfig(terms=f"{path}:fn")))
    message = str(caught.value)
    assert "raised SystemExit(2) (argparse.py, line" in message
    assert "called from script_rewards.py, line 4, in <module>" in message
    assert "if __name__ == '__main__':" in message


@pytest.mark.parametrize("stop", ["raise KeyboardInterrupt", "raise GeneratorExit", "import sys; sys.exit('no')"])
@pytest.mark.parametrize("timeout", [5.0, 0])
def test_an_import_that_exits_is_a_config_error_naming_the_line(tmp_path, stop, timeout):
    path = tmp_path / "bad_import.py"
    path.write_text(f"x = 1\n{stop}\n\ndef fn(example, completion):\n    return 1.0\n")
    if stop == "raise KeyboardInterrupt" and timeout == 0:  # the training thread: it may be a Ctrl-C
        with pytest.raises(KeyboardInterrupt, match=r"running .*bad_import.py \(bad_import.py, line 2, in <module>\)"):
            check_rl(RLConfig(reward=RewardConfig(terms=f"{path}:fn", timeout=timeout)))
        return
    with pytest.raises(ConfigError, match=r"running .*bad_import.py raised .*\(bad_import.py, line 2, in <module>\)"):
        check_rl(RLConfig(reward=RewardConfig(terms=f"{path}:fn", timeout=timeout)))


def test_an_import_that_never_finishes_is_named_after_the_time_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(function_source, "IMPORT_TIMEOUT", 0.5)
    path = tmp_path / "waits.py"
    path.write_text("import time\ntime.sleep(30)  # a download, a server, input()\n\ndef fn(example, completion):\n"
                    "    return 1.0\n")
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"running .*waits.py did not finish within 0.5 s; a module's top level"):
        check_rl(RLConfig(reward=RewardConfig(terms=f"{path}:fn")))
    assert time.perf_counter() - start < 3.0  # before: the command hung for the whole sleep


def test_a_reward_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "latin.py"
    path.write_bytes(b"def fn(example, completion):\n    return len('caf\xe9')\n")
    with pytest.raises(ConfigError, match=r"\(latin.py, line 2\); save the file as UTF-8"):
        check_rl(RLConfig(reward=RewardConfig(terms=f"{path}:fn")))


# --- tools ----------------------------------------------------------------------------------


def tool(function, timeout_seconds: float = 5.0) -> ToolRegistry:
    return ToolRegistry([Tool("lookup", "d", {"type": "object", "properties": {}}, function,
                              timeout_seconds=timeout_seconds)])


def interrupts(**_):
    raise KeyboardInterrupt("from the tool itself")


def closes(**_):
    raise GeneratorExit


@pytest.mark.parametrize("function, error", [(interrupts, "KeyboardInterrupt: from the tool itself"),
                                             (closes, "GeneratorExit: ")])
def test_a_tool_that_raises_a_base_exception_is_a_tool_error_with_its_line(function, error):
    result = tool(function).call(ToolCall("lookup", {}))  # before: the KeyboardInterrupt stopped the run
    assert (result.ok, result.reason, result.error) == (False, "tool_error", error)
    assert result.details()["where"].startswith("test_user_code_failures.py, line ")


def test_a_ctrl_c_while_a_tool_runs_still_interrupts():
    send_ctrl_c_in(0.3)
    with pytest.raises(KeyboardInterrupt):  # posttrain's own wait: the user's Ctrl-C, not the tool's error
        tool(lambda **_: time.sleep(3), timeout_seconds=10.0).call(ToolCall("lookup", {}))


# --- through the command line: non-zero, resumable, the real directory ----------------------


def exits_unless_fixed(directory: Path, how: str) -> tuple[Path, Path]:
    """(reward file, flag file): fn stops the way `how` says while the flag file exists."""
    flag = directory / "broken"
    flag.write_text("")
    path = directory / "flaky.py"
    path.write_text(f"import os, sys\n\ndef fn(example, completion):\n    if os.path.exists({str(flag)!r}):\n"
                    f"        {how}\n    return 0.0\n")
    return path, flag


def test_cli_a_reward_function_calling_sys_exit_0_fails_and_the_run_resumes(tmp_path, capsys):
    path, flag = exits_unless_fixed(tmp_path, "sys.exit(0)")
    argv = ["train", *TINY, "--rl.reward.terms", f"accuracy + {path}:fn", "--out_dir", str(tmp_path / "runs")]
    assert main(argv) == 2  # before: 0, as if the run had finished
    err = capsys.readouterr().err
    (run,) = (tmp_path / "runs").iterdir()
    assert err.startswith(f"posttrain train: error: reward function {path}:fn (posttrain signature) raised "
                          "SystemExit(0) (flaky.py, line 5, in fn)")
    assert f"the run directory {run} is resumable: `posttrain train --resume {run}`" in err
    assert "runs/<id>" not in err
    flag.unlink()  # fixed
    assert main(["train", "--resume", str(run)]) == 0
    assert "resuming sft" in capsys.readouterr().out
    assert json.loads((run / "summary.json").read_text())["final_stage"] == "rl"


def test_cli_an_interrupt_names_the_function_and_the_real_run_directory(tmp_path, capsys):
    path, _ = exits_unless_fixed(tmp_path, "raise KeyboardInterrupt")
    argv = ["train", *TINY, "--rl.reward.terms", f"accuracy + {path}:fn", "--rl.reward.timeout", "0",
            "--out_dir", str(tmp_path / "runs")]
    assert main(argv) == 130
    err = capsys.readouterr().err
    (run,) = (tmp_path / "runs").iterdir()
    assert f"posttrain train: interrupted while reward function {path}:fn ran (flaky.py, line 5, in fn)" in err
    assert f"`posttrain train --resume {run}` continues it from its last checkpoint" in err
    assert "runs/<id>" not in err


def test_an_exit_from_code_a_run_calls_is_named_and_the_run_stays_resumable(tmp_path):
    run = RunDir.create(str(tmp_path), "r")
    run.append_jsonl("metrics.jsonl", [{"stage": "sft", "step": 0}])  # has results: it is kept
    with pytest.raises(ExitInsideRun) as caught, run.resumable(f"posttrain train --resume {run.path}"):
        sys.exit(0)  # a judge's model, a rubric criterion, an environment: code that is not a reward function
    assert str(caught.value).startswith("SystemExit(0) was raised inside the run (test_user_code_failures.py, line")
    assert caught.value.__notes__ == [f"the run directory {run.path} is resumable: `posttrain train --resume "
                                      f"{run.path}` continues it from its last checkpoint"]
    with pytest.raises(KeyboardInterrupt) as interrupted, run.resumable("posttrain train --resume X"):
        raise KeyboardInterrupt
    assert interrupted.value.__notes__ == ["the run directory " + str(run.path) + " is resumable: `posttrain train "
                                           "--resume X` continues it from its last checkpoint"]


def test_a_run_about_to_be_removed_gets_no_resume_note(tmp_path):
    run = RunDir.create(str(tmp_path), "r")  # no results: __exit__ removes it
    with pytest.raises(ValueError) as caught, run, run.resumable("posttrain train --resume X"):
        raise ValueError("the model will not load")
    assert not hasattr(caught.value, "__notes__") and not run.path.exists()


def test_cli_an_exit_outside_any_parser_is_not_status_0(monkeypatch, capsys):
    monkeypatch.setitem(COMMANDS, "doctor", lambda argv: sys.exit(0))  # a command whose callee exits
    assert main(["doctor", "x"]) == 1
    assert "SystemExit(0) was raised at test_user_code_failures.py, line" in capsys.readouterr().err
    assert main(["export", "--help"]) == 0 and main(["export"]) == 2  # a parser's exits keep their status


# --- kill -9 at any point -------------------------------------------------------------------


def killed_after(out: Path, code: str) -> Path:
    """Run `code` in a process that creates a run in `out` (as `run`), then SIGKILL it; the directory."""
    script = (f"import os, signal\nfrom posttrain.runs.rundir import RunDir\nrun = RunDir.create({str(out)!r}, 'k')\n"
              f"{code}\nos.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[1])
    assert proc.returncode == -signal.SIGKILL
    (run,) = [p for p in out.iterdir() if p.name.endswith("-k")]
    return run


@pytest.mark.parametrize("code, files", [("", [".lock"]), ("run.write_json('config.json', {})", [".lock", "config.json"]),
                                         ("open(run.path / '.config.json.x1.tmp', 'w').write('{')", [".config.json.x1.tmp", ".lock"])])
def test_a_run_killed_before_it_started_is_refused_by_resume_and_swept_by_the_next_run(tmp_path, capsys, code, files):
    run = killed_after(tmp_path, code)
    assert sorted(p.name for p in run.iterdir()) == files
    assert main(["train", "--resume", str(run)]) == 2  # before: "not a run directory" or a resume of nothing
    err = capsys.readouterr().err
    assert f"{run} was killed while it was starting" in err and f"next run created in {tmp_path} removes" in err
    other = tmp_path / "20250101-000000-mine"  # named like a run, but holding what the user put there
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    started = killed_after(tmp_path / "b", "run.write_json('config.json', {}); run.write_json('meta.json', {})")
    nxt = RunDir.create(str(tmp_path), "next")
    assert not run.exists() and f"removed {run}" in capsys.readouterr().out.replace("\n", "")
    assert (other / "notes.txt").is_file() and started.exists()  # started runs and others' folders are left alone
    nxt.close()


def test_the_sweep_leaves_a_run_that_is_starting_right_now(tmp_path):
    live = RunDir.create(str(tmp_path), "live")  # this process holds its lock, before its config.json
    just_made = tmp_path / "20250101-000000-creating"  # another creator between its mkdir and its lock
    just_made.mkdir()
    (just_made / ".lock").write_text("")
    assert sweep_unstarted(tmp_path) == []
    assert live.path.exists() and just_made.exists()
    old = time.time() - 3600  # an empty lock an hour old: its creator died before writing its PID
    os.utime(just_made / ".lock", (old, old))
    assert sweep_unstarted(tmp_path) == [just_made]
    live.close()


def test_a_discard_killed_halfway_leaves_only_what_the_next_run_sweeps(tmp_path, monkeypatch):
    run = RunDir.create(str(tmp_path), "r")
    run.write_json("config.json", {})
    monkeypatch.setattr("shutil.rmtree", lambda *a, **k: None)  # the kill lands before the removal
    run.discard()
    monkeypatch.undo()
    leftover = [p.name for p in tmp_path.iterdir()]
    assert leftover == [f".{run.path.name}.discarded.tmp"]  # never half a run directory under its own name
    RunDir.create(str(tmp_path), "next").close()
    assert not (tmp_path / leftover[0]).exists()


def test_a_pruned_checkpoint_is_removed_whole_or_not_at_all(tmp_path, monkeypatch):
    stage = tmp_path / "checkpoints" / "rl"
    for step in (2, 4):
        (stage / f"step_00000{step}").mkdir(parents=True)
        (stage / f"step_00000{step}" / "model.safetensors").write_text("w")
    monkeypatch.setattr("shutil.rmtree", lambda *a, **k: None)  # killed right after the rename
    remove_checkpoint(stage / "step_000002")
    monkeypatch.undo()
    assert [p.name for p in complete_checkpoints(stage)] == ["step_000004"]
    assert (stage / ".step_000002.removed.tmp" / "model.safetensors").exists()  # what a resume sweeps


@pytest.mark.slow
def test_cli_kill_9_at_the_start_and_after_meta_json_resumes_or_is_swept(tmp_path):
    """A real `posttrain train` killed the moment its directory appears (before or just after
    config.json), and once meta.json exists: the first is swept by the next run, the second resumes."""
    repo = Path(__file__).parents[1]
    outcomes = {}
    for moment in ("directory", "meta.json"):
        out = tmp_path / moment.replace(".", "_")
        proc = subprocess.Popen([sys.executable, "-m", "posttrain", "train", *TINY, "--threads", "1", "--out_dir",
                                 str(out)], cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            runs = list(out.glob("*-arithmetic-grpo")) if out.exists() else []
            if runs and (moment == "directory" or (runs[0] / "meta.json").exists()):
                break
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        (run,) = out.glob("*-arithmetic-grpo")
        if (run / "meta.json").exists():
            assert main(["train", "--resume", str(run)]) == 0
            assert json.loads((run / "summary.json").read_text())["final_stage"] == "rl"
            outcomes[moment] = "resumed"
        else:
            with pytest.raises(RunDirError, match="killed while it was starting"):
                RunDir.resume(str(run))
            RunDir.create(str(out), "next").close()
            assert not run.exists()
            outcomes[moment] = "swept"
    assert outcomes["meta.json"] == "resumed"


# --- --init with a run directory, export, data files ------------------------------------------


def fake_run(root: Path) -> Path:
    run = root / "20250101-000000-arithmetic-grpo"
    for stage, step in (("sft", 5), ("rl", 3)):
        (run / "checkpoints" / stage / f"step_00000{step}").mkdir(parents=True)
        (run / "checkpoints" / stage / "latest").write_text(f"step_00000{step}")
        time.sleep(0.01)  # rl saved last
    (run / "config.json").write_text("{}")
    (run / "meta.json").write_text("{}")
    return run


def test_init_with_a_run_directory_names_the_checkpoint_to_pass(tmp_path, capsys):
    run = fake_run(tmp_path)
    latest = run / "checkpoints" / "rl" / "step_000003"
    for given in (run, run / "checkpoints"):
        with pytest.raises(ValueError, match=f"pass one of its checkpoints, the latest of the stage it saved last "
                                             f"\\(rl\\), {latest}, or sft's {run / 'checkpoints' / 'sft' / 'step_000005'}"):
            read_model_dir(resolve_model_dir(given))  # before: "has no weights beside its config.json"
    assert main(["train", "--init", str(run), "--sft.steps", "0", "--dry_run", "true"]) == 2
    assert f"is a run directory, not a model directory: pass one of its checkpoints" in capsys.readouterr().err


def gpt_mini_checkpoint(directory: Path) -> Path:
    GPTMini(GPTMiniConfig(vocab_size=100, dim=16, n_layer=1, n_head=2, hidden_dim=32, max_seq_len=32)
            ).save_pretrained(directory, CharTokenizer())
    return directory


def test_export_names_out_when_it_cannot_be_written(tmp_path, capsys):
    checkpoint = gpt_mini_checkpoint(tmp_path / "ckpt")
    (tmp_path / "a_file").write_text("")
    assert main(["export", str(checkpoint), str(tmp_path / "a_file" / "out")]) == 2
    err = capsys.readouterr().err  # before: a traceback naming the hidden .out.export.tmp
    assert f"OUT {tmp_path / 'a_file' / 'out'} cannot be created: {tmp_path / 'a_file'} is a file" in err
    assert "Traceback" not in err and ".export.tmp" not in err


def test_export_of_a_checkpoint_pruned_under_it_exports_the_newest_complete_step(tmp_path, monkeypatch):
    stage = tmp_path / "run" / "checkpoints" / "rl"
    old, new = gpt_mini_checkpoint(stage / "step_000002"), gpt_mini_checkpoint(stage / "step_000004")
    from posttrain.models import export

    real = export.export_gpt_mini

    def pruned_while_read(checkpoint, out):
        if checkpoint == old:  # the training run saves step 4 and prunes step 2 while it is read
            remove_checkpoint(old)
            raise FileNotFoundError(2, "No such file or directory", str(old / "model.safetensors"))
        return real(checkpoint, out)

    monkeypatch.setattr(export, "export_gpt_mini", pruned_while_read)
    with pytest.warns(UserWarning, match="step_000002 was removed while it was read.*exporting .*step_000004"):
        record = export_checkpoint(old, tmp_path / "out")
    assert record["source_checkpoint"] == str(new.resolve())
    assert json.loads((tmp_path / "out" / "posttrain_export.json").read_text())["source_checkpoint"] == str(new.resolve())


def test_a_data_file_that_is_not_utf8_is_named_by_line_and_a_bom_is_read(tmp_path):
    rows = ['{"prompt": "Q: 1+1\\n", "expected_answer": "2"}', '{"prompt": "Q: 2+2\\n", "expected_answer": "4"}']
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes("\n".join(rows).encode() + b'\n{"prompt": "caf\xe9", "expected_answer": "1"}\n')
    with pytest.raises(ValueError, match=r"latin.jsonl, line 3: not UTF-8 text \(0xe9 at byte 16 of the line"):
        read_rows(latin)
    as_json = tmp_path / "latin.json"
    as_json.write_bytes(b'[\n' + rows[0].encode() + b',\n{"prompt": "caf\xe9", "expected_answer": "1"}]\n')
    with pytest.raises(ValueError, match=r"latin.json, line 3: not UTF-8 text"):
        read_rows(as_json)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + "\n".join(rows).encode() + b"\n")  # as Windows Notepad saves UTF-8
    assert [row.record["expected_answer"] for row in read_rows(bom)] == ["2", "4"]
