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
    # a checkpoint's generation budget; 0 = its run's (posttrain_task.json), else 64, enough for the
    # arithmetic task; a whole function (humaneval) needs ~400
    max_new_tokens: int = 0
    # > 0: also this many sampled completions per problem, and pass@k for each k of `ks` by Chen et
    # al.'s unbiased estimator (HumanEval's metric: the chance that one of k samples is solved);
    # 0 = the greedy pass@1 only. n well above k lowers the estimate's variance
    samples: int = 0
    ks: str = "1"  # with samples: the k's, comma-separated, each at most `samples` (e.g. "1,5,10")
    # with samples: the sampling temperature; Chen et al. found 0.2 best for pass@1 and 0.8 for pass@100
    temperature: float = 0.8

    def pass_ks(self) -> list[int]:
        """The k's of `ks` as integers; ConfigError naming the setting when one is not."""
        try:
            return [int(k) for k in self.ks.split(",")]
        except ValueError:
            raise ConfigError(f"ks={self.ks!r} is not allowed: expected integers, comma-separated (e.g. '1,5,10')")

    def validate(self) -> None:
        check_device(self)
        if bool(self.checkpoint) == bool(self.completions):
            raise ConfigError("give exactly one of --checkpoint DIR (evaluate a model) or --completions FILE "
                              "(score existing completions)")
        if self.checkpoint and not Path(self.checkpoint).is_dir():
            raise ConfigError(f"checkpoint={self.checkpoint!r}: no such directory")
        check(self.split in ("train", "dev", "heldout"), "split", self.split, "train, dev or heldout")
        check_positive(self, "", "size")
        check(self.max_new_tokens >= 0, "max_new_tokens", self.max_new_tokens,
              "an integer >= 0 (0 = the checkpoint's run's budget)")
        check(self.samples >= 0, "samples", self.samples, "an integer >= 0 (0 = greedy pass@1 only)")
        if self.samples:
            check(not self.completions, "samples", self.samples, "0 with --completions (a file has one completion "
                  "per problem; pass@k samples a checkpoint)")
            check(all(1 <= k <= self.samples for k in self.pass_ks()), "ks", self.ks,
                  f"k's between 1 and samples={self.samples}: pass@k needs at least k samples per problem")
            check(self.temperature > 0, "temperature", self.temperature,
                  "a number > 0: greedy decoding would give every sample the same completion")


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


@dataclass
class StarConfig:
    """`posttrain star`: expert iteration (STaR / rejection-sampling fine-tuning): sample,
    keep what the verifier passes, fine-tune on it with the SFT loss, repeat. Sampling uses
    the RL settings (--rl.sampling.*), the start is --init or SFT as in `posttrain run`."""

    iterations: int = 4  # sample → filter → fine-tune rounds; each one's data comes from the policy it starts with
    prompts: int = 800  # fresh training prompts per iteration; × samples_per_prompt × iterations = the sample budget
    samples_per_prompt: int = 8  # K completions per prompt: more finds a passing rationale for harder prompts
    # true: prompts with no passing sample get K more samples with the answer as a hint line
    # (pipelines/star.py, HINT), and passing ones are trained on under the hint-free prompt
    # (STaR's rationalisation). Off by default: gpt_mini never saw a hint in SFT, and on the
    # arithmetic task it rescued few prompts for the K extra samples each costs (README)
    rationalize: bool = False
    # true: each iteration fine-tunes the starting checkpoint on the new data (STaR's choice:
    # training the same weights again and again on their own samples overfits); false:
    # continue from the previous iteration's weights (RFT / ReST-style)
    restart: bool = True
    distinct: bool = True  # keep each distinct passing completion once per prompt (RFT's de-duplication)
    steps: int = 100  # fine-tuning steps per iteration (batches drawn with replacement from the kept data)
    batch_size: int = 32  # kept rationales per fine-tuning step
    lr: float = 1e-4  # fine-tuning an SFT policy: a tenth of from-scratch SFT's 1e-3, as RL's rl.lr
    warmup_steps: int = 10  # linear warmup: Adam's first second-moment estimates are poor

    def validate(self) -> None:
        check_positive(self, "star", "iterations", "prompts", "samples_per_prompt", "steps", "batch_size")
        check(self.lr > 0, "star.lr", self.lr, "a number > 0")
        check(self.warmup_steps >= 0, "star.warmup_steps", self.warmup_steps, "an integer >= 0")
