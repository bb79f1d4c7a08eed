"""The settings of the commands that neither run the training loop (`posttrain train/run`,
config/) nor score (config/scoring.py): `posttrain star` (expert iteration) and `posttrain prm`
(an outcome or process reward model), which train with a loop of their own, `posttrain
systems` (the calculator), `posttrain doctor` (a run's diagnosis) and `posttrain equivalence`
(Kimi k1.5's answer-equivalence judge). Their sections and checks come from config/, as the training
commands' do."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from posttrain.config.checks import ConfigError, check, check_positive, check_threads
from posttrain.config.sections import EnvConfig


@dataclass
class DoctorConfig:
    """`posttrain doctor RUN`: why a run is not learning, named from its run directory's
    metrics.jsonl and samples.jsonl (runs/diagnosis.py): the causes its RL stage printed as
    it ran, each with the setting to change and the numbers that showed it."""

    # the run directory (runs/<id>), also given as the first argument: posttrain doctor runs/<id>
    run: str = ""
    # the stage to diagnose: "rl", "pref", or a --stages run's stage name (its algorithm); "" = every
    # stage that sampled or scored (SFT's steps have nothing to diagnose)
    stage: str = ""
    # also R1-Zero's two curves per RL step: mean response length and the share of samples with a
    # reflection word ("wait", "verify", ...), printed and drawn in <stage>_reflection.png (runs/reflection.py)
    reflection: bool = False

    def validate(self) -> None:
        check(bool(self.run), "run", self.run, "a run directory: posttrain doctor runs/<id>")
        check(Path(self.run, "metrics.jsonl").is_file(), "run", self.run,
              "a run directory with a metrics.jsonl (posttrain train writes one in runs/<id>)")


@dataclass
class EquivalenceConfig:
    """`posttrain equivalence`: train a small classifier that judges whether a final answer states
    the reference integer (Kimi k1.5's equivalence reward model, at toy scale), and measure the
    rule alone, the classifier alone and rule-then-classifier on held-out rows: accuracy, wrong
    answers paid and right answers missed, with 95% bootstrap CIs (rewards/equivalence_judge.py)."""

    out: str = "runs/equivalence_judge"  # the directory the judge is written to (replaced); pass it as --rl.rm.path
    # generated training rows, half right; 16,000 at 2,000 steps of 64 is 8 passes, about 90 s on one
    # thread of the 2-core EPYC this was measured on
    pairs: int = 16_000
    # held-out rows, on references training never sees; 2,000 gives CIs of about ±2 points on accuracy
    heldout: int = 2_000
    steps: int = 2_000  # optimizer steps of 64 rows: 8 passes over the default rows
    lr: float = 2e-3  # constant AdamW learning rate: the body is trained from scratch, as SFT's is
    # the judge's probability at which an answer the rule cannot parse is paid (higher: fewer wrong
    # answers paid, more right ones missed; 0.5 = the judge's own decision)
    threshold: float = 0.5
    seed: int = 0  # seeds the training rows, the body and the batch order; held-out rows are drawn from seed + 1
    threads: int = 0  # torch intra-op threads (0 = torch's default; 1 on a shared machine)

    def validate(self) -> None:
        check_positive(self, "", "pairs", "heldout", "steps")
        check(self.lr > 0, "lr", self.lr, "a number > 0")
        check(0.0 < self.threshold < 1.0, "threshold", self.threshold,
              "a probability strictly between 0 and 1 (0.5 = the judge's own decision)")
        check_threads(self)


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
    # arithmetic task it rescued few prompts for the K extra samples each costs (docs/guides/search.md)
    rationalize: bool = False
    # true: each iteration fine-tunes the starting checkpoint on the new data (STaR's choice:
    # training the same weights again and again on their own samples overfits); false:
    # continue from the previous iteration's weights (RFT / ReST-style)
    restart: bool = True
    distinct: bool = True  # keep each distinct passing completion once per prompt (RFT's de-duplication)
    # true: keep a passing completion only if every step of its chain checks too (verifiers/steps.py;
    # arithmetic tasks only): the outcome verifier alone lets 1-4.5% right answers from wrong
    # chains through, and every rationalised one (docs/guides/search.md); off = STaR's outcome-only filter
    step_check: bool = False
    steps: int = 100  # fine-tuning steps per iteration (batches drawn with replacement from the kept data)
    batch_size: int = 32  # kept rationales per fine-tuning step
    lr: float = 1e-4  # fine-tuning an SFT policy: a tenth of from-scratch SFT's 1e-3, as RL's rl.optim.lr
    warmup_steps: int = 10  # linear warmup: Adam's first second-moment estimates are poor

    def validate(self) -> None:
        check_positive(self, "star", "iterations", "prompts", "samples_per_prompt", "steps", "batch_size")
        check(self.lr > 0, "star.lr", self.lr, "a number > 0")
        check(self.warmup_steps >= 0, "star.warmup_steps", self.warmup_steps, "an integer >= 0")


@dataclass
class PrmConfig:
    """`posttrain prm`: train an outcome (orm) or process (prm) reward model on step labels,
    report its held-out step accuracy, AUROC and calibration with bootstrap CIs."""

    kind: str = "prm"  # prm: one probability per step, read after each step; orm: one per completion, at its end
    # a stepwise JSONL/JSON/Parquet file in TRL's format (prompt, completions: the steps, labels: one bool per
    # step; optional outcome), split by prompt into train and held-out; "" = label the policy's own samples
    data: str = ""
    # with --data: a held-out file of the same format (e.g. a prm run's prm_heldout.jsonl, beside its
    # prm_train.jsonl as --data, to train an ORM on the samples a PRM was trained on); "" = hold out
    # heldout_percent of --data's prompts
    heldout_data: str = ""
    # the policy that writes the samples and whose copy becomes the reward model's body: a run's
    # checkpoint, a transformers directory or a model name (smollm2-135m); "" = a short SFT of gpt_mini first
    init: str = ""
    # the task whose problems are sampled: --init's own when its checkpoint records one (posttrain_task.json),
    # else these settings; without --init, an arithmetic level (level 5 adds minus signs and more wrong steps)
    env: EnvConfig = field(default_factory=EnvConfig)
    # how the policy's steps are labelled: checker = the arithmetic step checker (verifiers/steps.py: first-error
    # labels, free); mc = Monte-Carlo (rewards/monte_carlo_labels.py: continuations rolled out from every step's
    # prefix, judged by the task's verifier), for tasks without a step checker, at a cost in sampled tokens
    labels: str = "checker"
    # with labels mc: continuations per step prefix. A right step from which the policy succeeds half the
    # time gets a hard label of 0 with probability 1/16 at 4; Math-Shepherd used 8, at twice the tokens
    mc_rollouts: int = 4
    # with labels mc: hard = 1 when any continuation ended right (Math-Shepherd's hard estimate: a wrong step
    # is one the policy cannot recover from); soft = the fraction that did (its value under the policy)
    mc_label: str = "hard"
    prompts: int = 500  # training problems sampled (distinct, train split)
    heldout_prompts: int = 200  # held-out problems (distinct, dev split: the search jobs keep heldout for themselves)
    samples_per_prompt: int = 4  # completions per problem: different mistakes on the same problem
    # 1.0 = the policy's own distribution: an SFT policy at 77% pass@1 writes a wrong step in ~1 of 4
    # completions; lower temperatures leave the reward model too few errors to learn from
    temperature: float = 1.0
    # a completion's token cap (the Monte-Carlo rollouts' too: prefix + rollout); 0 = --init's run's
    # (posttrain_task.json), else 48: the longest level-3 chain of thought is ~40 characters
    max_new_tokens: int = 0
    heldout_percent: int = 10  # with --data: the share of prompts held out (by a hash of the prompt)
    # how the steps are joined into the text the model reads: arithmetic (',' between chain steps, a newline
    # before the Final line), newline (one step per line, TRL's default separator) or answer_tag (one step per
    # line, the <answer> line ends it: reasoning-gym's worked steps); "" = the task's own (arithmetic for
    # arithmetic, answer_tag for reasoning_gym:NAME), which the policy's samples are always split by
    step_format: str = ""
    steps: int = 400  # AdamW steps on batches of labelled completions
    # measured on arithmetic L3 with a body copied from the SFT policy: at 3e-4 the loss was still
    # falling after 400 steps; 1e-3 gave the numbers in docs/guides/search.md, "Process reward models"
    lr: float = 1e-3
    batch_size: int = 32  # completions per step
    # completions per forward and backward pass (gradient accumulation: the step's gradient is the
    # whole batch's, to float rounding); 0 = all batch_size at once. A transformers body
    # (--init smollm2-135m) wants a few, as the Bradley–Terry model does (rl.rm.micro_batch_size)
    micro_batch_size: int = 0
    sft_steps: int = 600  # without --init: the SFT of `posttrain run` (600 steps, 150 demonstrations)
    threads: int = 0  # torch intra-op threads for the model's work; 0 = leave torch's default (all cores)
    out_dir: str = "runs"  # where the run directory is created
    name: str = "prm"  # the run directory's suffix
    seed: int = 0  # problems, samples, SFT and training order all derive from it

    def validate(self) -> None:
        check_threads(self)
        self.env.validate()
        check(self.kind in ("prm", "orm"), "kind", self.kind, "prm (a score per step) or orm (one per completion)")
        check(self.labels in ("checker", "mc"), "labels", self.labels,
              "checker (the arithmetic step checker) or mc (Monte-Carlo rollouts, any task)")
        check(self.mc_label in ("hard", "soft"), "mc_label", self.mc_label,
              "hard (some rollout ended right) or soft (the fraction that did)")
        check(not (self.kind == "orm" and self.labels == "mc" and not self.data), "labels", self.labels,
              "checker with kind orm, or --data: an ORM trains on outcomes alone and would never read the step "
              "labels the rollouts cost; train it on a prm run's samples with --data RUN/prm_train.jsonl "
              "--heldout_data RUN/prm_heldout.jsonl")
        check_positive(self, "", "prompts", "heldout_prompts", "samples_per_prompt", "mc_rollouts", "steps",
                       "batch_size")
        check(self.max_new_tokens >= 0, "max_new_tokens", self.max_new_tokens, "an integer >= 0 (0 = the run's)")
        check(self.temperature > 0, "temperature", self.temperature,
              "a number > 0: greedy samples repeat one completion per problem")
        check(0 < self.heldout_percent < 100, "heldout_percent", self.heldout_percent, "an integer in 1..99")
        check(self.lr > 0, "lr", self.lr, "a number > 0")
        check(self.micro_batch_size >= 0, "micro_batch_size", self.micro_batch_size,
              "an integer >= 0 (0 = the whole batch)")
        check(self.sft_steps >= 0, "sft_steps", self.sft_steps, "an integer >= 0")
        check(self.step_format in ("", "arithmetic", "newline", "answer_tag"), "step_format", self.step_format,
              "'' (the task's own), arithmetic, newline or answer_tag")
        check(bool(self.data) or not self.heldout_data, "heldout_data", self.heldout_data,
              "'' without --data (the policy's own samples hold out dev problems)")
        for name in ("data", "heldout_data"):
            if getattr(self, name) and not Path(getattr(self, name)).exists():
                raise ConfigError(f"{name}={getattr(self, name)!r}: no such file or directory")


@dataclass
class SystemsConfig:
    """`posttrain systems`: does a model fit on a cluster for an RL job, and where will a
    step's time go (posttrain/systems/); with --run, where a run's time went."""

    # a preset (gpt_mini, smollm2-135m, qwen2.5-0.5b/1.5b/7b/32b, gemma-2b, llama-2-7b, mistral-7b,
    # llama-3-8b, llama-3-70b: published config numbers), a config.json, or a model directory holding
    # one (its weights are never read); "" = smollm2-135m, or nothing when --run is given alone
    model: str = ""
    # a published device (h100-80gb, h200-141gb, a100-80gb, a100-40gb, l4-24gb), or cpu: this machine,
    # its ceilings measured now (a float32 GEMM and a large copy, a few seconds)
    gpu: str = "h100-80gb"
    gpus: int = 8  # devices in the cluster: the trainer data-parallel over all, rollout engines on all
    gpu_memory_gb: float = 0.0  # 0 = the device's own; another size for a variant (an H100 NVL has 94)
    # which copies the job holds: ppo (policy, critic, reference, reward model), grpo (policy, reference;
    # rloo, dr_grpo, dapo alike), dpo (offline: policy and reference, no rollout engine)
    algo: str = "grpo"
    # bytes per trained parameter: mixed (bf16 weights and grads, fp32 master and Adam: 16), mixed_fp32_grads
    # (18), fp32 (16; what runs on this CPU)
    precision: str = "mixed"
    zero_stage: int = 3  # ZeRO/FSDP sharding over the gpus: 0 none, 1 optimizer, 2 + gradients, 3 + weights
    lora_r: int = 0  # > 0: train rank-r adapters on every projection; the frozen base is also the reference
    prompts: int = 64  # prompts per step
    samples_per_prompt: int = 8  # K completions per prompt
    prompt_tokens: int = 512  # tokens per prompt (chat template included)
    response_tokens: float = 1024.0  # mean response length in tokens
    # std / mean of response lengths (log-normal): ~1 for reasoning traces, whose longest of 512 is ~10×
    # the mean; 0.3 for short answers
    response_cv: float = 1.0
    dtype: str = "bfloat16"  # the rollout engine's weights and KV cache (float32 on this CPU; fp8 halves both)
    micro_batch_rows: int = 1  # rows per forward/backward on each GPU: long sequences train one at a time
    checkpointing: bool = True  # activation checkpointing: each layer keeps its input only, +1/3 training FLOPs
    # fractions of the device's peak that real kernels reach: training MFU is typically 40-60%,
    # decode 60-80% of HBM bandwidth; on this CPU our update ran at ~65% of the GEMM ceiling
    compute_efficiency: float = 0.5
    memory_efficiency: float = 0.7
    verifier_ms: float = 5.0  # milliseconds to score one completion (a regex: <1; a code sandbox: ~100s)
    # a run directory (runs/<id>): also say where its RL steps' time went, from its metrics.jsonl
    run: str = ""
    threads: int = 1  # --gpu cpu: torch threads the ceilings are measured at (match the runs you compare)

    def validate(self) -> None:
        check_positive(self, "", "gpus", "prompts", "samples_per_prompt", "prompt_tokens", "micro_batch_rows",
                       "threads")
        check(self.response_tokens > 0, "response_tokens", self.response_tokens, "a mean length > 0")
        check(self.response_cv >= 0, "response_cv", self.response_cv, "a number >= 0 (0 = every response as long)")
        check(self.gpu_memory_gb >= 0, "gpu_memory_gb", self.gpu_memory_gb, "a size in GB >= 0 (0 = the device's)")
        check(self.zero_stage in (0, 1, 2, 3), "zero_stage", self.zero_stage, "0, 1, 2 or 3")
        check(self.lora_r >= 0, "lora_r", self.lora_r, "an integer >= 0 (0 = full fine-tuning)")
        check(self.algo in ("ppo", "grpo", "dpo"), "algo", self.algo, "ppo, grpo or dpo (the memory families)")
        for name in ("compute_efficiency", "memory_efficiency"):
            check(0 < getattr(self, name) <= 1, name, getattr(self, name), "a fraction in (0, 1]")
        check(self.verifier_ms >= 0, "verifier_ms", self.verifier_ms, "milliseconds >= 0")
        if self.run and not (Path(self.run) / "metrics.jsonl").is_file():
            raise ConfigError(f"run={self.run!r}: no metrics.jsonl there; give a run directory (runs/<id>)")
