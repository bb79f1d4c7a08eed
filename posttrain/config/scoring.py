"""The settings of the commands that score rather than train, the ones cli/scoring.py runs:
`posttrain eval` and `posttrain winrate` (Loop A: measure), `posttrain bon`, `posttrain search`,
`posttrain verify` and `posttrain think` (Loop B: select). Their sections and checks come from
config/, as the training commands' do; the other commands' settings are in config/commands.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from posttrain.config.checks import ConfigError, check, check_device, check_positive, check_threads
from posttrain.config.sections import EnvConfig


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
    threads: int = 0  # torch intra-op threads for the model's work; 0 = leave torch's default (all cores)
    out_dir: str = "runs"  # where the run directory is created
    name: str = "eval"  # the run directory's suffix
    seed: int = 0  # which problems of the split (a smaller size is a prefix of a larger one)
    device: str = "cpu"  # where the checkpoint's model runs: auto = cuda, mps, then cpu; cpu as in training's default
    dtype: str = "float32"  # bfloat16 = forward passes in bf16 (for GPUs; on the CPUs measured no faster: BENCHMARKS.md)
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
        check_threads(self)
        self.env.validate()
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
class WinrateJudgeConfig:
    """What decides each prompt of `posttrain winrate`: give exactly one."""

    # reward-model directories (`posttrain rlhf` writes runs/<id>/reward_model), comma-separated for an
    # ensemble; train it on other pairs than the policies', or it grades its own homework
    rm: str = ""
    ensemble: str = "mean"  # several --judge.rm: mean, min or mean-minus-std (rewards/ensemble.py)
    # a local LLM judge (rewards/judge.py): a gpt_mini or transformers checkpoint directory, or
    # "smollm2-135m"; it rates each answer 1..5 on accuracy from its next-token probabilities
    llm: str = ""
    # true: the task's own verifier is the judge (its reward; right beats wrong, equal rewards tie):
    # the ground truth a learned judge is audited against on a task that has one
    verifier: bool = False

    def validate(self) -> None:
        given = [name for name, on in (("rm", self.rm), ("llm", self.llm), ("verifier", self.verifier)) if on]
        if len(given) != 1:
            raise ConfigError(f"give exactly one judge: --judge.rm DIR[,DIR], --judge.llm MODEL or --judge.verifier "
                              f"true (got {', '.join('--judge.' + g for g in given) or 'none'})")
        check(self.ensemble in ("mean", "min", "mean-minus-std"), "judge.ensemble", self.ensemble,
              "mean, min or mean-minus-std")
        for directory in filter(None, (d.strip() for d in self.rm.split(","))):
            check(Path(directory).is_dir(), "judge.rm", self.rm, "reward-model directories that exist")

    def rm_paths(self) -> list[str]:
        return [d.strip() for d in self.rm.split(",") if d.strip()]


@dataclass
class WinrateConfig:
    """`posttrain winrate`: policy A against policy B on the same prompts, one answer each,
    judged pairwise (posttrain/eval/head_to_head.py; the math in posttrain/eval/winrate.py)."""

    a: str = ""  # policy A: a checkpoint directory, a stage's directory (its latest) or a run directory (its last stage's)
    b: str = ""  # policy B, the baseline, as --a; the win-rate is A's
    judge: WinrateJudgeConfig = field(default_factory=WinrateJudgeConfig)
    split: str = "heldout"  # whose prompts: train, dev or heldout (heldout: never trained on)
    size: int = 500  # prompts: a 95% CI of about ±4 points on a win-rate near 50%
    seed: int = 0  # which prompts of the split, the sampling seed, and the bootstrap's
    # 0 = greedy (each side's most likely answer: the rate is a property of the weights); > 0 samples
    # one answer per prompt at this temperature, as AlpacaEval does
    temperature: float = 0.0
    max_new_tokens: int = 0  # each answer's cap; 0 = A's run's (posttrain_task.json), else 64
    threads: int = 0  # torch intra-op threads for the model's work; 0 = leave torch's default (all cores)
    out_dir: str = "runs"  # where the run directory is created
    name: str = "winrate"  # the run directory's suffix

    def validate(self) -> None:
        check_threads(self)
        for side in ("a", "b"):
            value = getattr(self, side)
            if not value or not Path(value).is_dir():
                raise ConfigError(f"{side}={value!r}: give --{side} DIR, a checkpoint directory or a run directory "
                                  "(runs/<id>) that exists")
        check(self.split in ("train", "dev", "heldout"), "split", self.split, "train, dev or heldout")
        check_positive(self, "", "size")
        check(self.temperature >= 0, "temperature", self.temperature, "a number >= 0 (0 = greedy)")
        check(self.max_new_tokens >= 0, "max_new_tokens", self.max_new_tokens, "an integer >= 0 (0 = A's run's)")
        self.judge.validate()


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
class SearchConfig:
    """`posttrain search` (Loop B): test-time search methods side by side at fixed budgets of
    generated tokens per problem (posttrain/search/compare.py)."""

    checkpoint: str = ""  # the policy: a checkpoint directory written by `posttrain run/train`
    # the task when the checkpoint records none (posttrain_task.json); a recorded one is used as is
    env: EnvConfig = field(default_factory=EnvConfig)
    split: str = "heldout"  # whose problems: train, dev or heldout
    size: int = 200  # problems: a 95% CI of about ±6 points near 70%
    seed: int = 0  # which problems, and the sampling seeds
    # generated tokens per problem, comma-separated: each method runs once per budget; the N of the
    # N-sample methods is budget // max_new_tokens
    budgets: str = "64,128,256,512"
    max_new_tokens: int = 0  # one completion's cap; 0 = the checkpoint's run's
    temperature: float = 1.0  # sampling temperature of every method but greedy
    prm: str = ""  # a process reward model directory (`posttrain prm --kind prm`): PRM best-of-N, beam, MCTS
    orm: str = ""  # an outcome reward model directory (`posttrain prm --kind orm`): ORM best-of-N
    aggregation: str = "min"  # a PRM's step scores to one score in beam search and MCTS: min, product or last
    # where steps end: arithmetic ("," and the Final line), newline, or answer_tag (lines, the <answer> line
    # last: reasoning-gym's worked steps); "" = the PRM's own format, else the task's
    step_format: str = ""
    # partial solutions kept per problem; 0 = as many as the budget pays for, budget // (max_new_tokens ×
    # expansions), so that beam search, like the N-sample methods, grows with its budget
    beam_width: int = 0
    expansions: int = 2  # next steps sampled per kept partial
    mcts_children: int = 3  # next steps sampled per expanded MCTS node
    c_uct: float = 1.0  # MCTS exploration: the weight of the UCT bonus
    step_tokens: int = 16  # a step's token cap (an arithmetic step is at most ~8 characters)
    threads: int = 0  # torch intra-op threads for the model's work; 0 = leave torch's default (all cores)
    out_dir: str = "runs"  # where the run directory is created
    name: str = "search"  # the run directory's suffix

    def budget_list(self) -> list[int]:
        return token_budgets(self.budgets, "64,128,256", smallest=1, allowed="positive token counts")

    def validate(self) -> None:
        check_threads(self)
        self.env.validate()
        if not self.checkpoint or not Path(self.checkpoint).is_dir():
            raise ConfigError(f"checkpoint={self.checkpoint!r}: give --checkpoint DIR, a checkpoint directory "
                              "written by `posttrain run` or `posttrain train` (its policy is searched)")
        for name in ("prm", "orm"):
            if getattr(self, name) and not Path(getattr(self, name)).is_dir():
                raise ConfigError(f"{name}={getattr(self, name)!r}: no such directory (train one with "
                                  f"`posttrain prm --kind {name}`)")
        check(self.split in ("train", "dev", "heldout"), "split", self.split, "train, dev or heldout")
        self.budget_list()
        for name in ("size", "expansions", "mcts_children", "step_tokens"):
            check_positive(self, "", name)
        check(self.beam_width >= 0, "beam_width", self.beam_width, "an integer >= 0 (0 = scale with the budget)")
        check(self.max_new_tokens >= 0, "max_new_tokens", self.max_new_tokens, "an integer >= 0 (0 = the run's)")
        check(self.temperature > 0, "temperature", self.temperature,
              "a number > 0: the sampled methods need distinct samples (greedy is always in the table)")
        check(self.aggregation in ("min", "product", "last"), "aggregation", self.aggregation, "min, product or last")
        check(self.step_format in ("", "arithmetic", "newline", "answer_tag"), "step_format", self.step_format,
              "'' (the PRM's, else the task's), arithmetic, newline or answer_tag")
        check(self.c_uct >= 0, "c_uct", self.c_uct, "a number >= 0")


@dataclass
class VerifyConfig:
    """`posttrain verify` (Loop B): generate → verify → revise, each step verifier audited
    against the step checker (posttrain/search/self_verify.py)."""

    checkpoint: str = ""  # the policy: a checkpoint directory written by `posttrain run/train`
    env: EnvConfig = field(default_factory=EnvConfig)  # the task when the checkpoint records none
    split: str = "heldout"  # whose problems: train, dev or heldout
    size: int = 200  # problems
    seed: int = 0  # which problems, and the sampling seed
    prm: str = ""  # a process reward model directory (`posttrain prm --kind prm`), verified beside the policy itself
    # a step scoring below a threshold is flagged (the policy's confidence, a PRM's probability); each
    # threshold of this comma-separated list is one row per verifier: false positives against false negatives
    thresholds: str = "0.5,0.9"
    max_revisions: int = 2  # regrowths from the first flagged step, per problem
    temperature: float = 1.0  # drafts and regrowths are sampled: greedy would regrow the same step
    max_new_tokens: int = 0  # one completion's cap; 0 = the checkpoint's run's
    step_tokens: int = 16  # a step's token cap
    threads: int = 0  # torch intra-op threads for the model's work; 0 = leave torch's default (all cores)
    out_dir: str = "runs"  # where the run directory is created
    name: str = "verify"  # the run directory's suffix

    def threshold_list(self) -> list[float]:
        try:
            thresholds = [float(t) for t in self.thresholds.split(",")]
        except ValueError:
            raise ConfigError(f"thresholds={self.thresholds!r} is not allowed: expected numbers, comma-separated "
                              "(e.g. '0.5,0.9')") from None
        check(all(0 < t < 1 for t in thresholds), "thresholds", self.thresholds,
              "probabilities strictly between 0 and 1")
        return thresholds

    def validate(self) -> None:
        check_threads(self)
        self.env.validate()
        if not self.checkpoint or not Path(self.checkpoint).is_dir():
            raise ConfigError(f"checkpoint={self.checkpoint!r}: give --checkpoint DIR, a checkpoint directory "
                              "written by `posttrain run` or `posttrain train`")
        if self.prm and not Path(self.prm).is_dir():
            raise ConfigError(f"prm={self.prm!r}: no such directory (train one with `posttrain prm --kind prm`)")
        check(self.split in ("train", "dev", "heldout"), "split", self.split, "train, dev or heldout")
        for name in ("size", "step_tokens"):
            check_positive(self, "", name)
        self.threshold_list()
        check(self.max_revisions >= 0, "max_revisions", self.max_revisions, "an integer >= 0 (0: verify, never revise)")
        check(self.max_new_tokens >= 0, "max_new_tokens", self.max_new_tokens, "an integer >= 0 (0 = the run's)")
        check(self.temperature > 0, "temperature", self.temperature, "a number > 0: a greedy regrowth repeats the step")


@dataclass
class ThinkConfig:
    """`posttrain think` (Loop B): a thinking-mode-fused checkpoint (trained on env arithmetic_think)
    on the same problems in /no_think mode, in /think mode, and in /think mode under thinking
    budgets that force the answer after B tokens of thinking (posttrain/search/thinking_curve.py)."""

    checkpoint: str = ""  # the policy: a checkpoint directory of a run on --env.name arithmetic_think
    split: str = "heldout"  # whose problems: train, dev or heldout
    size: int = 500  # problems, each measured in every mode: a 95% CI of about ±4 points near 70%
    seed: int = 0  # which problems of the split
    # tokens allowed inside <think> before the answer is forced, comma-separated; a level-3 running sum
    # and its </think> take 30-38 of gpt_mini's characters, so 40 leaves the thinking uncut
    budgets: str = "0,8,16,24,32,40"
    answer_tokens: int = 16  # tokens allowed after the thinking: 'Final: 45' and EOS take 10
    max_new_tokens: int = 0  # the cap of the unbudgeted /think and /no_think answers; 0 = the checkpoint's run's
    # the text appended when the budget is spent (then "</think>" and a newline); "" = the one the
    # budget demonstrations end with (--env.arithmetic_think.budget_demos; posttrain/verifiers/think_tags.py EARLY_STOP)
    early_stop: str = ""
    threads: int = 0  # torch intra-op threads for the model's work; 0 = leave torch's default (all cores)
    out_dir: str = "runs"  # where the run directory is created
    name: str = "think"  # the run directory's suffix

    def budget_list(self) -> list[int]:
        return token_budgets(self.budgets, "0,8,16,32", smallest=0,
                             allowed="token counts >= 0 (0 forces the answer at once)")

    def validate(self) -> None:
        check_threads(self)
        if not self.checkpoint or not Path(self.checkpoint).is_dir():
            raise ConfigError(f"checkpoint={self.checkpoint!r}: give --checkpoint DIR, a checkpoint directory of a "
                              "run trained with --env.name arithmetic_think")
        check(self.split in ("train", "dev", "heldout"), "split", self.split, "train, dev or heldout")
        self.budget_list()
        check_positive(self, "", "size", "answer_tokens")
        check(self.max_new_tokens >= 0, "max_new_tokens", self.max_new_tokens, "an integer >= 0 (0 = the run's)")


def token_budgets(text: str, example: str, smallest: int, allowed: str) -> list[int]:
    """--budgets "a,b,c": the distinct token budgets, ascending, each at least `smallest`."""
    try:
        budgets = [int(b) for b in text.split(",")]
    except ValueError:
        raise ConfigError(f"budgets={text!r} is not allowed: expected integers, comma-separated "
                          f"(e.g. '{example}')") from None
    check(all(b >= smallest for b in budgets), "budgets", text, allowed)
    return sorted(set(budgets))
