"""A run's settings as a peer's mapping reads them: flat config.json keys (`rl.optim.lr`) and
the chosen algorithm's resolved hyperparameters as `ALGO.field` (`grpo.clip_eps_high`), with
a record of which keys the mapping read, so that what it did not read can be listed instead
of vanishing (runs/peer_configs.py). The per-peer mappings (peer_trl, peer_openrlhf,
peer_verl) read through this class and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from posttrain.config import ConfigError, TrainConfig
from posttrain.config.files import to_dict


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"rl": {"optim": {"lr": 1e-4}}} -> {"rl.optim.lr": 1e-4}; a dict-valued setting
    (rl.algo_params) is expanded too, and the caller drops it."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# What only says where the run is written, how it is logged or which local device runs it: a peer
# writes, logs and places its work its own way (its launcher picks the GPUs), so these are neither
# mapped nor listed (runs/lineage.py draws the same line for --parent)
BOOKKEEPING = ("name", "out_dir", "report_to", "checkpoint_every", "threads", "device")


class RunSettings:
    """What a mapping reads: `settings["rl.optim.lr"]` marks the key read and returns its
    value; `agrees(...)` marks keys whose value the peer already has without a setting."""

    def __init__(self, cfg: TrainConfig, algo_fields: dict[str, Any], peer: str) -> None:
        self.algo = cfg.rl.algo
        self.peer = peer
        self.values = {key: value for key, value in flatten(to_dict(cfg)).items()
                       if not key.startswith("rl.algo_params.") and key not in BOOKKEEPING}
        self.values |= {f"{self.algo}.{name}": value for name, value in algo_fields.items()}
        self.defaults = flatten(to_dict(TrainConfig()))
        self.read: set[str] = {"rl.algo"}  # every mapping starts from it

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return self.values[key]

    def field(self, name: str) -> Any:
        """The chosen algorithm's hyperparameter `name` (grpo.kl_coef for rl.algo=grpo)."""
        return self[f"{self.algo}.{name}"]

    def has_field(self, name: str) -> bool:
        return f"{self.algo}.{name}" in self.values

    def kl_estimator(self) -> str:
        """The algorithm's KL estimator; PPO's penalty in the reward is k1 without a field."""
        return self.field("kl_estimator") if self.has_field("kl_estimator") else "k1"

    def kl_term_off(self) -> None:
        """With kl_coef 0 the KL term's other fields do nothing: accounted for."""
        if not self.field("kl_coef"):
            self.agrees(f"{self.algo}.kl_estimator", f"{self.algo}.kl_importance_weight")

    def switched_off(self, *names: str) -> None:
        """Algorithm switches that are off (false) here: a peer without them does the same."""
        keys = [f"{self.algo}.{name}" for name in names]
        self.agrees(*(key for key in keys if key in self.values and not self.values[key]))

    def agrees(self, *keys: str) -> None:
        """Keys the mapping accounted for without a peer setting: the peer's fixed behaviour is
        this value, or the value has no effect here (a KL estimator with kl_coef 0)."""
        self.read.update(key for key in keys if key in self.values)

    def loss_agg(self, modes: Iterable[str], aggregates: str, divides_by: str) -> str:
        """The algorithm's loss_agg when the peer has it (`modes`; `aggregates` says how the peer
        names them), refused otherwise; Dr. GRPO's divisor must be the generation budget, which
        is what every peer divides by (`divides_by` says it in the peer's words)."""
        agg = self.field("loss_agg")
        modes = list(modes)
        if agg not in modes:
            raise self.refuse(f"{self.algo}.loss_agg", f"{aggregates} {', '.join(modes)}",
                              f"set --{self.algo}.loss_agg to one of those")
        if agg == "seq-mean-token-sum-norm" and self.field("max_len") != self["rl.sampling.max_new_tokens"]:
            raise self.refuse(f"{self.algo}.max_len", divides_by,
                              "leave max_len unset (it is then rl.sampling.max_new_tokens)")
        self.agrees(f"{self.algo}.max_len")
        return agg

    def refuse(self, key: str, allowed: str, fix: str) -> ConfigError:
        """The error for a value the peer cannot express: the key, its value, what the peer
        can do, and the change that makes it expressible."""
        return ConfigError(f"{key}={self.values[key]!r} cannot be carried to {self.peer}: {allowed}; {fix}")

    def unmapped(self) -> list[str]:
        """`key=value` for every key the mapping did not read that matters: each of the
        algorithm's own hyperparameters (they define the loss), and every other setting the
        run changed from posttrain's defaults."""
        left = []
        for key, value in self.values.items():
            if key in self.read:
                continue
            if key.startswith(f"{self.algo}.") or self.defaults.get(key, object()) != value:
                left.append(f"{key}={value!r}")
        return left


@dataclass
class PeerConfig:
    """A run's settings as one peer's configuration: `settings` (TRL's config keywords,
    OpenRLHF's flags, verl's Hydra keys, each with its value), `text` (the snippet, command or
    override list to run), what has no counterpart (`unmapped`: key=value) and what the peer
    needs that a posttrain config does not hold (`notes`: a dataset, a reward)."""

    peer: str  # trl, openrlhf or verl
    tested_against: str  # the peer's version whose parser or schema the tests check the output against
    entry: str  # what runs it: TRL's config class, OpenRLHF's or verl's module
    settings: dict[str, Any]
    unmapped: list[str]
    notes: list[str]
    text: str = ""


def policy_source(cfg: TrainConfig) -> tuple[str, list[str]]:
    """The model the peer starts from (init, else model.name) and a note where posttrain's
    own format has to be exported first: the peers load transformers directories."""
    model = cfg.init or cfg.model.name
    if cfg.init or model == "gpt_mini":
        return model, [f"the policy {model!r} is posttrain's own format: `posttrain export {model} OUT` writes a "
                       "transformers directory the peer loads; pass OUT as the model"]
    return model, []


def rows_per_minibatch(settings: RunSettings) -> int:
    """Completions per optimizer step: a rollout batch (prompts × samples) split into
    rl.update.minibatches; refused where it does not split evenly, which every peer requires."""
    rows = settings["rl.prompts_per_step"] * settings["rl.samples_per_prompt"]
    minibatches = settings["rl.update.minibatches"]
    if rows % minibatches:
        raise settings.refuse("rl.update.minibatches", f"the peers split a rollout batch of {rows} completions "
                              "into equal minibatches", f"choose a divisor of {rows}")
    return rows // minibatches


def annotated(header: str, unmapped: list[str], notes: list[str], body: str) -> str:
    """`body` under comment lines: what it is, each unmapped setting, what to supply."""
    lines = [f"# {header}"]
    if unmapped:
        lines.append("# unmapped (no counterpart in the peer; carried nowhere, check each):")
        lines += [f"#   {item}" for item in unmapped]
    lines += [f"# to supply: {note}" for note in notes]
    return "\n".join(lines) + "\n" + body
