"""A checkpoint records the task it was trained on, and `posttrain eval --checkpoint` scores
it on that task: the run's own held-out pass@1 comes back, level-2 problems stay level-2
problems, a user's JSONL file follows its checkpoint, and flags that ask for another task
win with one warning naming both."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import posttrain
from posttrain.config import ArithmeticConfig, EnvConfig
from posttrain.config.files import to_dict
from posttrain.eval.loop_a import choose_task
from posttrain.runs.checkpoints import TASK_FILE
from posttrain.runs.rundir import RunDirError
from posttrain.config.scoring import EvalConfig
from tests.test_pipeline import TINY, only_run_dir

# TINY, then (the last value of a flag wins) a model and an SFT large enough to solve most
# level-2 problems: a pass@1 strictly between 0 and 1 can only come back if the same problems
# are answered the same way, and level 3 scores visibly lower
LEVEL2 = [*TINY, "--model.dim", "64", "--model.hidden_dim", "128", "--sft.num_examples", "600", "--sft.steps", "300",
          "--sft.batch_size", "32", "--sft.warmup_steps", "10", "--env.arithmetic.level", "2", "--env.cot", "false",
          "--rl.steps", "2"]
LEVEL2_ENV = {"name": "arithmetic", "arithmetic": {"level": 2, "levels": "", "words": 0.0},
              "arithmetic_think": {"level": 3, "think_mode": "fused", "budget_demos": 0.0},
              "reasoning_gym": {"pool_size": 10_000, "task_config": "", "worked_steps": False},
              "tool_arithmetic": {"tool_demos": 1.0, "step_cost": 0.0, "malformed_penalty": 0.0, "thinking": "keep_all"},
              "cot": False, "spec_version": "", "path": "", "columns": "", "heldout_path": "", "allow_weak_sandbox": False}


def posttrain_cli(*args: str, cwd: Path | None = None) -> str:
    """`posttrain ARGS` in a fresh process, its output; one thread, as the training run had,
    so that greedy decoding of the same weights gives the same tokens."""
    proc = subprocess.run([sys.executable, "-m", "posttrain", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def evaluated(out: Path) -> tuple[dict, dict, list[dict]]:
    """(meta.json, summary.json, samples.jsonl rows) of the one eval run under `out`."""
    run = only_run_dir(out)
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    return json.loads((run / "meta.json").read_text()), json.loads((run / "summary.json").read_text()), rows


def n_terms(prompt: str) -> int:
    return prompt.removeprefix("Q: ").count("+") + 1  # level 2: three single-digit terms; level 3: five


@pytest.fixture(scope="module")
def level2_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("level2")
    posttrain_cli("train", *LEVEL2, "--out_dir", str(out))
    return only_run_dir(out)


def test_every_checkpoint_records_the_env_it_was_trained_on(level2_run):
    checkpoints = sorted(level2_run.glob("checkpoints/*/step_*"))
    # sft: steps 297 and 299 kept (checkpoint_every 2, keep_last 2); rl: its last step, 1
    assert [f"{c.parent.name}/{c.name}" for c in checkpoints] == ["rl/step_000001", "sft/step_000297",
                                                                  "sft/step_000299"]
    config = json.loads((level2_run / "config.json").read_text())
    for checkpoint in checkpoints:
        task = json.loads((checkpoint / TASK_FILE).read_text())
        assert task == {"format": 1, "env": LEVEL2_ENV, "spec_version": "final_int/strict-v1", "max_new_tokens": 48,
                        "system_prompt": "", "posttrain_version": posttrain.__version__}
        assert task["env"] == config["env"]
    assert not list(level2_run.glob("checkpoints/**/.*.tmp")), "no temporary file left behind"


@pytest.mark.parametrize("stage", ["sft", "rl"])
def test_eval_without_env_flags_scores_the_checkpoints_task_and_gets_the_runs_pass_at_1(level2_run, tmp_path, stage):
    checkpoint = level2_run / "checkpoints" / stage / (level2_run / "checkpoints" / stage / "latest").read_text()
    output = posttrain_cli("eval", "--checkpoint", str(checkpoint), "--size", "16", "--out_dir", str(tmp_path))
    assert output.splitlines()[0] == ("scoring on the task the checkpoint was trained on (posttrain_task.json): "
                                      "env.name=arithmetic, env.arithmetic.level=2, env.cot=false")
    assert "warning" not in output
    meta, summary, rows = evaluated(tmp_path)
    assert meta["task"] == summary["task"] == {"source": "checkpoint", "env": LEVEL2_ENV, "trained_on": LEVEL2_ENV}
    assert meta["spec_version"] == "final_int/strict-v1" and meta["sampling"]["max_new_tokens"] == 48
    assert json.loads((only_run_dir(tmp_path) / "config.json").read_text())["env"] == LEVEL2_ENV
    assert len(rows) == 16 and all(n_terms(r["prompt"]) == 3 and r["meta"]["level"] == 2 for r in rows)

    # the same 16 held-out problems as the run's own eval of this checkpoint, answered alike
    trained = {r["id"]: r for r in map(json.loads, (level2_run / f"eval_{stage}.jsonl").read_text().splitlines())}
    assert [r["id"] for r in rows] == list(trained)
    assert [r["completion"] for r in rows] == [trained[r["id"]]["completion"] for r in rows]
    run_pass = json.loads((level2_run / "summary.json").read_text())[stage]["mean"]
    assert run_pass > 0  # (RL reaches 16/16 on some CPUs: the completions above are what carry the check)
    assert summary["eval"]["mean"] == run_pass
    assert summary["eval"]["n"] == 16


def test_explicit_env_flags_win_with_one_warning_naming_both(level2_run, tmp_path):
    checkpoint = level2_run / "checkpoints" / "rl" / "step_000001"
    output = posttrain_cli("eval", "--checkpoint", str(checkpoint), "--size", "16", "--env.arithmetic.level", "3",
                           "--out_dir", str(tmp_path))
    warnings = [line for line in output.splitlines() if "warning" in line]
    assert warnings == ["warning: the checkpoint was trained on env.arithmetic.level=2; scoring on env.arithmetic.level=3 as asked"]
    meta, summary, rows = evaluated(tmp_path)
    # level 3, the flag's; cot false, still the checkpoint's (only the flags given replace its settings)
    assert meta["task"] == {"source": "flags", "env": {**LEVEL2_ENV, "arithmetic": {"level": 3, "levels": "", "words": 0.0}},
                            "trained_on": LEVEL2_ENV}
    assert meta["spec_version"] == "final_int/strict-v1"
    assert all(n_terms(r["prompt"]) == 5 and r["meta"]["level"] == 3 for r in rows)
    # the silent failure this prevents: a level-2 model read on level 3 looks untrained
    assert summary["eval"]["mean"] < json.loads((level2_run / "summary.json").read_text())["rl"]["mean"]

    # an env section in a --config file asks as explicitly as a flag
    (tmp_path / "level3.json").write_text('{"env": {"arithmetic": {"level": 3}}}')
    output = posttrain_cli("eval", "--checkpoint", str(checkpoint), "--size", "4", "--config",
                           str(tmp_path / "level3.json"), "--out_dir", str(tmp_path / "from_config"))
    assert "warning: the checkpoint was trained on env.arithmetic.level=2; scoring on env.arithmetic.level=3 as asked" in output
    assert evaluated(tmp_path / "from_config")[0]["task"]["env"]["arithmetic"]["level"] == 3


def test_a_copied_checkpoint_keeps_its_task(level2_run, tmp_path):
    copy = tmp_path / "elsewhere" / "my-model"
    shutil.copytree(level2_run / "checkpoints" / "rl" / "step_000001", copy)  # no run directory around it
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    output = posttrain_cli("eval", "--checkpoint", str(copy), "--size", "8", "--out_dir", "evals", cwd=elsewhere)
    assert "env.arithmetic.level=2, env.cot=false" in output.splitlines()[0]
    meta, summary, rows = evaluated(elsewhere / "evals")
    assert meta["task"]["source"] == "checkpoint" and meta["task"]["env"] == LEVEL2_ENV
    assert len(rows) == 8 and all(n_terms(r["prompt"]) == 3 for r in rows)


def test_a_checkpoint_without_the_file_says_it_is_scored_on_the_defaults(level2_run, tmp_path):
    old = tmp_path / "old-checkpoint"
    shutil.copytree(level2_run / "checkpoints" / "sft" / "step_000299", old)
    (old / TASK_FILE).unlink()  # as every checkpoint written before the file existed
    output = posttrain_cli("eval", "--checkpoint", str(old), "--size", "4", "--out_dir", str(tmp_path / "evals"))
    assert output.splitlines()[0] == (
        f"{old} does not record the task it was trained on (no posttrain_task.json: written by an older posttrain, "
        "or not by posttrain); scoring on the defaults: env.name=arithmetic, env.arithmetic.level=3, env.cot=true; if it was "
        "trained on another task, give its --env.* flags")
    meta, _, rows = evaluated(tmp_path / "evals")
    assert meta["task"] == {"source": "flags", "env": to_dict(EnvConfig()), "trained_on": None}
    assert all(n_terms(r["prompt"]) == 5 for r in rows)


# ---- a user's JSONL file, through a preference run (the pref stage's checkpoints) ----------------


def test_a_jsonl_task_is_recorded_with_its_absolute_path_and_scored_from_anywhere(tmp_path):
    rows = [{"prompt": f"Q: {a}*{b}\n", "expected_answer": a * b,
             "meta": {"solution": f"{a}*{b}={a * b}\nFinal: {a * b}"}} for a in range(2, 22) for b in range(2, 22)]
    (tmp_path / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = [{"prompt": r["prompt"], "chosen": r["meta"]["solution"], "rejected": f"Final: {r['expected_answer'] + 1}"}
             for r in rows[:24]]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    # relative paths, as a user types them
    posttrain_cli("train", *TINY, "--env.name", "jsonl", "--env.path", "problems.jsonl", "--algo", "dpo",
                  "--rl.preference.pairs", "pairs.jsonl", "--rl.steps", "2", "--out_dir", "runs", cwd=tmp_path)
    run = only_run_dir(tmp_path / "runs")
    checkpoints = sorted(run.glob("checkpoints/*/step_*"))
    assert {c.parent.name for c in checkpoints} >= {"sft", "pref"}
    jsonl_env = {**to_dict(EnvConfig()), "name": "jsonl", "path": str(tmp_path / "problems.jsonl")}
    for checkpoint in checkpoints:
        task = json.loads((checkpoint / TASK_FILE).read_text())
        assert task["env"] == jsonl_env and task["spec_version"] == "final_int/cot-v1"

    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    posttrain_cli("eval", "--checkpoint", str(run / "checkpoints" / "pref" / "step_000001"), "--size", "5",
                  "--out_dir", "evals", cwd=elsewhere)
    meta, _, samples = evaluated(elsewhere / "evals")
    assert meta["task"]["source"] == "checkpoint" and meta["spec_version"] == "final_int/cot-v1"
    prompts = {r["prompt"] for r in rows}
    assert len(samples) == 5 and all(s["prompt"] in prompts for s in samples)


# ---- choose_task alone: the rules, on a hand-written task file ----------------------------------


def checkpoint_with(tmp_path: Path, env: dict) -> str:
    (tmp_path / TASK_FILE).write_text(json.dumps({"format": 1, "env": env, "spec_version": "final_int/strict-v1",
                                                  "max_new_tokens": 48, "system_prompt": "",
                                                  "posttrain_version": posttrain.__version__}))
    return str(tmp_path)


def test_flags_replace_the_checkpoints_settings_one_by_one(tmp_path):
    cfg = EvalConfig(checkpoint=checkpoint_with(tmp_path, LEVEL2_ENV), env=EnvConfig(cot=True))
    chosen, source, line = choose_task(cfg, {"cot"})
    assert (chosen.env.arithmetic.level, chosen.env.cot, source) == (2, True, "flags")
    assert line == "warning: the checkpoint was trained on env.cot=false; scoring on env.cot=true as asked"

    # flags that agree with the checkpoint: no warning
    chosen, source, line = choose_task(EvalConfig(checkpoint=cfg.checkpoint, env=EnvConfig(arithmetic=ArithmeticConfig(level=2))), {"arithmetic.level"})
    assert (chosen.env, source) == (EnvConfig(arithmetic=ArithmeticConfig(level=2), cot=False), "flags")
    assert line == "scoring on env.name=arithmetic, env.arithmetic.level=2, env.cot=false, as asked and as trained"


def test_another_env_is_the_flags_alone_and_both_are_named_in_full(tmp_path):
    cfg = EvalConfig(checkpoint=checkpoint_with(tmp_path, LEVEL2_ENV), env=EnvConfig(name="math", path="p.jsonl"))
    chosen, source, line = choose_task(cfg, {"name", "path"})
    assert chosen.env == EnvConfig(name="math", path="p.jsonl")  # no level 2, no cot false: not math's settings
    assert line == ("warning: the checkpoint was trained on env.name=arithmetic, env.arithmetic.level=2, env.cot=false; "
                    "scoring on env.name=math, env.path=p.jsonl as asked")


def test_the_weak_sandbox_is_never_switched_on_by_a_checkpoint(tmp_path):
    code_env = {**LEVEL2_ENV, "name": "code", "path": str(tmp_path / TASK_FILE), "allow_weak_sandbox": True}
    chosen, source, _ = choose_task(EvalConfig(checkpoint=checkpoint_with(tmp_path, code_env)), set())
    assert source == "checkpoint" and chosen.env.name == "code" and chosen.env.allow_weak_sandbox is False
    # and giving it is the user's permission, not a different task
    chosen, source, line = choose_task(EvalConfig(checkpoint=str(tmp_path), env=EnvConfig(allow_weak_sandbox=True)),
                                       {"allow_weak_sandbox"})
    assert source == "checkpoint" and chosen.env.allow_weak_sandbox is True and "warning" not in line


def test_a_recorded_path_missing_here_and_a_damaged_file_are_refused_with_what_to_do(tmp_path):
    gone = {**LEVEL2_ENV, "name": "jsonl", "path": "/nowhere/problems.jsonl"}
    with pytest.raises(ValueError, match="trained on env.path=/nowhere/problems.jsonl, which does not exist here: "
                                         "give --env.path FILE"):
        choose_task(EvalConfig(checkpoint=checkpoint_with(tmp_path, gone)), set())
    (tmp_path / TASK_FILE).write_text('{"format": 1, "env": {"level": 2')  # truncated
    with pytest.raises(RunDirError, match=f"{TASK_FILE} cannot be read .*delete it and give the task as --env"):
        choose_task(EvalConfig(checkpoint=str(tmp_path)), set())
    checkpoint_with(tmp_path, {**LEVEL2_ENV, "temperature": 0.7})  # a setting this posttrain does not know
    with pytest.raises(RunDirError, match=r"unknown setting\(s\) \['env.temperature'\]"):
        choose_task(EvalConfig(checkpoint=str(tmp_path)), set())


def test_eval_samples_gives_unbiased_pass_at_k_seeded_and_beside_the_greedy_pass_at_1(level2_run, tmp_path):
    """--samples N --ks 1,3: N sampled completions per problem, pass@k by Chen et al.'s estimator
    (pass@1 = c/n per problem), each sample saved with its verdict; the same command, the same draws."""
    from math import comb

    checkpoint = level2_run / "checkpoints" / "rl" / "step_000001"
    flags = ["--checkpoint", str(checkpoint), "--size", "8", "--samples", "6", "--ks", "1,3", "--temperature", "1.0"]
    output = posttrain_cli("eval", *flags, "--out_dir", str(tmp_path / "a"))
    assert "6 samples per problem at temperature 1" in output and "pass@3" in output
    _, summary, greedy_rows = evaluated(tmp_path / "a")
    sampled = summary["pass_at_k"]
    n_correct = sampled["n_correct"]
    assert len(n_correct) == 8 and sampled["samples"] == 6
    assert sampled["pass@1"]["mean"] == pytest.approx(sum(c / 6 for c in n_correct) / 8)
    by_hand = sum(1 - comb(6 - c, 3) / comb(6, 3) for c in n_correct) / 8
    assert sampled["pass@3"]["mean"] == pytest.approx(by_hand)
    assert sampled["pass@1"]["mean"] <= sampled["pass@3"]["mean"]
    assert 0 < sampled["pass@1"]["mean"] < 1, "a level-2 checkpoint solves some samples, not all"
    rows = [json.loads(line) for line in (only_run_dir(tmp_path / "a") / "samples_pass_at_k.jsonl").open()]
    assert len(rows) == 48 and len(greedy_rows) == 8
    ids = [r["id"] for r in greedy_rows]
    assert [sum(r["solved"] for r in rows if r["id"] == i) for i in ids] == n_correct

    posttrain_cli("eval", *flags, "--out_dir", str(tmp_path / "b"))
    assert evaluated(tmp_path / "b")[1]["pass_at_k"]["n_correct"] == n_correct


@pytest.mark.parametrize("settings, message", [
    ({"samples": 4, "ks": "1,5"}, "k's between 1 and samples=4"),
    ({"samples": 4, "ks": "one"}, "expected integers, comma-separated"),
    ({"samples": 4, "temperature": 0.0}, "greedy decoding would give every sample the same completion"),
    ({"samples": -1}, "an integer >= 0"),
])
def test_pass_at_k_settings_that_cannot_work_are_refused_by_name(tmp_path, settings, message):
    from posttrain.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        EvalConfig(checkpoint=str(tmp_path), **settings).validate()
