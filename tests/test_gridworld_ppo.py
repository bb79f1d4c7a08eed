"""PPO on FrozenLake (posttrain/teach/demos/gridworld_ppo.py): that episodes land in the (B, T)
layout the library's functions expect, that padding cannot reach the advantages, and that
PPO actually solves the lake: fast on the deterministic map, in full (slow) on the
slippery one with the demo's defaults."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gymnasium")

from posttrain.algorithms.ppo import gae, token_level_rewards  # noqa: E402
from posttrain.teach.demos import gridworld_ppo  # noqa: E402
from posttrain.teach.demos.gridworld_ppo import Agent, Config, collect_rollout, make_envs, train  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def rollout(cfg: Config):
    gen = torch.Generator().manual_seed(cfg.seed)
    envs = make_envs(cfg)
    agent = Agent(envs[0].observation_space.n, envs[0].action_space.n, cfg.hidden, gen)
    return collect_rollout(envs, agent, gen)


def test_episodes_become_rows_with_a_prefix_mask():
    r = rollout(Config(episodes_per_rollout=32, seed=5))
    B, T = r.mask.shape
    assert B == 32 and T <= 100  # trimmed to the longest episode, never past the time limit
    lengths = r.mask.sum(-1).long()  # (B,)
    assert int(lengths.max()) == T and bool((lengths >= 1).all())
    # Each row is one episode: ones for its steps, then zeros, like a response mask.
    expected = (torch.arange(T)[None] < lengths[:, None]).float()
    torch.testing.assert_close(r.mask, expected)
    assert bool((r.rewards[r.mask == 0] == 0).all())
    # FrozenLake pays only on the step that reaches the goal, the last one: so the
    # per-step rewards are exactly token_level_rewards' "sequence reward on the last token".
    returns = r.rewards.sum(-1)  # (B,)
    torch.testing.assert_close(r.rewards, token_level_rewards(returns, r.mask))


def test_gae_on_padded_rows_equals_each_episode_alone_and_ignores_padding():
    r = rollout(Config(episodes_per_rollout=16, seed=1))
    gamma, lam = 0.99, 0.95
    adv, ret = gae(r.rewards, r.values, r.mask, gamma, lam)
    # Loop version, one episode at a time over its real steps only (V = 0 after the end).
    for b in range(16):
        n = int(r.mask[b].sum())
        a, v_next, a_next = torch.zeros(n), 0.0, 0.0
        for t in reversed(range(n)):
            delta = float(r.rewards[b, t]) + gamma * v_next - float(r.values[b, t])
            a[t] = a_next = delta + gamma * lam * a_next
            v_next = float(r.values[b, t])
        torch.testing.assert_close(adv[b, :n], a)
        torch.testing.assert_close(ret[b, :n], a + r.values[b, :n])
    # Garbage in the padding (after an episode ended) changes nothing.
    pad = r.mask == 0
    junk_rewards = torch.where(pad, torch.full_like(r.rewards, 1e6), r.rewards)
    junk_values = torch.where(pad, torch.full_like(r.values, float("nan")), r.values)
    adv2, ret2 = gae(junk_rewards, junk_values, r.mask, gamma, lam)
    torch.testing.assert_close(adv2, adv)
    torch.testing.assert_close(ret2, ret)


def test_command_line_builds_the_config():
    cfg = gridworld_ppo.parse_args(["--no-slippery", "--lr", "0.01", "--total-steps", "500", "--seed", "7"])
    assert cfg == Config(slippery=False, lr=0.01, total_steps=500, seed=7)
    assert gridworld_ppo.parse_args([]) == Config()


def test_ppo_solves_the_deterministic_lake_fast():
    # Measured: seeds 0-3 reach 0.9 at 5.5k-6.7k steps, ~4 s each on a busy 2-core machine.
    cfg = Config(slippery=False, threshold=0.9, total_steps=20_000, seed=0)
    result = train(cfg, log=lambda line: None)
    assert result["solved_at_step"] is not None and result["solved_at_step"] <= cfg.total_steps, result["rows"][-1]
    assert result["final_mean_return"] >= 0.9
    rows = result["rows"]
    assert rows[-1]["entropy"] < rows[0]["entropy"]  # the policy committed to a route
    assert rows[0]["entropy"] == pytest.approx(torch.log(torch.tensor(4.0)).item(), abs=0.01)  # started uniform


@pytest.mark.slow
def test_ppo_solves_slippery_frozenlake_with_the_defaults(tmp_path, capsys):
    # Measured: seed 0 solves at step 77,024 in ~12 s alone (~40 s beside another job).
    assert gridworld_ppo.main(["--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Conclusion: solved FrozenLake-v1 4x4 slippery at step" in out
