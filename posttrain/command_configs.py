"""The settings of the commands that score rather than train: `posttrain eval` (Loop A)
and `posttrain bon` (Loop B). Their sections and checks come from config.py, as the
training commands' do."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from posttrain.config import ConfigError, EnvConfig, check, check_device, check_positive


@dataclass
class EvalConfig:
    """`posttrain eval` (Loop A): score a checkpoint's held-out completions, or a file of
    completions someone else produced, and save every one with its score details."""

    checkpoint: str = ""  # a checkpoint directory written by `posttrain run/train`
    completions: str = ""  # or: a JSONL of {prompt, expected_answer, completion}, or a pack name ("frozen")
    # the verifier for --completions, any registered one (cot-v1: the default task's); a
    # checkpoint is scored by its env's verifier instead
    spec_version: str = "final_int/cot-v1"
    # a checkpoint's task: the one it records (posttrain_task.json, written by every training run),
    # except the settings given here as flags or in --config, which replace the recorded ones (with
    # a warning where they differ); a checkpoint that records none is scored on these settings
    env: EnvConfig = field(default_factory=EnvConfig)
    split: str = "heldout"  # which split's problems a checkpoint answers: train, dev or heldout
    size: int = 500  # problems: a 95% CI of about ±4 points near 70%
    out_dir: str = "runs"  # where the run directory is created
    name: str = "eval"  # the run directory's suffix
    seed: int = 0  # which problems of the split (a smaller size is a prefix of a larger one)
    device: str = "cpu"  # where the checkpoint's model runs: auto = cuda, mps, then cpu; cpu as in training's default
    dtype: str = "float32"  # bfloat16 = forward passes in bf16 (for GPUs; slower on a CPU without native bf16)

    def validate(self) -> None:
        check_device(self)
        if bool(self.checkpoint) == bool(self.completions):
            raise ConfigError("give exactly one of --checkpoint DIR (evaluate a model) or --completions FILE "
                              "(score existing completions)")
        if self.checkpoint and not Path(self.checkpoint).is_dir():
            raise ConfigError(f"checkpoint={self.checkpoint!r}: no such directory")
        check(self.split in ("train", "dev", "heldout"), "split", self.split, "train, dev or heldout")
        check_positive(self, "", "size")


@dataclass
class BonConfig:
    """`posttrain bon` (Loop B): best-of-N selection over a pack of candidates."""

    pack: str = "bon"  # a pack name or a JSONL path (format: posttrain/data/packs/README.md)
    n: int = 8  # candidates considered per prompt (the first n of each prompt's list)
    spec_version: str = "final_int/cot-v1"  # the verifier that grades, any registered one (cot-v1: the pack's)
    select_spec_version: str = ""  # the verifier that selects; "" = the grader (an oracle upper bound)
    out_dir: str = "runs"  # where the run directory is created
    name: str = "bon"  # the run directory's suffix

    def validate(self) -> None:
        check_positive(self, "", "n")
