"""Tests for the Bradley–Terry reward model: the loss by hand, the head reading the last
real token, held-out accuracy on the bundled sentiment pairs after a short training run,
and the scorer's verifier contract on any string."""

import math
import time

import pytest
import torch

from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.rewards.reward_model import (
    RewardModel,
    RewardModelScorer,
    bt_loss,
    collate_texts,
    pairwise_accuracy,
    train_reward_model,
)
from posttrain.data.sentiment_pairs import sentiment_pairs
from posttrain.types import Example


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_bt_loss_by_hand():
    # r_c − r_r = 1: −log σ(1) = log(1 + e^−1) = 0.313262; equal rewards: log 2
    assert bt_loss(torch.tensor([1.0]), torch.tensor([0.0])).item() == pytest.approx(0.313262, abs=1e-6)
    assert bt_loss(torch.tensor([2.0, -1.0]), torch.tensor([2.0, -1.0])).item() == pytest.approx(math.log(2))
    # a margin m = 1 demands the gap before the loss drops: gap 1 − 1 = 0 -> log 2
    assert bt_loss(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([1.0])).item() == pytest.approx(math.log(2))
    # only the difference matters (rewards are defined up to a constant)
    assert bt_loss(torch.tensor([11.0]), torch.tensor([10.0])).item() == pytest.approx(0.313262, abs=1e-6)


def test_reward_reads_the_last_real_token_and_ignores_padding():
    torch.manual_seed(0)
    rm = RewardModel(GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=1, n_head=2, hidden_dim=64, max_seq_len=32)))
    torch.nn.init.normal_(rm.head.weight)  # a non-zero head, so rewards differ
    seqs = [[1, 40, 41, 42, 2], [1, 50, 2]]
    tokens, lengths = collate_texts(seqs, pad_id=0)
    assert lengths.tolist() == [5, 3]
    with torch.no_grad():
        r = rm(tokens, lengths)  # (2,)
        alone = rm(torch.tensor([seqs[1]]), torch.tensor([3]))  # the short row without padding
        garbage = tokens.clone()
        garbage[1, 3:] = 77  # what sits in the padding
        assert r[1].item() == pytest.approx(alone.item(), abs=1e-5)
        assert torch.allclose(rm(garbage, lengths), r, atol=1e-6)
        # and a fresh model scores everything 0 (zero-initialised head): the first loss is log 2
        fresh = RewardModel(rm.body)
        assert fresh(tokens, lengths).abs().max().item() == 0.0


def test_mean_pooling_averages_the_real_tokens_and_ignores_padding(tmp_path):
    from posttrain.rewards.reward_model import load_reward_model, save_reward_model

    torch.manual_seed(0)
    rm = RewardModel(GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=1, n_head=2, hidden_dim=64, max_seq_len=32)),
                     pooling="mean")
    torch.nn.init.normal_(rm.head.weight)
    seqs = [[1, 40, 41, 42, 2], [1, 50, 2]]
    tokens, lengths = collate_texts(seqs, pad_id=0)
    with torch.no_grad():
        r = rm(tokens, lengths)  # (2,)
        for b, s in enumerate(seqs):  # loop: the head on every real position's hidden state, averaged
            h = rm.body.hidden_states(torch.tensor([s]))[0]  # (len, D)
            assert r[b].item() == pytest.approx(rm.head(h).mean().item(), abs=1e-5)
        garbage = tokens.clone()
        garbage[1, 3:] = 77
        assert torch.allclose(rm(garbage, lengths), r, atol=1e-6)
        last = RewardModel(rm.body)  # the same body and head, reading the last token instead
        last.head.load_state_dict(rm.head.state_dict())
        assert (last(tokens, lengths) - r).abs().min() > 1e-3
    # the pooling travels with the saved model
    loaded, _ = load_reward_model(save_reward_model(rm, tmp_path / "rm"))
    assert loaded.pooling == "mean" and torch.allclose(loaded(tokens, lengths), r, atol=1e-6)
    with pytest.raises(ValueError, match=r"pooling='max' is invalid; allowed: \('last', 'mean', 'loglik'\)"):
        RewardModel(rm.body, pooling="max")


def test_loglik_reward_is_the_bodys_mean_token_log_likelihood(tmp_path):
    from posttrain.models.logprobs import token_logp
    from posttrain.rewards.reward_model import load_reward_model, save_reward_model

    torch.manual_seed(0)
    body = GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=1, n_head=2, hidden_dim=64, max_seq_len=32))
    rm = RewardModel(body, pooling="loglik")  # starts at a = 1, b = 0: r = mean log π_body
    seqs = [[1, 40, 41, 42, 2], [1, 50, 2]]
    tokens, lengths = collate_texts(seqs, pad_id=0)
    with torch.no_grad():
        r = rm(tokens, lengths)  # (2,)
        for b, s in enumerate(seqs):  # loop: log π of every token after <bos>, averaged
            logp = token_logp(body(torch.tensor([s])), torch.tensor([s]))[0, 1:]  # (len − 1,)
            assert r[b].item() == pytest.approx(logp.mean().item(), abs=1e-5)
        garbage = tokens.clone()
        garbage[1, 3:] = 77
        assert torch.allclose(rm(garbage, lengths), r, atol=1e-6)  # padding never counts
        rm.head.weight.fill_(2.0)
        rm.head.bias.fill_(0.5)
        assert torch.allclose(rm(tokens, lengths), 2.0 * r + 0.5)  # the head is a · loglik + b
    loaded, _ = load_reward_model(save_reward_model(rm, tmp_path / "rm"))
    assert loaded.pooling == "loglik" and torch.allclose(loaded(tokens, lengths), 2.0 * r + 0.5, atol=1e-6)


@pytest.fixture(scope="module")
def trained():
    train = sentiment_pairs(3000, seed=0)
    # CPU time, not wall time: other jobs on a shared machine slow the clock, not the work
    start = time.process_time()
    model, history = train_reward_model(train, seed=0)  # 250 steps of 16 pairs, ~0.02M params
    return model, history, time.process_time() - start, train


def test_reward_model_learns_sentiment_preferences_held_out(trained):
    # Measured: held-out pairwise accuracy 0.79-0.80 for seeds 0, 1, 2, in 7-14 s of one CPU
    # core. Chance is 0.5; we assert 0.7.
    model, history, seconds, train = trained
    heldout = sentiment_pairs(300, seed=1, split="heldout")
    accuracy = pairwise_accuracy(model, heldout)
    assert accuracy > 0.7, accuracy
    assert seconds < 20, seconds
    assert history[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # zero head: every pair a tie
    assert sum(h["loss"] for h in history[-50:]) / 50 < 0.55
    # centred: the mean reward over the training responses is ~0 after training
    scorer = RewardModelScorer(model)
    rewards = [scorer.score(Example(p.prompt, ""), text)["reward"]
               for p in train[:200] for text in (p.chosen, p.rejected)]
    assert abs(sum(rewards) / len(rewards)) < 0.5


def test_scorer_follows_the_verifier_contract_on_any_string(trained):
    scorer = RewardModelScorer(trained[0])
    ex = Example("Review the soup:\n", "")
    for completion in ["", "The soup was tasty.", "x" * 100_000, "\x00\ud800\U0001F600", "<eos><pad>", "\n" * 500]:
        result = scorer.score(ex, completion)
        assert set(result) == {"reward", "details"}
        assert isinstance(result["reward"], float) and math.isfinite(result["reward"])
        assert result["details"]["source"] == "reward_model"
        assert result == scorer.score(ex, completion)  # deterministic
    assert scorer.score(ex, "x" * 100_000)["details"]["truncated"] is True
    assert scorer.score(ex, "The soup was tasty.")["details"]["truncated"] is False
    # it ranks the way it was trained to
    assert scorer.score(ex, "The soup was wonderful.")["reward"] > scorer.score(ex, "The soup was horrible.")["reward"]
    with pytest.raises(TypeError, match="must be a str"):
        scorer.score(ex, None)


def test_a_transformers_model_is_a_reward_model_body_that_saves_and_scores(tmp_path):
    """The same Bradley–Terry recipe on a local transformers model: train, save, load back
    as a transformers body, and score through the verifier contract (with its tokenizer)."""
    from posttrain.models.hf import HFPolicy
    from posttrain.rewards.reward_model import load_reward_model, reward_of, save_reward_model
    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.rewards.proxy import ProxyReward

    torch.manual_seed(0)
    GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=2, n_head=4, hidden_dim=64, max_seq_len=64)).save_pretrained(
        tmp_path / "llama", CharTokenizer())  # a tiny Llama directory, read back only by transformers
    body, tokenizer = HFPolicy.load(tmp_path / "llama")
    train = sentiment_pairs(400, seed=0)
    model, history = train_reward_model(train, RewardModel.from_policy(body, "last"), tokenizer, steps=60, lr=3e-3)
    assert isinstance(model.body, HFPolicy) and history[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert pairwise_accuracy(model, train, tokenizer) > 0.7  # chance 0.5: the transformers body learned

    directory = save_reward_model(model, tmp_path / "rm", tokenizer, {"heldout_accuracy": 0.0})
    loaded, _ = load_reward_model(directory)
    assert isinstance(loaded.body, HFPolicy)
    texts = [p.chosen for p in train[:8]]
    expected = reward_of(model, tokenizer, [train[0].prompt] * 8, texts)
    torch.testing.assert_close(reward_of(loaded, tokenizer, [train[0].prompt] * 8, texts), expected, atol=1e-5, rtol=0)
    proxy = ProxyReward.load(directory, lambda example, completion: {"reward": 0.0, "details": {}})
    scored = [proxy(Example(train[0].prompt, ""), t)["reward"] for t in texts]
    assert scored == pytest.approx(expected.tolist(), abs=1e-5)  # loaded with the tokenizer saved beside it
