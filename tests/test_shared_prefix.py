"""Shared-prefix groups (posttrain/models/shared_prefix.py): each prompt computed once per
group gives the hidden states, log-probs and gradients of the plain forward (to 1e-5), for
gpt_mini and a transformers Llama (with and without LoRA); and the sampler's prefill once
per distinct prompt leaves its samples unchanged."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import copy

import pytest
import torch

from posttrain.config import SamplingParams
from posttrain.models import CharTokenizer, GPTMini, GPTMiniConfig, shared_prefix
from posttrain.models.logprobs import response_logp_and_entropy
from posttrain.models.shared_prefix import batch_hidden_states, prompt_groups
from posttrain.roles.engines import RolloutEngine
from posttrain.types import Example, RolloutBatch


@pytest.fixture(autouse=True)
def share_at_any_width(monkeypatch):
    """The test models are narrow; the equality holds at any width, so test it at theirs."""
    monkeypatch.setattr(shared_prefix, "MIN_WIDTH", 0)


PROMPTS = ["3+4+1+8+2=", "12*3=", "7+9+9+1+5+6=", "1+1="]


def grouped_batch(model, tokenizer, K=4, seed=0) -> RolloutBatch:
    """K sampled completions of prompts of different lengths, collated as the controller does."""
    engine = RolloutEngine(copy.deepcopy(model), tokenizer, SamplingParams(max_new_tokens=12))
    episodes = engine.generate([Example(prompt=p, expected_answer=0) for p in PROMPTS], K,
                               torch.Generator().manual_seed(seed))
    return RolloutBatch.collate(episodes, tokenizer.pad_id)


def gpt_mini():
    torch.manual_seed(0)
    return GPTMini(GPTMiniConfig(vocab_size=100, dim=64, n_layer=2, n_head=4, hidden_dim=128, max_seq_len=64))


def hidden_and_grads(model, batch, share):
    model.zero_grad()
    hidden = batch_hidden_states(model, batch, share_prompt=share)
    logp, entropy = response_logp_and_entropy(hidden, model.lm_head, batch.tokens, batch.response_mask)
    # a loss that weighs rows differently, so a wrong routing of gradients between rows shows
    weights = torch.linspace(-1, 2, len(batch.tokens))[:, None]
    ((logp * weights).sum() + 0.1 * entropy.sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return hidden.detach(), logp.detach(), grads


def assert_same_as_plain(model, batch):
    real = batch.attention_mask.bool()
    prompt_lengths = (batch.attention_mask.sum(1) - batch.response_mask.sum(1)).long()
    first_rows, _ = prompt_groups(batch.tokens, prompt_lengths, batch.group_ids)
    saved = shared_prefix.saved_fraction(prompt_lengths, first_rows, int(batch.attention_mask.sum()))
    assert saved >= shared_prefix.MIN_SAVED_FRACTION  # so the shared path is the one compared
    plain_hidden, plain_logp, plain_grads = hidden_and_grads(model, batch, share=False)
    shared_hidden, shared_logp, shared_grads = hidden_and_grads(model, batch, share=True)
    assert (plain_hidden[real] - shared_hidden[real]).abs().max() < 1e-5
    assert (plain_logp - shared_logp).abs().max() < 1e-5
    assert plain_grads.keys() == shared_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        assert (grad - shared_grads[name]).abs().max() < 1e-5 * max(1.0, grad.abs().max()), name


def test_gpt_mini_shared_prefix_equals_the_plain_forward_and_its_gradients(monkeypatch):
    model, tokenizer = gpt_mini(), CharTokenizer()
    batch = grouped_batch(model, tokenizer)
    calls = []
    monkeypatch.setattr(shared_prefix, "shared_prefix_hidden_states",
                        lambda *a: calls.append(1) or _shared(*a))
    assert_same_as_plain(model, batch)
    assert calls, "the shared path did not run"


_shared = shared_prefix.shared_prefix_hidden_states


def test_rows_in_any_order_and_a_group_of_one_share_correctly():
    model, tokenizer = gpt_mini(), CharTokenizer()
    batch = grouped_batch(model, tokenizer)
    order = torch.randperm(len(batch.tokens), generator=torch.Generator().manual_seed(1))
    shuffled = batch.select(order[:-3])  # one prompt now has a single row
    assert_same_as_plain(model, shuffled)


def test_nothing_is_shared_when_group_ids_disagree_with_the_tokens():
    tokens = torch.tensor([[1, 5, 6, 7], [1, 5, 9, 7], [1, 2, 3, 4]])
    lengths = torch.tensor([2, 2, 2])
    assert prompt_groups(tokens, lengths, torch.tensor([0, 0, 1])) is not None  # same prompt [1, 5]
    different = torch.tensor([[1, 5, 6, 7], [1, 4, 9, 7], [1, 2, 3, 4]])
    assert prompt_groups(different, lengths, torch.tensor([0, 0, 1])) is None
    assert prompt_groups(tokens, torch.tensor([2, 3, 2]), torch.tensor([0, 0, 1])) is None
    assert prompt_groups(tokens, lengths, torch.tensor([0, 1, 2])) is None  # nothing repeats


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from posttrain.models.hf import HFPolicy

    directory = tmp_path_factory.mktemp("tiny_llama")
    gpt_mini().save_pretrained(directory, CharTokenizer())
    return directory, HFPolicy


def test_transformers_llama_shared_prefix_equals_the_plain_forward(tiny_llama):
    directory, HFPolicy = tiny_llama
    policy = HFPolicy.from_pretrained(directory).train()
    assert_same_as_plain(policy, grouped_batch(policy, CharTokenizer()))


def test_transformers_llama_with_lora_shared_prefix_equals_the_plain_forward(tiny_llama):
    pytest.importorskip("peft")
    directory, HFPolicy = tiny_llama
    policy = HFPolicy.from_pretrained(directory)
    policy.add_lora(4)
    for name, p in policy.named_parameters():  # B = 0 at the start would hide A's gradient
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    policy.train()
    assert_same_as_plain(policy, grouped_batch(policy, CharTokenizer()))


def test_a_narrow_model_takes_the_plain_forward(monkeypatch):
    """Below MIN_WIDTH the copies cost more than the prompt FLOPs they save (shared_prefix.py):
    gpt_mini's default width 128 computes every prompt, as before sharing existed."""
    monkeypatch.setattr(shared_prefix, "MIN_WIDTH", 256)
    model, tokenizer = gpt_mini(), CharTokenizer()
    batch = grouped_batch(model, tokenizer)
    monkeypatch.setattr(shared_prefix, "shared_prefix_hidden_states", lambda *a: pytest.fail("shared path taken"))
    assert model.config.dim == 64
    batch_hidden_states(model, batch, share_prompt=True)
