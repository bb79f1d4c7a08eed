"""Run directories: what every command leaves behind.

    runs/<timestamp>-<name>/
      config.json     the resolved configuration (re-runnable with --config)
      meta.json       git commit, spec and dataset versions, seeds, sampling, packages
      metrics.jsonl   one JSON object per step
      samples.jsonl   raw prompts, completions, rewards and score details
      summary.md / summary.json
      *.png           plots
      checkpoints/    model weights (+ optimizer state) to resume or evaluate

Every whole-file write goes to a temporary file first and is renamed into place, so a
run killed at any instant leaves either the old file or the new one, never half of one.
JSONL files are appended line by line and flushed; on resume the lines written after
the last checkpoint are dropped, so the resumed run's log equals an uninterrupted one.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from posttrain.files import write_atomic
from posttrain.types import Episode


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line of a JSONL file; a torn last line (a kill mid-write) is skipped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5, cwd=Path(__file__).resolve().parent)
        if out.returncode == 0:
            return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown"


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("posttrain", "torch", "transformers", "tokenizers", "safetensors", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"

    @classmethod
    def create(cls, out_dir: str, name: str) -> RunDir:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(out_dir) / f"{stamp}-{name}"
        suffix = 1
        while path.exists():  # two runs started within the same second
            suffix += 1
            path = Path(out_dir) / f"{stamp}-{name}-{suffix}"
        path.mkdir(parents=True)
        return cls(path)

    @classmethod
    def open(cls, path: str) -> RunDir:
        run = cls(Path(path))
        if not (run.path / "config.json").is_file():
            raise FileNotFoundError(f"{path!r} is not a run directory (no config.json in it); pass runs/<id> as written by `posttrain run`")
        return run

    def write_json(self, name: str, data: Any) -> None:
        write_json(self.path / name, data)

    def read_json(self, name: str) -> Any:
        path = self.path / name
        return json.loads(path.read_text()) if path.exists() else None

    def append_jsonl(self, name: str, rows: list[dict]) -> None:
        with open(self.path / name, "a") as f:
            for row in rows:
                f.write(json.dumps(row, default=str) + "\n")
            f.flush()

    def write_jsonl(self, name: str, rows: list[dict]) -> None:
        write_atomic(self.path / name, "".join(json.dumps(row, default=str) + "\n" for row in rows))

    def read_jsonl(self, name: str) -> list[dict]:
        return read_jsonl(self.path / name)

    def truncate_jsonl(self, name: str, keep: Callable[[dict], bool]) -> None:
        """Drop the rows a resumed run is about to write again."""
        self.write_jsonl(name, [row for row in self.read_jsonl(name) if keep(row)])

    def write_meta(self, extra: dict[str, Any]) -> None:
        meta = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "git_commit": git_commit(),
            "command": " ".join(sys.argv),
            "packages": package_versions(),
            **extra,
        }
        self.write_json("meta.json", meta)


def sample_row(stage: str, step: int, episode: Episode) -> dict:
    """One line of samples.jsonl (or eval_<stage>.jsonl): a completion, raw, with its reward and details."""
    return {"stage": stage, "step": step, "id": episode.example.id, "group": episode.group_id,
            "prompt": episode.example.prompt, "completion": episode.completion, "reward": episode.reward,
            "details": episode.details, "weight_version": episode.weight_version}
