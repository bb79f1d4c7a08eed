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

sft.teacher = "self" is R1's third stage, rejection-sampling SFT (Sec. 2.3.3): in a later
stage of --stages the teacher is a frozen copy of the policy the stages before left, typically
the reasoning-RL checkpoint. R1 does this because RL makes a model that solves more problems
than the cold-start data covered, but the cold start is small and RL's text is not curated;
sampling the RL model and keeping only verified samples turns what RL learned into a larger
SFT set of right answers (the paper's ~600k reasoning samples, with ~200k non-reasoning ones
beside them that this toy does not have; the paper also drops chains that mix languages or
are hard to read, where here the verifier alone filters). Unlike the paper, which
fine-tunes the base model for two epochs on that set, the stage here continues from the
policy it sampled: a 0.8M gpt_mini from random weights would not learn the task from a few
hundred rows.
"""

from __future__ import annotations

import copy

from posttrain.config import TrainConfig
from posttrain.config.sections import SELF_TEACHER
from posttrain.models import load_checkpoint_model
from posttrain.models.device import model_device, place
from posttrain.models.policy import Policy, SavablePolicy
from posttrain.pipelines.build import sampling_params, teacher_directory
from posttrain.pipelines.sft import fine_tune, sft_judge_rows
from posttrain.pipelines.verified_samples import rationale_episode, rationale_row, verified_rationales
from posttrain.roles.engines import make_engine
from posttrain.runs.checkpoints import save_checkpoint
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
    teacher, named = frozen_teacher(cfg.sft.teacher, policy)
    engine = make_engine(teacher, tokenizer, sampling_params(cfg))  # the teacher is its own frozen copy
    examples = env.fixed_set("train", cfg.sft.num_examples, seed=cfg.seed)  # the problems plain SFT reads
    kept, stats = verified_rationales(engine, env, examples, cfg.sft.teacher_samples,
                                      generator_for(cfg.seed, stage, "teacher-samples"), rationalize=False,
                                      distinct=True)
    console.print(f"{stage}: teacher {named} passed {stats['kept']} distinct samples of {stats['samples']} "
                  f"({100 * stats['prompts_solved']:.0f}% of {len(examples)} problems solved at least once)")
    if not kept and cfg.sft.teacher != SELF_TEACHER:
        raise ValueError(f"sft.teacher={cfg.sft.teacher!r}: none of its {stats['samples']} samples passed the "
                         "verifier, so there is nothing to fine-tune on; give a stronger teacher, or raise "
                         "--sft.teacher_samples or --sft.num_examples")
    rows = [rationale_row(e) for e in kept]
    run.write_jsonl(data_file, rows)  # the exact data the stage trains on
    return rows


def frozen_teacher(name: str, policy: SavablePolicy) -> tuple[Policy, str]:
    """The model that samples the stage's data, apart from the policy SFT then trains, and how
    the console names it: sft.teacher's checkpoint, or for "self" a copy of the policy as it is
    now (the last stage's checkpoint: pipelines/stages.py loads it before the next stage)."""
    if name == SELF_TEACHER:
        teacher = copy.deepcopy(policy)
        teacher.requires_grad_(False)
        return teacher, "self (the policy the stages before left)"
    directory = teacher_directory(name)
    return place(load_checkpoint_model(directory), model_device(policy), policy.compute_dtype), str(directory)


def distill_stage(cfg: TrainConfig, run: RunDir, env: Environment, tokenizer: Tokenizer, policy: SavablePolicy,
                  stage: str = "sft") -> None:
    """SFT on sft.teacher's verified samples, checkpointed as `stage` (sft.judge_demos' rows on
    top of each batch, as in plain SFT)."""
    demos = [rationale_episode(row, g) for g, row in enumerate(teacher_data(cfg, run, env, tokenizer, policy, stage))]
    if not demos:
        # only "self" gets here: a staged run whose policy solved nothing is a result to report, not a
        # reason to lose the stages before; the stage ends where it started (stages.json: equal digests)
        console.print(f"[bold red]{stage}: the policy passed none of its samples: nothing to fine-tune on, so the "
                      "stage keeps the policy as it is[/] (train the stages before longer)")
        save_checkpoint(run, stage, cfg.sft.steps - 1, policy, tokenizer)
        return
    fine_tune(run, stage, demos, tokenizer, policy, cfg.sft, cfg.seed, cfg.checkpoint_every,
              extra=sft_judge_rows(cfg, env, tokenizer))
