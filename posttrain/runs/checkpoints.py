"""Checkpoints: `checkpoints/<stage>/step_<N>/` holds the model (a transformers-loadable
directory) and `trainer_state.pt`; `checkpoints/<stage>/latest` names the newest complete one.

A checkpoint is written to a temporary directory and renamed into place only when
complete, and `latest` is replaced atomically, so `kill -9` at any moment leaves the
previous checkpoint intact, and every `step_<N>` directory is a complete checkpoint.

A checkpoint that is damaged all the same (a power cut before the disk caught up, a bad
copy, a hand edit) is not skipped for an older one: the resume stops with a message naming
the file and the checkpoint to delete, and says which step the run then continues from.
Falling back silently would redo steps, and a damaged file is worth a look.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

from posttrain.files import naming_disk_full
from posttrain.models import CheckpointMismatchError, load_checkpoint_model, save_checkpoint_model
from posttrain.runs.rundir import RunDir, RunDirError

STEP_DIR = re.compile(r"step_(\d+)")


def complete_checkpoints(stage_dir: Path) -> list[Path]:
    """Every step_<N> directory of a stage, oldest first (by N, not by spelling)."""
    found = [p for p in stage_dir.glob("step_*") if STEP_DIR.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(STEP_DIR.fullmatch(p.name)[1]))


def save_checkpoint(run: RunDir, stage: str, step: int, model, tokenizer, trainer=None,
                    extra: dict | None = None, keep_last: int = 2) -> Path:
    stage_dir = run.checkpoints / stage
    final = stage_dir / f"step_{step:06d}"
    tmp = stage_dir / f".step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with naming_disk_full(tmp):
            save_checkpoint_model(model, tokenizer, tmp)
            if trainer is not None:
                with open(tmp / "trainer_state.pt", "wb") as f:
                    torch.save({"trainer": trainer.state_dict(), "step": step, **(extra or {})}, f)
                    f.flush()
                    os.fsync(f.fileno())  # a power cut must not leave the rename on disk and the data not
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # half a checkpoint is only in the way (and, on a full disk, space)
        raise
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    with naming_disk_full(stage_dir / "latest"):
        (stage_dir / ".latest.tmp").write_text(final.name)
        (stage_dir / ".latest.tmp").replace(stage_dir / "latest")
    for old in complete_checkpoints(stage_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run: RunDir, stage: str) -> Path | None:
    """The checkpoint `latest` names; without a usable pointer (a kill between a rename and
    the pointer's update, or the named checkpoint deleted by hand because it was damaged),
    the newest complete step_<N> directory; None if the stage has none."""
    stage_dir = run.checkpoints / stage
    pointer = stage_dir / "latest"
    if pointer.is_file():
        path = stage_dir / pointer.read_text().strip()
        if STEP_DIR.fullmatch(path.name) and path.parent == stage_dir and path.is_dir():
            return path
    complete = complete_checkpoints(stage_dir)
    return complete[-1] if complete else None


def delete_and_resume(checkpoint: Path) -> str:
    """What to do about a damaged checkpoint, and where the run then continues from."""
    complete = complete_checkpoints(checkpoint.parent)
    older = complete[:complete.index(checkpoint)] if checkpoint in complete else complete
    then = (f"continues from {older[-1].name}, the previous checkpoint" if older
            else f"restarts the {checkpoint.parent.name} stage from its first step (no older checkpoint)")
    return f"delete {checkpoint} and resume again: the run then {then}"


def load_checkpoint_weights(checkpoint: Path, expected=None):
    """load_checkpoint_model for a run's own checkpoint: a damaged file becomes a RunDirError
    saying what to delete. A shape mismatch is not damage and keeps its own message."""
    try:
        return load_checkpoint_model(checkpoint, expected)
    except CheckpointMismatchError:
        raise
    except (OSError, ValueError) as error:  # the loaders name the file: "cannot read .../model.safetensors (...)"
        raise RunDirError(f"checkpoint {checkpoint} cannot be loaded ({error}); "
                          f"{delete_and_resume(checkpoint)}") from error


def load_trainer_state(checkpoint: Path) -> dict:
    """trainer_state.pt of a checkpoint: optimizer, scheduler and step, to resume exactly."""
    path = checkpoint / "trainer_state.pt"
    try:
        state = torch.load(path, weights_only=False)
    except FileNotFoundError:
        raise RunDirError(f"{path} is missing: checkpoint {checkpoint} holds weights but not the optimizer state "
                          f"needed to resume; {delete_and_resume(checkpoint)}") from None
    except Exception as error:  # torch words a damaged file many ways: EOFError, RuntimeError (zip), OSError, ...
        reason = str(error).split(". ")[0].split("\n")[0] or type(error).__name__
        raise RunDirError(f"{path} is truncated or corrupt ({path.stat().st_size} bytes; torch.load: {reason}); "
                          f"{delete_and_resume(checkpoint)}") from error
    if not isinstance(state, dict) or not {"trainer", "step"} <= set(state):
        raise RunDirError(f"{path} is not a posttrain trainer state (expected a dict with 'trainer' and 'step'); "
                          f"{delete_and_resume(checkpoint)}")
    return state
