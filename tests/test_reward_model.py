"""Tests for the Bradley–Terry reward model: the loss by hand, the head reading the last
real token, held-out accuracy on the bundled sentiment pairs after a short training run,
and the scorer's verifier contract on any string."""

import dataclasses
import io
import math
import time

import pytest
import torch

from posttrain.config import ConfigError, RewardModelConfig
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.rewards.reward_model import (
    RewardModel,
    RewardModelScorer,
    bt_loss,
    collate_texts,
    encode_for_reward,
    pairwise_accuracy,
    reward_of,
)
from posttrain.rewards.reward_model_training import (
    BradleyTerryLoss,
    PairBatch,
    pair_batches,
    reward_model_trainer,
    shuffled_batches,
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


# --- training through the one Trainer: today's numbers, micro-batches, exact resume ------


def tiny_body(seed: int) -> GPTMini:
    torch.manual_seed(seed)
    return GPTMini(GPTMiniConfig(vocab_size=CharTokenizer().vocab_size, dim=16, n_layer=1, n_head=2, hidden_dim=32,
                                 max_seq_len=96))


def gapped_pairs(n: int) -> list:
    """Sentiment pairs with a margin in pair.meta["gap"] (0, 0.5 or 1), so the margin path runs too."""
    return [dataclasses.replace(p, meta={**p.meta, "gap": (i % 3) * 0.5})
            for i, p in enumerate(sentiment_pairs(n, seed=0))]


def plain_adamw_loop(pairs, model, tokenizer, steps, lr, batch_size, margin_key, seed):
    """train_reward_model as it was before it trained through the Trainer, its own AdamW
    loop line for line: the reference today's defaults have to reproduce."""
    torch.manual_seed(seed)
    max_len = model.config.max_seq_len
    chosen = [encode_for_reward(tokenizer, p.prompt, p.chosen, max_len)[0] for p in pairs]
    rejected = [encode_for_reward(tokenizer, p.prompt, p.rejected, max_len)[0] for p in pairs]
    margins = torch.tensor([float(p.meta[margin_key]) for p in pairs]) if margin_key else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    batches = shuffled_batches(len(pairs), batch_size, seed)
    losses = []
    model.train()
    for _ in range(steps):
        idx = next(batches)
        tokens, lengths = collate_texts([chosen[i] for i in idx] + [rejected[i] for i in idx], tokenizer.pad_id)
        r = model(tokens, lengths)
        r_c, r_r = r[: len(idx)], r[len(idx) :]
        loss = bt_loss(r_c, r_r, margins[idx] if margins is not None else None)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    mean_reward = reward_of(model, tokenizer, [p.prompt for p in pairs] * 2,
                            [p.chosen for p in pairs] + [p.rejected for p in pairs]).mean()
    with torch.no_grad():
        model.head.bias -= mean_reward
    return losses


@pytest.mark.parametrize("pooling", ["last", "loglik"])
def test_the_trainer_reproduces_the_plain_adamw_loop_bit_for_bit(pooling):
    pairs, tokenizer = gapped_pairs(40), CharTokenizer()
    settings = dict(steps=12, lr=3e-3, batch_size=8, margin_key="gap", seed=3)
    reference = RewardModel(tiny_body(0), pooling)
    losses = plain_adamw_loop(pairs, reference, tokenizer, **settings)
    model, history = train_reward_model(pairs, RewardModel(tiny_body(0), pooling), tokenizer, **settings)
    assert [h["loss"] for h in history] == losses and losses[-1] < losses[0]
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name
    assert {h["lr"] for h in history} == {3e-3}  # constant: no warmup, no decay


def bt_gradient(batch: PairBatch, micro_batch_size: int, pooling: str) -> torch.Tensor:
    """The gradient of one Trainer.step (clipping off), left in .grad."""
    model = RewardModel(tiny_body(0), pooling)
    torch.nn.init.normal_(model.head.weight, std=0.3)  # a live head: every parameter gets a gradient
    reward_model_trainer(model, 1e-3, 1, micro_batch_size).step(batch, BradleyTerryLoss())
    # (the body's LM head has no gradient unless the readout is "loglik")
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("pooling", ["last", "mean", "loglik"])
def test_micro_batches_give_the_whole_batch_gradient(pooling):
    # each micro-batch is padded to its own longest text: padding must not matter either
    batch = next(pair_batches(gapped_pairs(16), CharTokenizer(), 96, batch_size=7, seed=0, margin_key="gap"))
    whole = bt_gradient(batch, 0, pooling)
    scale = whole.abs().max()
    assert scale > 1e-3
    for size in (1, 3):  # to float32 rounding: other shapes sum in another order
        torch.testing.assert_close(bt_gradient(batch, size, pooling), whole, atol=1e-4 * scale, rtol=0)


def test_a_resumed_reward_model_training_ends_with_the_uninterrupted_weights():
    pairs, N, k = gapped_pairs(40), 9, 4
    # warmup, clipping and micro-batches all on: the moments, the schedule's position and the step count must resume
    settings = dict(lr=3e-3, steps=N, micro_batch_size=3, warmup_steps=6, grad_clip=0.05)
    loss = BradleyTerryLoss()

    def batches():  # the same seed, the same batches
        return pair_batches(pairs, CharTokenizer(), 96, batch_size=8, seed=5, margin_key="gap")

    straight = RewardModel(tiny_body(0))
    history = reward_model_trainer(straight, **settings).fit(batches(), loss, N)
    assert max(h["grad_norm"] for h in history) > 0.05  # clipping acted

    first = RewardModel(tiny_body(0))
    trainer = reward_model_trainer(first, **settings)
    trainer.fit(batches(), loss, k)
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "trainer": trainer.state_dict()}, buffer)

    def resume(with_trainer_state: bool) -> tuple[RewardModel, list]:
        model = RewardModel(tiny_body(1))  # other weights: what it ends with comes from the checkpoint
        fresh = reward_model_trainer(model, **settings)
        buffer.seek(0)
        saved = torch.load(buffer, weights_only=True)
        model.load_state_dict(saved["model"])
        if with_trainer_state:
            fresh.load_state_dict(saved["trainer"])
        rest = batches()
        for _ in range(k):  # the batches the first k steps trained on
            next(rest)
        return model, fresh.fit(rest, loss, N - k)

    resumed, tail = resume(True)
    assert [h["lr"] for h in tail] == [h["lr"] for h in history[k:]]  # still warming up at step k
    assert [h["loss"] for h in tail] == [h["loss"] for h in history[k:]]
    for (name, a), b in zip(resumed.state_dict().items(), straight.state_dict().values()):
        assert torch.equal(a, b), name
    # the test can fail: with fresh moments and the warmup started over, the weights differ
    restarted, _ = resume(False)
    assert not all(torch.equal(a, b) for a, b in zip(restarted.parameters(), straight.parameters()))


def test_the_reward_model_settings_reach_the_trainer():
    pairs = gapped_pairs(16)
    model, history = train_reward_model(pairs, RewardModel(tiny_body(0)), steps=3, lr=1e-3, batch_size=8,
                                        micro_batch_size=4, warmup_steps=4, grad_clip=1e-4)
    # linear warmup over 4 steps; each step logs the rate of the next one, as Trainer.update does
    assert [h["lr"] for h in history] == pytest.approx([5e-4, 7.5e-4, 1e-3])
    assert min(h["grad_norm"] for h in history) > 1e-4  # every step was clipped
    with pytest.raises(ConfigError, match="rl.rm.micro_batch_size"):
        RewardModelConfig(micro_batch_size=-1).validate()
