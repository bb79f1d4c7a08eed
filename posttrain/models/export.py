"""`posttrain export`: a checkpoint as a plain transformers model directory.

A posttrain checkpoint is already close to one: gpt_mini writes Llama weights and a
`tokenizers` file, a full fine-tune of a transformers model writes what `save_pretrained`
writes. What only posttrain knows is added here, so that code which has never heard of
posttrain gets the model that was trained, asked the way it was trained:

- LoRA: the adapters are merged into the base weights (W + (α/r)·B A), so the export needs
  neither peft nor the base directory;
- the prompt layout: a transformers policy was trained with its system prompt, so the
  exported chat template inserts that system turn whenever the messages bring none, and
  `tokenizer.apply_chat_template([{"role": "user", ...}], add_generation_prompt=True)`
  gives the tokens training saw. gpt_mini's layout is `<bos>` + the prompt, written as a
  chat template of its own;
- the stop token: `generation_config.json` names the token posttrain's sampler stopped on,
  so `generate` ends the answer where training did.

The directory is written beside OUT and renamed into place when complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path

from posttrain.files import DiskFullError, disk_full_errno

from .gpt_mini import GPTMini
from .hf import POLICY_RECORD, HFPolicy, HFTokenizer, quiet_transformers, read_policy_record
from .lora_checkpoint import find_base, is_adapter_checkpoint

EXPORT_RECORD = "posttrain_export.json"  # in the export: what it was made from

# gpt_mini's prompt layout (roles/rollout.py::encode_prompt): <bos>, the prompt, and the
# answer follows directly; a demonstration's answer ends with <eos>. It was never trained on
# system turns or several rounds, so the template refuses them rather than invent a layout.
GPT_MINI_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' and loop.first %}{{ bos_token + message['content'] }}"
    "{% elif message['role'] == 'assistant' and loop.index == 2 %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('gpt_mini was trained on one user prompt (optionally followed by its answer); "
    "a ' + message['role'] + ' turn at position ' + loop.index|string + ' has no place in its prompt layout') }}"
    "{% endif %}{% endfor %}"
)


def with_system_prompt(chat_template: str, system_prompt: str) -> str:
    """`chat_template` with `system_prompt` as the system turn whenever the messages do not
    start with one of their own (which still wins, as posttrain's --model.system_prompt does)."""
    # json.dumps writes a valid Jinja string literal: Jinja reads the same backslash escapes
    # (\n, \", \\); non-ASCII characters are left as they are
    literal = json.dumps(system_prompt, ensure_ascii=False)
    return ("{% if not messages or messages[0]['role'] != 'system' %}"
            "{% set messages = [{'role': 'system', 'content': " + literal + "}] + messages %}"
            "{% endif %}" + chat_template)


def check_out(out: Path, checkpoint: Path, overwrite: bool) -> None:
    """Refuse an OUT that holds something, unless told to overwrite it, and never one whose
    removal would delete the checkpoint or the base model the export is made from."""
    sources = [checkpoint.resolve()]
    record = read_policy_record(checkpoint)
    if record.get("lora_r") and is_adapter_checkpoint(checkpoint):
        base = find_base(checkpoint, record)  # a missing base fails here, naming it, before anything is written
        if Path(base).is_dir():
            sources.append(Path(base).resolve())
    target = out.resolve()
    for source in sources:
        if target == source or target in source.parents:
            raise ValueError(f"OUT {out} is or contains {source}, which the export reads: choose another directory")
    if out.exists() and not out.is_dir():
        raise ValueError(f"OUT {out} exists and is a file, not a directory: choose another path")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"OUT {out} exists and is not empty: choose a new directory, or pass --overwrite to replace "
                         "everything in it")
    # the export is written beside OUT and renamed into place: OUT's parent must be a directory we can write
    existing = next(p for p in (out.parent.absolute(), *out.parent.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"OUT {out} cannot be created: {existing} is a file, not a directory; choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"OUT {out} cannot be created: {existing} is not writable by this user; choose a directory "
                         "you can write to")


def export_checkpoint(checkpoint: str | Path, out: str | Path, overwrite: bool = False) -> dict:
    """Write `checkpoint` (gpt_mini or transformers, LoRA or not) to `out` as a plain
    transformers directory; return what was written (EXPORT_RECORD's contents).

    A checkpoint of a run still training can be pruned while it is read (the run keeps its
    last few and removes older ones whole: runs/checkpoints.py::remove_checkpoint); the
    export then starts again from the newest complete step of the same stage, with a
    warning, and the record's source_checkpoint names the step exported."""
    checkpoint, out = Path(checkpoint), Path(out)
    if not checkpoint.is_dir():
        raise FileNotFoundError(f"no checkpoint at {checkpoint}: the directory does not exist")
    check_out(out, checkpoint, overwrite)
    quiet_transformers()
    for _ in range(PRUNED_RETRIES):
        try:
            return write_export(checkpoint, out)
        except Exception:
            newer = newest_step(checkpoint.parent)
            if checkpoint.is_dir() or newer is None or newer == checkpoint:
                raise  # not pruned under us: the error is the export's own
            warnings.warn(f"{checkpoint} was removed while it was read (its run, still training, keeps only its "
                          f"newest checkpoints): exporting {newer}, the newest complete one, instead", stacklevel=2)
            checkpoint = newer
    return write_export(checkpoint, out)


# how many times an export starts again after the checkpoint it read was pruned (each prune
# is a checkpoint interval of training: three in one export means the run saves faster than
# this machine exports, and the last try's error is reported)
PRUNED_RETRIES = 3


def newest_step(stage_dir: Path) -> Path | None:
    """The stage's step_<N> directory with the largest N, or None (the layout runs/checkpoints.py writes)."""
    steps = [p for p in stage_dir.glob("step_*") if re.fullmatch(r"step_\d+", p.name) and p.is_dir()]
    return max(steps, key=lambda p: int(p.name[len("step_"):]), default=None)


def write_export(checkpoint: Path, out: Path) -> dict:
    """The export itself: written to a hidden directory beside OUT, renamed into place when
    whole. A failure to write names OUT (an OSError from inside names the hidden directory)."""
    tmp = out.parent / f".{out.name}.export.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if (checkpoint / POLICY_RECORD).is_file():
            record = export_transformers(checkpoint, tmp)
        elif (checkpoint / "config.json").is_file():
            record = export_gpt_mini(checkpoint, tmp)
        else:
            raise ValueError(f"{checkpoint} is not a posttrain checkpoint: it has neither {POLICY_RECORD} (a "
                             "transformers policy) nor config.json (gpt_mini); give a checkpoint directory "
                             "(checkpoints/<stage>/step_N) or a run directory")
        record["source_checkpoint"] = str(checkpoint.resolve())
        (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)  # empty, or --overwrite: check_out said so
        tmp.rename(out)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, OSError) and error.filename and is_within(Path(error.filename), tmp, out):
            # an error of the files being written (not of the checkpoint read): named by OUT
            code = disk_full_errno(error)
            if code is not None:
                raise DiskFullError(code, out, "free space and run the export again") from error
            raise ValueError(f"cannot write OUT {out}: {error.strerror} ({error.filename})") from error
        raise
    return record


def is_within(path: Path, *directories: Path) -> bool:
    path = path.absolute()
    return any(path == d.absolute() or d.absolute() in path.parents for d in directories)


def export_transformers(checkpoint: Path, out: Path) -> dict:
    """A transformers policy: LoRA merged, the system prompt in the chat template."""
    from transformers import AutoTokenizer

    policy = HFPolicy.from_pretrained(checkpoint)
    lora_r = policy.config.lora_r
    model = policy.hf.merge_and_unload() if lora_r else policy.hf  # peft's W + (α/r)·B A, adapters gone
    record = read_policy_record(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    system_prompt = record.get("system_prompt", "")
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if system_prompt and has_template:  # without a template posttrain never used the system prompt either
        tokenizer.chat_template = with_system_prompt(tokenizer.chat_template, system_prompt)
    stop = HFTokenizer(tokenizer)  # the ids posttrain's sampler used
    model.generation_config.eos_token_id = stop.eos_id
    model.generation_config.pad_token_id = stop.pad_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"kind": "transformers", "lora_merged": lora_r, "lora_base": policy.config.lora_base if lora_r else "",
            "system_prompt": system_prompt if has_template else "", "chat_template": has_template,
            "eos_token_id": stop.eos_id, "parameters": sum(p.numel() for p in model.parameters())}


def export_gpt_mini(checkpoint: Path, out: Path) -> dict:
    """gpt_mini: its Llama weights as they are, and the character tokenizer with its prompt
    layout as a chat template."""
    from transformers import AutoTokenizer, GenerationConfig

    from .tokenizer import CharTokenizer

    model = GPTMini.from_pretrained(checkpoint)  # checks the config and every tensor
    char = CharTokenizer.load(checkpoint)
    model.save_pretrained(out, char)  # config.json (LlamaForCausalLM) and model.safetensors
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    tokenizer.chat_template = GPT_MINI_CHAT_TEMPLATE
    # posttrain never lets text spell a special token; a chat template does ("<bos>" + prompt),
    # and every transformers tokenizer reads "<eos>" in text as the token
    tokenizer.split_special_tokens = False
    tokenizer.save_pretrained(out)
    GenerationConfig(bos_token_id=char.bos_id, eos_token_id=char.eos_id, pad_token_id=char.pad_id).save_pretrained(out)
    return {"kind": "gpt_mini", "lora_merged": 0, "lora_base": "", "system_prompt": "", "chat_template": True,
            "eos_token_id": char.eos_id, "parameters": model.num_params()}


def exported_size(directory: Path) -> int:
    """Bytes of every file in a directory (recursively): what an export or checkpoint costs on disk."""
    return sum(f.stat().st_size for f in Path(directory).rglob("*") if f.is_file())

