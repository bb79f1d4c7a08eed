"""The demos: their numbers, not just that they ran. Each assertion is a claim a demo's
conclusion line makes (probabilities follow the advantage's sign, a baseline cuts
variance, credit reaches the first action, the KL optimum has a closed form, near
misses score 0)."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from posttrain.teach.demos import DEMOS, bandit, kl_tradeoff, run_demo, tokens, two_step_mdp
from posttrain.models.tokenizer import CharTokenizer


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# --------------------------------------------------------------------------------------
# bandit
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("adv", [0.7, -0.7])
def test_bandit_probability_follows_the_sign_of_the_advantage(adv):
    theta = torch.tensor([[0.3, -0.2, 0.0, 0.5, -0.1]])  # (1, K)
    action = torch.tensor([2])
    new_theta, grad = bandit.reinforce_step(theta, action, torch.tensor([adv]), lr=0.5)
    pi, new_pi = torch.softmax(theta, -1)[0], torch.softmax(new_theta, -1)[0]
    # The loss gradient through policy_gradient_loss is −A · (onehot(a) − π), worked by hand.
    expected = -adv * (torch.eye(5)[2] - pi)
    torch.testing.assert_close(grad[0], expected)
    moved = new_pi - pi
    assert math.copysign(1, moved[2]) == math.copysign(1, adv)  # the sampled action follows A
    others = torch.tensor([0, 1, 3, 4])
    assert (torch.sign(moved[others]) == -math.copysign(1, adv)).all()  # everyone else the other way


def test_bandit_zero_advantage_changes_nothing():
    theta = torch.randn(1, 5, generator=torch.Generator().manual_seed(0))
    new_theta, _ = bandit.reinforce_step(theta, torch.tensor([1]), torch.tensor([0.0]), lr=1.0)
    torch.testing.assert_close(new_theta, theta)


def test_bandit_vectorised_rows_equal_one_learner_each():
    thetas = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    actions, advs = torch.tensor([0, 3, 3, 1]), torch.tensor([1.0, -0.5, 0.2, 0.0])
    batched, _ = bandit.reinforce_step(thetas, actions, advs, lr=0.3)
    for s in range(4):
        single, _ = bandit.reinforce_step(thetas[s : s + 1], actions[s : s + 1], advs[s : s + 1], lr=0.3)
        torch.testing.assert_close(batched[s], single[0])


@pytest.mark.parametrize("offset, min_ratio", [(0.0, 1.3), (1.0, 3.0)])
def test_bandit_baseline_lowers_gradient_variance(offset, min_ratio):
    # Measured with these settings: ratio ≈ 1.5 for 0/1 rewards, ≈ 4.3 with rewards 1/2
    # (the baseline cannot remove the coin-flip noise, only the offset from zero).
    probs = torch.tensor(bandit.DEFAULT_PROBS)
    curves = {b: bandit.run_learners(probs, 100, 100, 0.5, b, 0.9, seed=1, offset=offset) for b in bandit.BASELINES}
    var = {b: float(c["grad_var"].mean()) for b, c in curves.items()}
    assert var["none"] / var["running_mean"] > min_ratio
    for c in curves.values():
        # the autograd gradients' spread matches the exact variance (Monte Carlo, 10^4 samples)
        assert float(c["grad_var_sampled"].mean()) == pytest.approx(float(c["grad_var"].mean()), rel=0.1)
        # and both learn: P(best arm) climbs from 0.2
        assert float(c["p_best"][-1]) > 0.35
    # less noise, faster learning (measured P(best) 0.81 vs 0.73 with 0/1 rewards, 0.79 vs 0.41 with 1/2)
    assert float(curves["running_mean"]["p_best"][-1]) > float(curves["none"]["p_best"][-1])


def test_flipped_rewards_shrink_the_gradient_by_one_minus_two_epsilon():
    # by hand, two arms at the uniform policy: E g = Σ_a π(a) q(a) (onehot(a) − π)
    two = torch.tensor([0.2, 0.8])
    torch.testing.assert_close(bandit.flipped_probs(two, 0.25), torch.tensor([0.35, 0.65]))  # 0.25 + 0.5 p
    clean, _ = bandit.expected_grad_and_variance(torch.zeros(1, 2), two, torch.zeros(1))
    noisy, _ = bandit.expected_grad_and_variance(torch.zeros(1, 2), bandit.flipped_probs(two, 0.25), torch.zeros(1))
    torch.testing.assert_close(clean[0], torch.tensor([-0.15, 0.15]))
    torch.testing.assert_close(noisy[0], torch.tensor([-0.075, 0.075]))  # half: 1 − 2 × 0.25
    # flipping sampled rewards is the coin flipped_probs describes (10^5 draws per arm, within 5 standard errors)
    gen, n, flip = torch.Generator().manual_seed(0), 100_000, 0.3
    probs = torch.tensor(bandit.DEFAULT_PROBS)
    rewards = (torch.rand(n, 5, generator=gen) < probs).float()  # (n, K)
    flipped = torch.where(torch.rand(n, 5, generator=gen) < flip, 1 - rewards, rewards)
    assert (flipped.mean(0) - bandit.flipped_probs(probs, flip)).abs().max() < 5 * 0.5 / n**0.5
    # the five-arm bandit at a policy that is not uniform: the factor holds exactly, the variance hardly moves
    theta = torch.tensor([[0.4, 1.0, -0.3, 0.6, 0.0]])
    rows = bandit.reward_noise_table(theta, probs, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert [round(r["grad_ratio"], 5) for r in rows] == [1.0, 0.8, 0.6, 0.4, 0.2, 0.0]
    assert all(r["variance"] == pytest.approx(rows[0]["variance"], rel=0.15) for r in rows)
    assert [r["snr"] for r in rows] == sorted((r["snr"] for r in rows), reverse=True) and rows[-1]["snr"] < 1e-20
    with pytest.raises(ValueError, match="flip 1.5 is a probability"):
        bandit.flipped_probs(probs, 1.5)


def test_a_format_reward_rises_while_accuracy_falls():
    correct, formatted = torch.tensor(bandit.DEFAULT_PROBS), torch.tensor(bandit.FORMAT_PROBS)
    paid_format = bandit.paid_for(formatted, correct, runs=300, steps=60, lr=0.5, seed=0)
    paid_answer = bandit.paid_for(correct, correct, runs=300, steps=60, lr=0.5, seed=0)
    # from the uniform policy: format paid 0.74 of the time, accuracy 0.46 (the arms' means)
    assert float(paid_format["reward"][0]) == pytest.approx(0.74)
    assert float(paid_format["accuracy"][0]) == pytest.approx(0.46)
    # measured after 60 steps: format reward 0.91, accuracy 0.29; paid for the answer, accuracy 0.70
    assert float(paid_format["reward"][-1]) > 0.85 and float(paid_format["accuracy"][-1]) < 0.35
    assert float(paid_answer["accuracy"][-1]) > 0.6
    torch.testing.assert_close(paid_answer["reward"], paid_answer["accuracy"])


# --------------------------------------------------------------------------------------
# two-step MDP
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("baseline", two_step_mdp.BASELINES)
def test_two_step_best_first_action_rises(baseline):
    for seed in (0, 1, 2):
        curve = two_step_mdp.run_learner(baseline, steps=40, batch_size=16, lr=1.0, seed=seed)
        assert curve["p_best_first"][0] == pytest.approx(0.5)
        assert curve["p_best_first"][-1] > 0.8
        assert curve["p_follow_up"][-1] > 0.9


def test_two_step_return_credits_both_steps():
    policy, gen = two_step_mdp.TwoStepPolicy(), torch.Generator().manual_seed(0)
    algo = two_step_mdp.REINFORCE(baseline="none")
    batch, _ = two_step_mdp.train_step(policy, algo, 8, lr=0.0, gen=gen)
    expected_r = two_step_mdp.REWARD[batch.tokens[:, 0], batch.tokens[:, 1]]
    torch.testing.assert_close(batch.rewards, expected_r)
    # no baseline: A_1 = A_2 = G = the final reward, on the first action too
    torch.testing.assert_close(batch.advantages, expected_r[:, None].expand(-1, 2))


# --------------------------------------------------------------------------------------
# KL trade-off
# --------------------------------------------------------------------------------------


def test_kl_gradient_ascent_matches_closed_form_and_tradeoff_is_monotone():
    rewards = torch.tensor(kl_tradeoff.REWARDS)
    ref_logp = torch.log_softmax(torch.tensor(kl_tradeoff.REF_LOGITS), -1)
    rows = kl_tradeoff.sweep(rewards, ref_logp, list(kl_tradeoff.BETAS), lr=0.1, max_iters=3000, tol=1e-6)
    for r in rows:
        assert r["max_abs_diff"] < 1e-3, r
    by_beta = sorted(rows, key=lambda r: r["beta"])
    rewards_seq, kls = [r["mean_reward"] for r in by_beta], [r["kl"] for r in by_beta]
    assert all(a > b for a, b in zip(rewards_seq, rewards_seq[1:]))  # reward falls as β grows
    assert all(a > b for a, b in zip(kls, kls[1:]))  # and so does the KL


def test_kl_closed_form_limits():
    rewards = torch.tensor(kl_tradeoff.REWARDS)
    ref_logp = torch.log_softmax(torch.tensor(kl_tradeoff.REF_LOGITS), -1)
    torch.testing.assert_close(kl_tradeoff.closed_form_policy(rewards, ref_logp, 1e4), ref_logp.exp(), atol=1e-4, rtol=0)
    greedy = kl_tradeoff.closed_form_policy(rewards, ref_logp, 1e-3)
    assert int(greedy.argmax()) == int(rewards.argmax()) and float(greedy.max()) > 0.999
    assert float(kl_tradeoff.exact_kl(ref_logp, ref_logp)) == 0.0


# --------------------------------------------------------------------------------------
# tokens
# --------------------------------------------------------------------------------------


def test_tokens_near_misses_and_their_verdicts():
    rows = tokens.inspect(CharTokenizer(), tokens.NEAR_MISSES, "323")
    assert [r["reward"] for r in rows] == [1.0, 0.0, 0.0, 0.0]
    assert [r["reason"] for r in rows] == ["ok", "bad_spacing", "leading_zero", "extra_lines"]
    assert [r["n_tokens"] for r in rows] == [10, 11, 11, 10]  # one token per character
    assert rows[3]["pieces"][6] == "\n"


def test_tokens_autotokenizer_from_saved_chartokenizer_splits_identically(tmp_path):
    CharTokenizer().save(tmp_path)
    hf = tokens.load_tokenizer(str(tmp_path))
    assert not isinstance(hf, CharTokenizer)
    ours = CharTokenizer()
    for text in (*tokens.NEAR_MISSES, "7+5=12,12+9=21\nFinal: 21", "  Final: -3\n", "<eos>"):
        assert tokens.split(hf, text) == tokens.split(ours, text)


def test_tokens_missing_tokenizer_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        tokens.load_tokenizer(str(tmp_path / "nope"))


# --------------------------------------------------------------------------------------
# every demo writes its run directory
# --------------------------------------------------------------------------------------

SMALL = {
    "bandit": ["--steps", "20", "--runs", "8"],
    "two_step_mdp": ["--steps", "10", "--runs", "2"],
    "kl_tradeoff": ["--betas", "0.3,1,3", "--max-iters", "500"],
    "tokens": [],
    "gridworld_ppo": ["--no-slippery", "--threshold", "0.9", "--total-steps", "20000"],
    "sentiment_steering": ["--pretrain-steps", "20", "--steps", "2", "--betas", "1,0", "--eval-samples", "1",
                           "--max-new-tokens", "16"],
}


@pytest.mark.parametrize("name", list(DEMOS))
def test_demo_writes_run_directory(name, tmp_path, capsys):
    assert run_demo(name, ["--out-dir", str(tmp_path), "--seed", "3", *SMALL[name]]) == 0
    (run,) = tmp_path.iterdir()
    assert run.name.endswith(name)
    (csv_path,) = run.glob("*.csv")
    with open(csv_path, newline="") as f:
        table = list(csv.reader(f))
    assert len(table) > 1 and len({len(row) for row in table}) == 1  # header + rows, rectangular
    (png,) = run.glob("*.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (log,) = run.glob("*_log.txt")
    assert "Conclusion" in log.read_text()
    assert (run / "config.json").is_file() and (run / "meta.json").is_file()
    assert "Conclusion" in capsys.readouterr().out


def test_bandit_slow_mode_does_not_wait_without_a_terminal(tmp_path, capsys):
    # pytest's stdin is not a TTY: --slow must print the prediction prompt and go on.
    assert bandit.main(["--out-dir", str(tmp_path), "--slow", "--steps", "3", "--runs", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count("Predict: which probability should go up, and why?") == 3


def test_bandit_fast_mode_prints_one_line_per_step(tmp_path, capsys):
    assert bandit.main(["--out-dir", str(tmp_path), "--fast", "--steps", "7", "--runs", "4"]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("step ") for line in out.splitlines()) == 7


def test_unknown_demo_lists_the_valid_names():
    with pytest.raises(ValueError, match="bandit, two_step_mdp, kl_tradeoff, tokens"):
        run_demo("bandits", [])
