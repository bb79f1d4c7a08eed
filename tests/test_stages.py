"""`--stages`: stages that compose in one run. What each stage runs with, that each starts
from the weights the one before saved (by sha256 of the weights), an evaluation after each
with the paired difference, and kill -9 then resume ending exactly where an uninterrupted
run ends."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from posttrain.cli import main
from posttrain.cli.training import train_config
from posttrain.config import ConfigError, EnvConfig, TrainConfig, parse_stages
from posttrain.models import load_checkpoint_model
from posttrain.pipelines.checks import check_config
from posttrain.pipelines.stage_plan import stage_plan
from posttrain.runs.checkpoints import final_checkpoint, weights_digest
from tests.test_pipeline import metrics_without_timings, only_run_dir, posttrain

# --- what each stage runs with -----------------------------------------------------------


def test_stage_names_kinds_and_settings_as_written():
    assert parse_stages("") == []
    assert parse_stages(" sft , dpo[rl.optim.lr=3e-5, dpo.beta=0.5] ,grpo,sft,grpo[rl.steps=5]") == [
        ("sft", "sft", {}), ("dpo", "dpo", {"rl.optim.lr": "3e-5", "dpo.beta": "0.5"}), ("grpo", "grpo", {}),
        ("sft_2", "sft", {}), ("grpo_2", "grpo", {"rl.steps": "5"})]


@pytest.mark.parametrize("stages,message", [
    ("sft,,grpo", "could not read ''"),
    ("dpo[rl.optim.lr]", "KEY=VALUE pairs in dpo's brackets"),
    ("dpo[rl.optim.lr=1", "every '[' closed"),
    ("dpo[[rl.optim.lr=1]]", "no brackets inside brackets"),
    ("dpo[rl.optim.lr=1,rl.optim.lr=2]", "dpo sets rl.optim.lr twice"),
])
def test_unreadable_stages_are_refused_with_what_was_wrong(stages, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        TrainConfig(stages=stages).validate()


def test_each_stage_gets_the_run_settings_with_its_own_on_top():
    base = TrainConfig(stages="sft[sft.steps=10],dpo[rl.optim.lr=3e-5,rl.steps=100,dpo.nll_coef=1,"
                              "rl.sampling.temperature=1.5],grpo[grpo.kl_coef=0.04]")
    sft, dpo, grpo = stage_plan(base)
    assert (sft.name, sft.steps, sft.cfg.sft.lr) == ("sft", 10, base.sft.lr)
    assert (dpo.cfg.rl.algo, dpo.steps, dpo.cfg.rl.optim.lr, dpo.cfg.rl.algo_params) == ("dpo", 100, 3e-5, {"nll_coef": 1.0})
    assert dpo.cfg.rl.sampling.temperature == 1.5 and dpo.cfg.rl.prompts_per_step == base.rl.prompts_per_step
    assert (grpo.cfg.rl.algo, grpo.steps, grpo.cfg.rl.optim.lr, grpo.cfg.rl.algo_params) == ("grpo", 200, 1e-4,
                                                                                        {"kl_coef": 0.04})
    assert dpo.cfg.sft.steps == grpo.cfg.sft.steps == 0  # only an sft stage runs SFT
    assert all(stage.cfg.stages == "" for stage in (sft, dpo, grpo))  # each is a plain run's config


def test_a_stage_may_pose_the_task_its_own_way_and_keeps_the_run_task():
    """env.* keys in brackets change the task's settings for that stage only (Qwen3's think-only
    cold start before fused SFT); the stages without them keep the run's."""
    think = EnvConfig(name="arithmetic_think")
    base = TrainConfig(env=think, stages="sft[env.arithmetic_think.think_mode=think],"
                                         "grpo[env.arithmetic_think.think_mode=think,rl.steps=5],sft,grpo")
    plan = think_sft, think_grpo, fused_sft, fused_grpo = stage_plan(base)
    assert [stage.cfg.env.arithmetic_think.think_mode for stage in plan] == ["think", "think", "fused", "fused"]
    assert think_sft.cfg.env.kwargs() == think_grpo.cfg.env.kwargs() == {"think_mode": "think"}
    assert fused_sft.cfg.env == fused_grpo.cfg.env == base.env and think_grpo.steps == 5
    with pytest.raises(ConfigError, match=r"stages: grpo\[env.name=...\] is not allowed: every stage is scored on "
                                          r"the run's held-out problems"):
        stage_plan(TrainConfig(stages="sft,grpo[env.name=arithmetic_think]"))
    with pytest.raises(ConfigError, match=r"stages: sft's env.\* settings: think_mode must be one of "
                                          r"\['fused', 'think', 'no_think'\], got 'sometimes'"):
        check_config(TrainConfig(env=think, stages="sft[env.arithmetic_think.think_mode=sometimes]"))


@pytest.mark.parametrize("stages,message", [
    ("sft[rl.optim.lr=1]", "a sft stage takes sft.* keys"),
    ("grpo[dpo.beta=1]", "a grpo stage takes rl.* keys and grpo.* keys"),
    ("ppo2", "unknown stage 'ppo2'"),
    ("dpo[rl.steps=1.5]", "rl.steps='1.5' is not allowed: expected an integer"),
    ("dpo[dpo.beta=x]", "dpo.beta='x' is not allowed: expected a finite number"),
    ("dpo[dpo.bogus=1]", "unknown setting"),
    ("dpo[rl.algo=grpo]", "the stage's name is its algorithm"),
])
def test_a_stage_setting_that_cannot_be_used_is_refused_by_name(stages, message):
    with pytest.raises(ConfigError, match=message.replace("*", r"\*").replace("[", r"\[")):
        stage_plan(TrainConfig(stages=stages))


def test_algorithm_section_flags_go_into_the_brackets_of_their_stages():
    cfg = train_config(["--stages", "sft,dpo[rl.steps=5],grpo", "--dpo.beta", "0.5", "--grpo.kl_coef", "0.04",
                        "--sft.steps", "3"])
    assert cfg.stages == "sft,dpo[rl.steps=5,dpo.beta=0.5],grpo[grpo.kl_coef=0.04]"
    assert stage_plan(cfg)[1].cfg.rl.algo_params == {"beta": 0.5}
    with pytest.raises(ConfigError, match="the ppo section is not allowed here"):
        train_config(["--stages", "sft,grpo", "--ppo.kl_coef", "0.1"])
    # a stage's own bracket wins over its section's flag
    cfg = train_config(["--stages", "dpo[dpo.beta=0.2]", "--dpo.beta", "0.5"])
    assert cfg.stages == "dpo[dpo.beta=0.2]"


@pytest.mark.parametrize("command", ["rlhf", "compare", "star"])
def test_commands_with_their_own_stages_refuse_stages(command, capsys):
    extra = ["--algos", "grpo"] if command == "compare" else []
    assert main([command, "--stages", "sft,grpo", *extra]) == 2
    assert "is not allowed with `posttrain " + command in capsys.readouterr().err


def test_dry_run_checks_every_stage(capsys):
    assert main(["train", "--stages", "sft,dpo[rl.steps=3],grpo", "--dry_run", "true"]) == 0
    out = capsys.readouterr().out
    assert "stage sft (sft, 600 steps): data:" in out and "stage dpo (dpo, 3 steps)" in out
    assert main(["train", "--stages", "sft,grpo[rl.optim.lr=-1]", "--dry_run", "true"]) == 2
    assert "rl.optim.lr=-1.0 is not allowed" in capsys.readouterr().err


# --- a whole run: tiny, in a subprocess, killed and resumed --------------------------------

TINY = [
    "--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
    "--sft.num_examples", "16", "--sft.batch_size", "8", "--sft.warmup_steps", "2",
    "--rl.prompts_per_step", "4", "--rl.samples_per_prompt", "4", "--rl.eval_every", "4", "--rl.dev_size", "8",
    "--heldout_size", "16", "--checkpoint_every", "2", "--threads", "1", "--dpo.beta", "0.5",
]


def pairs_file(folder: Path) -> Path:
    """Pairs built from the task's own solutions: a six-step SFT policy solves nothing, so its
    samples would give no verifier pair to learn from."""
    from posttrain.data.preference import save_preference_jsonl
    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.types import PreferencePair

    env = ArithmeticEnv()
    pairs = [PreferencePair(e.prompt, env.solution(e), env.solution(e).rsplit(" ", 1)[0]
                            + f" {int(e.expected_answer) + 1}") for e in env.fixed_set("train", 24)]
    save_preference_jsonl(pairs, folder / "pairs.jsonl")
    return folder / "pairs.jsonl"


def stages_flags(folder: Path) -> list[str]:
    # grpo's length charge gives rewards that differ within a group (the policy solves nothing yet): a signal
    return [*TINY, "--stages", f"sft[sft.steps=6],dpo[rl.preference.pairs={pairs_file(folder)},rl.steps=8],"
            "grpo[rl.steps=6,rl.reward.length_penalty=0.01,rl.reward.length_free=5]", "--out_dir", str(folder / "out")]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stages")
    proc = posttrain("train", *stages_flags(folder))
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output
    return only_run_dir(folder / "out")


def test_each_stage_starts_from_the_weights_the_one_before_saved(uninterrupted):
    run = uninterrupted
    records = json.loads((run / "stages.json").read_text())
    assert [(r["name"], r["kind"], r["steps"]) for r in records] == [("sft", "sft", 6), ("dpo", "dpo", 8),
                                                                       ("grpo", "grpo", 6)]
    assert records[0]["start"]["checkpoint"] == "checkpoints/init/step_000000"
    assert [r["end"]["checkpoint"] for r in records] == ["checkpoints/sft/step_000005", "checkpoints/dpo/step_000007",
                                                         "checkpoints/grpo/step_000005"]
    for before, after in zip(records, records[1:]):
        assert after["start"] == before["end"]  # the same checkpoint, and the same weights in memory
        assert after["start"]["sha256"] != after["end"]["sha256"]  # and the stage changed them
    # the digests name what the files hold: read them back in this process
    for record in records:
        for side in ("start", "end"):
            weights = load_checkpoint_model(run / record[side]["checkpoint"])
            assert weights_digest(weights) == record[side]["sha256"], (record["name"], side)
    # each stage's metrics rows under its own name, each step once
    rows = metrics_without_timings(run)
    for record in records:
        assert [r["step"] for r in rows if r["stage"] == record["name"]] == list(range(record["steps"]))
    # the preference stage's reference is the SFT checkpoint: before its first update the policy
    # equals the reference, so every pair's implicit reward is 0 and the loss is log 2
    dpo_first = next(r for r in rows if r["stage"] == "dpo")
    assert dpo_first["loss"] == pytest.approx(torch.log(torch.tensor(2.0)).item(), abs=1e-5)
    assert final_checkpoint(run)[0] == run / "checkpoints" / "grpo" / "step_000005"


def test_an_evaluation_after_each_stage_and_one_table(uninterrupted):
    run = uninterrupted
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_stage"] == "grpo"
    for name in ("start", "sft", "dpo", "grpo"):
        assert summary[name]["n"] == 16 and (run / f"eval_{name}.jsonl").is_file()
        assert 0 <= summary[name]["ci_low"] <= summary[name]["mean"] <= summary[name]["ci_high"] <= 1
    for before, after in (("start", "sft"), ("sft", "dpo"), ("dpo", "grpo")):
        diff = summary["paired"][after]
        assert diff["n"] == 16 and diff["mean_diff"] == pytest.approx(summary[after]["mean"] - summary[before]["mean"])
    table = (run / "summary.md").read_text()
    assert "| stage | kind | steps | held-out pass@1 (95% CI) | vs previous stage (paired, points) | time |" in table
    assert [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")][1:] == [
        "start", "sft", "dpo", "grpo"]
    for name in ("dpo_pairs.jsonl", "dpo_pairs_dev.jsonl", "dpo_rounds.json", "grpo_metrics.png", "config.json"):
        assert (run / name).is_file(), name


def test_a_run_killed_in_its_second_stage_resumes_to_identical_results(uninterrupted, tmp_path):
    proc = posttrain("train", *stages_flags(tmp_path))
    deadline = time.time() + 600
    while time.time() < deadline:  # kill once the dpo stage has checkpointed mid-way
        runs = [p for p in (tmp_path / "out").iterdir() if p.is_dir()] if (tmp_path / "out").is_dir() else []
        pointer = runs[0] / "checkpoints" / "dpo" / "latest" if runs else None
        if pointer and pointer.exists() and "step_000003" <= pointer.read_text().strip() < "step_000007":
            break
        assert proc.poll() is None, "the run finished before it could be killed; " + proc.stdout.read()
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    run = only_run_dir(tmp_path / "out")
    assert not (run / "summary.md").exists() and not (run / "eval_dpo.jsonl").exists()

    resumed = posttrain("train", "--resume", str(run))
    output, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, output
    assert "resuming dpo" in output and "resuming sft" not in output  # a finished stage is loaded, not rerun
    assert metrics_without_timings(run) == metrics_without_timings(uninterrupted)
    mine, theirs = (json.loads((r / "summary.json").read_text()) for r in (run, uninterrupted))
    for key in ("start", "sft", "dpo", "grpo", "paired"):
        assert mine[key] == theirs[key], key
    digests = [[(r["start"]["sha256"], r["end"]["sha256"]) for r in json.loads((d / "stages.json").read_text())]
               for d in (run, uninterrupted)]
    assert digests[0] == digests[1]
