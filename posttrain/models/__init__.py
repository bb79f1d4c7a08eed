"""Models and tokenizers: `gpt_mini` (a readable decoder whose checkpoints are
transformers Llama checkpoints) and `tokenizer` (one token per character).

`MODELS` maps a config's `model.name` to a builder; the controller only ever calls
`build_model`, `save_checkpoint_model` and `load_checkpoint_model`.
"""

from __future__ import annotations

from pathlib import Path

from .gpt_mini import CheckpointMismatchError, GPTMini, GPTMiniConfig, KVCache, check_same_config, read_llama_config
from .tokenizer import CharTokenizer

__all__ = ["MODELS", "CharTokenizer", "CheckpointMismatchError", "GPTMini", "GPTMiniConfig", "KVCache",
           "build_model", "load_checkpoint_model", "save_checkpoint_model"]


def gpt_mini_config(model_cfg, tokenizer: CharTokenizer | None = None) -> GPTMiniConfig:
    """posttrain.config.ModelConfig -> GPTMiniConfig (the vocabulary comes from the tokenizer)."""
    return GPTMiniConfig(vocab_size=(tokenizer or CharTokenizer()).vocab_size, dim=model_cfg.dim,
                         n_layer=model_cfg.n_layer, n_head=model_cfg.n_head, hidden_dim=model_cfg.hidden_dim,
                         max_seq_len=model_cfg.max_seq_len)


MODELS = {"gpt_mini": lambda model_cfg, tokenizer: GPTMini(gpt_mini_config(model_cfg, tokenizer))}


def build_model(model_cfg, tokenizer) -> GPTMini:
    return MODELS[model_cfg.name](model_cfg, tokenizer)


def save_checkpoint_model(model: GPTMini, tokenizer, directory: Path) -> None:
    model.save_pretrained(directory, tokenizer)


def load_checkpoint_model(directory: Path, expected=None) -> GPTMini:
    """Load a checkpoint directory; `expected` (a ModelConfig or GPTMiniConfig) makes a
    checkpoint of a different shape an error that lists the differing fields."""
    if expected is not None and not isinstance(expected, GPTMiniConfig):
        expected = gpt_mini_config(expected)
    return GPTMini.from_pretrained(directory, expected_config=expected)


def check_checkpoint_shape(directory: Path, model_cfg) -> None:
    """Fail fast, before a run starts, when a checkpoint does not fit the configured model."""
    check_same_config(read_llama_config(Path(directory)), gpt_mini_config(model_cfg), Path(directory))
