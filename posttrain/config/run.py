"""The whole run: `TrainConfig` gathers the sections and adds what belongs to the run itself
(seed, run directory, device, trackers, stages), checks the settings that span sections,
and reads `--stages`; `rlhf_config` is where `posttrain rlhf` starts."""

from __future__ import annotations

from dataclasses import dataclass, field

from posttrain.config.checks import check, check_device, check_positive, check_threads
from posttrain.config.dist import DistConfig
from posttrain.config.rl import RLConfig
from posttrain.config.sections import EnvConfig, ModelConfig, SFTConfig


TRACKERS = ("tensorboard", "trackio", "wandb", "mlflow")  # what report_to can name (posttrain/runs/trackers.py)


@dataclass
class TrainConfig:
    """`posttrain run` / `posttrain train`: SFT from scratch, then RL, with held-out
    evaluation before and after RL."""

    name: str = ""  # the run directory's suffix; "" = "<env>-<algo>"
    seed: int = 0  # every random draw of the run derives from it (posttrain/seeds.py)
    out_dir: str = "runs"  # where run directories are created
    # where the policy starts: a run's checkpoint, any transformers model directory or a model name as
    # model.name takes; SFT is skipped. "" = model.name (gpt_mini from scratch) with SFT first
    init: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy: gpt_mini from scratch, or a local pretrained model
    env: EnvConfig = field(default_factory=EnvConfig)  # the task the policy learns and is scored on
    sft: SFTConfig = field(default_factory=SFTConfig)  # stage 1: teach the answer format from a few demonstrations
    rl: RLConfig = field(default_factory=RLConfig)  # stage 2: RL (or a preference loss) from the SFT policy
    heldout_size: int = 500  # held-out problems scored before and after RL: a 95% CI of about ±4 points near 70%
    checkpoint_every: int = 25  # steps between checkpoints (a killed run loses at most this many)
    threads: int = 0  # torch intra-op threads; 0 = leave torch's default (all cores)
    dist: DistConfig = field(default_factory=DistConfig)  # where rollout and training run; the default is one process
    # experiment trackers that copy the metrics, a few samples per RL step and the held-out results:
    # none, or any of tensorboard, trackio, wandb, mlflow, comma-separated (offline unless their own
    # variables say otherwise); none: the run directory is the record, the trackers optional installs
    report_to: str = "none"
    # where the policy and every tensor it reads live: auto = cuda if visible, else mps, else cpu.
    # cpu by default: the tests' device, and every number in this repository was measured on it
    device: str = "cpu"
    # bfloat16: float32 weights and optimizer state, bf16 forward passes (log-probs and losses in
    # float32), for GPUs. float32 by default: on both CPUs measured, bf16 was no faster
    # (the AMD EPYC has avx512_bf16; BENCHMARKS.md, "bf16 on this CPU")
    dtype: str = "float32"
    # several stages in one run, each from the last checkpoint of the one before, evaluated after each,
    # one table: "sft,dpo,grpo" (sft, an RL algorithm or a preference loss). A stage's own settings go in
    # brackets as config.json keys (env.* too): "sft,dpo[rl.optim.lr=3e-5,dpo.nll_coef=1],grpo"; the rest
    # are the run's (pipelines/stages.py). "" = the two-stage job: SFT, then rl.algo
    stages: str = ""

    def trackers(self) -> list[str]:
        """The tracker names report_to lists; [] for "none"."""
        names = [name.strip() for name in self.report_to.split(",")]
        return [] if names == ["none"] else names

    def validate(self) -> None:
        self.env.validate()
        check_device(self)
        parse_stages(self.stages)
        self.model.validate()
        self.sft.validate()
        self.rl.validate()
        self.dist.validate()
        if self.dist.rollout_shards:
            check(self.dist.rollout_shards <= self.rl.prompts_per_step, "dist.rollout_shards",
                  self.dist.rollout_shards, f"at most rl.prompts_per_step={self.rl.prompts_per_step} (a shard holds whole groups)")
        rows = self.rl.prompts_per_step * self.rl.samples_per_prompt // self.rl.update.minibatches
        check(self.dist.trainer_ranks <= rows, "dist.trainer_ranks", self.dist.trainer_ranks,
              f"at most the {rows} rows of a minibatch (rl.prompts_per_step × rl.samples_per_prompt / "
              "rl.update.minibatches): every rank needs a row")
        check_positive(self, "", "heldout_size", "checkpoint_every")
        check_threads(self)
        names = self.trackers()
        check(all(name in TRACKERS for name in names) and len(set(names)) == len(names), "report_to", self.report_to,
              f"'none', or one or more of {', '.join(TRACKERS)}, comma-separated, each once (e.g. 'tensorboard,wandb')")


def parse_stages(text: str) -> list[tuple[str, str, dict[str, str]]]:
    """The stages of TrainConfig.stages, in order: (name, kind, settings as written). The
    name is the kind, with _2, _3, ... on a kind's later stages (it names the stage's
    checkpoints and metrics); the settings map config.json keys to their text, typed later
    against their section. "" gives []. ConfigError names what cannot be read."""
    items, depth, current = [], 0, ""
    for char in text + ",":
        if char == "," and depth == 0:
            items.append(current.strip())
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        check(depth in (0, 1), "stages", text, "stage names with at most one [KEY=VALUE,...] each, e.g. "
              "'sft,dpo[rl.optim.lr=3e-5],grpo' (no brackets inside brackets)")
        current += char
    check(depth == 0, "stages", text, "every '[' closed by a ']', e.g. 'sft,dpo[rl.optim.lr=3e-5],grpo'")
    if items == [""]:
        return []
    stages = []
    seen: dict[str, int] = {}  # stages of each kind so far
    for item in items:
        kind, bracket, rest = item.partition("[")
        kind = kind.strip()
        check(bool(kind) and kind.replace("_", "").isalnum() and (not bracket or rest.endswith("]")), "stages", text,
              f"comma-separated stage names, each optionally followed by [KEY=VALUE,...] (could not read {item!r})")
        settings: dict[str, str] = {}
        for pair in filter(None, (p.strip() for p in rest[:-1].split(","))) if bracket else []:
            key, equals, value = (part.strip() for part in pair.partition("="))
            check(bool(equals and key and value), "stages", text, f"KEY=VALUE pairs in {kind}'s brackets, e.g. "
                  f"{kind}[rl.optim.lr=3e-5] (could not read {pair!r})")
            check(key not in settings, "stages", text, f"each setting once per stage ({kind} sets {key} twice)")
            settings[key] = value
        seen[kind] = seen.get(kind, 0) + 1
        stages.append((kind if seen[kind] == 1 else f"{kind}_{seen[kind]}", kind, settings))
    return stages


def rlhf_config() -> TrainConfig:
    """Where `posttrain rlhf` starts (flags and --config change it as they change `train`'s):
    PPO with its value head and a KL penalty in the reward, InstructGPT's setting."""
    return TrainConfig(name="rlhf", rl=RLConfig(algo="ppo", algo_params={"kl_coef": 0.05}))
