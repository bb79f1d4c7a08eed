"""GPTMini's checkpoint format is transformers' Llama: the two translations between a
GPTMiniConfig and a Llama `config.json`.

GPTMini is Llama-shaped (RMSNorm, RoPE, SwiGLU, plain multi-head attention, no biases), so
its config is a subset of LlamaConfig: writing one is a renaming; reading one checks every
field GPTMini has no code for (grouped KV heads, biases, RoPE scaling, ...) and refuses the
file rather than load a different function under the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.types import Tokenizer


def llama_config(c, tokenizer: Tokenizer | None = None) -> dict:
    """A GPTMiniConfig `c` -> the config.json of transformers' LlamaConfig."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": c.vocab_size, "hidden_size": c.dim, "intermediate_size": c.hidden_dim,
        "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_head,  # plain multi-head attention, no grouped KV heads
        "head_dim": c.head_dim, "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps, "tie_word_embeddings": c.tie_embeddings,
        # transformers 5.x reads `rope_parameters`; 4.x reads the top-level `rope_theta`.
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "rope_theta": c.rope_theta,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0,
        "dtype": "float32", "torch_dtype": "float32",  # the 5.x name, the 4.x name
        "bos_token_id": getattr(tokenizer, "bos_id", None),
        "eos_token_id": getattr(tokenizer, "eos_id", None),
        "pad_token_id": getattr(tokenizer, "pad_id", None),
    }


def gpt_mini_fields(directory: Path) -> dict:
    """directory/config.json (LlamaConfig fields) -> the GPTMiniConfig fields, refusing what
    GPTMini cannot represent instead of loading it wrong."""
    path = directory / "config.json"
    if not path.is_file():
        why = "the directory does not exist" if not directory.exists() else "it has no config.json"
        raise FileNotFoundError(
            f"no checkpoint at {directory}: {why}. "
            "Expected a directory written by GPTMini.save_pretrained."
        )
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
        rope = hf.get("rope_parameters") or {"rope_theta": hf.get("rope_theta", 10000.0)}
        n_head = hf["num_attention_heads"]
        needs = {  # field: (value in the file, the only value GPTMini implements)
            "model_type": (hf.get("model_type"), "llama"),
            "num_key_value_heads": (hf.get("num_key_value_heads", n_head), n_head),
            "head_dim": (hf.get("head_dim") or hf["hidden_size"] // n_head,
                         hf["hidden_size"] // n_head),
            "hidden_act": (hf.get("hidden_act", "silu"), "silu"),
            "attention_bias": (hf.get("attention_bias", False), False),
            "mlp_bias": (hf.get("mlp_bias", False), False),
            "rope_parameters.rope_type": (rope.get("rope_type", "default"), "default"),
        }
        fields = dict(
            vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layer=hf["num_hidden_layers"],
            n_head=n_head, hidden_dim=hf["intermediate_size"],
            max_seq_len=hf["max_position_embeddings"], rope_theta=float(rope["rope_theta"]),
            norm_eps=float(hf["rms_norm_eps"]),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not a readable Llama config ({e!r}); re-save it") from e
    bad = [f"{k}={got!r} (GPTMini needs {want!r})" for k, (got, want) in needs.items() if got != want]
    if bad:
        raise ValueError(
            f"{path} describes a model GPTMini cannot represent: {', '.join(bad)}. "
            "Load it with transformers.AutoModelForCausalLM instead."
        )
    return fields
