"""The rollout role: old_logp captured while sampling equals a fresh teacher-forced pass."""

import copy

import pytest
import torch

from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.roles.rollout import RolloutEngine, sample_next_token
from posttrain.config import SamplingParams
from posttrain.roles.trainer import Trainer
from posttrain.types import Example, RolloutBatch

TOK = CharTokenizer()


class RaiseLikelihood:
    """A loss for tests of the sampler: push up the log-probability of every sampled token."""

    loss_agg = "seq-mean-token-sum"

    def compute_loss(self, outputs, batch):
        return -(outputs.logp * batch.response_mask).sum(), {}


RAISE_LIKELIHOOD = RaiseLikelihood()


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=64, max_seq_len=64))


def examples():
    # prompts of different lengths, so the sampler has to left-pad
    return [Example("Q: 1+2\n", "3", "a"), Example("Q: 10+20+30\n", "60", "b"), Example("Q: 7\n", "7", "c")]


def test_old_logp_matches_teacher_forced_forward():
    for temperature in (1.0, 0.7):
        model = tiny_model()
        engine = RolloutEngine(copy.deepcopy(model), TOK, SamplingParams(temperature=temperature, max_new_tokens=20))
        episodes = engine.generate(examples(), samples_per_prompt=4, generator=torch.Generator().manual_seed(1))
        batch = RolloutBatch.collate(episodes, TOK.pad_id, temperature=temperature)
        trainer = Trainer(model, lr=1e-3, total_steps=1)
        with torch.no_grad():
            logp = trainer.forward(batch).logp * batch.response_mask
        assert batch.response_mask.sum() > 20  # something was sampled
        torch.testing.assert_close(logp, batch.old_logp, atol=1e-5, rtol=0)


def test_groups_and_stop_token():
    model = tiny_model()
    engine = RolloutEngine(model, TOK, SamplingParams(max_new_tokens=30))
    episodes = engine.generate(examples(), samples_per_prompt=3, generator=torch.Generator().manual_seed(0))
    assert [e.group_id for e in episodes] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [e.example.id for e in episodes[::3]] == ["a", "b", "c"]
    for e in episodes:
        assert len(e.response_ids) == len(e.response_logp) <= 30
        assert TOK.eos_id not in e.response_ids[:-1]  # sampling stops at the first EOS
        assert e.finished == (e.response_ids[-1] == TOK.eos_id)
        assert e.completion == TOK.decode([t for t in e.response_ids if t != TOK.eos_id])


def test_sampling_is_reproducible_with_a_generator():
    engine = RolloutEngine(tiny_model(), TOK, SamplingParams(max_new_tokens=16))
    a = engine.generate(examples(), 2, torch.Generator().manual_seed(5))
    b = engine.generate(examples(), 2, torch.Generator().manual_seed(5))
    assert [e.response_ids for e in a] == [e.response_ids for e in b]


def test_greedy_picks_argmax_and_top_p_truncates():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    token, logp = sample_next_token(logits, SamplingParams(temperature=0.0), None)
    assert token.item() == 1
    assert abs(logp.item() - torch.log_softmax(logits, -1)[0, 1].item()) < 1e-6
    # probabilities ≈ [0.09, 0.66, 0.24, 0.03]: top_p=0.5 leaves only token 1
    tokens = {sample_next_token(logits, SamplingParams(top_p=0.5), torch.Generator().manual_seed(s))[0].item() for s in range(50)}
    assert tokens == {1}


def test_shared_engine_samples_the_trainers_weights_without_a_copy():
    """Colocated, the engine reads the trainer's own parameters: after an optimizer step
    it samples from the new weights with no copy, and sampling leaves training mode and
    requires_grad as the trainer set them."""
    from posttrain.roles.weight_sync import InProcessWeightSync, SharedWeights

    policy = tiny_model()
    shared = RolloutEngine(policy, TOK, SamplingParams(max_new_tokens=12), shares_weights=True)
    sync = SharedWeights(policy, shared)
    trainer = Trainer(policy, lr=1e-2, total_steps=1)
    policy.train()
    episodes = shared.generate(examples(), 2, torch.Generator().manual_seed(3))
    assert policy.training and all(p.requires_grad for p in policy.parameters())
    assert {e.weight_version for e in episodes} == {0}

    batch = RolloutBatch.collate(episodes, TOK.pad_id)
    trainer.update(batch, RAISE_LIKELIHOOD)
    assert sync.push() == 1
    # a separate copy synced the old way samples exactly what the shared engine now samples
    copied = RolloutEngine(copy.deepcopy(tiny_model()), TOK, SamplingParams(max_new_tokens=12))
    InProcessWeightSync(policy, copied).push()
    a = shared.generate(examples(), 2, torch.Generator().manual_seed(4))
    b = copied.generate(examples(), 2, torch.Generator().manual_seed(4))
    assert [e.response_ids for e in a] == [e.response_ids for e in b]
    assert {e.weight_version for e in a} == {1}
    # and they differ from what the weights before the step sample
    before = RolloutEngine(tiny_model(), TOK, SamplingParams(max_new_tokens=12))
    c = before.generate(examples(), 2, torch.Generator().manual_seed(4))
    assert [e.response_logp for e in a] != [e.response_logp for e in c]


def test_shared_weights_refuses_an_engine_with_its_own_copy():
    from posttrain.roles.weight_sync import SharedWeights

    policy = tiny_model()
    engine = RolloutEngine(copy.deepcopy(policy), TOK, SamplingParams())
    with pytest.raises(ValueError, match="InProcessWeightSync"):
        SharedWeights(policy, engine)


def test_compiled_decode_samples_the_current_weights_with_exact_old_logp():
    """`SamplingParams(compile=True)`: old_logp still equals a teacher-forced pass, and
    after an optimizer step on the shared module the compiled sampler follows the new
    weights (parameters are inputs of the compiled graph, not baked-in constants)."""
    policy = tiny_model()
    params = SamplingParams(max_new_tokens=10, compile=True)
    engine = RolloutEngine(policy, TOK, params, shares_weights=True)
    trainer = Trainer(policy, lr=1e-2, total_steps=2)
    for step in range(2):
        episodes = engine.generate(examples(), 2, torch.Generator().manual_seed(step))
        batch = RolloutBatch.collate(episodes, TOK.pad_id)
        with torch.no_grad():
            logp = trainer.forward(batch).logp * batch.response_mask
        torch.testing.assert_close(logp, batch.old_logp, atol=1e-5, rtol=0)
        eager = RolloutEngine(copy.deepcopy(policy), TOK, SamplingParams(max_new_tokens=10))
        reference = eager.generate(examples(), 2, torch.Generator().manual_seed(step))
        assert [e.response_ids for e in episodes] == [e.response_ids for e in reference]
        trainer.update(batch, RAISE_LIKELIHOOD)


def test_a_large_call_decodes_in_batches_of_whole_groups_with_the_same_episodes(monkeypatch):
    many = [Example(f"Q: {i}+{i}\n", str(2 * i), f"e{i}") for i in range(7)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    whole = RolloutEngine(tiny_model(), TOK, greedy).generate(many, samples_per_prompt=3)

    engine = RolloutEngine(tiny_model(), TOK, greedy)
    engine.max_rows = 7  # two groups of 3 per batch: 7 examples -> batches of 2, 2, 2, 1
    batch_rows = []
    decode = engine._generate
    monkeypatch.setattr(engine, "_generate", lambda ex, k, *a, **kw: batch_rows.append(len(ex) * k) or decode(ex, k, *a, **kw))
    split = engine.generate(many, samples_per_prompt=3)

    assert batch_rows == [6, 6, 6, 3]
    assert [e.group_id for e in split] == [i for i in range(7) for _ in range(3)]  # indices into `many`, not the batch
    assert [e.example.id for e in split] == [e.example.id for e in whole]
    assert [e.response_ids for e in split] == [e.response_ids for e in whole]  # greedy: batching changes nothing
