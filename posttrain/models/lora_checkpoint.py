"""LoRA checkpoints that hold the adapters alone, in the format peft loads.

A LoRA run trains a few hundred thousand adapter weights on top of a frozen base of 135M
(SmolLM2). Saving the base again in every checkpoint would write ~520 MB for what changed
by ~2 MB, so a LoRA checkpoint holds only what peft's `save_pretrained` writes
(`adapter_config.json`, `adapter_model.safetensors`) and names its base:

- in `adapter_config.json`, `base_model_name_or_path` is the base's directory, so that
  `peft.PeftModel.from_pretrained(base, checkpoint)` and even plain
  `transformers.AutoModelForCausalLM.from_pretrained(checkpoint)` (which sees the adapter
  config and loads base + adapters when peft is installed) give the trained policy;
- in posttrain's policy record, `base` (a known name or an absolute directory),
  `base_relative` (the same directory seen from the checkpoint, so that a run directory
  moved or copied as a whole keeps working) and `base_fingerprint`.

The base is usually the run's own SFT checkpoint, a directory that a user can delete or
overwrite. The fingerprint catches a base that is there but is not the one the adapters
were trained on: loading them on other weights would run without an error and give a
different policy.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from .smollm2 import KNOWN_MODELS, convert_smollm2

if TYPE_CHECKING:  # names for annotations only: importing transformers or peft here would slow every start-up
    from peft import PeftModel
    from transformers import PreTrainedModel

ADAPTER_CONFIG = "adapter_config.json"  # peft's names
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoraBaseError(ValueError):
    """An adapter checkpoint's base is missing or is no longer the model it was trained on:
    the checkpoint itself is fine, so the fix is to restore the base, not to delete it."""


def is_adapter_checkpoint(directory: str | os.PathLike) -> bool:
    return (Path(directory) / ADAPTER_CONFIG).is_file()


def plain_base_state(peft_model: PeftModel) -> dict[str, torch.Tensor]:
    """The base model's state dict under the names transformers gives it: peft wraps every
    adapted Linear in place (`q_proj.base_layer.weight` next to `q_proj.lora_A...`)."""
    base = peft_model.get_base_model()
    return {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if "lora_" not in k}


def weights_fingerprint(state_dict: dict[str, torch.Tensor]) -> str:
    """A hash of every tensor's name, shape and first 64 values: cheap (no pass over the
    whole 520 MB), and any retraining of the base moves some of those values. The values are
    rounded to bfloat16 first, so a base trained in float32 and reloaded in bfloat16 (or the
    reverse) still matches, while an update of any useful size still changes them."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach()
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(tensor.flatten()[:64].to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes())
    return digest.hexdigest()[:16]


def base_directory(base: str) -> str:
    """The directory a base name stands for, for peft's adapter config: a known name's cached
    conversion, a directory made absolute; any other name is left to transformers as is."""
    if base in KNOWN_MODELS:
        return str(convert_smollm2())
    return str(Path(base).resolve()) if Path(base).is_dir() else base


def save_adapters(peft_model: PeftModel, directory: Path, base: str) -> dict:
    """Write the adapters into `directory` (peft's files, pointing at the base) and return
    the fields the policy record adds: where the base is, and its fingerprint."""
    if not base:
        raise ValueError("this LoRA policy does not know where its base weights load from, and its checkpoint "
                         "holds the adapters alone: call add_lora(r, base=NAME_OR_DIRECTORY) with the model or "
                         "checkpoint whose weights the policy held when the adapters were added")
    peft_model.peft_config["default"].base_model_name_or_path = base_directory(base)
    peft_model.save_pretrained(directory)
    (Path(directory) / "README.md").unlink(missing_ok=True)  # peft's model-card template, all placeholders
    record = {"base": base, "base_fingerprint": weights_fingerprint(plain_base_state(peft_model))}
    if Path(base).is_dir():
        record["base"] = str(Path(base).resolve())
        record["base_relative"] = os.path.relpath(Path(base).resolve(), Path(directory).resolve())
    return record


def find_base(directory: Path, record: dict) -> str:
    """The base an adapter checkpoint's record names: a model name as it is (the model loader
    resolves it, or says why it cannot), else the first of its directories, seen from the
    checkpoint and then as recorded, that exists."""
    base = record.get("base", "")
    if base in KNOWN_MODELS or (base and not Path(base).is_absolute()):  # directories are recorded absolute
        return base
    tried = ([directory / record["base_relative"]] if record.get("base_relative") else []) + ([Path(base)] if base else [])
    for candidate in tried:
        if candidate.is_dir():
            return str(candidate.resolve())
    where = " nor ".join(str(p) for p in tried) or "(no base recorded)"
    raise LoraBaseError(
        f"{directory} holds LoRA adapters alone, and the base model they were trained on is missing: "
        f"neither {where} exists. Put the base back at {base or 'its place'} (for a run, the checkpoint named "
        f"there is the run's SFT or init checkpoint), or edit \"base\" in {directory}/posttrain_policy.json to "
        "where it is now.")


def load_adapters(directory: Path, record: dict,
                  load_base: Callable[[str], PreTrainedModel]) -> tuple[PeftModel, str]:
    """(the peft model: base + trainable adapters, the base's name or directory). `load_base`
    loads a base model by name or directory (models/hf.py's loader, which never downloads)."""
    from peft import PeftModel

    base = find_base(directory, record)
    if is_adapter_checkpoint(base):
        raise ValueError(f"{directory}: its base {base} is itself a LoRA checkpoint; export that one to plain weights "
                         "first (posttrain export) and train on the export")
    model = load_base(base)
    want = record.get("base_fingerprint")
    if want and weights_fingerprint(model.state_dict()) != want:
        raise LoraBaseError(
            f"{directory} holds LoRA adapters trained on a base whose weights differ from the model now at {base} "
            f"(fingerprint {weights_fingerprint(model.state_dict())}, recorded {want}): the directory was "
            "overwritten or retrained since. Restore that base, or retrain the adapters on this one.")
    with warnings.catch_warnings():  # peft calls a transformers method that warns of its own rename
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return PeftModel.from_pretrained(model, directory, is_trainable=True), base
