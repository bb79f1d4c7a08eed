"""A model's shape: the dozen numbers of its config.json that every systems formula reads.

Memory, KV cache and FLOPs depend on the architecture only through a few integers: layers,
width, attention heads and key/value heads, head width, MLP width, vocabulary. `ModelShape`
holds them; `shape_from_config` reads them from a transformers config.json (Llama, Qwen2,
Mistral, Gemma, GPT-2 and anything else that names them the usual way); PRESETS holds the
published configs of a few well-known models, numbers only (nothing is downloaded).

    attention     n_kv_heads == n_heads: MHA; 1: MQA; in between: GQA (each K/V head
                  serves n_heads / n_kv_heads query heads)
    parameters    parameter_count(shape), matmul_parameter_count(shape) (the weights a
                  token multiplies through: every Linear, the output head included)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# bytes per element; fp8/int8 quantised weights are 1, int4 (GPTQ/AWQ-style) half a byte
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "fp8": 1, "int8": 1, "int4": 0.5}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name ("bfloat16", "fp8", ...); ValueError naming the known ones."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not known: expected one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that memory and FLOPs depend on."""

    name: str
    n_layers: int
    hidden: int  # the residual stream's width (hidden_size, d_model)
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads: n_heads (MHA), 1 (MQA), or a divisor in between (GQA)
    head_dim: int  # usually hidden / n_heads; Gemma and a few others set it apart
    intermediate: int  # the MLP's inner width
    vocab: int
    tied_embeddings: bool  # the output head reuses the input embedding matrix (one copy in memory)
    max_positions: int  # the longest context the positions were trained for
    mlp_matrices: int = 3  # SwiGLU/GeGLU: gate, up, down; a GELU MLP (GPT-2): 2
    qkv_bias: bool = False  # Qwen2 adds biases to q, k, v
    norms_per_layer: int = 2  # RMSNorm/LayerNorm before attention and before the MLP

    def __post_init__(self) -> None:
        for name in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "intermediate", "vocab",
                     "max_positions", "mlp_matrices"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{self.name or 'model'}: {name}={value!r} must be a positive integer")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name or 'model'}: n_heads={self.n_heads} is not a multiple of "
                             f"n_kv_heads={self.n_kv_heads}: each key/value head serves a whole group of query heads")

    @property
    def attention(self) -> str:
        """"MHA", "GQA" or "MQA": how many query heads share one key/value head."""
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of one token's keys (and, equally, its values) in one layer."""
        return self.n_kv_heads * self.head_dim


def layer_parameter_count(shape: ModelShape) -> int:
    """Weights of one transformer block: q, k, v, o projections, the MLP, the norms' gains."""
    attention = shape.hidden * shape.q_dim + 2 * shape.hidden * shape.kv_dim + shape.q_dim * shape.hidden
    bias = (shape.q_dim + 2 * shape.kv_dim) if shape.qkv_bias else 0
    mlp = shape.mlp_matrices * shape.hidden * shape.intermediate
    return attention + bias + mlp + shape.norms_per_layer * shape.hidden


def parameter_count(shape: ModelShape) -> int:
    """Every parameter: the blocks, the embedding, the final norm, and the output head
    unless it is tied to the embedding."""
    embedding = shape.vocab * shape.hidden
    head = 0 if shape.tied_embeddings else shape.vocab * shape.hidden
    return shape.n_layers * layer_parameter_count(shape) + embedding + head + shape.hidden


def matmul_parameter_count(shape: ModelShape) -> int:
    """The weights a token is multiplied through in a forward pass: every projection and
    the output head (tied or not). The embedding lookup is a gather, not a matmul, and the
    norms are elementwise, so neither costs 2 FLOPs per weight."""
    attention = shape.hidden * shape.q_dim + 2 * shape.hidden * shape.kv_dim + shape.q_dim * shape.hidden
    mlp = shape.mlp_matrices * shape.hidden * shape.intermediate
    return shape.n_layers * (attention + mlp) + shape.vocab * shape.hidden


def shape_from_config(config: dict, name: str = "") -> ModelShape:
    """A ModelShape from a transformers config.json's dict. (GPT-2's learned position
    embeddings and its biases other than q/k/v, 0.7% of its parameters, are left out.)

    Reads the Llama-family keys (num_hidden_layers, hidden_size, num_attention_heads,
    num_key_value_heads, head_dim, intermediate_size, vocab_size, tie_word_embeddings,
    max_position_embeddings) and GPT-2's (n_layer, n_embd, n_head, n_inner, n_positions);
    a multimodal config's `text_config` is read in its place. ValueError naming the key a
    config lacks."""
    if isinstance(config.get("text_config"), dict):  # e.g. Llama-4, Gemma-3: the language model's part
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type", "")}
    gpt2 = "n_embd" in config
    keys = ({"n_layers": "n_layer", "hidden": "n_embd", "n_heads": "n_head", "vocab": "vocab_size",
             "max_positions": "n_positions"} if gpt2 else
            {"n_layers": "num_hidden_layers", "hidden": "hidden_size", "n_heads": "num_attention_heads",
             "vocab": "vocab_size", "max_positions": "max_position_embeddings"})
    missing = [key for key in keys.values() if config.get(key) is None]
    if missing:
        raise ValueError(f"config {name or '(dict)'} has no {missing}: expected a transformers causal-LM "
                         "config.json (Llama, Qwen2, Mistral, Gemma or GPT-2 key names)")
    values = {field: int(config[key]) for field, key in keys.items()}
    model_type = str(config.get("model_type", ""))
    if gpt2:  # GELU MLP of 4 × width, multi-head attention, biases everywhere (counted as qkv only)
        intermediate = int(config.get("n_inner") or 4 * values["hidden"])
        return ModelShape(name=name, n_kv_heads=values["n_heads"], head_dim=values["hidden"] // values["n_heads"],
                          intermediate=intermediate, tied_embeddings=True, mlp_matrices=2, qkv_bias=True, **values)
    if config.get("intermediate_size") is None:
        raise ValueError(f"config {name or '(dict)'} has no 'intermediate_size': the MLP's width is needed")
    return ModelShape(
        name=name, intermediate=int(config["intermediate_size"]),
        n_kv_heads=int(config.get("num_key_value_heads") or values["n_heads"]),
        head_dim=int(config.get("head_dim") or values["hidden"] // values["n_heads"]),
        # transformers' PretrainedConfig defaults to tied; LlamaConfig and Qwen2Config to untied
        tied_embeddings=bool(config.get("tie_word_embeddings", model_type not in ("llama", "qwen2", "mistral"))),
        qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")),
        **values)


def _preset(name, layers, hidden, heads, kv_heads, intermediate, vocab, tied, positions, head_dim=0, qkv_bias=False):
    return ModelShape(name=name, n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=kv_heads,
                      head_dim=head_dim or hidden // heads, intermediate=intermediate, vocab=vocab,
                      tied_embeddings=tied, max_positions=positions, qkv_bias=qkv_bias)


# Published config.json numbers (the models' Hugging Face configs), so that `posttrain
# systems --model llama-3-8b` needs no download. Parameter counts these give are tested
# against the published totals (tests/test_systems_memory.py).
PRESETS: dict[str, ModelShape] = {s.name: s for s in [
    # make run's model: GPTMiniConfig's defaults with the character tokenizer's 100 symbols
    _preset("gpt_mini", 4, 128, 4, 4, 352, 100, False, 128),
    _preset("smollm2-135m", 30, 576, 9, 3, 1536, 49152, True, 8192),  # the offline real model; GQA 3:1
    _preset("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, True, 32768, qkv_bias=True),
    _preset("qwen2.5-1.5b", 28, 1536, 12, 2, 8960, 151936, True, 32768, qkv_bias=True),
    _preset("gemma-2b", 18, 2048, 8, 1, 16384, 256000, True, 8192, head_dim=256),  # MQA
    _preset("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, False, 4096),  # MHA
    _preset("mistral-7b", 32, 4096, 32, 8, 14336, 32000, False, 32768),
    _preset("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, False, 32768, qkv_bias=True),
    _preset("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, False, 8192),
    _preset("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, False, 32768, qkv_bias=True),
    _preset("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, False, 8192),
]}


def load_shape(source: str) -> ModelShape:
    """A preset's name (PRESETS), a config.json file, or a directory holding one."""
    if source in PRESETS:
        return PRESETS[source]
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"model {source!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json file "
                         "or a directory holding one")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a JSON config ({error}); give a transformers config.json") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a {type(config).__name__}, not a config object")
    return shape_from_config(config, name=str(source))
