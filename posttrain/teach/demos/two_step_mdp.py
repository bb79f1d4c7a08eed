"""Delayed reward: how a first action gets credit it never sees directly (spec Milestone 2).

Two steps, two actions each, and one reward at the very end:

    step 1: choose a1 ∈ {0, 1}        step 2: choose a2 ∈ {0, 1}, knowing a1
    reward R[a1][a2], paid only after step 2

    R = [[0.5, 0.5],     a1 = 0 is safe: 0.5 whatever follows
         [0.0, 1.0]]     a1 = 1 is the best first action, but only if a2 = 1 follows

At the start both first actions are worth 0.5 on average, so step 1 has nothing to learn
until step 2 has learned to follow a1 = 1 with a2 = 1. No reward is ever attached to a1
itself; its credit arrives through the return. With reward only at the end (and no
discount) the return of every step equals the final reward,

    G_1 = G_2 = R[a1][a2],     A_t = G_t − b,

which is exactly what an LLM completion sees: one verifier score, copied onto every
token. So the episode here *is* a two-token completion: a (B, T=2) batch of actions with
their log-probs and a response mask, pushed through the library's REINFORCE algorithm
(`compute_advantages` then `compute_loss`, the code the LLM trainer runs), with
baseline none, running_mean or group_mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from posttrain.models.logprobs import entropy_from_logits
from posttrain.algorithms.reinforce import REINFORCE
from posttrain.teach.demos.common import demo_parser, finish_run, one_torch_thread, pyplot, save_figure, start_run
from posttrain.types import PolicyOutputs, RolloutBatch

REWARD = torch.tensor([[0.5, 0.5], [0.0, 1.0]])  # R[a1][a2], see the module docstring
BEST_FIRST = 1  # argmax over a1 of max over a2 of R
BASELINES = REINFORCE.BASELINES  # ("none", "running_mean", "group_mean")


class TwoStepPolicy:
    """π1(a1) = softmax(theta1) and π2(a2 | a1) = softmax(theta2[a1]): a separate step-2
    distribution for each first action, as a token's distribution depends on its prefix."""

    def __init__(self) -> None:
        self.theta1 = torch.zeros(2, requires_grad=True)  # (2,) logits of the first action
        self.theta2 = torch.zeros(2, 2, requires_grad=True)  # (a1, 2) logits of the second

    def parameters(self) -> list[torch.Tensor]:
        return [self.theta1, self.theta2]

    def step_logits(self, actions: torch.Tensor) -> torch.Tensor:
        """The logits each action of each episode was drawn from: (B, T=2, 2)."""
        first = self.theta1.expand(actions.shape[0], 2)  # (B, 2)
        second = self.theta2[actions[:, 0]]  # (B, 2) the row chosen by a1
        return torch.stack([first, second], dim=1)  # (B, 2, 2)

    @torch.no_grad()
    def sample(self, batch_size: int, gen: torch.Generator) -> torch.Tensor:
        """(B, 2) long: a1 from π1, then a2 from π2(· | a1)."""
        a1 = torch.multinomial(torch.softmax(self.theta1, -1).expand(batch_size, 2), 1, generator=gen)[:, 0]
        a2 = torch.multinomial(torch.softmax(self.theta2[a1], -1), 1, generator=gen)[:, 0]
        return torch.stack([a1, a2], dim=1)

    @torch.no_grad()
    def p_best_first(self) -> float:
        return float(torch.softmax(self.theta1, -1)[BEST_FIRST])

    @torch.no_grad()
    def p_follow_up(self) -> float:
        """π2(a2 = 1 | a1 = 1): does step 2 finish what the best first action started?"""
        return float(torch.softmax(self.theta2[BEST_FIRST], -1)[1])


def as_rollout_batch(actions: torch.Tensor, logp: torch.Tensor, rewards: torch.Tensor) -> RolloutBatch:
    """The episodes as the LLM path sees completions: B rows of T = 2 response tokens,
    one scalar reward per row, all rows answers to the same prompt (group 0)."""
    ones = torch.ones(actions.shape, dtype=torch.float32)  # (B, 2)
    return RolloutBatch(tokens=actions, attention_mask=ones, response_mask=ones, old_logp=logp.detach(),
                        rewards=rewards, group_ids=torch.zeros(actions.shape[0], dtype=torch.long))


def train_step(policy: TwoStepPolicy, algo: REINFORCE, batch_size: int, lr: float, gen: torch.Generator):
    """Sample B episodes, score them at the end, and take one SGD step through the
    library's REINFORCE. Returns (batch with advantages, metrics)."""
    actions = policy.sample(batch_size, gen)  # (B, 2)
    rewards = REWARD[actions[:, 0], actions[:, 1]]  # (B,) paid once, after step 2
    logits = policy.step_logits(actions)  # (B, 2, 2)
    logp = torch.log_softmax(logits, -1).gather(-1, actions[..., None])[..., 0]  # (B, 2) log π(a_t | a_<t)
    batch = as_rollout_batch(actions, logp, rewards)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))  # A_t = G_t − b on both steps
    loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=entropy_from_logits(logits)), batch)
    for p in policy.parameters():
        p.grad = None
    loss.backward()
    with torch.no_grad():
        for p in policy.parameters():
            p -= lr * p.grad
    return batch, metrics


def run_learner(baseline: str, steps: int, batch_size: int, lr: float, seed: int) -> dict[str, list[float]]:
    """One learner from the uniform policy; per-step P(best a1), P(follow-up), mean reward
    (each measured before that step's update)."""
    gen = torch.Generator().manual_seed(seed)
    policy = TwoStepPolicy()
    algo = REINFORCE(baseline=baseline)  # loss_agg seq-mean-token-sum: −A · (log π1 + log π2)
    curve = {"p_best_first": [], "p_follow_up": [], "mean_reward": []}
    for _ in range(steps):
        curve["p_best_first"].append(policy.p_best_first())
        curve["p_follow_up"].append(policy.p_follow_up())
        batch, _ = train_step(policy, algo, batch_size, lr, gen)
        curve["mean_reward"].append(float(batch.rewards.mean()))
    return curve


# --------------------------------------------------------------------------------------
# Plumbing: story table, arguments, run directory, plot
# --------------------------------------------------------------------------------------


def show_credit(console: Console, batch: RolloutBatch, rows: int) -> None:
    """A table of episodes: the reward appears once, the return and advantage on both steps."""
    table = Table(title="one batch of episodes: reward at the end, credit on both steps")
    for col in ("a1", "a2", "reward (end)", "G_1 = G_2", "A_1 (step 1)", "A_2 (step 2)"):
        table.add_column(col, justify="right")
    for b in range(min(rows, batch.batch_size)):
        r = float(batch.rewards[b])
        table.add_row(str(int(batch.tokens[b, 0])), str(int(batch.tokens[b, 1])), f"{r:.1f}", f"{r:.1f}",
                      f"{batch.advantages[b, 0]:+.3f}", f"{batch.advantages[b, 1]:+.3f}")
    console.print(table)


def _plot(path, curves: dict[str, dict[str, torch.Tensor]]) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, c in curves.items():
        ax1.plot(c["p_best_first"].mean(0), label=f"baseline={name}")
        ax2.plot(c["p_follow_up"].mean(0), label=f"baseline={name}")
    ax1.set(xlabel="step", ylabel="P(a1 = best)", title="step 1: credit arrives through the return", ylim=(0, 1))
    ax2.set(xlabel="step", ylabel="P(a2 = 1 | a1 = 1)", title="step 2: learns first", ylim=(0, 1))
    ax1.legend()
    ax2.legend()
    save_figure(fig, path)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = demo_parser("two_step_mdp", __doc__)
    p.add_argument("--steps", type=int, default=60, help="updates per learner")
    p.add_argument("--batch-size", type=int, default=16, help="episodes per update (one group)")
    # Big steps are safe here: two parameters per decision and a clean reward.
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=10, help="independent learners per baseline (averaged)")
    p.add_argument("--baselines", default=",".join(BASELINES), help=f"comma-separated subset of {list(BASELINES)}")
    args = p.parse_args(argv)
    args.baselines = args.baselines.split(",")
    bad = [b for b in args.baselines if b not in BASELINES]
    if bad:
        p.error(f"unknown baseline(s) {bad}; choose from {list(BASELINES)}")
    return args


@one_torch_thread()
def main(argv: list[str]) -> int:
    args = parse_args(argv)
    console, run = start_run("two_step_mdp", args, seed=args.seed)
    start = time.perf_counter()

    console.print(escape(f"Two-step MDP: reward R[a1][a2] only after step 2, R = {REWARD.tolist()}; "
                         "best path a1=1 then a2=1"))
    # One illustrative update with a group-mean baseline, to see where the credit goes.
    policy, gen = TwoStepPolicy(), torch.Generator().manual_seed(args.seed)
    before = (policy.p_best_first(), policy.p_follow_up())
    batch, _ = train_step(policy, REINFORCE(baseline="group_mean"), 8, args.lr, gen)
    show_credit(console, batch, 8)
    console.print("No reward was attached to a1, yet A_1 = A_2: the first action is judged by how the whole "
                  f"episode ended. This update moved P(a1=1) {before[0]:.3f} -> {policy.p_best_first():.3f} "
                  f"and P(a2=1 | a1=1) {before[1]:.3f} -> {policy.p_follow_up():.3f}.\n")

    curves = {}
    for name in args.baselines:
        runs = [run_learner(name, args.steps, args.batch_size, args.lr, args.seed + 1000 * i) for i in range(args.runs)]
        curves[name] = {k: torch.tensor([r[k] for r in runs]) for k in runs[0]}  # each (runs, steps)
        c = curves[name]
        marks = sorted({0, args.steps // 4, args.steps // 2, args.steps - 1})
        trail = "  ".join(f"step {t}: {float(c['p_best_first'][:, t].mean()):.2f}" for t in marks)
        console.print(f"baseline={name:13s} P(best first action) {trail}   "
                      f"(follow-up P(a2=1|a1=1) at the end {float(c['p_follow_up'][:, -1].mean()):.2f})")

    names = list(curves)
    header = "step," + ",".join(f"{k}_{n}" for n in names for k in ("p_best_first", "p_follow_up", "mean_reward"))
    lines = [f"{t}," + ",".join(f"{float(curves[n][k][:, t].mean()):.4f}" for n in names
                                for k in ("p_best_first", "p_follow_up", "mean_reward")) for t in range(args.steps)]
    (run.path / "two_step_mdp.csv").write_text(header + "\n" + "\n".join(lines) + "\n")
    _plot(run.path / "two_step_mdp.png", curves)
    final = {n: float(curves[n]["p_best_first"][:, -1].mean()) for n in names}
    start_p = float(curves[names[0]]["p_best_first"][:, 0].mean())
    run.write_json("summary.json", {"p_best_first_start": start_p, "p_best_first_end": final,
                                    "seconds": time.perf_counter() - start})
    ends = ", ".join(f"{final[n]:.2f} ({n})" for n in names)
    finish_run(console, run, "two_step_mdp", f"P(best first action) rose from {start_p:.2f} to {ends} "
               f"in {args.steps} steps, although its reward only ever arrived after step 2.")
    return 0
