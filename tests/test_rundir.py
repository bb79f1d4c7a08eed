"""Run directories under stress: one writer at a time, creation that cannot race, names
that stay inside out_dir, temp files of killed writes swept on resume, and a damaged run
file reported by name with what to do, never as a traceback."""

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.runs.rundir import RunDir, RunDirError

TINY = [
    "--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
    "--sft.num_examples", "16", "--sft.steps", "6", "--sft.batch_size", "8", "--sft.warmup_steps", "2",
    "--rl.prompts_per_step", "4", "--rl.samples_per_prompt", "4", "--rl.eval_every", "5", "--rl.dev_size", "8",
    "--heldout_size", "16", "--checkpoint_every", "2", "--threads", "1",
]


def only_run(out: Path) -> Path:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run


def evaluations(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    return {stage: summary[stage] for stage in ("sft", "pref")}  # not wall times


def rows_without_timings(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def fails_with(capsys, argv, *needles) -> str:
    """The command exits 2 with one line on stderr containing every needle, and no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    return err


def hold_in_another_process(run: Path) -> subprocess.Popen:
    """A second process that resumes `run` (taking its lock) and then waits to be killed."""
    code = (f"from posttrain.runs.rundir import RunDir; import time; run = RunDir.resume({str(run)!r}); "
            "print('holding', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder


# ---------------------------------------------------------------------------------------
# one writer per run directory
# ---------------------------------------------------------------------------------------


def test_a_second_writer_is_refused_and_the_first_logs_every_step_once(tmp_path, capsys):
    first = subprocess.Popen([sys.executable, "-m", "posttrain", "train", *TINY, "--rl.steps", "30",
                              "--out_dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not (list(tmp_path.glob("*/config.json")) and first.poll() is None):
        assert time.time() < deadline and first.poll() is None, first.stdout.read()
        time.sleep(0.01)
    run = only_run(tmp_path)
    # the scheduler's mistake: resume a run whose process is still alive
    fails_with(capsys, ["train", "--resume", str(run)], f"{run} is being written by another posttrain process",
               f"PID {first.pid}", f"kill {first.pid}")
    output, _ = first.communicate(timeout=600)
    assert first.returncode == 0, output
    steps = [(r["stage"], r["step"]) for r in rows_without_timings(run)]
    assert steps == [("sft", s) for s in range(6)] + [("rl", s) for s in range(30)]  # 36 rows, none twice


def test_the_lock_dies_with_its_process_and_guards_the_temp_file_sweep(tmp_path):
    run = RunDir.create(str(tmp_path), "r")
    run.write_json("config.json", {})
    run.write_json("meta.json", {})  # started: a run without it is resumed by no one (test_user_code_failures.py)
    run.close()
    holder = hold_in_another_process(run.path)
    # what a killed writer leaves (here: files the live holder might be in the middle of writing)
    stale = [run.path / ".metrics.jsonl.k3j9x.tmp",  # write_atomic's, killed before its rename
             run.checkpoints / "rl" / ".step_000004.tmp" / "model.safetensors",  # a checkpoint's, half written
             run.checkpoints / "rl" / ".latest.tmp"]
    kept = [run.path / "metrics.jsonl", run.path / ".hidden_but_not_temp", run.checkpoints / "rl" / "step_000002" / "x",
            run.path / "row-b" / ".config.json.abc.tmp"]  # a nested run (a compare row) has its own writer
    for path in stale + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    (run.path / "row-b" / "meta.json").write_text("{}")

    with pytest.raises(RunDirError, match=f"PID {holder.pid}"):
        RunDir.resume(str(run.path))
    assert all(p.exists() for p in stale)  # refused before touching anything the holder may be writing
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()

    resumed = RunDir.resume(str(run.path))  # kill -9 left no stale lock
    assert (run.path / ".lock").read_text() == f"{os.getpid()}\n"
    assert not any(p.exists() for p in stale)
    assert not (run.checkpoints / "rl" / ".step_000004.tmp").exists()
    assert all(p.exists() for p in kept)
    resumed.close()


def test_a_read_only_open_takes_no_lock(tmp_path):
    run = RunDir.create(str(tmp_path), "r")
    run.write_json("config.json", {"a": 1})
    holder_free = RunDir.open(str(run.path))  # `posttrain diff` reads runs that may still be training
    assert holder_free.lock is None and holder_free.read_json("config.json") == {"a": 1}


# ---------------------------------------------------------------------------------------
# creation: no race, no escape
# ---------------------------------------------------------------------------------------


def create_at_the_barrier(out_dir: str, barrier, results) -> None:
    barrier.wait()
    run = RunDir.create(out_dir, "same")
    results.put((os.getpid(), str(run.path), (run.path / ".lock").read_text().strip()))
    # alive until every one has created: a creator that died before its config and meta would
    # leave a directory the next creation sweeps (test_user_code_failures.py), as it should
    barrier.wait()


def test_sixty_simultaneous_creations_of_one_name_make_sixty_directories(tmp_path):
    fork = multiprocessing.get_context("fork")  # starts in milliseconds, so all 60 meet at the barrier
    barrier, results = fork.Barrier(60), fork.Queue()
    workers = [fork.Process(target=create_at_the_barrier, args=(str(tmp_path), barrier, results)) for _ in range(60)]
    for worker in workers:
        worker.start()
    made = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert [w.exitcode for w in workers] == [0] * 60  # the old exists-then-mkdir lost 5-11 of them
    paths = {path for _, path, _ in made}
    assert len(paths) == 60 and paths == {str(p) for p in tmp_path.iterdir()}
    assert all(Path(path).name.split("-same")[1] in ("", *(f"-{n}" for n in range(2, 61))) for path in paths)
    assert all(holder == str(pid) for pid, _, holder in made)  # each directory locked by its own creator


@pytest.mark.parametrize("name", ["../../x", "/abs", "a/b", "..", "a\\b", "x" * 201])
def test_a_name_that_would_leave_out_dir_is_refused_before_any_directory_is_made(tmp_path, name):
    out = tmp_path / "deep" / "runs"
    with pytest.raises(RunDirError, match="is not allowed: a run name becomes one directory inside out_dir"):
        RunDir.create(str(out), name)
    assert list(tmp_path.iterdir()) == []
    assert not Path("/abs").exists() and not (tmp_path / "x").exists()


def test_out_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(RunDirError, match="out_dir=.*/f' is a file, not a directory"):
        RunDir.create(str(tmp_path / "f"), "r")
    with pytest.raises(RunDirError, match=f"cannot be created: {tmp_path / 'f'} is a file"):
        RunDir.create(str(tmp_path / "f" / "runs"), "r")
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


# ---------------------------------------------------------------------------------------
# damaged run files: which file, what is wrong, what to do
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished preference run (SFT then 4 SimPO steps), checkpoints at pref steps 1 and 3."""
    from posttrain.data.preference import save_preference_jsonl
    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.types import PreferencePair

    out = tmp_path_factory.mktemp("finished")
    env = ArithmeticEnv()
    pairs = [PreferencePair(e.prompt, env.solution(e), env.solution(e).rsplit(" ", 1)[0] + " 0")
             for e in env.fixed_set("train", 24)]
    save_preference_jsonl(pairs, out / "pairs.jsonl")
    assert main(["train", *TINY, "--algo", "simpo", "--rl.preference.pairs", str(out / "pairs.jsonl"), "--rl.steps", "4",
                 "--out_dir", str(out / "runs")]) == 0
    return only_run(out / "runs")


def damaged_copy(finished: Path, tmp_path: Path, name: str, damage=lambda raw: raw[: len(raw) // 2]) -> Path:
    run = tmp_path / finished.name
    shutil.copytree(finished, run)
    (run / name).write_bytes(damage((run / name).read_bytes()))
    return run


def unfinish(run: Path) -> None:
    """Make the copy a run killed after pref step 1's checkpoint: steps 2-3 still to train."""
    shutil.rmtree(run / "checkpoints" / "pref" / "step_000003")
    (run / "summary.json").unlink()


def test_truncated_trainer_state_names_the_file_and_the_checkpoint_to_delete(finished, tmp_path, capsys):
    ckpt = "checkpoints/pref/step_000003"
    run = damaged_copy(finished, tmp_path, f"{ckpt}/trainer_state.pt")
    size = (run / ckpt / "trainer_state.pt").stat().st_size
    fails_with(capsys, ["train", "--resume", str(run)], f"{run / ckpt / 'trainer_state.pt'} is truncated or corrupt "
               f"({size} bytes; torch.load: ", f"delete {run / ckpt} and resume again: the run then continues from "
               "step_000001, the previous checkpoint")
    # and the advice works: the resume redoes steps 2-3 exactly ...
    shutil.rmtree(run / ckpt)
    assert main(["train", "--resume", str(run)]) == 0
    assert rows_without_timings(run) == rows_without_timings(finished)
    # ... and only those: the rows before it keep their wall times, so they were not trained again
    rows = [(run / "metrics.jsonl").read_text().splitlines(), (finished / "metrics.jsonl").read_text().splitlines()]
    assert rows[0][:-2] == rows[1][:-2] and rows[0][-2:] != rows[1][-2:]
    assert evaluations(run) == evaluations(finished)


def test_truncated_checkpoint_weights_name_the_file(finished, tmp_path, capsys):
    ckpt = "checkpoints/pref/step_000003"
    run = damaged_copy(finished, tmp_path, f"{ckpt}/model.safetensors")
    fails_with(capsys, ["train", "--resume", str(run)], f"checkpoint {run / ckpt} cannot be loaded",
               f"{run / ckpt / 'model.safetensors'}", f"delete {run / ckpt} and resume again")


def test_truncated_config_json_names_the_file(finished, tmp_path, capsys):
    run = damaged_copy(finished, tmp_path, "config.json")
    size = (run / "config.json").stat().st_size
    fails_with(capsys, ["train", "--resume", str(run)], f"{run / 'config.json'} is truncated or corrupt ({size} bytes, "
               "not valid JSON at line ", "\"command\" in meta.json")


def test_truncated_summary_json_names_the_file_and_is_recomputed_once_deleted(finished, tmp_path, capsys):
    run = damaged_copy(finished, tmp_path, "summary.json", lambda raw: raw[:7])
    fails_with(capsys, ["train", "--resume", str(run)], f"{run / 'summary.json'} is truncated or corrupt (7 bytes",
               "delete it and resume")
    (run / "summary.json").unlink()
    assert main(["train", "--resume", str(run)]) == 0
    assert evaluations(run) == evaluations(finished)


def test_a_damaged_metrics_line_names_file_and_line(finished, tmp_path, capsys):
    def damage_line_3(raw: bytes) -> bytes:
        lines = raw.split(b"\n")
        lines[2] = lines[2][:20]
        return b"\n".join(lines)

    run = damaged_copy(finished, tmp_path, "metrics.jsonl", damage_line_3)
    fails_with(capsys, ["train", "--resume", str(run)],
               f"{run / 'metrics.jsonl'}:3 is damaged (not valid JSON at column ", "delete that line")


def test_a_torn_last_metrics_line_is_what_a_kill_leaves_and_resumes(finished, tmp_path):
    run = damaged_copy(finished, tmp_path, "metrics.jsonl", lambda raw: raw + b'{"stage": "pref", "st')
    unfinish(run)
    assert main(["train", "--resume", str(run)]) == 0
    assert rows_without_timings(run) == rows_without_timings(finished)


def test_truncated_pref_rounds_json_names_the_file(finished, tmp_path, capsys):
    run = damaged_copy(finished, tmp_path, "pref_rounds.json")
    unfinish(run)  # so the resume reads which pairs round 0 trained on
    fails_with(capsys, ["train", "--resume", str(run)], f"{run / 'pref_rounds.json'} is truncated or corrupt",
               "restore it from a copy")


def test_write_or_check_writes_then_names_a_stale_file(tmp_path, capsys):
    from posttrain.files import jsonl_text, write_or_check

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    texts = {first: jsonl_text([{"q": "é"}, {"q": 2}]), second: jsonl_text([])}
    assert texts[first] == '{"q": "é"}\n{"q": 2}\n'
    assert write_or_check(texts, "python -m gen", ["--check"]) == 1  # nothing written yet: both stale
    assert not first.exists() and f"out of date (run python -m gen): {first}, {second}" in capsys.readouterr().out
    assert write_or_check(texts, "python -m gen", []) == 0 and first.read_text(encoding="utf-8") == texts[first]
    assert "wrote 2 rows to" in capsys.readouterr().out
    assert write_or_check(texts, "python -m gen", ["--check"]) == 0
    first.write_text('{"q": 3}\n', encoding="utf-8")
    assert write_or_check(texts, "python -m gen", ["--check"]) == 1
    assert f"out of date (run python -m gen): {first}\n" == capsys.readouterr().out


def test_an_atomic_write_gives_the_mode_a_plain_write_would(tmp_path):
    from posttrain.files import PROCESS_UMASK, write_atomic

    fresh = tmp_path / "fresh.json"
    write_atomic(fresh, "{}")
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~PROCESS_UMASK  # not mkstemp's 0600
    kept = tmp_path / "private.json"
    kept.write_text("old")
    kept.chmod(0o640)
    write_atomic(kept, "new")
    assert kept.read_text() == "new" and kept.stat().st_mode & 0o777 == 0o640  # a file keeps its own mode
