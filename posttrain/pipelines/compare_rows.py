"""`posttrain compare --row NAME:KEY=VALUE,...`: rows that differ in any setting.

    --row grpo                                  the shared settings as they are
    --row clip_higher:grpo.clip_eps_high=0.28   a hyperparameter of the row's algorithm
    --row lite:rl.algo=lite_ppo,rl.optim.lr=2e-4      any setting, by its key in config.json
    --row weak_start:init=runs/X/checkpoints/sft/step_000100   its own start

A row is the shared config (defaults < --config < flags) with the row's settings, and
only those, on top. Keys are config.json's (`rl.optim.lr`, `rl.sampling.max_new_tokens`,
`seed`, `init`), or `ALGO.FIELD` for a hyperparameter of the row's algorithm (ALGO must be
the row's rl.algo), which joins the shared rl.algo_params. Values are read as the setting's
type ("3e-4" a number, "true" a bool). A value cannot contain ",KEY=" (the comma there
starts the next setting). Every row is built and checked before anything trains; a key
that does not exist is refused with the valid ones beside it.

`--rows NAME` runs a named set of rows (ROW_SETS), e.g. `progressive`: seed 000's
REINFORCE → PPO build, each row one change on the row before.

Rows share one SFT start unless they set `init`: so a row may not change what shapes that
start (model.*, sft.*) without its own init, and never name or out_dir (compare names
each row's run after the row, inside its own directory).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any

from posttrain.algorithms import ALGORITHMS
from posttrain.algorithms.preference import PREFERENCE_LOSSES
from posttrain.config import ConfigError, TrainConfig
from posttrain.config.files import coerce, from_dict

ROW_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # it names the row's run directory
NOT_PER_ROW = {"name": "compare names each row's run after the row",
               "out_dir": "every row's run goes inside compare's own directory"}
SHARED_START = ("model", "sft")  # the sections that shape the shared SFT start
SETTING = re.compile(r",(?=\s*[A-Za-z_][\w.]*\s*=)")  # a comma that starts the next KEY=


# Named sets of rows for --rows. "progressive" is seed 000's REINFORCE from scratch, each row
# one setting away from the row before (tests/test_compare_rows.py checks it): vanilla
# REINFORCE (A = r), + a baseline (the group mean), + the group's std (GRPO's
# normalisation), + the hybrid's batch std (Lite PPO's), + PPO: each batch cut into 4
# minibatches, so the policy moves between updates and the clip (inert in a single
# on-policy update, where every ratio is 1) starts to bind.
ROW_SETS = {
    "progressive": ["vanilla:grpo.adv_norm=no-baseline",
                    "baseline:grpo.adv_norm=none",
                    "group_norm:grpo.adv_norm=group",
                    "hybrid_norm:grpo.adv_norm=group-mean-batch-std",
                    "ppo_clip:grpo.adv_norm=group-mean-batch-std,rl.update.minibatches=4"],
}


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a comparison: its label and its settings as given, KEY -> value text."""

    label: str
    settings: dict[str, str]

    def text(self) -> str:
        """The row as --row takes it."""
        return self.label + (":" + ",".join(f"{k}={v}" for k, v in self.settings.items()) if self.settings else "")


def parse_row(text: str) -> Row:
    """`NAME[:KEY=VALUE,...]` -> Row, or ConfigError saying what is malformed."""
    label, colon, body = text.partition(":")
    label = label.strip()
    if not ROW_NAME.fullmatch(label):
        raise ConfigError(f"--row {text!r}: the row's name {label!r} must be letters, digits, '_', '.', '+' or '-' "
                          "(it names the row's run directory), then ':' and its settings, e.g. "
                          "--row clip_higher:grpo.clip_eps_high=0.28")
    settings: dict[str, str] = {}
    for part in SETTING.split(body) if colon and body.strip() else []:
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"--row {text!r}: {part!r} is not KEY=VALUE; write settings as "
                              f"{label}:rl.optim.lr=2e-4,grpo.clip_eps_high=0.28")
        if key in settings:
            raise ConfigError(f"--row {text!r}: {key} is given twice; give each setting once")
        settings[key] = value.strip()
    return Row(label, settings)


def parse_rows(texts: list[str], row_set: str = "") -> list[Row]:
    """The rows of the named set `row_set` (ROW_SETS; "" = none), then every --row, parsed;
    their names must differ."""
    if row_set and row_set not in ROW_SETS:
        raise ConfigError(f"--rows {row_set!r} is not a set of rows; the sets: {', '.join(sorted(ROW_SETS))}")
    rows = [parse_row(text) for text in [*ROW_SETS.get(row_set, []), *texts]]
    labels = [row.label for row in rows]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError(f"--row names must differ, {repeated} repeat: each names a run and a line of the table")
    return rows


def row_config(cfg: TrainConfig, row: Row) -> TrainConfig:
    """`cfg` with the row's settings and only those; ConfigError (naming the row, the key and
    the valid keys) for a setting that does not exist or cannot be set per row."""
    where = f"--row {row.text()!r}"
    sections: dict[str, Any] = {**ALGORITHMS, **PREFERENCE_LOSSES}  # @dataclass classes, each its settings
    nested: dict = {}
    algo_settings = {}
    for key, value in row.settings.items():
        head, _, rest = key.partition(".")
        if head in sections:
            algo_settings[key] = value
            continue
        if key in NOT_PER_ROW:
            raise ConfigError(f"{where}: {key} cannot be set per row: {NOT_PER_ROW[key]}")
        *path, leaf = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{where}: {key} and {part} are both given: {part} is a setting or a section")
        if isinstance(node.get(leaf), dict):
            raise ConfigError(f"{where}: {key} is a section; set its settings one by one ({key}.FIELD=VALUE)")
        node[leaf] = value
    unknown = sorted(set(nested) - {f.name for f in dataclasses.fields(TrainConfig)})
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {unknown}; a key is a setting's key in config.json, one of "
                          f"{sorted(f.name for f in dataclasses.fields(TrainConfig))} or inside one of those sections "
                          "(e.g. rl.optim.lr, rl.sampling.max_new_tokens), or ALGO.FIELD for a hyperparameter of the "
                          f"row's algorithm (e.g. grpo.clip_eps_high); algorithms: {sorted(sections)}")
    try:
        new = from_dict(TrainConfig, nested, base=cfg)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    if not new.init:
        shaping = [key for key in row.settings if key.partition(".")[0] in SHARED_START]
        if shaping:
            raise ConfigError(f"{where}: {shaping} would change the shared SFT start, which is trained once for all "
                              "rows with the shared settings; give the row its own start with init=CHECKPOINT, or "
                              "set them for every row (flags before --row)")
    params = dict(new.rl.algo_params)
    for key, value in algo_settings.items():
        head, _, field = key.partition(".")
        if head != new.rl.algo:
            raise ConfigError(f"{where}: {key} is not allowed: the row trains rl.algo={new.rl.algo!r}, so its "
                              f"hyperparameters are {new.rl.algo}.FIELD")
        cls = sections[head]
        fields = {f.name for f in dataclasses.fields(cls)}
        if field not in fields:
            raise ConfigError(f"{where}: {key} does not exist; {head}'s hyperparameters are {sorted(fields)}")
        params[field] = coerce(value, typing.get_type_hints(cls)[field], key)
    return dataclasses.replace(new, rl=dataclasses.replace(new.rl, algo_params=params))


# The settings that change what held-out pass@1 measures (eval/comparison.py's instrument):
# the task, its verifier and its data (env.*), and the held-out set (heldout_size). Rows
# that differ in them are different metrics, so compare refuses them unless told otherwise.
INSTRUMENT_SECTIONS = ("env", "heldout_size")


def instrument_changes(rows: list[Row]) -> list[str]:
    """Each row setting that changes the measuring instrument, as 'ROW: KEY=VALUE'."""
    return [f"{row.label}: {key}={value}" for row in rows for key, value in row.settings.items()
            if key.split(".")[0] in INSTRUMENT_SECTIONS]


def check_rows_measure_alike(rows: list[Row], allow_different: bool = False) -> list[str]:
    """[] when every row is measured the same way; else ConfigError naming each row setting
    that changes the instrument, or, with `allow_different`, those settings to print beside
    the table (eval/comparison.py's locked-room rule, before anything trains)."""
    changes = instrument_changes(rows)
    if changes and not allow_different:
        raise ConfigError("rows that change what held-out pass@1 measures would compare different metrics, and "
                          "their paired differences would mix the model with the measurement:\n  "
                          + "\n  ".join(changes) + "\nKeep the task, its verifier and the held-out set shared "
                          "(set them as flags for every row), or pass --allow-different to run them anyway, with "
                          "these settings listed beside the table")
    return changes


def row_algorithms(rows: list[Row], cfg: TrainConfig) -> set[str]:
    """The algorithms the rows train: the shared rl.algo and every row's own."""
    return {cfg.rl.algo} | {row.settings["rl.algo"] for row in rows if "rl.algo" in row.settings}
