"""Models and tokenizers: `gpt_mini` (a readable decoder whose checkpoints are
transformers Llama checkpoints) and `tokenizer` (one token per character), or any local
transformers causal LM through `hf.HFPolicy` / `hf.HFTokenizer`.

A config's `model.name` is "gpt_mini" (built from scratch), a known pretrained name
("smollm2-135m") or a local transformers directory. The controller only ever calls
`make_policy`, `save_checkpoint_model`, `load_checkpoint_model` and `load_tokenizer`.
"""

from __future__ import annotations

from pathlib import Path

from .gpt_mini import CheckpointMismatchError, GPTMini, GPTMiniConfig, KVCache, check_same_config, read_llama_config
from .tokenizer import CharTokenizer

__all__ = ["MODELS", "CharTokenizer", "CheckpointMismatchError", "GPTMini", "GPTMiniConfig", "KVCache",
           "build_model", "is_pretrained", "load_checkpoint_model", "load_tokenizer", "make_policy",
           "save_checkpoint_model"]


def gpt_mini_config(model_cfg, tokenizer: CharTokenizer | None = None) -> GPTMiniConfig:
    """posttrain.config.ModelConfig -> GPTMiniConfig (the vocabulary comes from the tokenizer)."""
    return GPTMiniConfig(vocab_size=(tokenizer or CharTokenizer()).vocab_size, dim=model_cfg.dim,
                         n_layer=model_cfg.n_layer, n_head=model_cfg.n_head, hidden_dim=model_cfg.hidden_dim,
                         max_seq_len=model_cfg.max_seq_len)


MODELS = {"gpt_mini": lambda model_cfg, tokenizer: GPTMini(gpt_mini_config(model_cfg, tokenizer))}


def build_model(model_cfg, tokenizer) -> GPTMini:
    return MODELS[model_cfg.name](model_cfg, tokenizer)


def is_pretrained(model_cfg) -> bool:
    """True for a transformers model (a known name or a directory), False for gpt_mini."""
    return model_cfg.name not in MODELS


def make_policy(model_cfg):
    """(policy, tokenizer): a freshly initialised gpt_mini (seed torch first), or a
    pretrained transformers model loaded offline."""
    if not is_pretrained(model_cfg):
        tokenizer = CharTokenizer()
        return build_model(model_cfg, tokenizer), tokenizer
    from .hf import HFPolicy

    return HFPolicy.load(model_cfg.name, model_cfg.system_prompt)


def save_checkpoint_model(model, tokenizer, directory: Path) -> None:
    model.save_pretrained(directory, tokenizer)


def _is_transformers_checkpoint(directory: Path) -> bool:
    from .hf import POLICY_RECORD

    return (Path(directory) / POLICY_RECORD).exists()


def load_checkpoint_model(directory: Path, expected=None):
    """Load a checkpoint directory; `expected` (a ModelConfig, GPTMiniConfig or
    HFPolicyConfig) makes a gpt_mini checkpoint of a different shape an error that lists
    the differing fields. A checkpoint written from a transformers policy loads as one."""
    from .hf import HFPolicy, HFPolicyConfig

    if isinstance(expected, HFPolicyConfig) or _is_transformers_checkpoint(directory):
        return HFPolicy.from_pretrained(directory)
    if expected is not None and not isinstance(expected, GPTMiniConfig):
        if is_pretrained(expected):
            raise ValueError(f"{directory} is a gpt_mini checkpoint, but model.name={expected.name!r}")
        expected = gpt_mini_config(expected)
    return GPTMini.from_pretrained(directory, expected_config=expected)


def load_tokenizer(directory: Path, model_cfg=None):
    """The tokenizer saved beside a checkpoint's weights, with model_cfg's system prompt,
    or, when that is empty, the one the checkpoint was trained with."""
    if _is_transformers_checkpoint(directory):
        from transformers import AutoTokenizer

        from .hf import HFTokenizer, read_policy_record

        system_prompt = getattr(model_cfg, "system_prompt", "") or read_policy_record(directory).get("system_prompt", "")
        return HFTokenizer(AutoTokenizer.from_pretrained(directory, local_files_only=True), system_prompt)
    return CharTokenizer.load(directory)


def check_checkpoint_shape(directory: Path, model_cfg) -> None:
    """Fail fast, before a run starts, when a checkpoint does not fit the configured model."""
    if is_pretrained(model_cfg) or _is_transformers_checkpoint(directory):
        return  # a transformers checkpoint carries its own shape
    check_same_config(read_llama_config(Path(directory)), gpt_mini_config(model_cfg), Path(directory))
