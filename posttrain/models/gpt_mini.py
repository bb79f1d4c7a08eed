"""GPTMini: a small decoder-only transformer whose weights *are* a Llama checkpoint.

The architecture is Llama's (Touvron et al. 2023, https://arxiv.org/abs/2302.13971):
pre-norm residual blocks with RMSNorm, rotary position embeddings, causal multi-head
attention and a SwiGLU MLP, no biases. Submodules carry exactly the names of transformers'
`LlamaForCausalLM`, so `save_pretrained` writes a directory that
`transformers.LlamaForCausalLM.from_pretrained` loads with no renaming table, and
tests/test_gpt_mini.py asserts both give the same logits.

Shapes: B batch, T new tokens in this call, S = T_past + T keys, D model dim,
H heads, hd head dim, V vocab.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from posttrain.files import write_atomic
from posttrain.types import Tokenizer

from .gpt_mini_config import CheckpointMismatchError, GPTMiniConfig, check_same_config, mismatch_lines, read_llama_config
from .kv_cache import KVCache
from .llama_format import llama_config


# ---- building blocks --------------------------------------------------------------------


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g: LayerNorm without the mean subtraction and bias;
    cheaper, and what Llama uses (Zhang & Sennrich 2019, https://arxiv.org/abs/1910.07467)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # the mean of squares in float32 even when the model runs in bf16
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_tables(head_dim: int, max_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angle pos * theta^(-2i / hd) for every position and channel
    pair, each (max_len, hd) (RoFormer, Su et al. 2021, https://arxiv.org/abs/2104.09864,
    eq. 15). Channel i is paired with channel i + hd/2 (Llama's "rotate half" layout,
    not RoFormer's neighbours 2i, 2i+1), so each frequency appears once in each half."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)  # (hd/2,)
    angles = torch.outer(torch.arange(max_len).float(), inv_freq)  # (max_len, hd/2)
    angles = torch.cat([angles, angles], dim=-1)  # (max_len, hd)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (a, b) = (x_i, x_{i+hd/2}) by its angle:
    (a, b) -> (a cos - b sin, b cos + a sin). x (B, H, T, hd), cos and sin (B, 1, T, hd)."""
    a, b = x.chunk(2, dim=-1)  # (B, H, T, hd/2) each
    rotated_half = torch.cat([-b, a], dim=-1)  # (B, H, T, hd)
    return x * cos + rotated_half * sin


class Attention(nn.Module):
    """Causal multi-head self-attention (Vaswani et al. 2017) with RoPE on q and k."""

    def __init__(self, config: GPTMiniConfig) -> None:
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        D = config.dim
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        B, T, _ = t.shape
        return t.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)

    def forward(self, x, cos, sin, allowed, layer, kv_cache):
        B, T, D = x.shape
        q, k, v = self.heads(self.q_proj(x)), self.heads(self.k_proj(x)), self.heads(self.v_proj(x))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # (B, H, T, hd)
        if kv_cache is not None:
            k, v = kv_cache.write(layer, k, v)  # (B, H, S, hd)
        # softmax(q k^T / sqrt(hd)) v in one fused kernel, never materialising a float mask.
        if allowed is None:  # training fast path: plain causal, no mask tensor at all
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, H, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))  # (B, T, D)


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020, https://arxiv.org/abs/2002.05202): down(silu(gate x) * up x)."""

    def __init__(self, config: GPTMiniConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.up_proj = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.down_proj = nn.Linear(config.hidden_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: GPTMiniConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, allowed, layer, kv_cache):
        # Pre-norm: the residual stream x is never normalised, only what each branch reads.
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, allowed, layer, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """The `model.` prefix of Llama's state dict: embeddings, blocks, final norm."""

    def __init__(self, config: GPTMiniConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)


def default_position_ids(attention_mask: torch.Tensor, T_past: int) -> torch.Tensor:
    """Each new token's index among the real tokens of its row, (B, T) from a mask
    (B, T_past + T); padding gets 0. E.g. mask [0 0 1 1 1] -> positions [0 0 0 1 2].
    RoPE only sees relative distances, so shifting a whole row by its pad count would
    change its logits only by rounding; counting real tokens anyway gives a padded prompt
    exactly the angles of the unpadded one, the convention transformers' `generate` uses."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, T_past:]  # (B, T)


def attention_allowed(attention_mask: torch.Tensor | None, T: int, T_past: int,
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """Which keys each query may attend to: bool (B or 1, 1, T, S), True = attend.
    Query t sits at index T_past + t of the key sequence; it sees earlier keys that are
    real tokens, and always itself, so a padding query never has an empty row (softmax
    over nothing is 0/0 = NaN in a plain softmax). A real query already sees itself, so
    this changes no real row."""
    S = T_past + T
    q_idx = torch.arange(T_past, S, device=device).unsqueeze(1)  # (T, 1)
    k_idx = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    allowed = (k_idx <= q_idx)[None, None]  # (1, 1, T, S), causal
    if attention_mask is not None:
        is_real = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        allowed = (allowed & is_real) | (k_idx == q_idx)[None, None]  # (B, 1, T, S)
    return allowed


class GPTMini(nn.Module):
    # the dtype the roles autocast its forward passes to; float32 weights either way (models/device.py)
    compute_dtype: torch.dtype = torch.float32
    rope_cos: torch.Tensor  # (max_seq_len, hd) buffers, registered in __init__: declared for the type checker
    rope_sin: torch.Tensor

    def __init__(self, config: GPTMiniConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rope_tables(config.head_dim, config.max_seq_len, config.rope_theta)
        # Not persistent: derived from the config, and absent from a Llama state dict.
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq_len, hd)
        self.register_buffer("rope_sin", sin, persistent=False)  # (max_seq_len, hd)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                continue  # RMSNorm gains start at 1
            std = 0.02  # Llama's initializer_range
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                # GPT-2 (Radford et al. 2019, sec. 2.3): the projections that write into the
                # residual stream get 1/sqrt(2 * n_layer), so its variance stays flat in depth.
                std /= math.sqrt(2 * config.n_layer)
            nn.init.normal_(p, mean=0.0, std=std)
        self.gradient_checkpointing = False  # model.gradient_checkpointing; see gradient_checkpointing_enable

    def gradient_checkpointing_enable(self) -> None:
        """Keep only each block's input during a training forward pass and recompute the
        block's insides in backward: activation memory per block drops from everything
        attention and the MLP save to one (B, T, D) tensor, for about one more forward pass
        of compute (Chen et al. 2016, https://arxiv.org/abs/1604.06174). The gradients are
        the same (tests/test_gradient_checkpointing.py). Named as transformers names it, so
        HFPolicy offers the same switch."""
        self.gradient_checkpointing = True

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        """An empty KV cache for sampling; HFPolicy.new_cache has the same signature, so the
        rollout role never names a cache class."""
        # on the model's device, in the dtype its forward passes write (bf16 under autocast: half the memory)
        return KVCache.empty(self.config, batch_size, max_len, dtype=self.compute_dtype,
                             device=self.lm_head.weight.device)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # a tied matrix is counted once

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      position_ids: torch.Tensor | None = None,
                      kv_cache: KVCache | None = None) -> torch.Tensor:
        """Final-norm hidden states (B, T, D) for input_ids (B, T).

        attention_mask (B, T_past + T): 1 = real token, 0 = padding (float, int or bool).
        position_ids (B, T): by default `default_position_ids(attention_mask)`, or
            T_past + t when there is no mask.
        kv_cache: keys/values of the T_past earlier positions; this call appends to it.
        With neither mask nor cache (training on right-padded rows) attention is plain
        causal, and a real token never sees the padding after it."""
        B, T = input_ids.shape
        T_past = 0 if kv_cache is None else kv_cache.length
        S = T_past + T
        limit = self.config.max_seq_len if kv_cache is None else kv_cache.max_len
        if S > limit:
            raise ValueError(
                f"{S} positions (T_past={T_past} + T={T}) exceed the limit {limit} "
                "(config.max_seq_len, or the KVCache's max_len); shorten the prompt or "
                "max_new_tokens, or build a model with a larger max_seq_len"
            )
        if attention_mask is not None and tuple(attention_mask.shape) != (B, S):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, expected "
                f"(B, T_past + T) = ({B}, {S}): it must cover the cached positions too"
            )
        explicit = position_ids is not None
        if position_ids is None and attention_mask is not None:
            position_ids = default_position_ids(attention_mask, T_past)  # (B, T)
        elif position_ids is None:
            position_ids = torch.arange(T_past, S, device=input_ids.device).expand(B, T)
        # only a batch wider than the RoPE tables can reach past them (a cache may hold more
        # columns than positions, see KVCache.empty); checked only then, to spare a device sync
        if (explicit or S > self.config.max_seq_len) and position_ids.max() >= self.config.max_seq_len:
            raise ValueError(
                f"position_ids reach {int(position_ids.max())}, but the RoPE tables end at "
                f"max_seq_len - 1 = {self.config.max_seq_len - 1}"
            )
        x = self.model.embed_tokens(input_ids)  # (B, T, D)
        cos = self.rope_cos[position_ids].unsqueeze(1).to(x.dtype)  # (B, 1, T, hd)
        sin = self.rope_sin[position_ids].unsqueeze(1).to(x.dtype)  # (B, 1, T, hd)
        allowed = None
        if attention_mask is not None or kv_cache is not None:
            allowed = attention_allowed(attention_mask, T, T_past, device=x.device)
        # Only a training pass that will run backward is checkpointed; not one that fills a KV
        # cache (sampling, the shared-prompt pass), since the recompute would write it twice.
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled() and kv_cache is None
        for i, block in enumerate(self.model.layers):
            if recompute:
                x = checkpoint(block, x, cos, sin, allowed, i, None, use_reentrant=False)  # (B, T, D)
            else:
                x = block(x, cos, sin, allowed, i, kv_cache)  # (B, T, D)
        if kv_cache is not None:
            kv_cache.advance(T)
        return self.model.norm(x)  # (B, T, D)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                kv_cache: KVCache | None = None) -> torch.Tensor:
        """Next-token logits (B, T, V); arguments as in `hidden_states`."""
        h = self.hidden_states(input_ids, attention_mask, position_ids, kv_cache)  # (B, T, D)
        return self.lm_head(h)  # (B, T, V)

    # ---- checkpoints: a transformers Llama directory (plumbing) --------------------------

    def save_pretrained(self, directory: str | os.PathLike, tokenizer: Tokenizer | None = None) -> None:
        """Write config.json and model.safetensors (and the tokenizer's files) that both
        `GPTMini.from_pretrained` and `transformers.LlamaForCausalLM.from_pretrained` read."""
        from safetensors.torch import save as safetensors_bytes

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        if self.config.tie_embeddings:
            del tensors["lm_head.weight"]  # the embedding matrix itself; Llama omits it too
        weights = safetensors_bytes(tensors, metadata={"format": "pt"})
        write_atomic(directory / "model.safetensors", weights)
        if tokenizer is not None:
            tokenizer.save(directory)
        # config.json last, so a first save that is interrupted leaves no loadable config.
        llama = llama_config(self.config, tokenizer)
        write_atomic(directory / "config.json", json.dumps(llama, indent=2) + "\n")

    @classmethod
    def from_pretrained(
        cls, directory: str | os.PathLike, expected_config: GPTMiniConfig | None = None
    ) -> GPTMini:
        """Load a directory written by `save_pretrained` (or by transformers, for a Llama
        with plain multi-head attention). With `expected_config`, refuse a checkpoint whose
        config differs in any field (not only shapes: a different rope_theta or norm_eps
        would silently change the function), listing every difference."""
        from safetensors.torch import load_file

        directory = Path(directory)
        config = read_llama_config(directory)
        if expected_config is not None:
            check_same_config(config, expected_config, directory)
        weights = directory / "model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"{weights} not found: {directory} has a config but no weights")
        try:
            state_dict = load_file(weights)
        except Exception as e:  # safetensors has its own error types for a truncated file
            raise ValueError(f"cannot read {weights} ({e}): the file is corrupt; re-save it") from e
        model = cls(config)
        load_state_dict_checked(model, state_dict, source=str(weights))
        return model


def load_state_dict_checked(model: GPTMini, state_dict: dict, source: str) -> None:
    """`model.load_state_dict(state_dict)`, but every missing, unexpected or mis-shaped
    tensor is reported at once as `name: checkpoint=X, expected=Y`, not torch's first error."""
    state_dict = dict(state_dict)
    tied = model.config.tie_embeddings and "lm_head.weight" not in state_dict
    if tied and "model.embed_tokens.weight" in state_dict:
        state_dict["lm_head.weight"] = state_dict["model.embed_tokens.weight"]  # one matrix
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state_dict.items()}
    diffs = {
        k: (found.get(k, "missing"), expected.get(k, "absent"))
        for k in list(expected) + [k for k in found if k not in expected]
        if found.get(k, "missing") != expected.get(k, "absent")
    }
    if diffs:
        raise CheckpointMismatchError(
            f"the weights in {source} do not fit GPTMini({model.config}):\n"
            + mismatch_lines(diffs)
            + "\nBuild the model from the checkpoint's own config "
            "(GPTMini.from_pretrained without expected_config) or retrain with this config."
        )
    model.load_state_dict(state_dict)
