"""Where a model's files are on disk: a known short name (converted once), a local
directory, or a hub name already in the local Hugging Face cache, never the network; and
the error that names the right directory when a run's checkpoint folder or its `latest`
pointer is passed instead of a checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

from .smollm2 import KNOWN_MODELS, convert_smollm2


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub finds it ($HF_HUB_CACHE, else
    $HF_HOME/hub, else ~/.cache/huggingface/hub), read at each call: huggingface_hub reads
    its variables once, at import, and a test or notebook may point them elsewhere later."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path(constants.HF_HUB_CACHE)


def named_by_latest(stage_dir: Path) -> Path | None:
    """The checkpoint a run's stage folder's `latest` pointer names (runs/checkpoints.py writes
    it; runs.checkpoints.latest_in also falls back when it is stale), or None without a pointer.
    For error messages that say which directory to pass instead of the folder or the pointer."""
    pointer = stage_dir / "latest"
    return stage_dir / pointer.read_text(encoding="utf-8", errors="replace").strip() if pointer.is_file() else None


def refuse_run_directory(directory: Path) -> None:
    """ValueError naming the checkpoint to pass when `directory` is a run directory or its
    checkpoints/ folder, where one model directory is wanted (--init): a run directory holds
    a config.json too, of settings, not of a model. (Commands that take a run directory, as
    export and evaluate() do, pick its checkpoint themselves.)"""
    if (directory / "checkpoints").is_dir() and (directory / "meta.json").is_file():
        folder, what = directory / "checkpoints", "a run directory"
    elif directory.name == "checkpoints" and any(named_by_latest(stage) for stage in directory.iterdir()
                                                  if stage.is_dir()):
        folder, what = directory, "a run's checkpoints folder"
    else:
        return
    # each stage's latest checkpoint, the one written last first: the policy a run ended with
    latest = sorted((pointed for stage in folder.iterdir() if stage.is_dir()
                     for pointed in [named_by_latest(stage)] if pointed is not None and pointed.is_dir()),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    if not latest:
        raise ValueError(f"{directory} is {what}, not a model directory, and it holds no checkpoint yet (the run "
                         "stopped before its first one): resume the run, or pass another checkpoint directory")
    others = "".join(f", or {p.parent.name}'s {p}" for p in latest[1:])
    raise ValueError(f"{directory} is {what}, not a model directory: pass one of its checkpoints, the latest of "
                     f"the stage it saved last ({latest[0].parent.name}), {latest[0]}{others}")


def resolve_model_dir(name_or_path: str | os.PathLike) -> Path:
    """The local directory a model name stands for: a known short name (KNOWN_MODELS,
    converted once), an existing directory, or a hub name such as
    "HuggingFaceTB/SmolLM2-135M-Instruct" already in the local Hugging Face cache (the
    snapshot its `main` ref points at). Looks only at the disk, never at the network; a
    name found nowhere is a ValueError that says how to get it there."""
    name = str(name_or_path)
    if name in KNOWN_MODELS:
        return convert_smollm2()
    if Path(name).is_dir():
        return Path(name)
    if Path(name).is_file():  # most often a run's `latest` pointer, named in place of the step it names
        pointed = named_by_latest(Path(name).parent) if Path(name).name == "latest" else None
        raise ValueError(f"{name} is a file, not a model directory" + (
            f": it names the stage's latest checkpoint; pass that directory, {pointed}" if pointed and pointed.is_dir()
            else ": pass the directory that holds config.json and the weights"))
    from huggingface_hub import try_to_load_from_cache

    cache = hub_cache_dir()
    try:  # reads refs/ and snapshots/ of the cache folder; it has no network code path
        config = try_to_load_from_cache(name, "config.json", cache_dir=cache)
    except ValueError:  # not a valid hub name ("a/b/c", "../x"): a mistyped path
        config = None
    if isinstance(config, str):
        return Path(config).parent
    known = "\n".join(f"  {k}: {v}" for k, v in KNOWN_MODELS.items())
    raise ValueError(
        f"unknown model {name!r}: it is neither a known name nor an existing local directory, and it is not "
        f"in the local Hugging Face cache ({cache}; set HF_HUB_CACHE or HF_HOME to look elsewhere). Nothing is "
        f"downloaded at run time: on a machine with network run `hf download {name}` (it fills that cache), "
        f"or pass a directory written by save_pretrained. Known names:\n{known}"
    )
