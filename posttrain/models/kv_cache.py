"""KVCache: the keys and values a gpt_mini sampler keeps between decoding steps."""

from __future__ import annotations

import torch

from .gpt_mini_config import GPTMiniConfig


class KVCache:
    """Keys and values of every layer for the positions already processed, preallocated
    so that decoding a token writes in place instead of concatenating (which would copy
    the whole cache every step). `length` is how many positions are filled."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        self.keys, self.values = keys, values  # n_layer tensors, each (B, H, max_len, hd)
        self.length = 0

    @classmethod
    def empty(
        cls,
        config: GPTMiniConfig,
        batch_size: int,
        max_len: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        """An unfilled cache for `max_len` columns (default: config.max_seq_len). A column is
        not a position: a left-padded row's positions start at its first real token (they
        come from the attention mask), so a batch mixing a long row with a short budget and a
        short row with a long one may need more columns than the model has positions, while
        every row's positions stay below config.max_seq_len (hidden_states checks that)."""
        max_len = config.max_seq_len if max_len is None else max_len
        if max_len < 1:
            raise ValueError(f"KVCache max_len={max_len}: must be at least 1")
        shape = (batch_size, config.n_head, max_len, config.head_dim)
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layer)]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layer)]
        return cls(keys, values)

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store this call's k, v (B, H, T, hd) after the filled positions and return views
        of all keys and values so far, each (B, H, length + T, hd). `length` moves on in
        `advance`, once every layer has written."""
        start, end = self.length, self.length + k.shape[2]
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only these rows (the sampler drops rows that have finished); the name and
        meaning are transformers' Cache method of the same name, so one call serves both."""
        self.keys = [k[indices] for k in self.keys]
        self.values = [v[indices] for v in self.values]

