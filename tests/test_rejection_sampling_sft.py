"""R1's rejection-sampling SFT (sft.teacher = "self", pipelines/distill.py): in a later stage
of --stages the policy the stages before left samples the training problems, the verifier keeps
the right, distinct samples, and SFT trains on them. A tiny four-stage run in R1's order, its
third stage's rows all passed by the verifier, the rows read back on resume without sampling
again, and "self" refused where no earlier stage trained a policy."""

import shutil

import pytest

import posttrain
from posttrain.config import ConfigError, ModelConfig, RLConfig, SFTConfig, TrainConfig
from posttrain.pipelines import distill
from posttrain.pipelines.checks import check_config
from posttrain.pipelines.stages import run_stages
from posttrain.runs.rundir import RunDir
from tests.test_api import Countdown
from tests.test_opd_distill import AnyNumber

pytestmark = pytest.mark.usefixtures("one_thread")

R1_ORDER = "sft,grpo,sft[sft.teacher=self,sft.steps=4,sft.teacher_samples=4],grpo"


def tiny(out, stages: str = R1_ORDER, **sft) -> TrainConfig:
    return TrainConfig(model=ModelConfig(dim=32, n_layer=2, n_head=2, hidden_dim=64),
                       sft=SFTConfig(num_examples=16, batch_size=8, warmup_steps=2, steps=30, **sft),
                       rl=RLConfig(steps=2, prompts_per_step=4, samples_per_prompt=4, dev_size=8, eval_every=5),
                       heldout_size=8, checkpoint_every=2, threads=1, out_dir=str(out), stages=stages)


@pytest.fixture(scope="module")
def four_stages(tmp_path_factory):
    return posttrain.train(tiny(tmp_path_factory.mktemp("r1_order")), env=AnyNumber())


def test_the_third_stage_trains_on_the_rl_policys_verified_samples(four_stages):
    run = RunDir(four_stages.run_dir)
    assert [s["name"] for s in four_stages.summary["stages"]] == ["sft", "grpo", "sft_2", "grpo_2"]
    rows = run.read_jsonl("sft_2_teacher_data.jsonl")
    assert rows, "the RL policy passed none of its samples"
    examples = {e.prompt: e for e in AnyNumber().fixed_set("train", 16, seed=0)}  # the problems plain SFT reads
    for row in rows:  # each row passes the verifier again, and was a stopped completion of a training problem
        assert AnyNumber().score(examples[row["prompt"]], row["completion"])["reward"] == 1.0 == row["reward"]
        assert row["response_ids"][-1] == 2
    assert len({(r["prompt"], r["completion"]) for r in rows}) == len(rows)  # each distinct sample once
    assert not (run.path / "sft_teacher_data.jsonl").exists()  # the cold start trained on the worked solutions
    # the teacher was the grpo stage's last checkpoint: sft_2 started from it and trained its own 4 steps
    stages = {s["name"]: s for s in four_stages.summary["stages"]}
    assert stages["sft_2"]["start"]["sha256"] == stages["grpo"]["end"]["sha256"]
    assert sorted(p.name for p in (run.path / "checkpoints" / "sft_2").glob("step_*"))[-1] == "step_000003"


def test_a_resumed_run_reads_the_stages_rows_back_without_sampling_again(four_stages, tmp_path, monkeypatch):
    copy = tmp_path / "resumed"
    shutil.copytree(four_stages.run_dir, copy)
    for stage in ("sft_2", "grpo_2"):  # killed at the start of the third stage, after its rows were written
        shutil.rmtree(copy / "checkpoints" / stage)
    run = RunDir(copy)
    rows = run.read_jsonl("sft_2_teacher_data.jsonl")
    monkeypatch.setattr(distill, "frozen_teacher", lambda *a, **k: pytest.fail("the policy was sampled again"))
    run_stages(tiny(tmp_path), run, AnyNumber())
    assert run.read_jsonl("sft_2_teacher_data.jsonl") == rows
    assert (copy / "checkpoints" / "grpo_2").is_dir()


@pytest.mark.parametrize("stages,where", [("", "a plain run"), ("sft[sft.teacher=self],grpo", "the first stage")])
def test_self_is_refused_where_no_earlier_stage_trained_a_policy(tmp_path, stages, where):
    cfg = tiny(tmp_path, stages=stages, teacher="self" if not stages else "")
    with pytest.raises(ConfigError, match=r"sft.teacher='self' is not allowed: .* this is a plain run or the first "
                                          r"stage, with no such policy; use it after an RL stage, e.g. --stages "
                                          r"'sft,grpo,sft\[sft.teacher=self\],grpo'"):
        check_config(cfg, AnyNumber())
    check_config(tiny(tmp_path), AnyNumber())  # R1's order passes


def test_a_policy_that_solved_nothing_leaves_the_stage_where_it_started(tmp_path, capsys):
    cfg = tiny(tmp_path, stages="sft[sft.steps=1],sft[sft.teacher=self,sft.steps=3]")
    result = posttrain.train(cfg, env=Countdown())  # exact answers: a one-step policy gets none right
    run = RunDir(result.run_dir)
    assert run.read_jsonl("sft_2_teacher_data.jsonl") == []
    assert "sft_2: the policy passed none of its samples: nothing to fine-tune on" in capsys.readouterr().out
    first, second = result.summary["stages"]
    assert second["start"]["sha256"] == second["end"]["sha256"] == first["end"]["sha256"]
    assert not [r for r in run.read_jsonl("metrics.jsonl") if r.get("stage") == "sft_2"]  # no step was trained
