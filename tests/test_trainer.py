"""The trainer: masked positions cannot change a loss, accumulation equals the full batch,
and one update moves the policy the way the advantage says."""

import dataclasses

import pytest
import torch

from posttrain.algorithms import make_algorithm
from posttrain.algorithms.core import LOSS_AGG_MODES, micro_batch_share
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.value_head import ValueHead
from posttrain.roles.trainer import Trainer, sft_loss, warmup_cosine
from posttrain.types import Episode, Example, RolloutBatch


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=2, n_head=2, hidden_dim=64, max_seq_len=64))


def random_batch(seed=0, B=6, group_size=3):
    g = torch.Generator().manual_seed(seed)
    episodes = []
    for b in range(B):
        P = int(torch.randint(2, 6, (1,), generator=g))
        R = int(torch.randint(1, 8, (1,), generator=g))
        episodes.append(Episode(example=Example("p", "1"), group_id=b // group_size,
                                prompt_ids=torch.randint(5, 100, (P,), generator=g).tolist(),
                                response_ids=torch.randint(5, 100, (R,), generator=g).tolist(),
                                response_logp=(-torch.rand(R, generator=g) * 3).tolist(),
                                reward=float(torch.randint(0, 2, (1,), generator=g))))
    return RolloutBatch.collate(episodes, pad_id=0)


def loss_and_grads(model, batch, loss_fn):
    model.zero_grad()
    trainer = Trainer(model, lr=1e-3, total_steps=1)
    loss, _ = loss_fn(trainer.forward(batch), batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def perturb_masked(batch, seed=1):
    """Change every value the loss must ignore: padding tokens, and old_logp/advantages
    at prompt and padding positions."""
    g = torch.Generator().manual_seed(seed)
    off_response = batch.response_mask == 0
    padding = batch.attention_mask == 0
    tokens = torch.where(padding, torch.randint(5, 100, batch.tokens.shape, generator=g), batch.tokens)
    old_logp = torch.where(off_response, torch.randn(batch.tokens.shape, generator=g) * 50, batch.old_logp)
    advantages = torch.where(off_response, torch.randn(batch.tokens.shape, generator=g) * 50, batch.advantages)
    return dataclasses.replace(batch, tokens=tokens, old_logp=old_logp, advantages=advantages)


def test_masked_positions_cannot_change_any_loss():
    algo = make_algorithm("grpo")
    batch = random_batch()
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    assert (batch.attention_mask == 0).any()  # the batch really has padding to perturb
    for loss_fn in (sft_loss, algo.compute_loss):
        model = tiny_model()
        loss, grads = loss_and_grads(model, batch, loss_fn)
        loss2, grads2 = loss_and_grads(model, perturb_masked(batch), loss_fn)
        assert loss.abs() > 0
        assert torch.equal(loss, loss2)
        for a, b in zip(grads, grads2):
            torch.testing.assert_close(a, b, atol=1e-7, rtol=0)


def accumulated_gradient(batch, loss, micro_batch_size):
    """The gradient one optimizer step used: Trainer._step leaves it in .grad (no clipping)."""
    model = tiny_model()
    Trainer(model, lr=1e-3, total_steps=1, micro_batch_size=micro_batch_size, grad_clip=0).update(batch, loss)
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def scored_batch(algo, B=8):
    batch = random_batch(B=B, group_size=4)  # response lengths 1..7: token and row shares differ
    batch = dataclasses.replace(batch, ref_logp=batch.old_logp - 0.1)  # a live KL term
    return dataclasses.replace(batch, **algo.compute_advantages(batch))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_give_the_whole_batch_gradient_for_every_loss_mode(mode):
    # GRPO with a KL term and an entropy bonus, aggregated with `mode`: every term of the loss
    algo = make_algorithm("grpo", loss_agg=mode, kl_coef=0.04, entropy_coef=0.01, budget=16)
    batch = scored_batch(algo)
    whole = accumulated_gradient(batch, algo, 0)
    assert whole.abs().max() > 1e-4
    for size in (1, 4):
        torch.testing.assert_close(accumulated_gradient(batch, algo, size), whole, atol=1e-6, rtol=0)


def test_micro_batches_are_exact_for_ppo_and_sft_too():
    ppo = make_algorithm("ppo", budget=16)  # token-mean policy and value losses
    for loss in (ppo, sft_loss):
        batch = random_batch(B=8)
        if loss is ppo:
            batch = dataclasses.replace(batch, values=torch.zeros_like(batch.old_logp))
            batch = dataclasses.replace(batch, **ppo.compute_advantages(batch))
        grads = {}
        for size in (0, 1, 4):
            model = tiny_model()
            torch.manual_seed(1)  # the same critic each time
            critic = ValueHead(32) if loss is ppo else None
            Trainer(model, lr=1e-3, total_steps=1, micro_batch_size=size, grad_clip=0, critic=critic).update(batch, loss)
            grads[size] = torch.cat([p.grad.flatten() for p in model.parameters()])
        for size in (1, 4):
            torch.testing.assert_close(grads[size], grads[0], atol=1e-6, rtol=0)


def test_weighting_token_mean_by_rows_would_be_wrong(monkeypatch):
    """The tests above can fail: weight a token-mean loss's micro-batches by their share of
    the rows (what the trainer did before) and single-row micro-batches give another gradient."""
    from posttrain.roles import trainer as trainer_module

    algo = make_algorithm("grpo", loss_agg="token-mean")
    batch = scored_batch(algo)
    assert micro_batch_share("token-mean", batch.response_mask[:1], batch.response_mask) == pytest.approx(
        batch.response_mask[0].sum().item() / batch.response_mask.sum().item())
    whole = accumulated_gradient(batch, algo, 0)
    monkeypatch.setattr(trainer_module, "micro_batch_share", lambda mode, micro, full: micro.shape[0] / full.shape[0])
    by_rows = accumulated_gradient(batch, algo, 1)
    assert (by_rows - whole).abs().max() > 1e-4


def test_one_update_follows_the_advantage():
    """Rewarded completions become more likely, unrewarded ones less likely."""
    algo = make_algorithm("grpo")
    batch = random_batch(B=4, group_size=4)
    batch.rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    model = tiny_model()
    trainer = Trainer(model, lr=1e-2, total_steps=1, grad_clip=0)
    with torch.no_grad():
        logp = trainer.forward(batch).logp * batch.response_mask  # (B, T)
    before = logp.sum(1)  # log-prob of each whole completion
    batch = dataclasses.replace(batch, old_logp=logp)  # on-policy: ratio 1 at the first step
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    trainer.update(batch, algo)
    with torch.no_grad():
        after = (trainer.forward(batch).logp * batch.response_mask).sum(1)
    change = after - before
    assert (change[[0, 2]] > 0).all() and (change[[1, 3]] < 0).all(), change


def test_warmup_then_cosine():
    m = warmup_cosine(warmup_steps=4, total_steps=14, final_fraction=0.1)
    assert [m(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert abs(m(9) - (0.1 + 0.9 * 0.5)) < 1e-9  # halfway through the decay: cos(π/2) = 0
    assert abs(m(14) - 0.1) < 1e-9 and abs(m(100) - 0.1) < 1e-9


def test_the_schedule_end_and_beta2_are_settings():
    """rl.optim.final_lr_fraction ends the cosine decay (1 = constant after warmup) and
    rl.optim.adam_beta2 is AdamW's second-moment decay; both reach the optimizer."""
    model, batch = tiny_model(), scored_batch(make_algorithm("grpo"))
    constant = Trainer(model, lr=1e-3, total_steps=4, warmup_steps=1, final_lr_fraction=1.0, adam_beta2=0.999)
    lrs = [constant.update(batch, make_algorithm("grpo"))["lr"] for _ in range(4)]
    assert lrs == pytest.approx([1e-3] * 4)
    assert constant.optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    decayed = Trainer(tiny_model(), lr=1e-3, total_steps=4, warmup_steps=1)
    assert [decayed.update(batch, make_algorithm("grpo"))["lr"] for _ in range(4)][-1] == pytest.approx(1e-4)


def test_a_negative_setting_is_refused_with_its_value():
    for setting in ("micro_batch_size", "warmup_steps", "grad_clip"):
        with pytest.raises(ValueError, match=f"{setting}=-1.*must be >= 0"):
            Trainer(tiny_model(), lr=1e-3, total_steps=1, **{setting: -1})
