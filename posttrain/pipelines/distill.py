"""R1's distillation stage: SFT on a teacher's own verified samples (`--sft.teacher`).

DeepSeek-R1 (arXiv:2501.12948, Sec. 2.4) made its small models by SFT alone on samples of the
large one, kept where they were right. Here the SFT stage does the same when sft.teacher names
a teacher (a checkpoint, a run directory or a model name, with the policy's tokenizer):

    1. the teacher samples sft.teacher_samples completions of each of the sft.num_examples
       training problems plain SFT would use (the RL sampling settings)
    2. the verifier keeps the right ones that ended on a stop token, each distinct one once per
       problem (pipelines/verified_samples.py::keep_verified: STaR's filter, another model sampling)
    3. SFT on them (pipelines/sft.py::fine_tune), as on the worked solutions

Where on-policy distillation (algorithms/opd.py) grades the student's own text token by token,
this trains on the teacher's text: off-policy, one bit of verification per sample. The kept
samples are written to `<stage>_teacher_data.jsonl` before training, and read back on resume,
so a resumed run trains on exactly the same rows.
"""

from __future__ import annotations

from posttrain.config import TrainConfig
from posttrain.models import load_checkpoint_model
from posttrain.models.device import model_device, place
from posttrain.models.policy import SavablePolicy
from posttrain.pipelines.build import sampling_params, teacher_directory
from posttrain.pipelines.sft import fine_tune, sft_judge_rows
from posttrain.pipelines.verified_samples import rationale_episode, rationale_row, verified_rationales
from posttrain.roles.engines import make_engine
from posttrain.runs.console import console
from posttrain.runs.rundir import RunDir
from posttrain.seeds import generator_for
from posttrain.types import Environment, Tokenizer


def teacher_data(cfg: TrainConfig, run: RunDir, env: Environment, tokenizer: Tokenizer, policy: SavablePolicy,
                 stage: str) -> list[dict]:
    """The rows the stage trains on: read back from `<stage>_teacher_data.jsonl`, or sampled from
    sft.teacher now and written there first."""
    data_file = f"{stage}_teacher_data.jsonl"
    if (run.path / data_file).exists():
        return run.read_jsonl(data_file)
    directory = teacher_directory(cfg.sft.teacher)
    teacher = place(load_checkpoint_model(directory), model_device(policy), policy.compute_dtype)
    engine = make_engine(teacher, tokenizer, sampling_params(cfg))  # the teacher is its own frozen copy
    examples = env.fixed_set("train", cfg.sft.num_examples, seed=cfg.seed)  # the problems plain SFT reads
    kept, stats = verified_rationales(engine, env, examples, cfg.sft.teacher_samples,
                                      generator_for(cfg.seed, stage, "teacher-samples"), rationalize=False,
                                      distinct=True)
    console.print(f"{stage}: teacher {directory} passed {stats['kept']} distinct samples of {stats['samples']} "
                  f"({100 * stats['prompts_solved']:.0f}% of {len(examples)} problems solved at least once)")
    if not kept:
        raise ValueError(f"sft.teacher={cfg.sft.teacher!r}: none of its {stats['samples']} samples passed the "
                         "verifier, so there is nothing to fine-tune on; give a stronger teacher, or raise "
                         "--sft.teacher_samples or --sft.num_examples")
    rows = [rationale_row(e) for e in kept]
    run.write_jsonl(data_file, rows)  # the exact data the stage trains on
    return rows


def distill_stage(cfg: TrainConfig, run: RunDir, env: Environment, tokenizer: Tokenizer, policy: SavablePolicy,
                  stage: str = "sft") -> None:
    """SFT on sft.teacher's verified samples, checkpointed as `stage` (sft.judge_demos' rows on
    top of each batch, as in plain SFT)."""
    demos = [rationale_episode(row, g) for g, row in enumerate(teacher_data(cfg, run, env, tokenizer, policy, stage))]
    fine_tune(run, stage, demos, tokenizer, policy, cfg.sft, cfg.seed, cfg.checkpoint_every,
              extra=sft_judge_rows(cfg, env, tokenizer))
