"""A character-level tokenizer: one token per character, no merges, no surprises.

Why characters? The synthetic tasks (arithmetic with a running-sum chain of thought, the
strict `Final: <int>` answer line) are short ASCII strings. With one token per character a
learner can read every action the policy took, a digit is always one token, and the whole
vocabulary is 100 entries, so the embedding and output layers stay tiny.

Vocabulary, fixed and in this order:

    0 <pad>   1 <bos>   2 <eos>   3 <unk>   4 "\\n"   5.. the printable ASCII chars 32..126

`save` writes the same vocabulary as a Hugging Face `tokenizers` file, so
`transformers.AutoTokenizer.from_pretrained(directory)` gives a fast tokenizer that encodes
and decodes exactly like this class (tests/test_tokenizer.py checks it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from posttrain.files import write_atomic

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]  # newline, then space .. "~"
VOCAB = SPECIAL_TOKENS + CHARS  # index in this list = token id


class CharTokenizer:
    """Maps each character to one id. `encode` never adds special tokens; the caller
    decides where `<bos>`/`<eos>` go (the rollout role appends `<eos>` as the stop token)."""

    def __init__(self) -> None:
        self.itos: list[str] = list(VOCAB)
        self.stoi: dict[str, int] = {s: i for i, s in enumerate(self.itos)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3
        self.vocab_size = len(self.itos)
        self.special_ids = frozenset(range(len(SPECIAL_TOKENS)))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"

    def encode(self, text: str) -> list[int]:
        """One id per character; characters outside the vocabulary become `unk_id`.
        The text "<eos>" is five characters, not the special token: specials are ids
        the code inserts, never something a string can smuggle in."""
        # Hot path (thousands of short strings per sampling step): a bound dict lookup
        # per character is the fastest pure-Python way.
        get, unk = self.stoi.get, self.unk_id
        return [get(ch, unk) for ch in text]

    def prompt_ids(self, prompt: str, messages: list[dict[str, str]] | None = None) -> list[int]:
        """`[<bos>] + encode(prompt)`: the layout gpt_mini is trained and sampled on. It has
        no chat template, so a conversation's `messages` are not rendered: `prompt`, their
        plain text (envs/dataset_files.py::plain_prompt), is what it reads."""
        return [self.bos_id] + self.encode(prompt)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Inverse of `encode` on in-vocabulary text. `ids` may be a list or a 1-D tensor.
        With `skip_special_tokens`, ids 0..3 (pad, bos, eos, unk) are dropped; otherwise
        they appear as their names, e.g. "<eos>"."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        itos, n = self.itos, self.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= n):  # min/max run in C: cheap on the hot path
            bad = next(i for i in ids if not 0 <= i < n)
            raise ValueError(
                f"token id {bad} is outside the vocabulary [0, {n}); "
                "was it produced by a model with a different vocab_size?"
            )
        if skip_special_tokens:
            special = self.special_ids
            return "".join([itos[i] for i in ids if i not in special])
        return "".join([itos[i] for i in ids])

    # ---- Hugging Face format (plumbing) -------------------------------------------------

    def to_hf_json(self) -> dict:
        """The `tokenizer.json` a `tokenizers.Tokenizer` reads: a WordLevel model over
        single characters, a pre-tokenizer that isolates every character, and a `Fuse`
        decoder that joins tokens without inserting spaces."""
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel(vocab=dict(self.stoi), unk_token="<unk>"))
        # [\s\S] matches any single character, newline included ("." would skip "\n").
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        # special=True makes `decode(..., skip_special_tokens=True)` drop them, as ours does.
        tok.add_special_tokens(list(SPECIAL_TOKENS))
        return json.loads(tok.to_str())

    def save(self, directory: str | os.PathLike) -> None:
        """Write `tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        names = dict(pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **names,
            # Like `encode` above: `add_special_tokens=True` must not prepend <bos> or
            # append <eos> behind the caller's back.
            "add_bos_token": False,
            "add_eos_token": False,
            # Otherwise transformers would "clean up" spaces before punctuation on decode.
            "clean_up_tokenization_spaces": False,
            # A literal "<eos>" in text stays five characters, matching `encode`.
            "split_special_tokens": True,
            "model_max_length": 1_000_000,  # no limit of its own; the model has max_seq_len
            "padding_side": "left",  # the sampler left-pads prompts
            "posttrain_tokenizer": "char",
        }
        spec = json.dumps(self.to_hf_json(), ensure_ascii=False)
        write_atomic(directory / "tokenizer.json", spec)
        write_atomic(directory / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
        write_atomic(directory / "special_tokens_map.json", json.dumps(names, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | os.PathLike) -> CharTokenizer:
        """Read a directory written by `save`, checking it really holds this vocabulary."""
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"no tokenizer at {path}: expected a directory written by CharTokenizer.save"
            )
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
            model_type, vocab = spec["model"]["type"], spec["model"]["vocab"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a readable tokenizers file ({e!r}); re-save it") from e
        tok = cls()
        if model_type != "WordLevel" or vocab != tok.stoi:
            got = len(vocab) if isinstance(vocab, dict) else type(vocab).__name__
            raise ValueError(
                f"{path} is not a CharTokenizer: expected a WordLevel model with the "
                f"{tok.vocab_size}-entry character vocabulary, got a {model_type} model with "
                f"vocabulary size {got}. Load other tokenizers with "
                "transformers.AutoTokenizer.from_pretrained instead."
            )
        return tok
