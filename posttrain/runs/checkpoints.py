"""Checkpoints: `checkpoints/<stage>/step_<N>/` holds the model (a transformers-loadable
directory) and `trainer_state.pt`; `checkpoints/<stage>/latest` names the newest complete one.

Each checkpoint also holds `posttrain_task.json` (TASK_FILE): the task it was trained on,
so that `posttrain eval --checkpoint DIR` scores it on that task, wherever DIR is copied.

A checkpoint is written to a temporary directory and renamed into place only when
complete, and `latest` is replaced atomically, so `kill -9` at any moment leaves the
previous checkpoint intact, and every `step_<N>` directory is a complete checkpoint.

A checkpoint that is damaged all the same (a power cut before the disk caught up, a bad
copy, a hand edit) is not skipped for an older one: the resume stops with a message naming
the file and the checkpoint to delete, and says which step the run then continues from.
Falling back silently would redo steps, and a damaged file is worth a look.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.config import EnvConfig, TrainConfig, parse_stages
from posttrain.config.files import from_dict, to_dict
from posttrain.files import naming_disk_full
from posttrain.models import CheckpointMismatchError, load_checkpoint_model, save_checkpoint_model
from posttrain.models.lora_checkpoint import LoraBaseError
from posttrain.runs.rundir import RunDir, RunDirError, read_json, write_json
from posttrain.types import Tokenizer
from posttrain.version import __version__

STEP_DIR = re.compile(r"step_(\d+)")

# In every checkpoint: what `posttrain eval` needs to score it as its run did. Inside the
# checkpoint, not only in the run's config.json, so that a copied checkpoint keeps it.
TASK_FILE = "posttrain_task.json"
TASK_FORMAT = 1  # raised when a key changes meaning, so an old reader can refuse a new file


@dataclass
class CheckpointTask:
    """A checkpoint's TASK_FILE, read."""

    env: EnvConfig  # the run's env section: the task it trained and was scored on
    spec_version: str  # the verifier that scored it in training (the env's own when env.spec_version is "")
    max_new_tokens: int  # the generation budget of the run's own held-out evals (rl.sampling.max_new_tokens)
    system_prompt: str  # transformers policies: the system turn its prompts had ("" = the template's default)
    posttrain_version: str  # the version that wrote the file


def task_record(run: RunDir, tokenizer: Tokenizer) -> dict | None:
    """What TASK_FILE holds for a checkpoint of `run`; None without the run's config.json
    (no run starts without one: recording the defaults instead would be a wrong record)."""
    # Read from the run's config.json and meta.json, not passed in: every caller already hands
    # save_checkpoint its run (runs/stage.py for sft, rl and pref; the init and pref_reference
    # checkpoints), and these files are the run's one record of its settings, so no caller
    # needs a new argument that could disagree with them.
    config = run.read_json("config.json")
    if config is None:
        return None
    cfg = from_dict(TrainConfig, config)  # as a resume reads it
    env = to_dict(cfg.env)
    for key in ("path", "heldout_path"):  # relative to where the run started; the eval may run from anywhere
        if env.get(key):
            env[key] = os.path.abspath(env[key])
    meta = run.read_json("meta.json") or {}
    return {"format": TASK_FORMAT, "env": env, "spec_version": meta.get("spec_version", ""),
            "max_new_tokens": cfg.rl.sampling.max_new_tokens,
            "system_prompt": getattr(tokenizer, "system_prompt", ""),  # the one saved with the tokenizer
            "posttrain_version": __version__}


def read_task(checkpoint: Path) -> CheckpointTask | None:
    """The task a checkpoint records, or None for one without TASK_FILE (written before it
    existed, or any transformers model); a file that cannot be read raises RunDirError."""
    path = Path(checkpoint) / TASK_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != TASK_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this posttrain reads format {TASK_FORMAT}")
        return CheckpointTask(from_dict(EnvConfig, data["env"], "env."), str(data["spec_version"]),
                              int(data["max_new_tokens"]), str(data["system_prompt"]), str(data["posttrain_version"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:  # AttributeError: not an object
        raise RunDirError(f"{path} cannot be read ({type(error).__name__}: {error}): copy it again from the run's "
                          "checkpoint, or delete it and give the task as --env.* flags") from None


def complete_checkpoints(stage_dir: Path) -> list[Path]:
    """Every step_<N> directory of a stage, oldest first (by N, not by spelling)."""
    found = [p for p in stage_dir.glob("step_*") if STEP_DIR.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(STEP_DIR.fullmatch(p.name)[1]))


def save_checkpoint(run: RunDir, stage: str, step: int, model, tokenizer: Tokenizer, trainer=None,
                    extra: dict | None = None, keep_last: int = 2) -> Path:
    stage_dir = run.checkpoints / stage
    final = stage_dir / f"step_{step:06d}"
    tmp = stage_dir / f".step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with naming_disk_full(tmp):
            save_checkpoint_model(model, tokenizer, tmp)
            task = task_record(run, tokenizer)
            if task is not None:
                write_json(tmp / TASK_FILE, task)
            if trainer is not None:
                with open(tmp / "trainer_state.pt", "wb") as f:
                    torch.save({"trainer": trainer.state_dict(), "step": step, **(extra or {})}, f)
                    f.flush()
                    os.fsync(f.fileno())  # a power cut must not leave the rename on disk and the data not
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # half a checkpoint is only in the way (and, on a full disk, space)
        raise
    if final.exists():  # this step saved before (a resumed stage redoing it): moved aside in one step
        remove_checkpoint(final)
    tmp.rename(final)
    with naming_disk_full(stage_dir / "latest"):
        (stage_dir / ".latest.tmp").write_text(final.name)
        (stage_dir / ".latest.tmp").replace(stage_dir / "latest")
    for old in complete_checkpoints(stage_dir)[:-keep_last]:
        remove_checkpoint(old)
    return final


def remove_checkpoint(checkpoint: Path) -> None:
    """Delete a step_<N> directory so that no kill leaves half of one: it is renamed to a
    hidden `.step_<N>.removed.tmp` first (one atomic step; RunDir.resume sweeps what a kill
    leaves of that), so every step_<N> directory stays a complete checkpoint. A reader
    that had it open (`posttrain export` of a run still training) finds it gone, not torn."""
    doomed = checkpoint.with_name(f".{checkpoint.name}.removed.tmp")
    shutil.rmtree(doomed, ignore_errors=True)
    try:
        checkpoint.rename(doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def latest_checkpoint(run: RunDir, stage: str) -> Path | None:
    """The checkpoint `latest` names; without a usable pointer (a kill between a rename and
    the pointer's update, or the named checkpoint deleted by hand because it was damaged),
    the newest complete step_<N> directory; None if the stage has none."""
    return latest_in(run.checkpoints / stage)


def latest_in(stage_dir: Path) -> Path | None:
    """latest_checkpoint for a stage's directory, checkpoints/<stage>."""
    pointer = stage_dir / "latest"
    if pointer.is_file():
        path = stage_dir / pointer.read_text().strip()
        if STEP_DIR.fullmatch(path.name) and path.parent == stage_dir and path.is_dir():
            return path
    complete = complete_checkpoints(stage_dir)
    return complete[-1] if complete else None


# The stages whose checkpoints hold the policy, the one trained last first: the RL or
# preference stage follows SFT, and `init` is the untrained start saved when SFT has no steps.
# A --stages run names its own (policy_stages).
POLICY_STAGES = ("rl", "pref", "sft", "init")


def policy_stages(run_dir: Path) -> tuple[str, ...]:
    """The stages of a run whose checkpoints hold the policy, the one trained last first:
    a --stages run's, in reverse order of its config.json's stages, then its start."""
    config = read_json(run_dir / "config.json")
    stages = config.get("stages", "") if isinstance(config, dict) else ""
    if not stages:
        return POLICY_STAGES
    return tuple(name for name, _, _ in reversed(parse_stages(stages))) + ("init",)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of a model's weights (every tensor of its state dict, by name, as float32 bytes):
    equal digests mean the same weights, whatever file or process they came from."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def final_checkpoint(path: str | Path) -> tuple[Path, str]:
    """(checkpoint, how it was chosen) for `path`: a checkpoint directory itself, a stage's
    directory (its latest), or a run directory (the latest checkpoint of the stage trained
    last); FileNotFoundError saying what `path` is when it holds none."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist: give a run directory (runs/<id>) or a checkpoint directory "
                                "(runs/<id>/checkpoints/<stage>/step_N)")
    if (path / "checkpoints").is_dir():
        for stage in policy_stages(path):
            checkpoint = latest_in(path / "checkpoints" / stage)
            if checkpoint is not None:
                return checkpoint, f"the latest checkpoint of run {path}'s {stage} stage, the last one it trained"
        found = sorted(p.name for p in (path / "checkpoints").iterdir() if p.is_dir())
        raise FileNotFoundError(f"run {path} has no policy checkpoint in checkpoints/{{{','.join(policy_stages(path))}}} "
                                f"(found: {', '.join(found) or 'nothing'}): it stopped before its first checkpoint; "
                                "resume it, or give a checkpoint directory")
    if STEP_DIR.fullmatch(path.name) or not complete_checkpoints(path):
        return path, "the checkpoint given"
    return latest_in(path), f"the latest checkpoint of stage directory {path}"


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
    except (CheckpointMismatchError, LoraBaseError):  # not damage: their messages say what to do
        raise
    except (OSError, ValueError) as error:  # the loaders name the file: "cannot read .../model.safetensors (...)"
        raise RunDirError(f"checkpoint {checkpoint} cannot be loaded ({error}); "
                          f"{delete_and_resume(checkpoint)}") from error


def load_trainer_state(checkpoint: Path) -> dict:
    """trainer_state.pt of a checkpoint: optimizer, scheduler and step, to resume exactly."""
    path = checkpoint / "trainer_state.pt"
    try:
        # map_location cpu: a GPU run's optimizer state loads on any machine; load_state_dict
        # then moves each tensor to its parameter's device
        state = torch.load(path, weights_only=False, map_location="cpu")
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
