"""The whole job on a tiny budget: run directory contents, and kill -9 then resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TINY = [
    "--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
    "--sft.num_examples", "16", "--sft.steps", "6", "--sft.batch_size", "8", "--sft.warmup_steps", "2",
    "--rl.prompts_per_step", "4", "--rl.samples_per_prompt", "4", "--rl.eval_every", "5", "--rl.dev_size", "8",
    "--heldout_size", "16", "--checkpoint_every", "2", "--threads", "1",
]


def posttrain(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "posttrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def only_run_dir(out: Path) -> Path:
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def metrics_without_timings(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    proc = posttrain("train", *TINY, "--rl.steps", "30", "--out_dir", str(out))
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    return only_run_dir(out)


def test_run_directory_has_everything(uninterrupted):
    run = uninterrupted
    for name in ("config.json", "meta.json", "metrics.jsonl", "samples.jsonl", "summary.md", "summary.json",
                 "rl_metrics.png", "reward_curve.png", "eval_sft.jsonl", "eval_rl.jsonl"):
        assert (run / name).is_file(), name
    summary = json.loads((run / "summary.json").read_text())
    for stage in ("sft", "rl"):
        assert set(summary[stage]) >= {"mean", "ci_low", "ci_high", "n"}
        assert summary[stage]["n"] == 16
        assert 0 <= summary[stage]["ci_low"] <= summary[stage]["mean"] <= summary[stage]["ci_high"] <= 1
    # before/after, paired on the 16 held-out problems, with the noise rule beside the CI
    paired = summary["rl_vs_sft"]
    assert paired["n_shared"] == 16
    assert paired["mean_diff"] == pytest.approx(summary["rl"]["mean"] - summary["sft"]["mean"])
    assert paired["noise_rule"]["verdict"] in ("likely noise", "over 5 points")
    assert "noise rule: " in (run / "summary.md").read_text()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["spec_version"] == "final_int/cot-v1"
    assert meta["prompt"] == {"template": "<bos>{prompt}"}  # gpt_mini: the problem's text after <bos>
    assert meta["seed"] == 0 and "git_commit" in meta and "torch" in meta["packages"]
    rows = metrics_without_timings(run)
    assert [r["step"] for r in rows if r["stage"] == "rl"] == list(range(30))
    assert [r["step"] for r in rows if r["stage"] == "sft"] == list(range(6))
    # GRPO without a KL term leaves out exactly the rows of groups that all scored alike
    rl_rows = [r for r in rows if r["stage"] == "rl"]
    assert all(r["skipped_rows"] == pytest.approx(r["zero_variance_groups"]) for r in rl_rows)
    assert any(r["skipped_rows"] > 0 for r in rl_rows)
    # six SFT steps teach nothing: every sample is wrong, and the run says so by its fifth RL step
    assert all(r["reward_mean"] == 0 for r in rl_rows[:5])
    assert any(w.startswith("step 4: 5 steps in a row without a learning signal") for w in summary["warnings"])
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 30 * 4 * 4  # every sampled completion, raw, with its score details
    assert all("reason" in s["details"] for s in samples)
    # the final checkpoint is a transformers-loadable Llama directory
    latest = run / "checkpoints" / "rl" / (run / "checkpoints" / "rl" / "latest").read_text().strip()
    assert (latest / "model.safetensors").is_file() and (latest / "config.json").is_file()


def test_killed_run_resumes_to_identical_metrics(uninterrupted, tmp_path):
    proc = posttrain("train", *TINY, "--rl.steps", "30", "--out_dir", str(tmp_path))
    # wait until RL has checkpointed at least once and is still running, then SIGKILL it
    deadline = time.time() + 300
    while time.time() < deadline:
        runs = [p for p in tmp_path.iterdir() if p.is_dir()]
        pointer = runs[0] / "checkpoints" / "rl" / "latest" if runs else None
        if pointer and pointer.exists() and pointer.read_text().strip() >= "step_000003":
            break
        assert proc.poll() is None, "the run finished before it could be killed; " + proc.stdout.read()
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    run = only_run_dir(tmp_path)
    assert not (run / "summary.md").exists()
    # what a kill in the middle of an atomic write leaves (this kill may or may not have): swept on resume
    (run / ".summary.json.q1w2e3.tmp").write_text("{")
    (run / "checkpoints" / "rl" / ".step_000099.tmp").mkdir()

    resumed = posttrain("train", "--resume", str(run))
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output
    assert "resuming rl" in output and "unfinished temporary file(s) of a killed write" in output
    assert not list(run.rglob("*.tmp"))
    assert metrics_without_timings(run) == metrics_without_timings(uninterrupted)
    assert json.loads((run / "summary.json").read_text())["rl"] == json.loads((uninterrupted / "summary.json").read_text())["rl"]


def test_shaped_reward_and_adaptive_kl(tmp_path):
    proc = posttrain("train", *TINY, "--rl.steps", "4", "--rl.reward.terms", "r1", "--rl.reward.length_penalty", "0.01",
                     "--rl.reward.length_free", "5", "--rl.kl.target", "0.001", "--grpo.kl_coef", "0.04",
                     "--out_dir", str(tmp_path))
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    run = only_run_dir(tmp_path)
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    components = sample["details"]["components"]
    assert set(components) == {"accuracy", "format", "length_linear"}
    # reward = 1·accuracy + 0.2·format − 0.01·max(0, characters − 5)
    expected = components["accuracy"] + 0.2 * components["format"] + components["length_linear"]
    assert abs(sample["reward"] - expected) < 1e-9
    assert components["length_linear"] == -0.01 * max(0, len(sample["completion"]) - 5)
    rows = [r for r in metrics_without_timings(run) if r["stage"] == "rl"]
    coefs = [r["kl_coef"] for r in rows]
    assert coefs[0] == 0.04
    for before, after, row in zip(coefs, coefs[1:], rows):
        # proportional control: β grows when KL is above target, shrinks below, at most ±20%/horizon
        error = max(-0.2, min(0.2, row["kl_ref"] / 0.001 - 1))
        assert abs(after - before * (1 + error / 100)) < 1e-12


def test_preference_loss_trains_from_a_pairs_file(tmp_path):
    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.types import PreferencePair
    from posttrain.data.preference import save_preference_jsonl

    env = ArithmeticEnv()
    pairs = []
    for example in env.fixed_set("train", 24):
        right = env.solution(example)
        wrong = right.rsplit(" ", 1)[0] + f" {int(example.expected_answer) + 1}"
        pairs.append(PreferencePair(example.prompt, right, wrong))
    save_preference_jsonl(pairs, tmp_path / "pairs.jsonl")
    proc = posttrain("train", *TINY, "--algo", "simpo", "--rl.preference.pairs", str(tmp_path / "pairs.jsonl"),
                     "--rl.steps", "6", "--out_dir", str(tmp_path / "runs"))
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    run = only_run_dir(tmp_path / "runs")
    assert run.name.endswith("arithmetic-simpo")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_stage"] == "pref" and summary["pref"]["n"] == 16
    rows = [r for r in metrics_without_timings(run) if r["stage"] == "pref"]
    assert [r["step"] for r in rows] == list(range(6))
    assert {"loss", "accuracy", "margin"} <= set(rows[0]) and "dev_pass@1" in rows[4] and "kl_ref" in rows[5]
    assert len((run / "pairs.jsonl").read_text().splitlines()) == 24
    assert (run / "pref_metrics.png").is_file()


def checkpoint_save_fills_the_disk(monkeypatch, at_call: int) -> None:
    """torch.save of the at_call-th trainer state writes half its bytes, then fails as torch
    does on a full disk: a RuntimeError raised while handling the OSError (ENOSPC)."""
    import errno
    import io

    import torch

    real, calls = torch.save, []

    def save_or_full(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) != at_call:
            return real(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        real(obj, buffer)
        f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 169280 vs 169172")

    monkeypatch.setattr(torch, "save", save_or_full)


def metrics_append_fills_the_disk(monkeypatch, rl_step: int) -> None:
    """The append of RL step rl_step's metrics row writes half the line, then ENOSPC."""
    import errno

    from posttrain.runs import rundir

    class FillingFile:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            if text.startswith(f'{{"stage": "rl", "step": {rl_step},'):
                self.f.write(text[: len(text) // 2])
                self.f.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(text)

        def flush(self):
            self.f.flush()

    def fake_open(path, *args, **kwargs):
        f = open(path, *args, **kwargs)
        return FillingFile(f) if Path(path).name == "metrics.jsonl" else f

    monkeypatch.setattr(rundir, "open", fake_open, raising=False)  # append_jsonl's open


@pytest.mark.parametrize("fill, where", [
    (lambda mp: checkpoint_save_fills_the_disk(mp, at_call=3 + 5), "checkpoints/rl/.step_000009.tmp"),  # SFT saved 3
    (lambda mp: metrics_append_fills_the_disk(mp, rl_step=12), "metrics.jsonl"),
])
def test_disk_full_is_one_clear_message_and_the_run_resumes_exactly(uninterrupted, tmp_path, monkeypatch, capsys,
                                                                     fill, where):
    from posttrain.cli import main

    fill(monkeypatch)
    assert main(["train", *TINY, "--rl.steps", "30", "--out_dir", str(tmp_path)]) == 2
    monkeypatch.undo()  # space is back
    run = only_run_dir(tmp_path)
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"posttrain train: error: disk full while writing {run / where}" in err
    assert f"(No space left on device); the run directory is resumable: free space and run `posttrain train " \
           f"--resume {run}`" in err
    assert not list(run.rglob("*.tmp"))  # the half-written checkpoint was removed, not left to fill the disk

    assert main(["train", "--resume", str(run)]) == 0
    assert metrics_without_timings(run) == metrics_without_timings(uninterrupted)
    assert json.loads((run / "summary.json").read_text())["rl"] == json.loads(
        (uninterrupted / "summary.json").read_text())["rl"]


# slow: a real tmpfs filled up; the simulated full disk (test_disk_full_is_one_clear_message...) runs in make test
@pytest.mark.slow
def test_a_real_full_disk_stops_cleanly_and_resumes_exactly(uninterrupted, tmp_path):
    """The same on a real 1 MB tmpfs (a whole run needs ~1.8 MB), in a private mount namespace."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["unshare", "-m", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                      capture_output=True).returncode:
        pytest.skip("a tiny tmpfs needs root and mount namespaces (unshare -m)")
    posttrain = f"{sys.executable} -m posttrain"
    script = f"""
        mount -t tmpfs -o size=1m tmpfs {disk}
        {posttrain} train {' '.join(TINY)} --rl.steps 30 --out_dir {disk} > /dev/null 2> {tmp_path}/err
        echo $? > {tmp_path}/rc
        mount -o remount,size=50m {disk}
        {posttrain} train --resume {disk}/*/ > /dev/null 2>> {tmp_path}/err
        echo $? >> {tmp_path}/rc
        mkdir {tmp_path}/copy && cp {disk}/*/metrics.jsonl {disk}/*/summary.json {tmp_path}/copy/
        find {disk} -name '*.tmp' >> {tmp_path}/err
    """
    subprocess.run(["unshare", "-m", "sh", "-c", script], check=True, timeout=600, cwd=Path(__file__).parents[1])
    assert (tmp_path / "rc").read_text().split() == ["2", "0"]  # stopped, then resumed to the end
    (message,) = (tmp_path / "err").read_text().splitlines()  # and nothing else on stderr, no temp file left
    assert message.startswith(f"posttrain train: error: disk full while writing {disk}/")
    assert "(No space left on device); the run directory is resumable: free space and run `posttrain train " \
           f"--resume {disk}/" in message
    assert metrics_without_timings(tmp_path / "copy") == metrics_without_timings(uninterrupted)
    assert json.loads((tmp_path / "copy" / "summary.json").read_text())["rl"] == json.loads(
        (uninterrupted / "summary.json").read_text())["rl"]
