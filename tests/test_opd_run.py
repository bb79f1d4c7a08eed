"""On-policy distillation wired into a run: a teacher trained with the library (a few SFT
steps), then `posttrain train --algo opd --opd.teacher <run>` logging the KL to the teacher;
a teacher equal to the student giving advantages of exactly 0; the top-k path through the
trainer; and the refusals before a run starts (no teacher, a teacher that does not load, a
teacher with another tokenizer)."""

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from posttrain.algorithms.opd import OPD
from posttrain.cli import main
from posttrain.config import ConfigError, RLConfig, TrainConfig
from posttrain.config.sections import SamplingParams
from posttrain.models.logprobs import response_topk
from posttrain.pipelines.build import teacher_directory
from posttrain.pipelines.checks import check_config
from posttrain.roles.engines.torch_engine import RolloutEngine
from posttrain.roles.reference import Reference
from posttrain.roles.teacher import TeacherScores, make_teacher
from posttrain.roles.trainer import Trainer
from posttrain.types import RolloutBatch
from tests.test_pipeline import TINY, only_run_dir
from tests.test_rollout import TOK, examples, tiny_model
from tests.test_start_from_model import save_tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory) -> Path:
    """A teacher trained by the library: 20 SFT steps, no RL (the student below gets 5)."""
    out = tmp_path_factory.mktemp("teacher")
    assert main(["train", *TINY, "--sft.steps", "20", "--rl.steps", "0", "--out_dir", str(out)]) == 0
    return only_run_dir(out)


def test_a_run_distils_from_the_teacher_and_logs_its_kl(teacher_run, tmp_path):
    assert main(["train", *TINY, "--algo", "opd", "--opd.teacher", str(teacher_run), "--sft.steps", "5",
                 "--rl.steps", "2", "--out_dir", str(tmp_path)]) == 0
    run = only_run_dir(tmp_path)
    assert json.loads((run / "config.json").read_text())["rl"]["algo_params"] == {"teacher": str(teacher_run)}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl_rows = [r for r in rows if r["stage"] == "rl"]
    assert [r["step"] for r in rl_rows] == [0, 1]
    for r in rl_rows:  # the KL from the student's samples to the teacher: > 0 (another model) and finite
        assert 0 < r["teacher_kl"] < math.inf and math.isfinite(r["teacher_kl_k1"]) and r["time/reference"] > 0
        # A_t = −k1_t on every sampled token: the advantages' mean is minus the logged k1 mean
        assert r["adv_mean"] == pytest.approx(-r["teacher_kl_k1"], rel=1e-4, abs=1e-7)


def test_the_teacher_is_a_checkpoint_a_stage_folder_or_a_run(teacher_run):
    checkpoint = teacher_directory(str(teacher_run))
    assert checkpoint.parent == teacher_run / "checkpoints" / "sft" and checkpoint.name.startswith("step_")
    assert teacher_directory(str(checkpoint)) == checkpoint
    assert teacher_directory(str(checkpoint.parent)) == checkpoint  # the stage's latest


def sampled_batch(model, temperature=1.0) -> RolloutBatch:
    engine = RolloutEngine(copy.deepcopy(model), TOK, SamplingParams(temperature=temperature, max_new_tokens=20))
    episodes = engine.generate(examples(), samples_per_prompt=4, generator=torch.Generator().manual_seed(1))
    return RolloutBatch.collate(episodes, TOK.pad_id, temperature=temperature)


@pytest.mark.parametrize("divergence", ["k1", "k3"])
def test_a_teacher_equal_to_the_student_gives_advantages_of_exactly_zero(divergence, tmp_path):
    student = tiny_model()
    student.save_pretrained(tmp_path / "same", TOK)
    teacher = make_teacher(student, tmp_path / "same")  # the student's weights, read back from disk
    batch = sampled_batch(student, temperature=0.7)
    metrics = teacher.before_advantages(batch)
    assert batch.teacher_logp is not None and batch.response_mask.sum() > 20
    # the sampler's old_logp is the student's to float rounding (its KV-cached forward) ...
    assert abs(metrics["teacher_kl_k1"]) < 1e-5 and 0 <= metrics["teacher_kl"] < 1e-9
    # ... and the student's own forward pass, the one the trainer runs, gives the teacher's bits
    with torch.no_grad():
        student_logp = Trainer(student, lr=1e-3, total_steps=1).forward(batch).logp * batch.response_mask
    batch = dataclasses.replace(batch, old_logp=student_logp)
    advantages = OPD(teacher="same", divergence=divergence).compute_advantages(batch)["advantages"]
    assert advantages.abs().max().item() == 0.0


def test_topk_flows_from_the_teacher_through_the_trainer():
    """The teacher's top k on the batch, the trainer's forward reading the student's log-probs
    at those tokens, one update: with a teacher equal to the student the top-k KL is 0 (to float
    rounding); with another teacher it is > 0 and the update lowers it."""
    student = tiny_model(seed=0)
    batch = sampled_batch(student)
    algo = OPD(teacher="t", divergence="topk", topk=8)
    same = TeacherScores(Reference(student), topk=8)
    same.before_advantages(batch)
    assert batch.teacher_topk_ids is not None and batch.teacher_topk_ids.shape == (*batch.tokens.shape, 8)
    trainer = Trainer(student, lr=1e-2, total_steps=2, micro_batch_size=5)  # micro-batches cut the (B, T, k) too
    with torch.no_grad():
        _, metrics = algo.compute_loss(trainer.forward(batch), dataclasses.replace(batch, **algo.compute_advantages(batch)))
    assert metrics["topk_kl"] < 1e-6
    other = TeacherScores(Reference(tiny_model(seed=1)), topk=8)
    other.before_advantages(batch)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    first = trainer.update(batch, algo)
    second = trainer.update(batch, algo)
    assert first["topk_kl"] > 0.01 and second["topk_kl"] < first["topk_kl"]
    # the teacher's top k are its k likeliest tokens, largest first, and its sampled-token log-probs are Reference.logp's
    logp, topk_logp, _ = response_topk(other.teacher.model, batch, 8)
    torch.testing.assert_close(logp, other.teacher.logp(batch))
    on = batch.response_mask > 0
    assert (topk_logp[on][:, :-1] >= topk_logp[on][:, 1:]).all() and (topk_logp[~on] == 0).all()


def opd_config(teacher: str) -> TrainConfig:
    return TrainConfig(rl=RLConfig(algo="opd", algo_params={"teacher": teacher}, steps=2))


def test_a_run_without_a_teacher_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"rl.algo_params.teacher \(--opd.teacher\)='' is not allowed: expected a "
                                          "teacher for rl.algo='opd'"):
        check_config(TrainConfig(rl=RLConfig(algo="opd", steps=2)))


def test_a_teacher_that_does_not_load_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not load as a teacher"):
        check_config(opd_config(str(tmp_path / "missing")))
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # a run killed before its first checkpoint
    (tmp_path / "run" / "meta.json").write_text("{}")
    with pytest.raises(ConfigError, match="does not load as a teacher.*no policy checkpoint"):
        check_config(opd_config(str(tmp_path / "run")))


def test_a_teacher_with_another_tokenizer_is_refused_before_the_run(tmp_path, teacher_run):
    other = save_tiny_llama(tmp_path / "llama")  # a character per token too, but other ids: <unk> is 0, <s> 1
    with pytest.raises(ConfigError, match=r"the teacher's tokenizer is not the student's \(vocabulary 103 against "
                                          r"100.*token 0 is '<pad>' to the student and '<unk>' to the teacher"):
        check_config(opd_config(str(other)))
    found = check_config(dataclasses.replace(opd_config(str(teacher_run)), heldout_size=16))
    assert any(line.startswith(f"teacher: '{teacher_run}' is {teacher_run}/checkpoints/sft/step_") for line in found)
