"""`posttrain doctor RUN`: why a run is not learning, read from its run directory.

    posttrain doctor runs/<id>              every stage that sampled (rl, pref, a --stages run's)
    posttrain doctor runs/<id> --stage rl   one of them
    posttrain doctor runs/<id> --reflection true   and R1-Zero's curves: response length and
                                            reflection words per step (runs/reflection.py)

It prints runs/diagnosis.py's findings on the run's metrics.jsonl and samples.jsonl, the
same causes the RL stage printed as it ran and summary.md lists, each with the setting to
change and the numbers that showed it. It reads the files only, so it works on a run still
running, a killed one, or one copied from another machine. Exit status: 0 when nothing was
found, 1 when a cause was named (a script can stop on it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import tyro

from posttrain.cli.flags import parse_flags
from posttrain.config import ConfigError
from posttrain.config.commands import DoctorConfig
from posttrain.config.type_checks import check_types

SUMMARY = ("why a run is not learning, named from its run directory's metrics and samples: each cause with the "
           "setting to change and the numbers that showed it (exit status 1 when a cause is found)")
# the metrics of a stage that samples or scores pairs: an SFT stage logs neither, and has nothing to diagnose
DIAGNOSED = ("reward_mean", "dev_pref_logps_chosen_per_token")


def cmd_doctor(argv: list[str]) -> int:
    if argv and not argv[0].startswith("-"):  # posttrain doctor RUN: the run directory as its first argument
        argv = ["--run", argv[0], *argv[1:]]
    cfg = parse_flags(argv, "posttrain doctor", SUMMARY + ".",
                      [("settings", Annotated[DoctorConfig, tyro.conf.arg(name="")], DoctorConfig())]).settings
    check_types(cfg)
    cfg.validate()
    # imported here for start-up time: runs/ loads torch for checkpoints
    from posttrain.runs.diagnosis import diagnose, step_samples
    from posttrain.runs.rundir import read_jsonl

    run = Path(cfg.run)
    rows, samples = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "samples.jsonl")
    stages = [s for s in dict.fromkeys(r.get("stage", "") for r in rows)
              if any(key in r for r in rows if r.get("stage") == s for key in DIAGNOSED)]
    if cfg.stage:
        if cfg.stage not in {r.get("stage") for r in rows}:
            raise ConfigError(f"stage={cfg.stage!r} is not allowed: expected a stage of {run}'s metrics.jsonl, "
                              f"one of {stages or sorted({str(r.get('stage')) for r in rows})}")
        stages = [cfg.stage]
    config = read_config(run)
    found = 0
    print(f"posttrain doctor {run}")
    for stage in stages:
        stage_rows = [r for r in rows if r.get("stage") == stage]
        stage_samples = [s for s in samples if s.get("stage") == stage]
        findings = diagnose(stage_rows, step_samples(stage_samples), config)
        found += len(findings)
        head = f"{stage}: {len(stage_rows)} steps, {len(stage_samples)} samples"
        if not findings:
            print(f"{head}: nothing found (no monitor fired, and the samples show no cause)")
        else:
            print(f"{head}: {len(findings)} cause{'s' if len(findings) > 1 else ''}, the earliest first")
            for finding in findings:
                print(f"- {finding.line()}")
        if cfg.reflection:
            show_reflection(run, stage, stage_samples)
    if not stages:
        print(f"no stage of {run} sampled or scored anything: an SFT-only run has nothing to diagnose")
    return 1 if found else 0


def show_reflection(run: Path, stage: str, samples: list[dict]) -> None:
    """R1-Zero's response length and reflection-word share per step of `stage`, printed and
    drawn beside the run's other plots."""
    from posttrain.runs.reflection import REFLECTION_WORDS, plot_trend, reflection_trend, trend_lines

    trend = reflection_trend(samples, stage)
    if not trend:
        print(f"{stage}: no samples in samples.jsonl, so no response length or reflection words to show")
        return
    plot = run / f"{stage}_reflection.png"
    plot_trend(trend, plot, f"{run.name}, {stage}: {len(REFLECTION_WORDS)} reflection words (runs/reflection.py)")
    print(f"{stage}: response length and reflection words ({', '.join(REFLECTION_WORDS)}) per step (plot: {plot})")
    print("\n".join(trend_lines(trend, every=max(1, len(trend) // 10))))


def read_config(run: Path) -> dict:
    """The run's config.json, for the values the settings to change have now ({} without one)."""
    path = run / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}
