"""Checkpoints: `checkpoints/<stage>/step_<N>/` holds the model (a transformers-loadable
directory) and `trainer_state.pt`; `checkpoints/<stage>/latest` names the newest complete one.

A checkpoint is written to a temporary directory and renamed into place only when
complete, and `latest` is replaced atomically, so `kill -9` at any moment leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from posttrain.models import save_checkpoint_model
from posttrain.runs.rundir import RunDir


def save_checkpoint(run: RunDir, stage: str, step: int, model, tokenizer, trainer=None,
                    extra: dict | None = None, keep_last: int = 2) -> Path:
    stage_dir = run.checkpoints / stage
    final = stage_dir / f"step_{step:06d}"
    tmp = stage_dir / f".step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint_model(model, tokenizer, tmp)
    if trainer is not None:
        torch.save({"trainer": trainer.state_dict(), "step": step, **(extra or {})}, tmp / "trainer_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (stage_dir / ".latest.tmp").write_text(final.name)
    (stage_dir / ".latest.tmp").replace(stage_dir / "latest")
    for old in sorted(stage_dir.glob("step_*"))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run: RunDir, stage: str) -> Path | None:
    pointer = run.checkpoints / stage / "latest"
    if not pointer.exists():
        return None
    path = run.checkpoints / stage / pointer.read_text().strip()
    return path if path.is_dir() else None
