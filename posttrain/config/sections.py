"""The sections every training command shares, each a dataclass with its own `validate()`:
the policy (`model`), the task (`env`: the settings several environments read, and a section
per environment, `env.arithmetic`, `env.reasoning_gym`, ..., for the settings only it reads),
how the policy is sampled (`sampling`, which RL, evaluation and search all read) and
supervised fine-tuning (`sft`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from posttrain.config.checks import check, check_non_negative, check_positive


@dataclass
class ModelConfig:
    # "gpt_mini": the readable from-scratch decoder (the fields below shape it);
    # "smollm2-135m": SmolLM2-135M-Instruct, converted once from a PyPI package, no download;
    # or the path of any local transformers causal-LM directory
    name: str = "gpt_mini"
    dim: int = 128  # gpt_mini width: ~0.8M parameters with 4 layers, trains from scratch in a minute on 2 cores
    n_layer: int = 4  # gpt_mini depth: four blocks are enough for five-term running sums
    n_head: int = 4  # gpt_mini attention heads: 32-dimensional heads at dim 128
    hidden_dim: int = 352  # gpt_mini SwiGLU width ≈ 8/3·dim (LLaMA's ratio), rounded to a multiple of 32
    max_seq_len: int = 96  # gpt_mini context: prompt (~15 chars) + chain of thought (~40) with room to spare
    # transformers models: >0 trains rank-r LoRA adapters in the RL and preference stages,
    # and the reference is the policy with its adapters off; 0 trains every weight
    lora_r: int = 0
    lora_alpha: int = 0  # the adapters' scale α (α/r multiplies B·A); 0 = 2·r, the common choice
    system_prompt: str = ""  # instruct models: replaces the chat template's default system turn; "" keeps it
    # recompute each block's activations in backward: less memory, same gradients, slower; off
    # (gpt_mini never runs short of memory, BENCHMARKS.md)
    gradient_checkpointing: bool = False

    def validate(self, prefix: str = "model") -> None:
        check_positive(self, prefix, "dim", "n_layer", "n_head", "hidden_dim", "max_seq_len")
        check_non_negative(self, prefix, "lora_r", "lora_alpha")
        check(self.dim % (2 * self.n_head) == 0, f"{prefix}.n_head", self.n_head, f"a divisor of {prefix}.dim="
              f"{self.dim} into even heads: a gpt_mini head gets dim / n_head channels, RoPE turns them in pairs")


@dataclass
class ArithmeticConfig:
    """env.name arithmetic: generated sums with a `Final: <int>` answer (posttrain/envs/arithmetic.py)."""

    level: int = 3  # difficulty 1..5, 3: five one-digit terms
    # a mixed task: levels drawn from this list ("2,3,5"; curricula order by them); "" = level alone
    levels: str = ""
    # prompts in number words, and this share of solutions; 0 = digits only
    words: float = 0.0


@dataclass
class ArithmeticThinkConfig:
    """env.name arithmetic_think: the arithmetic problems with a /think or /no_think switch in
    the prompt, Qwen3's thinking-mode fusion (posttrain/envs/thinking_modes.py)."""

    level: int = 3  # difficulty, 1..5, as the arithmetic task's; 3 = five single-digit terms
    # the switch in the prompts: fused (each problem /think or /no_think, half each: SFT on both
    # modes) | think | no_think (every prompt one mode: measure it)
    think_mode: str = "fused"
    # the share of /think demonstrations cut at a random point and closed as a thinking budget
    # closes them (early-stop text, </think>, answer); 0 = Qwen3's recipe, never seen
    budget_demos: float = 0.0


@dataclass
class ReasoningGymConfig:
    """env.name reasoning_gym:NAME: any reasoning-gym task, graded by its own scorer
    (posttrain/envs/reasoning_gym_tasks.py; pip install 'posttrain[tasks]')."""

    # items generated (indices 0..pool_size-1, seed 0), split ~80/10/10 by a hash of each question;
    # 10,000 leaves ~1,000 held out for a task with that many distinct questions
    pool_size: int = 10_000
    # the task's own settings as a JSON object, e.g. '{"max_terms": 3}'; "" = reasoning-gym's
    # defaults (an unknown setting is refused with the task's list)
    task_config: str = ""
    # SFT demonstrations that show their work, one step per line before the <answer> line, for the
    # tasks with a step writer (leg_counting, chain_sum, aiw: posttrain/envs/reasoning_gym_tasks.py);
    # false = the item's answer alone, all reasoning-gym gives
    worked_steps: bool = False


@dataclass
class ToolArithmeticConfig:
    """env.name tool_arithmetic: 3-digit products with a calculator tool, a multi-turn task
    for the agent loop (posttrain/envs/tool_arithmetic.py)."""

    # the share of SFT demonstrations that call the calculator; the rest state the product at
    # once, so below 1 the SFT policy mostly guesses and RL must find the tool
    tool_demos: float = 1.0
    # subtracted from the answer's score per tool call and per malformed call
    # (posttrain/rewards/agentic.py): costs only, so a wrong answer never earns more than 0
    step_cost: float = 0.0
    malformed_penalty: float = 0.0  # subtracted per malformed tool call, as step_cost is per call
    # which earlier <think>…</think> the model reads before its next turn, keep_all | keep_last |
    # drop (posttrain/roles/thinking.py); the last two train one row per turn
    thinking: str = "keep_all"


# The environments with settings of their own, each a section of env named as the environment
# is registered (posttrain/envs/__init__.py): a setting lives in the section of the one
# environment that takes it, and a test holds each section's fields to its parameters.
ENV_SECTIONS = ("arithmetic", "arithmetic_think", "reasoning_gym", "tool_arithmetic")


@dataclass
class EnvConfig:
    """The task: its name, a section per environment with the settings only it reads
    (ENV_SECTIONS), and the settings several environments read."""

    # the task: "arithmetic" (generated, no data needed), or your --env.path file scored by
    # final_int ("jsonl"), math-verify ("math") or its tests in the sandbox ("code"), GSM8K's own
    # {question, answer} file scored on its `#### <int>` line ("gsm8k"), or an external
    # one (pip install 'posttrain[tasks]'): "reasoning_gym:NAME" (any reasoning-gym task, its own
    # grader) or "humaneval" (164 problems, all held out); posttrain/envs/__init__.py
    name: str = "arithmetic"
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)  # env.name arithmetic
    arithmetic_think: ArithmeticThinkConfig = field(default_factory=ArithmeticThinkConfig)  # env.name arithmetic_think
    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)  # env.name reasoning_gym:NAME
    tool_arithmetic: ToolArithmeticConfig = field(default_factory=ToolArithmeticConfig)  # env.name tool_arithmetic
    # arithmetic and jsonl: worked steps before `Final: <int>` (spec final_int/cot-v1); false: one line only
    cot: bool = True
    # the verifier, a name in posttrain/verifiers VERIFIERS (jsonl, math, code, reasoning_gym; a
    # hackable final_int spec to red-team); "" = the environment's own
    spec_version: str = ""
    # the problems of env "jsonl", "math", "code" or "gsm8k": a .jsonl, .json or .parquet file, or a directory
    # (save_to_disk's, or of data files), rows {"prompt", "expected_answer"} or TRL's prompt/completion
    # and messages; other columns go to reward functions (posttrain/envs/problem_rows.py)
    path: str = ""
    # your column names for ours, when they differ: "prompt=question,expected_answer=answer" (ours
    # = yours); "" reads the names as they are (posttrain/envs/dataset_files.py)
    columns: str = ""
    # a held-out set of your own (same formats): every row of it is held out, env.path's rows train
    # (and give dev); "" splits env.path itself by a hash of each prompt, or by its own test split
    heldout_path: str = ""
    # env "code" and "humaneval" only: where no namespace sandbox exists (not root, most containers) run the tests
    # in the weak prelude-only one, which can leak files and network; off (posttrain/guards/sandbox.py)
    allow_weak_sandbox: bool = False

    def section(self) -> str:
        """The section of the environment env.name names ("reasoning_gym:chain_sum": reasoning_gym),
        or "" for one without settings of its own (jsonl, math, code, humaneval)."""
        family = self.name.partition(":")[0]
        return family if family in ENV_SECTIONS else ""

    def kwargs(self) -> dict[str, Any]:
        """The settings changed from their defaults, as keyword arguments of the environment:
        the shared ones and those of its own section. One that does not take a setting
        rejects it by name (make_env); so does every environment a changed setting of another
        environment's section, passed by its dotted name ("reasoning_gym.pool_size"), which no
        parameter has: a setting is refused, never dropped, also where validate() did not run."""
        defaults = EnvConfig()
        changed = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if f.name != "name" and f.name not in ENV_SECTIONS
                   and getattr(self, f.name) != getattr(defaults, f.name)}
        for section in ENV_SECTIONS:
            own = section == self.section()
            changed |= {name if own else f"{section}.{name}": value
                        for name, value in changed_fields(getattr(self, section)).items()}
        return changed

    def arithmetic_level(self) -> int:
        """The level of an arithmetic task, env.arithmetic's or env.arithmetic_think's as env.name
        reads; arithmetic's (3 by default) for other tasks, as a run's meta.json records it."""
        return self.arithmetic_think.level if self.section() == "arithmetic_think" else self.arithmetic.level

    def settings(self) -> dict[str, Any]:
        """Every setting as {name: value}, a section's as "arithmetic.level": the names of the
        --env.* flags, in the order of the fields."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                values |= {f"{f.name}.{inner.name}": getattr(value, inner.name) for inner in dataclasses.fields(value)}
            else:
                values[f.name] = value
        return values

    def replaced(self, values: dict[str, Any]) -> EnvConfig:
        """A copy with the settings `values` ({name: value}, as settings() names them) replaced."""
        top = {name: value for name, value in values.items() if "." not in name}
        for section in {name.partition(".")[0] for name in values if "." in name}:
            inner = {name.partition(".")[2]: value for name, value in values.items() if name.startswith(section + ".")}
            top[section] = dataclasses.replace(getattr(self, section), **inner)
        return dataclasses.replace(self, **top)

    def validate(self, prefix: str = "env") -> None:
        """A section the chosen environment does not read keeps its defaults: a setting there
        would be silently ignored."""
        for section in ENV_SECTIONS:
            if section == self.section():
                continue
            for name, value in changed_fields(getattr(self, section)).items():
                default = getattr(type(getattr(self, section))(), name)
                reader = f"{section}:NAME" if section == "reasoning_gym" else section
                check(False, f"{prefix}.{section}.{name}", value, f"its default {default!r} with "
                      f"{prefix}.name={self.name!r}: only env.name {reader} reads the {section} section")


def changed_fields(section: Any) -> dict[str, Any]:
    """{name: value} of the fields of the dataclass `section` that differ from its defaults."""
    defaults = type(section)()
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)
            if getattr(section, f.name) != getattr(defaults, f.name)}


SAMPLER_WEIGHTS = ("float32", "int8")


@dataclass
class SamplingParams:
    temperature: float = 1.0  # sample from the policy itself: RL needs its exploration; 0 = greedy
    top_p: float = 1.0  # 1.0 keeps old_logp an exact log-prob of the sampling distribution
    max_new_tokens: int = 48  # the generation budget: the longest level-3 chain of thought is ~40 characters
    # end a completion at its first newline; always on for one-line answers (env.cot false)
    stop_at_newline: bool = False
    # torch.compile the sampler's decode step; measured on gpt_mini (make run's batch): 17%
    # faster decoding after a compile of ~2 minutes on 2 busy cores (BENCHMARKS.md)
    compile: bool = False
    # the weights the sampler decodes with: "int8" quantises every Linear (CPU, torch's int8
    # kernels; models/int8.py) while the trainer stays float32, and the update corrects the
    # mismatch with importance weights (rl.mismatch); evaluation always decodes in
    # float32. float32 is the default because int8 only pays for large matrices (SmolLM2,
    # not gpt_mini: BENCHMARKS.md)
    weights: str = "float32"
    # what samples (roles/engines/): "torch", posttrain's own sampler in the trainer's process, the
    # one every number in this repository was measured with. Any name registered in ENGINES
    engine: str = "torch"

    def validate(self, prefix: str = "sampling") -> None:
        check(self.temperature >= 0, f"{prefix}.temperature", self.temperature, "a number >= 0 (0 = greedy)")
        check(0 < self.top_p <= 1, f"{prefix}.top_p", self.top_p, "a number in (0, 1]")
        check_positive(self, prefix, "max_new_tokens")
        check(self.weights in SAMPLER_WEIGHTS, f"{prefix}.weights", self.weights,
              f"one of {list(SAMPLER_WEIGHTS)} (int8: decode with int8 Linear weights on the CPU)")
        check(not (self.compile and self.weights == "int8"), f"{prefix}.compile", self.compile,
              f"false with {prefix}.weights='int8' (torch.compile does not take torch's int8 Linear modules); "
              "choose one of the two")


SELF_TEACHER = "self"  # sft.teacher's value for "the policy so far" (pipelines/distill.py)


@dataclass
class SFTConfig:
    # Few demonstrations on purpose: SFT teaches the format, RL has to earn the accuracy.
    # Measured at seed 0 (held-out pass@1 after SFT): 120 demos 29%, 150 demos 69%, and 300
    # demos 92% (little left for RL to show).
    num_examples: int = 150
    steps: int = 600  # 128 epochs of 150 demos: the loss is ~0, what SFT can learn is learnt; 0 skips SFT
    batch_size: int = 32  # demonstrations per step: enough to average out one odd example
    lr: float = 1e-3  # from-scratch training of a 0.8M model tolerates a large step
    warmup_steps: int = 30  # linear warmup: Adam's first second-moment estimates are poor
    weight_decay: float = 0.1  # the usual AdamW decay for training from scratch
    # judge demonstrations for SFT: this many training problems, each its solution judged "Y"
    # and a wrong twin (a step's slip carried through) judged "N", in the self-judge's compact
    # prompt (posttrain/data/judge_demos.py; the self-rewarding paper's evaluation fine-tuning
    # data), sft.batch_size of them drawn on top of each batch of solutions. What rl.preference.self_reward
    # needs on gpt_mini, which cannot read a judge prompt untaught; 1,000 took its judge from
    # chance to AUROC ~0.7 against the verifier (docs/guides/preference.md, "Self-rewarding rounds").
    # 0 = none: plain SFT
    judge_demos: int = 0
    # R1's distillation stage (DeepSeek-R1, arXiv:2501.12948, Sec. 2.4: SFT of smaller models on a
    # stronger one's verified samples): a teacher (a checkpoint, a run directory or a model name,
    # with the policy's tokenizer) samples sft.teacher_samples completions of each of the
    # sft.num_examples training problems, and SFT trains on those the verifier passes, each
    # distinct one once, instead of the environment's worked solutions (pipelines/distill.py).
    # "" = the worked solutions; "self": later in --stages, the policy so far (R1's rejection sampling)
    teacher: str = ""
    teacher_samples: int = 4  # completions per problem: a problem the teacher solves half the time keeps one 15 times in 16

    def validate(self, prefix: str = "sft") -> None:
        check_positive(self, prefix, "num_examples", "batch_size", "teacher_samples")
        check_non_negative(self, prefix, "judge_demos")
        check(self.steps >= 0, f"{prefix}.steps", self.steps, "an integer >= 0 (0 skips SFT)")
        check(self.lr > 0, f"{prefix}.lr", self.lr, "a positive number")
        check_non_negative(self, prefix, "warmup_steps", "weight_decay")
