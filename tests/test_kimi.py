"""Kimi k1.5's squared loss (algorithms/kimi.py): by hand, its gradient against the report's
Eq. 3 and against REINFORCE's, the direction it pulls, and what it refuses."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posttrain.algorithms import make_algorithm
from posttrain.algorithms.kimi import Kimi, kimi_loss
from posttrain.algorithms.reinforce import REINFORCE
from posttrain.types import PolicyOutputs, RolloutBatch


def two_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp, old_logp, adv, mask): row 0 has 2 response tokens and A = 0.5, row 1 one token
    (then padding, whose log-prob must not count) and A = −0.5."""
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    old_logp = torch.tensor([[0.0, -0.7, -0.8], [0.0, -2.0, 0.0]])
    logp = torch.tensor([[0.0, -0.5, -0.4], [0.0, -2.5, -9.0]])  # row 1's last position is padding
    adv = torch.tensor([[0.0, 0.5, 0.5], [0.0, -0.5, 0.0]])
    return logp, old_logp, adv, mask


def test_kimi_loss_by_hand():
    logp, old_logp, adv, mask = two_rows()
    # ℓ_0 = (−0.5 + 0.7) + (−0.4 + 0.8) = 0.6;  ℓ_1 = −2.5 + 2.0 = −0.5 (padding ignored)
    # τ = 0.1: row 0: −0.5·0.6 + 0.05·0.36 = −0.3 + 0.018 = −0.282
    #          row 1: −(−0.5)(−0.5) + 0.05·0.25 = −0.25 + 0.0125 = −0.2375;  mean −0.25975
    loss, metrics = kimi_loss(logp, old_logp, adv, mask, tau=0.1)
    assert loss.item() == pytest.approx(-0.25975, abs=1e-6)
    assert metrics["pg_loss"] == pytest.approx((-0.3 - 0.25) / 2, abs=1e-6)
    assert metrics["sq_loss"] == pytest.approx((0.018 + 0.0125) / 2, abs=1e-6)
    assert metrics["seq_log_ratio"] == pytest.approx(0.05, abs=1e-6)
    assert metrics["seq_log_ratio_abs"] == pytest.approx(0.55, abs=1e-6)
    # it is the report's square (A − τℓ)² / (2τ) less its constant A² / (2τ)
    square = ((0.5 - 0.1 * 0.6) ** 2 + (-0.5 + 0.1 * 0.5) ** 2) / (2 * 0.1)
    constant = (0.25 + 0.25) / (2 * 0.1)
    assert loss.item() == pytest.approx((square - constant) / 2, abs=1e-6)


def test_the_gradient_is_the_reports_eq_3():
    """d loss / d logp_t = (−A + τ ℓ) / B on every response token of the row (Eq. 3 negated:
    −A ∇log π + τ/2 ∇ℓ²), and 0 on padding and prompt."""
    logp, old_logp, adv, mask = two_rows()
    logp = logp.clone().requires_grad_(True)
    kimi_loss(logp, old_logp, adv, mask, tau=0.1)[0].backward()
    expected = torch.tensor([[0.0, (-0.5 + 0.1 * 0.6) / 2, (-0.5 + 0.1 * 0.6) / 2],
                             [0.0, (0.5 + 0.1 * -0.5) / 2, 0.0]])
    torch.testing.assert_close(logp.grad, expected)


def test_at_the_sampling_policy_the_gradient_is_reinforce_with_the_group_mean_baseline():
    """ℓ = 0 when π_θ = π_old: the first gradient of a batch is REINFORCE's exactly, whatever τ."""
    batch = group_batch()
    kimi, reinforce = Kimi(tau=0.3), REINFORCE(baseline="group_mean", loss_agg="seq-mean-token-sum")
    grads = []
    for algo in (kimi, reinforce):
        scored = dataclasses.replace(batch, **algo.compute_advantages(batch))
        logp = batch.old_logp.clone().requires_grad_(True)
        algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros_like(logp)), scored)[0].backward()
        grads.append(logp.grad)
    torch.testing.assert_close(grads[0], grads[1])
    assert grads[0].abs().sum() > 0


def test_the_square_pulls_a_moved_sequence_back_to_pi_old_whatever_its_advantage():
    """A row whose advantage is 0 but whose log-prob has risen (ℓ > 0): the gradient of the
    loss is positive on its tokens, so a descent step lowers its log-prob back towards π_old;
    fallen (ℓ < 0), it is raised. With A > 0 and ℓ short of A/τ the row is still pushed up."""
    mask = torch.tensor([[1.0, 1.0]])
    old = torch.tensor([[-1.0, -1.0]])
    for shift, sign in ((0.2, 1.0), (-0.2, -1.0)):
        logp = (old + shift).requires_grad_(True)
        kimi_loss(logp, old, torch.zeros(1, 2), mask, tau=0.5)[0].backward()
        assert (torch.sign(logp.grad) == sign).all()
        assert logp.grad[0, 0].item() == pytest.approx(0.5 * 2 * shift)  # τ ℓ, ℓ = 2 · shift
    logp = (old + 0.2).requires_grad_(True)  # ℓ = 0.4 < A / τ = 1 / 0.5 = 2
    kimi_loss(logp, old, torch.ones(1, 2), mask, tau=0.5)[0].backward()
    assert (logp.grad < 0).all()  # descent raises it further
    logp = (old + 1.5).requires_grad_(True)  # ℓ = 3 > A / τ = 2: overshot, pulled back
    kimi_loss(logp, old, torch.ones(1, 2), mask, tau=0.5)[0].backward()
    assert (logp.grad > 0).all()


def test_one_descent_step_on_a_categorical_policy_moves_towards_the_optimum_l_equals_a_over_tau():
    """Minimising (A − τℓ)² over ℓ directly: repeated steps on one sampled token converge to
    ℓ = A / τ, the mirror-descent optimum log(π*/π_old) for that sample."""
    logit = torch.zeros(3, requires_grad=True)
    old = torch.log_softmax(logit.detach(), -1)[1]
    opt = torch.optim.SGD([logit], lr=0.5)
    for _ in range(400):
        opt.zero_grad()
        logp = torch.log_softmax(logit, -1)[1]
        loss, _ = kimi_loss(torch.stack([logp])[None], old.reshape(1, 1), torch.tensor([[0.4]]), torch.ones(1, 1), 1.0)
        loss.backward()
        opt.step()
    ell = (torch.log_softmax(logit.detach(), -1)[1] - old).item()
    assert ell == pytest.approx(0.4, abs=1e-3)


def test_kimi_declares_zero_advantage_rows_not_inert():
    algo = make_algorithm("kimi")
    assert not algo.zero_advantage_rows_are_inert and algo.needs_groups and not algo.accepts_turn_rows
    batch = dataclasses.replace(group_batch(), rewards=torch.ones(6))  # every group flat: A = 0 everywhere
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    assert batch.advantages.abs().sum() == 0
    assert algo.rows_with_gradient(batch) is None  # nothing may be left out...
    logp = (batch.old_logp + 0.1 * batch.response_mask).requires_grad_(True)
    algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros_like(logp)), batch)[0].backward()
    assert logp.grad.abs().sum() > 0  # ...because these rows do pull once π has moved


@pytest.mark.parametrize("params, field", [({"tau": 0.0}, "tau"), ({"tau": -1.0}, "tau"),
                                           ({"loss_agg": "token-mean"}, "loss_agg"),
                                           ({"baseline": "running_mean"}, "baseline")])
def test_bad_settings_are_refused_naming_the_field(params, field):
    with pytest.raises(ValueError) as err:
        make_algorithm("kimi", **params)
    assert f"Kimi.{field}=" in str(err.value)


def group_batch() -> RolloutBatch:
    """Two groups of three, mixed rewards, ragged responses."""
    g = torch.Generator().manual_seed(0)
    B, T = 6, 7
    response_mask = torch.zeros(B, T)
    for b in range(B):
        response_mask[b, 2: 2 + 2 + b % 4] = 1
    old_logp = torch.where(response_mask > 0, -torch.rand(B, T, generator=g) * 2, 0.0)
    return RolloutBatch(tokens=torch.randint(0, 10, (B, T), generator=g), attention_mask=torch.ones(B, T),
                        response_mask=response_mask, old_logp=old_logp,
                        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0]), group_ids=torch.arange(B) // 3)


def test_a_short_run_trains_with_it_and_the_square_acts_from_the_second_minibatch(tmp_path):
    import json

    from posttrain.cli import main
    from tests.test_pipeline import TINY

    assert main(["train", *TINY, "--algo", "kimi", "--kimi.tau", "0.1", "--rl.steps", "2", "--rl.update.minibatches", "2",
                 "--rl.sampling.temperature", "1.5", "--out_dir", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    rl = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [m for m in rl if m.get("stage") == "rl"]
    assert len(rl) == 2 and all(m["skipped_rows"] == 0.0 for m in rl)  # never left out
    # averaged over the two minibatches: the second one ran after the first step moved π
    assert any(m["seq_log_ratio_abs"] > 0 and m["sq_loss"] > 0 for m in rl)
