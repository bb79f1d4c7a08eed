"""One change at a time: every run can name the run it changes (`--parent RUN_DIR`), and its
meta.json then records which settings differ from that parent's config.json.

    "parent": {"run": "runs/20250101-120000-arithmetic-grpo",
               "changed": ["rl.optim.lr"],
               "values": {"rl.optim.lr": [0.0001, 0.0003]}}          # [parent's, this run's]

If a run changes the prompt *and* the scorer *and* the dataset and its number moves, nothing
was learned: no one can say which change moved it. So a run that changes more than one
setting from its parent is allowed, and warned about by name; a run that changes nothing is
a repeat, which is worth knowing too (any difference between the two is noise or
nondeterminism).

Settings are compared as the dotted keys of config.json (`rl.sampling.temperature`,
`rl.algo_params.kl_coef`), so what is reported is exactly the flag that was changed. Keys
that only say where a run is written or copied (`name`, `out_dir`, `report_to`,
`checkpoint_every`) are not changes: a resumed run reproduces the same numbers whatever
they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.config.files import upgraded
from posttrain.runs.rundir import RunDir, RunDirError

# Where a run is written and what copies its logs, not what it does (see the docstring)
NOT_A_CHANGE = frozenset({"name", "out_dir", "report_to", "checkpoint_every"})

MISSING = "(not set)"  # a key one side has and the other does not: a command with other settings


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"rl": {"optim": {"lr": 3e-4}}} -> {"rl.optim.lr": 3e-4}. Lists and other values stay whole; an empty
    dict has no leaves, so {"algo_params": {}} against {"algo_params": {"beta": 1}} differs
    in `algo_params.beta` alone, the one setting that was changed."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def differing_keys(a: dict[str, Any], b: dict[str, Any], ignore=frozenset()) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (a's value, b's value)} for every key whose value differs between the two
    nested dicts, in sorted key order; a key only one side has shows MISSING on the other.
    A key in `ignore`, or under one (`out_dir` ignores `out_dir.x`), is skipped."""
    flat_a, flat_b = flatten(a), flatten(b)
    out = {}
    for key in sorted(set(flat_a) | set(flat_b)):
        if any(key == skip or key.startswith(skip + ".") for skip in ignore):
            continue
        va, vb = flat_a.get(key, MISSING), flat_b.get(key, MISSING)
        if va != vb:
            out[key] = (va, vb)
    return out


def read_parent(parent: str | Path) -> dict[str, Any]:
    """The parent run's config.json, read before the new run is created: a parent that is
    not a run directory stops the command while nothing has been spent. An older run's keys
    are read where they are now (config/files.py MOVED), so only real changes differ."""
    path = Path(parent)
    if not (path / "config.json").is_file():
        raise RunDirError(f"--parent {str(parent)!r} is not a run directory (no config.json in it): pass the "
                          "runs/<id> directory of the run this one changes, as written by posttrain")
    config = RunDir(path).read_json("config.json")
    if not isinstance(config, dict):
        raise RunDirError(f"{path / 'config.json'} holds a JSON {type(config).__name__}, not the settings of a run")
    return upgraded(config)  # a parent written before settings moved into sections, in today's keys


def parent_record(parent: str | Path, parent_config: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """What meta.json records under "parent": the parent's directory, the settings this run
    changed (dotted config keys), and each one's [parent's, this run's] value."""
    changed = differing_keys(parent_config, config, ignore=NOT_A_CHANGE)
    return {"run": str(parent), "changed": list(changed), "values": {k: list(v) for k, v in changed.items()}}


def describe_changes(record: dict[str, Any]) -> str:
    """The line a run prints about its parent: the one change made, or a warning that names
    every change when there are several, or a note that there is none."""
    changed, values = record["changed"], record["values"]
    if len(changed) > 1:
        return (f"warning: this run changes {len(changed)} settings from its parent {record['run']} "
                f"({', '.join(changed)}): if its numbers move, you cannot tell which change moved them. "
                "Change one thing at a time, or name a parent that differs in one setting")
    if not changed:
        return (f"note: this run changes no setting from its parent {record['run']}: it is a repeat, so any "
                "difference between their numbers is noise (or nondeterminism)")
    was, now = values[changed[0]]
    return f"one change from the parent {record['run']}: {changed[0]} {was!r} -> {now!r}"


def record_parent(run: RunDir, parent: str | Path) -> dict[str, Any]:
    """Add the "parent" record to `run`'s meta.json (written already, with its config.json)
    and return it. Check the parent with read_parent before creating the run: this reads it
    again, and a parent removed in between fails here."""
    record = parent_record(parent, read_parent(parent), run.read_json("config.json") or {})
    meta = run.read_json("meta.json") or {}
    run.write_json("meta.json", {**meta, "parent": record})
    return record
