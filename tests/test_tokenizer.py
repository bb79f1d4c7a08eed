"""CharTokenizer: exact round trips, and the same ids/decodes from transformers'
AutoTokenizer on the saved files (an independent implementation of the same spec)."""

import json

import pytest

from posttrain.models.tokenizer import CharTokenizer
from posttrain.roles.engines.contract import encode_prompt

STRINGS = [
    "Final: -42",
    "7+5=12,12+9=21,21+0=21\nFinal: 21",
    "  two leading spaces, two trailing  ",
    "tabs\tand\r\nwindows newlines",  # \t and \r are not in the vocabulary -> <unk>
    "0123456789 !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "héllo wörld → 😀",  # unicode -> <unk>
    "<eos> typed as text is five characters",
    "",
]


def test_vocabulary_layout():
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.vocab_size == 4 + 1 + 95 == 100
    assert tok.encode("\n") == [4]
    assert tok.encode(" ~") == [5, 99]  # ASCII 32 is id 5, ASCII 126 is id 99
    assert tok.encode("Final: -42") == [ord(c) - 32 + 5 for c in "Final: -42"]


@pytest.mark.parametrize("text", [s for s in STRINGS if s.isascii() and "\t" not in s])
def test_round_trip_on_in_vocabulary_text(text):
    tok = CharTokenizer()
    ids = tok.encode(text)
    assert len(ids) == len(text)  # one token per character, nothing added
    assert tok.decode(ids) == text


def test_unknown_characters_become_unk():
    tok = CharTokenizer()
    ids = tok.encode("aé😀\tb")
    assert ids == [tok.encode("a")[0], 3, 3, 3, tok.encode("b")[0]]
    assert tok.decode(ids) == "ab"  # <unk> is special: dropped when skipping
    assert tok.decode(ids, skip_special_tokens=False) == "a<unk><unk><unk>b"


def test_decode_skips_or_shows_special_tokens():
    tok = CharTokenizer()
    ids = [tok.bos_id] + tok.encode("hi") + [tok.eos_id, tok.pad_id]
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special_tokens=False) == "<bos>hi<eos><pad>"
    with pytest.raises(ValueError, match="token id 100 is outside the vocabulary"):
        tok.decode([100])


def test_save_load_round_trip_and_rejects_other_tokenizers(tmp_path):
    tok = CharTokenizer()
    tok.save(tmp_path)
    assert CharTokenizer.load(tmp_path).stoi == tok.stoi
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    spec["model"]["vocab"]["a"], spec["model"]["vocab"]["b"] = spec["model"]["vocab"]["b"], spec["model"]["vocab"]["a"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="is not a CharTokenizer"):
        CharTokenizer.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="no tokenizer at"):
        CharTokenizer.load(tmp_path / "missing")


def test_transformers_autotokenizer_agrees(tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = CharTokenizer()
    tok.save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert hf.is_fast
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id, hf.unk_token_id) == (0, 1, 2, 3)
    assert len(hf) == tok.vocab_size
    for text in STRINGS:
        ids = tok.encode(text)
        # add_special_tokens=True (the default) adds nothing: no <bos>, no <eos>.
        assert hf(text)["input_ids"] == ids, text
        assert hf.encode(text, add_special_tokens=False) == ids, text
        for skip in (True, False):
            assert hf.decode(ids, skip_special_tokens=skip) == tok.decode(ids, skip_special_tokens=skip)
    with_specials = [tok.bos_id] + tok.encode("a b") + [tok.eos_id, tok.pad_id]
    assert hf.decode(with_specials, skip_special_tokens=True) == "a b"
    assert hf.decode(with_specials, skip_special_tokens=False) == "<bos>a b<eos><pad>"


def test_transformers_left_pads_batches_with_pad_id(tmp_path):
    transformers = pytest.importorskip("transformers")
    CharTokenizer().save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    batch = hf(["ab", "abcd"], padding=True)
    assert batch["input_ids"][0][:2] == [0, 0]
    assert batch["attention_mask"] == [[0, 0, 1, 1], [1, 1, 1, 1]]


@pytest.mark.parametrize("prompt", ["", "Q: 17*19\n", "system: Add.\nuser: Q: 3+3\nassistant: ", "naïve <eos>"])
def test_prompt_ids_are_bos_then_the_prompts_characters(prompt):
    """The layout every gpt_mini prompt is sampled from (roles/engines/contract.py::encode_prompt):
    <bos>, then the prompt's characters. A conversation's turns are not rendered (there is no
    chat template): its plain text, which Example.prompt holds, is what the model reads."""
    tok = CharTokenizer()
    turns = [{"role": "system", "content": "Add."}, {"role": "user", "content": "Q: 3+3"}]
    for messages in (None, [], turns):
        assert tok.prompt_ids(prompt, messages) == [tok.bos_id] + tok.encode(prompt)
        assert encode_prompt(tok, prompt, messages) == [tok.bos_id] + tok.encode(prompt)
