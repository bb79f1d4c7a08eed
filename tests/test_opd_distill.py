"""R1's distillation stage (pipelines/distill.py, --sft.teacher): SFT on a teacher's own
samples that the verifier passes. A teacher trained by the library on a tiny task, a student's
SFT stage on its verified samples, the rows on disk read back on resume, and a teacher with
another tokenizer refused before the run."""

import dataclasses

import pytest

import posttrain
from posttrain.config import ConfigError, ModelConfig, RLConfig, SFTConfig, TrainConfig
from posttrain.pipelines import distill
from posttrain.pipelines.checks import check_config
from posttrain.runs.rundir import RunDir
from tests.test_api import Countdown
from tests.test_start_from_model import save_tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")


class AnyNumber(Countdown):
    """"The number before n", scored leniently (any number passes), so that a teacher of a few
    SFT steps passes some of its samples and the test runs in seconds."""

    spec_version = "countdown-any-number-v1"

    def score(self, example, completion):
        return {"reward": float(completion.strip().isdigit()), "details": {}}


def tiny(out, **sft) -> TrainConfig:
    return TrainConfig(model=ModelConfig(dim=32, n_layer=2, n_head=2, hidden_dim=64),
                       sft=SFTConfig(num_examples=16, batch_size=8, warmup_steps=2, **sft),
                       rl=RLConfig(steps=0, dev_size=8), heldout_size=8, threads=1, out_dir=str(out))


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    out = tmp_path_factory.mktemp("distill")
    teacher = posttrain.train(tiny(out, steps=30), env=AnyNumber())
    student = posttrain.train(tiny(out, steps=4, teacher=str(teacher.run_dir), teacher_samples=4), env=AnyNumber())
    return teacher, student


def test_the_student_is_fine_tuned_on_the_teachers_verified_samples(distilled):
    teacher, student = distilled
    rows = RunDir(student.run_dir).read_jsonl("sft_teacher_data.jsonl")
    assert rows, "the teacher passed none of its samples"
    problems = {e.prompt for e in AnyNumber().fixed_set("train", 16, seed=0)}  # the problems plain SFT would read
    for row in rows:
        assert row["reward"] == 1.0 and row["completion"].strip().isdigit()  # passed by the verifier
        assert row["prompt"] in problems and row["response_ids"][-1] == 2  # ended on <eos>: it stopped
    assert len({(r["prompt"], r["completion"]) for r in rows}) == len(rows)  # each distinct sample once
    # not the worked solutions: a weak teacher's numbers are not all "the number before n"
    assert any(r["completion"] != r["expected_answer"] for r in rows)
    steps = sorted(p.name for p in (student.run_dir / "checkpoints" / "sft").glob("step_*"))
    assert steps[-1] == "step_000003"


def test_a_resumed_stage_reads_its_rows_back_without_the_teacher(distilled, monkeypatch):
    _, student = distilled
    run = RunDir(student.run_dir)
    monkeypatch.setattr(distill, "load_checkpoint_model", lambda *a, **k: pytest.fail("the teacher was loaded again"))
    cfg = tiny(student.run_dir.parent, steps=4, teacher="unused")
    assert distill.teacher_data(cfg, run, AnyNumber(), None, None, "sft") == run.read_jsonl("sft_teacher_data.jsonl")


def test_a_teacher_with_another_tokenizer_is_refused_before_the_run(tmp_path):
    other = save_tiny_llama(tmp_path / "llama")
    cfg = dataclasses.replace(tiny(tmp_path, steps=4, teacher=str(other)), heldout_size=16)
    with pytest.raises(ConfigError, match=r"sft.teacher='.*llama' is not allowed: the teacher's tokenizer is not the "
                                          "student's"):
        check_config(cfg)
    with pytest.raises(ConfigError, match="sft.teacher_samples=0 is not allowed: expected a positive integer"):
        check_config(tiny(tmp_path, steps=4, teacher_samples=0))
