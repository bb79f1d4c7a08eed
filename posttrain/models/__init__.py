"""Models and tokenizers: `gpt_mini` (a readable decoder whose checkpoints are
transformers Llama checkpoints) and `tokenizer` (one token per character), or any local
transformers causal LM through `hf.HFPolicy` / `hf.HFTokenizer`. `policy.Policy` declares
what the library calls on either kind of policy (posttrain.types.Tokenizer, on either tokenizer).

A config's `model.name` is "gpt_mini" (built from scratch), a known pretrained name
("smollm2-135m") or a local transformers directory. The controller only ever calls
`make_policy`, `save_checkpoint_model`, `load_checkpoint_model` and `load_tokenizer`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from posttrain.config import ModelConfig
from posttrain.types import Tokenizer

from .gpt_mini import GPTMini
from .gpt_mini_config import CheckpointMismatchError, GPTMiniConfig, check_same_config, read_llama_config
from .kv_cache import KVCache
from .lora_checkpoint import base_directory, find_base, is_adapter_checkpoint
from .model_dirs import named_by_latest, refuse_run_directory, resolve_model_dir
from .policy import SavablePolicy
from .smollm2 import KNOWN_MODELS, SOURCE_FILE, default_cache_dir
from .tokenizer import CharTokenizer

if TYPE_CHECKING:  # for annotations only: models/hf.py is imported where a transformers policy is loaded
    from .hf import HFPolicy

# with_settings hands back what it was given, GPTMini or HFPolicy
P = TypeVar("P", GPTMini, "HFPolicy")

__all__ = ["MODELS", "CharTokenizer", "CheckpointMismatchError", "GPTMini", "GPTMiniConfig", "KVCache",
           "build_model", "is_pretrained", "is_transformers_policy", "load_checkpoint_model", "load_tokenizer", "make_policy",
           "policy_context", "read_model_dir", "save_checkpoint_model"]


def gpt_mini_config(model_cfg: ModelConfig, tokenizer: CharTokenizer | None = None) -> GPTMiniConfig:
    """posttrain.config.ModelConfig -> GPTMiniConfig (the vocabulary comes from the tokenizer)."""
    return GPTMiniConfig(vocab_size=(tokenizer or CharTokenizer()).vocab_size, dim=model_cfg.dim,
                         n_layer=model_cfg.n_layer, n_head=model_cfg.n_head, hidden_dim=model_cfg.hidden_dim,
                         max_seq_len=model_cfg.max_seq_len)


MODELS = {"gpt_mini": lambda model_cfg, tokenizer: GPTMini(gpt_mini_config(model_cfg, tokenizer))}


def build_model(model_cfg: ModelConfig, tokenizer: CharTokenizer) -> GPTMini:
    return MODELS[model_cfg.name](model_cfg, tokenizer)


def is_pretrained(model_cfg: ModelConfig) -> bool:
    """True for a transformers model (a known name or a directory), False for gpt_mini."""
    return model_cfg.name not in MODELS


def is_transformers_policy(model_cfg: ModelConfig, init: str = "") -> bool:
    """Whether a run's policy is a transformers model: the one `init` loads (any model but a
    gpt_mini checkpoint), else model_cfg's."""
    if not init:
        return is_pretrained(model_cfg)
    return _is_transformers_checkpoint(resolve_model_dir(init))


def make_policy(model_cfg: ModelConfig) -> tuple[GPTMini | HFPolicy, Tokenizer]:
    """(policy, tokenizer): a freshly initialised gpt_mini (seed torch first), or a
    pretrained transformers model loaded offline."""
    if not is_pretrained(model_cfg):
        chars = CharTokenizer()
        return with_settings(build_model(model_cfg, chars), model_cfg), chars
    from .hf import HFPolicy

    policy, tokenizer = HFPolicy.load(model_cfg.name, model_cfg.system_prompt)
    return with_settings(policy, model_cfg), tokenizer


def with_settings(policy: P, model_cfg: ModelConfig) -> P:
    """`policy` with model_cfg's training switches on (model.gradient_checkpointing), whether
    built here or loaded from a checkpoint: they are how it trains, not what it is."""
    if model_cfg.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    return policy


def save_checkpoint_model(model: SavablePolicy, tokenizer: Tokenizer, directory: Path) -> None:
    model.save_pretrained(directory, tokenizer)


def _is_transformers_checkpoint(directory: str | Path) -> bool:
    """True for any transformers model directory: one posttrain saved from a transformers
    policy (it has POLICY_RECORD) or one posttrain never wrote (a save_pretrained, a hub
    snapshot, SmolLM2's own conversion, so `posttrain eval --checkpoint` can measure the
    untrained base model). False for a gpt_mini checkpoint, whose character tokenizer marks it."""
    from .hf import POLICY_RECORD

    if (Path(directory) / POLICY_RECORD).exists():
        return True
    try:
        tokenizer_config = json.loads((Path(directory) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True  # no readable CharTokenizer record: not a gpt_mini checkpoint
    return not (isinstance(tokenizer_config, dict) and tokenizer_config.get("posttrain_tokenizer") == "char")


def load_checkpoint_model(directory: Path, expected=None) -> GPTMini | HFPolicy:
    """Load a checkpoint directory; `expected` (a ModelConfig, GPTMiniConfig or
    HFPolicyConfig) makes a gpt_mini checkpoint of a different shape an error that lists
    the differing fields. A checkpoint written from a transformers policy loads as one."""
    from .hf import HFPolicy, HFPolicyConfig

    settings = expected if isinstance(expected, ModelConfig) else ModelConfig()  # a shape alone: no switches
    if isinstance(expected, HFPolicyConfig) or _is_transformers_checkpoint(directory):
        return with_settings(HFPolicy.from_pretrained(directory), settings)
    if expected is not None and not isinstance(expected, GPTMiniConfig):
        if is_pretrained(expected):
            raise ValueError(f"{directory} is a gpt_mini checkpoint, but model.name={expected.name!r}")
        expected = gpt_mini_config(expected)
    return with_settings(GPTMini.from_pretrained(directory, expected_config=expected), settings)


def load_tokenizer(directory: str | Path, model_cfg: ModelConfig | None = None) -> Tokenizer:
    """The tokenizer saved beside a checkpoint's weights, with model_cfg's system prompt,
    or, when that is empty, the one the checkpoint was trained with."""
    if _is_transformers_checkpoint(directory):
        from transformers import AutoTokenizer

        from .hf import HFTokenizer, read_policy_record

        system_prompt = getattr(model_cfg, "system_prompt", "") or read_policy_record(directory).get("system_prompt", "")
        return HFTokenizer(AutoTokenizer.from_pretrained(directory, local_files_only=True), system_prompt)
    return CharTokenizer.load(directory)


def check_checkpoint_shape(directory: Path, model_cfg: ModelConfig) -> None:
    """Fail fast, before a run starts, when a checkpoint does not fit the configured model."""
    if is_pretrained(model_cfg) or _is_transformers_checkpoint(directory):
        return  # a transformers checkpoint carries its own shape
    check_same_config(read_llama_config(Path(directory)), gpt_mini_config(model_cfg), Path(directory))


def read_model_dir(directory: str | Path) -> dict:
    """A local transformers model directory's config.json, read without loading the weights,
    or ValueError saying what the directory lacks (an empty one, a config, any weights)."""
    directory = Path(directory)
    refuse_run_directory(directory)  # its config.json is the run's settings: name the checkpoint to pass
    if not any(directory.iterdir()):
        raise ValueError(f"{directory} is empty: a model directory holds config.json, the weights and the "
                         "tokenizer, as save_pretrained writes them")
    config = directory / "config.json"
    if not config.is_file():
        latest = named_by_latest(directory)  # a run's stage folder: its checkpoints are step_* inside
        if latest is not None:
            raise ValueError(f"{directory} is a run's checkpoint folder, not one checkpoint: pass one of its steps, "
                             f"e.g. the latest, {latest}")
        raise ValueError(f"{directory} has no config.json, so it is not a transformers model directory (write one "
                         "with save_pretrained)")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{config} cannot be read as JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{config} holds no JSON object, so it is not a model config")
    if not any(directory.glob("*.safetensors")) and not any(directory.glob("*.bin")):
        raise ValueError(f"{directory} has no weights (*.safetensors or *.bin) beside its config.json")
    return data


# The names config.json gives the number of positions: Llama and most since, GPT-2, gpt_mini
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len")


def policy_context(model_cfg: ModelConfig, init: str = "") -> tuple[int, Tokenizer] | None:
    """(positions, tokenizer) of the policy a run builds from model_cfg, or from the
    checkpoint `init`, read without loading any weights: gpt_mini's max_seq_len, a
    transformers directory's config.json (a known name's once converted). None for a known
    name before its one-time conversion (SmolLM2-135M has 8,192 positions: no generation
    budget here comes close),
    or a config.json that names no position count."""
    if not init and not is_pretrained(model_cfg):
        return model_cfg.max_seq_len, CharTokenizer()
    if not init and model_cfg.name in KNOWN_MODELS and not (default_cache_dir() / SOURCE_FILE).is_file():
        return None  # not converted yet (its record is written last): the check would cost the conversion
    from .hf import read_policy_record

    directory = resolve_model_dir(init or model_cfg.name)  # a name in the local hub cache: its snapshot
    if init and not _is_transformers_checkpoint(directory):  # a gpt_mini checkpoint of model_cfg's shape
        return model_cfg.max_seq_len, load_tokenizer(directory)
    weights = directory
    if init and is_adapter_checkpoint(directory):  # LoRA adapters alone: the positions are their base's
        weights = Path(base_directory(find_base(directory, read_policy_record(directory))))
    positions = [value for key, value in read_model_dir(weights).items() if key in CONTEXT_KEYS]
    if not positions or not isinstance(positions[0], int):
        return None
    # imported here for start-up time, as make_policy does: transformers is slow to import
    from transformers import AutoTokenizer

    from .hf import HFTokenizer

    try:
        tokenizer = (load_tokenizer(directory, model_cfg) if init else
                     HFTokenizer(AutoTokenizer.from_pretrained(directory, local_files_only=True), model_cfg.system_prompt))
    except (OSError, ValueError, TypeError) as error:  # transformers' words for a missing or broken tokenizer
        raise ValueError(f"{directory}: cannot load its tokenizer: {str(error).splitlines()[0][:200]}") from None
    return positions[0], tokenizer
