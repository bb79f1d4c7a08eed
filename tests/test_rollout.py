"""The rollout role: old_logp captured while sampling equals a fresh teacher-forced pass."""

import copy

import pytest
import torch

from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.engines.torch_engine import sample_next_token
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


def assert_frequencies_match(tokens, probs, n_sigma=5.0):
    """Each token's empirical frequency within n_sigma binomial standard errors of its
    probability; a token of probability 0 never drawn."""
    n = tokens.numel()
    freq = torch.bincount(tokens, minlength=probs.numel()).double() / n
    probs = probs.double()
    tolerance = n_sigma * (probs * (1 - probs) / n).sqrt()
    assert (freq[probs == 0] == 0).all(), f"drew tokens of probability 0: {freq}"
    assert ((freq - probs).abs() <= tolerance).all(), f"frequencies {freq} vs probabilities {probs} (±{tolerance})"


ROWS = 200_000  # draws of one distribution, in one call: 5σ ≈ 5e-3 for a token of probability 0.35


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampled_frequencies_match_the_tempered_probabilities(temperature):
    probs = torch.tensor([0.02, 0.08, 0.10, 0.20, 0.25, 0.35])
    logits = probs.log().expand(ROWS, -1)  # (ROWS, 6)
    token, _ = sample_next_token(logits, SamplingParams(temperature=temperature), torch.Generator().manual_seed(0))
    tempered = probs ** (1 / temperature) / (probs ** (1 / temperature)).sum()  # softmax(log p / T), by hand
    assert_frequencies_match(token, tempered)


def test_top_p_draws_only_from_the_renormalised_nucleus():
    # sorted: 0.40 (token 1), 0.30 (3), 0.15 (4) reach 0.85 ≥ top_p = 0.8; 0.10 (0) and 0.05 (2) are cut
    probs = torch.tensor([0.10, 0.40, 0.05, 0.30, 0.15])
    logits = probs.log().expand(ROWS, -1)
    token, logp = sample_next_token(logits, SamplingParams(top_p=0.8), torch.Generator().manual_seed(0))
    nucleus = torch.tensor([0.0, 0.40, 0.0, 0.30, 0.15]) / 0.85
    assert_frequencies_match(token, nucleus)
    # the log-prob is the untruncated one, as the trainer recomputes it
    torch.testing.assert_close(logp, probs.log()[token])


@pytest.mark.parametrize("logits_row", [
    [0.0] + [-1e4] * 7,  # all mass on index 0 (the others underflow to probability 0)
    [-1e4] * 7 + [0.0],  # all mass on the last index
    [float("-inf")] * 3 + [1.5] + [float("-inf")] * 4,  # -inf logits except one
])
def test_a_certain_token_is_always_drawn(logits_row):
    logits = torch.tensor(logits_row).expand(10_000, -1)
    for top_p in (1.0, 0.5):
        token, logp = sample_next_token(logits, SamplingParams(top_p=top_p), torch.Generator().manual_seed(0))
        assert (token == torch.tensor(logits_row).argmax()).all()
        assert (logp == 0).all()


@pytest.mark.parametrize("u", [0.0, 1 - 2**-53, 1.0])
def test_zero_probability_tokens_are_never_drawn_at_the_ends_of_u(monkeypatch, u):
    """Feed the draw its extreme uniforms: u = 0, the largest double below 1, and u = 1
    (what u × total looks like when it rounds up to total). Rows have zero-probability
    tokens first, last, and between two positive ones, so a search that stops on a
    plateau of the CDF, runs off its end, or clamps to the last index would draw one."""
    rows = torch.tensor([
        [-1e4, -1e4, 0.0, -1e4],  # leading and trailing zeros
        [0.0, -1e4, -1e4, 0.0],  # a plateau in the middle
        [0.0, 0.0, -1e4, -1e4],  # zeros at the end
        [-1e4, -1e4, -1e4, 0.0],  # zeros, then all the mass on the last index
    ])
    first_positive, last_positive = torch.tensor([2, 0, 0, 3]), torch.tensor([2, 3, 1, 3])
    calls = []

    def fixed_uniform(n, **kwargs):
        calls.append(n)
        return torch.full((n,), u, dtype=kwargs.get("dtype", torch.float32))

    monkeypatch.setattr(torch, "rand", fixed_uniform)
    for top_p in (1.0, 0.99):
        token, _ = sample_next_token(rows, SamplingParams(top_p=top_p), None)
        probs = torch.softmax(rows, -1)
        assert (probs.gather(-1, token[:, None]) > 0).all(), f"u={u}, top_p={top_p}: drew {token.tolist()}"
        if top_p == 1.0:  # in vocabulary order, the ends of u are the first and last possible tokens
            assert token.tolist() == (first_positive if u == 0 else last_positive).tolist()
    assert calls == [4, 4]  # one uniform per row, drawn for all rows at once


def test_a_token_of_probability_2e_9_owns_its_slice_of_u(monkeypatch):
    """The draw resolves the tail: in float32 the 1 - 2e-9 of token 0 rounds to 1, the
    cumulative sum stays flat across token 1, and no float32 u lands in token 1's slice,
    so a float32 draw never picks it. In float64 it owns the top 2e-9 of u's range."""
    logits = torch.tensor([[0.0, -20.0]])  # probabilities (1 - 2.06e-9, 2.06e-9)
    for u, expected in ((1 - 1e-10, 1), (1 - 4e-9, 0)):
        monkeypatch.setattr(torch, "rand", lambda n, u=u, **kwargs: torch.full((n,), u, dtype=kwargs.get("dtype")))
        assert sample_next_token(logits, SamplingParams(), None)[0].item() == expected


def test_draws_are_reproducible_and_each_row_has_its_own_stream():
    logits = torch.randn(300, 50, generator=torch.Generator().manual_seed(0)) * 3
    params = SamplingParams(temperature=0.7, top_p=0.9)
    a, logp = sample_next_token(logits, params, torch.Generator().manual_seed(1))
    b, _ = sample_next_token(logits, params, torch.Generator().manual_seed(1))
    c, _ = sample_next_token(logits, params, torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    # the log-prob is log_softmax(logits / T) at the token, before top-p
    torch.testing.assert_close(logp, torch.log_softmax(logits / 0.7, -1).gather(-1, a[:, None]).squeeze(-1))
    # a row's token does not depend on the other rows' logits (the sampler feeds finished
    # rows dummy logits and relies on this)
    other_rows = logits.clone()
    other_rows[::2] = torch.randn(150, 50, generator=torch.Generator().manual_seed(3))
    d, _ = sample_next_token(other_rows, params, torch.Generator().manual_seed(1))
    assert torch.equal(a[1::2], d[1::2])


def test_nan_logits_are_refused():
    logits = torch.zeros(3, 5)
    logits[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"logit rows \[1\]"):
        sample_next_token(logits, SamplingParams(), torch.Generator().manual_seed(0))


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


# slow: torch.compile takes ~40 s; the eager sampler's exact old_logp is checked in make test
@pytest.mark.slow
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
