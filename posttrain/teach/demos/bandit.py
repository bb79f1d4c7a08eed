"""One policy-gradient step in slow motion, on a K-armed bandit (spec Milestone 1).

The policy is a softmax over K logits θ. Each step it samples one action a, a hidden
coin flip pays reward r ∈ {0, 1} with that arm's success probability, and REINFORCE moves
θ along

    A · ∇_θ log π(a),   A = r − b,   ∇_θ log π(a) = onehot(a) − π        (softmax)

so the sampled action's probability goes up when A > 0 and down when A < 0, and every
other action moves the opposite way. b is the baseline: 0 ("none") or an exponential
moving average of earlier rewards ("running_mean"). It does not change the expected
gradient (E_π[onehot(a) − π] = 0) but it shrinks its variance, which the ablation
measures over many independent runs.

Nothing here is a toy copy of the math: the loss is the library's `policy_gradient_loss`
on log-probs shaped (B, T) = (runs, 1 token) with a response mask, exactly what the
LLM trainer feeds it, and the running baseline is reinforce.py's `ema_update`. The
gradient comes from autograd; the demo only prints onehot(a) − π beside it to show they
agree.

When the reward lies. `flipped_probs` turns a 0/1 reward flipped at rate ε (a noisy verifier,
a mislabelled answer) into the arm probabilities it amounts to, ε + (1 − 2ε)p: the expected
gradient shrinks by exactly (1 − 2ε), its variance hardly moves, and at ε = ½ no signal is left
(`reward_noise_table`). `paid_for` trains learners on one payment and measures another, so a
reward that pays the answer's format whatever the answer (FORMAT_PROBS) shows reward rising
while accuracy falls.

    posttrain demo bandit            # the story for 5 steps, then the ablation
    posttrain demo bandit --slow     # pause before each update and predict it first
    posttrain demo bandit --fast     # one line per step
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from posttrain.algorithms.core import policy_gradient_loss
from posttrain.algorithms.reinforce import ema_update
from posttrain.teach.demos.common import demo_parser, finish_run, one_torch_thread, pyplot, save_figure, start_run

# Success probability of each arm. The best arm (index 1) is not the last one and not
# much better than the runner-up (index 3), so the learner has something to figure out.
DEFAULT_PROBS = (0.3, 0.8, 0.2, 0.6, 0.4)
BASELINES = ("none", "running_mean")  # reinforce.py's names; group_mean needs > 1 sample per step
# The same arms read as answer styles: the chance each writes the answer in the asked-for format
# ("Final: n"). Arm 2 always writes it and is rarely right (a confident guess); arm 1, the most
# accurate, forgets it half the time. A reward for the format alone prefers arm 2.
FORMAT_PROBS = (0.9, 0.5, 1.0, 0.6, 0.7)


# --------------------------------------------------------------------------------------
# The algorithm: one REINFORCE step for S independent bandit learners at once
# --------------------------------------------------------------------------------------


def reinforce_step(
    theta: torch.Tensor, actions: torch.Tensor, adv: torch.Tensor, lr: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step on the library's policy-gradient loss.

    Args:
        theta:   (S, K) logits of S independent learners (S = 1 for the story).
        actions: (S,) long, the sampled action of each learner.
        adv:     (S,) advantage r − b of each learner.
        lr:      step size.

    Returns (new_theta (S, K), grad (S, K)) where grad is ∇_θ of the loss, i.e. −A · (onehot − π).
    """
    theta = theta.detach().requires_grad_(True)
    logp_all = torch.log_softmax(theta, dim=-1)  # (S, K)
    # Each learner's "completion" is one token, its action: (B, T) = (S, 1), all in the response.
    logp = logp_all.gather(1, actions[:, None])  # (S, 1)
    mask = torch.ones_like(logp)  # (S, 1)
    loss = policy_gradient_loss(logp, adv[:, None], mask, agg="seq-mean-token-sum")
    # The aggregation averages over the S rows; the learners are independent, so undo
    # that mean and each row of theta.grad is exactly its own learner's gradient.
    (loss * theta.shape[0]).backward()
    grad = theta.grad.detach()  # (S, K)
    return (theta - lr * grad).detach(), grad


def expected_grad_and_variance(theta: torch.Tensor, probs_true: torch.Tensor, b: torch.Tensor, offset: float = 0.0):
    """The exact mean and variance of one learner's one-sample gradient estimate
    g = (r − b)(onehot(a) − π) at its current θ and baseline b, by enumerating the K
    actions instead of sampling; r = offset + Bernoulli(probs_true[a]).
    theta (S, K), b (S,) -> (mean (S, K), variance (S,)), variance = E‖g − E g‖²
    (the trace of the covariance)."""
    pi = torch.softmax(theta, dim=-1)  # (S, K)
    direction = torch.eye(theta.shape[1])[None] - pi[:, None, :]  # (S, K actions, K) onehot(a) − π
    mean_adv = offset + probs_true[None] - b[:, None]  # (S, K) E[r − b | a]
    # E[(r − b)² | a] for a Bernoulli reward: its variance plus the squared mean.
    second_adv = probs_true * (1 - probs_true) + mean_adv**2  # (S, K)
    g_mean = (pi * mean_adv)[..., None].mul(direction).sum(1)  # (S, K) the b term cancels
    g_second = (pi * second_adv * direction.pow(2).sum(-1)).sum(1)  # (S,) E‖g‖²
    return g_mean, g_second - g_mean.pow(2).sum(-1)


def run_learners(
    probs_true: torch.Tensor, runs: int, steps: int, lr: float, baseline: str, ema_decay: float, seed: int,
    offset: float = 0.0,
) -> dict[str, torch.Tensor]:
    """Train `runs` independent learners (vectorised over runs) for `steps` steps.

    Returns per-step tensors, each (steps,): mean_reward (over runs), p_best (mean π of
    the best arm), grad_var (E over runs of the exact variance of the gradient estimate),
    grad_var_sampled (the same measured from the autograd gradients: mean over runs of
    ‖g − E g‖², an unbiased estimate of grad_var), and mean_pi (steps, K), π averaged over
    runs before each step's update. Rewards are offset + Bernoulli(p)."""
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; choose one of {list(BASELINES)}")
    gen = torch.Generator().manual_seed(seed)
    K = probs_true.numel()
    theta = torch.zeros(runs, K)  # start uniform: no preference before any evidence
    running = torch.zeros(runs)  # each learner's own EMA of its rewards
    best = int(probs_true.argmax())
    out = {k: torch.zeros(steps) for k in ("mean_reward", "p_best", "grad_var", "grad_var_sampled")}
    out["mean_pi"] = torch.zeros(steps, K)
    for t in range(steps):
        pi = torch.softmax(theta, dim=-1)  # (S, K)
        actions = torch.multinomial(pi, 1, generator=gen)[:, 0]  # (S,)
        rewards = offset + (torch.rand(runs, generator=gen) < probs_true[actions]).float()  # (S,)
        # The baseline uses earlier steps only (b = 0 on the first), as in REINFORCE.
        b = running if (baseline == "running_mean" and t > 0) else torch.zeros(runs)
        g_mean, g_var = expected_grad_and_variance(theta, probs_true, b, offset)
        theta, grad = reinforce_step(theta, actions, rewards - b, lr)
        running = ema_update(running, rewards, ema_decay, t)
        # grad is the loss gradient, −g: the ascent direction g is its negative
        out["mean_reward"][t] = rewards.mean()
        out["p_best"][t] = pi[:, best].mean()
        out["mean_pi"][t] = pi.mean(0)
        out["grad_var"][t] = g_var.mean()
        out["grad_var_sampled"][t] = (-grad - g_mean).pow(2).sum(-1).mean()
    return out


# --------------------------------------------------------------------------------------
# When the reward lies: flipped labels, and a reward for the format alone
# --------------------------------------------------------------------------------------


def flipped_probs(probs_true: torch.Tensor, flip: float) -> torch.Tensor:
    """Each arm's chance of paying 1 once its 0/1 reward is flipped with probability `flip`:
    p(1 − ε) + (1 − p)ε = ε + (1 − 2ε)p. The flip is one more coin, so a bandit with noisy
    rewards is a bandit with these probabilities, and every function here takes them."""
    if not 0.0 <= flip <= 1.0:
        raise ValueError(f"flip {flip} is a probability: give a number in [0, 1]")
    return flip + (1.0 - 2.0 * flip) * probs_true


def reward_noise_table(theta: torch.Tensor, probs_true: torch.Tensor, flips: list[float]) -> list[dict[str, float]]:
    """At one learner's θ (1, K), for each flip rate ε: the expected gradient's length, its
    ratio to the clean one, the one-sample variance with the policy's mean (noisy) reward as
    baseline (what a group mean estimates), and signal-to-noise ‖E g‖² / variance. The ratio is
    exactly 1 − 2ε: the flip adds ε to every arm, which the baseline cancels, and shrinks every
    gap between arms by 1 − 2ε; the variance stays near p(1 − p)'s, so the signal-to-noise falls
    by (1 − 2ε)², and a learner needs 1/(1 − 2ε)² times the samples for the same signal."""
    pi = torch.softmax(theta, dim=-1)  # (1, K)
    rows, clean = [], None
    for flip in flips:
        noisy = flipped_probs(probs_true, flip)  # (K,)
        g_mean, g_var = expected_grad_and_variance(theta, noisy, (pi * noisy).sum(-1))
        signal = float(g_mean.norm())
        clean = signal if clean is None else clean
        rows.append({"flip": flip, "grad_norm": signal, "grad_ratio": signal / clean if clean else 0.0,
                     "variance": float(g_var[0]), "snr": signal**2 / float(g_var[0])})
    return rows


def paid_for(paid: torch.Tensor, correct: torch.Tensor, runs: int, steps: int, lr: float, seed: int,
             ema_decay: float = 0.9) -> dict[str, torch.Tensor]:
    """Train `runs` learners on rewards Bernoulli(paid[a]) (running-mean baseline) and read off,
    per step (steps,), what they expect to be paid, Σ_a π(a)·paid(a), and the accuracy of the
    policy, Σ_a π(a)·correct(a), both averaged over runs. paid = correct: the honest reward;
    paid = FORMAT_PROBS: a reward for the format, whatever the answer."""
    out = run_learners(paid, runs, steps, lr, "running_mean", ema_decay, seed)
    return {"reward": out["mean_pi"] @ paid, "accuracy": out["mean_pi"] @ correct}


# --------------------------------------------------------------------------------------
# The story: one learner, every quantity printed
# --------------------------------------------------------------------------------------


def _vec(x: torch.Tensor) -> str:
    fmt = "{:+.3f}" if bool((x < 0).any()) else "{:.3f}"  # signs only where some entry is negative
    return "[" + ", ".join(fmt.format(v) for v in x.tolist()) + "]"


def _pause(slow: bool, seconds: float) -> None:
    """Wait for Enter on a terminal; never block when stdin is a pipe or file (tests, CI)."""
    if not slow:
        return
    if sys.stdin is not None and sys.stdin.isatty():
        input("   [Enter] to reveal the update ")
    elif seconds > 0:
        time.sleep(seconds)


def tell_story(console, probs_true, steps, lr, baseline, ema_decay, seed, mode, story_steps, pause_s, offset=0.0):
    """One learner, told step by step. mode: "story" (full story for `story_steps` steps, then
    quiet), "slow" (the same with a prediction prompt and a pause), "fast" (one line per step).
    Returns one dict per step for metrics.jsonl."""
    gen = torch.Generator().manual_seed(seed)
    K = probs_true.numel()
    theta = torch.zeros(1, K)
    running = torch.zeros(1)
    rows = []
    for t in range(steps):
        pi = torch.softmax(theta, dim=-1)  # (1, K)
        action = torch.multinomial(pi, 1, generator=gen)[:, 0]  # (1,)
        reward = offset + (torch.rand(1, generator=gen) < probs_true[action]).float()  # (1,)
        b = running if (baseline == "running_mean" and t > 0) else torch.zeros(1)
        adv = reward - b
        new_theta, grad = reinforce_step(theta, action, adv, lr)
        new_pi = torch.softmax(new_theta, dim=-1)
        a, r, bv, A = int(action), float(reward), float(b), float(adv)
        direction = torch.eye(K)[a] - pi[0]  # ∇_θ log π(a) for a softmax policy
        row = dict(step=t, action=a, reward=r, baseline=bv, advantage=A, p_action_before=float(pi[0, a]),
                   p_action_after=float(new_pi[0, a]), probs=[round(p, 4) for p in new_pi[0].tolist()])
        rows.append(row)
        if mode == "fast":
            console.print(f"step {t:3d}  a={a}  r={r:g}  b={bv:.3f}  A={A:+.3f}  "
                          f"π(a) {row['p_action_before']:.3f} -> {row['p_action_after']:.3f}  π={_vec(new_pi[0])}")
        elif t < story_steps:
            console.print(f"\n[bold]── step {t} ──[/bold]")
            console.print(f" θ (logits)        {_vec(theta[0])}")
            console.print(f" π = softmax(θ)    {_vec(pi[0])}")
            console.print(f" sampled action    a = {a}   (π(a) = {pi[0, a]:.3f})")
            console.print(f" reward            r = {r:g}   (arm {a} pays {1 + offset:g} with probability {probs_true[a]:.2f}, else {offset:g})")
            console.print(f" baseline          b = {bv:.3f}   ({'EMA of earlier rewards' if baseline != 'none' else 'off'})")
            console.print(f" advantage         A = r − b = {A:+.3f}")
            if mode == "slow":
                console.print(" [yellow]Predict: which probability should go up, and why?[/yellow]")
                _pause(True, pause_s)
            console.print(f" ∇θ log π(a) = onehot(a) − π = {_vec(direction)}")
            console.print(f" autograd: −∇θ loss           = {_vec(-grad[0])}  (= A · (onehot(a) − π))")
            console.print(f" θ ← θ + lr·A·(onehot(a) − π)  = {_vec(new_theta[0])}   (lr = {lr})")
            verb = "up" if A > 0 else "down" if A < 0 else "nowhere"
            console.print(f" π after update    {_vec(new_pi[0])}   π({a}) went {verb}: "
                          f"{pi[0, a]:.3f} -> {new_pi[0, a]:.3f} because A {'>' if A > 0 else '<' if A < 0 else '='} 0")
        theta = new_theta
        running = ema_update(running, reward, ema_decay, t)
    return rows


# --------------------------------------------------------------------------------------
# Plumbing: arguments, run directory, plot
# --------------------------------------------------------------------------------------


def _plot(path, curves: dict[str, dict[str, torch.Tensor]], probs_true) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, c in curves.items():
        # A running average over 10 steps, so the curve shows the trend, not each coin flip.
        r = c["mean_reward"]
        smooth = torch.nn.functional.avg_pool1d(r[None, None], 10, 1, padding=0)[0, 0] if r.numel() >= 10 else r
        ax1.plot(range(len(smooth)), smooth, label=f"baseline={name}")
        ax2.plot(c["grad_var"], label=f"baseline={name}")
    ax1.axhline(float(probs_true.max()), color="gray", ls="--", lw=1, label="best arm")
    ax1.set(xlabel="step", ylabel="mean reward over runs (10-step average)", title="learning curve")
    ax2.set(xlabel="step", ylabel="variance of the gradient estimate", title="gradient noise", yscale="log")
    ax1.legend()
    ax2.legend()
    save_figure(fig, path)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = demo_parser("bandit", __doc__)
    p.add_argument("--probs", default=",".join(map(str, DEFAULT_PROBS)),
                   help="comma-separated success probability of each arm; K = how many")
    # Large enough that a handful of steps visibly moves π, small enough that one lucky
    # coin flip cannot lock the policy onto a bad arm.
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=200, help="steps per learner")
    p.add_argument("--runs", type=int, default=200, help="independent learners in the ablation")
    p.add_argument("--baseline", choices=BASELINES, default="running_mean", help="for the story learner")
    p.add_argument("--ema-decay", type=float, default=0.9, help="reinforce.py's default: remembers ~10 steps")
    p.add_argument("--reward-offset", type=float, default=0.0,
                   help="added to every reward: the best arm and the expected gradient stay the same, "
                        "but without a baseline every update gets larger and noisier (try 1)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--slow", action="store_true", help="predict, then press Enter, before each update")
    mode.add_argument("--fast", action="store_true", help="one line per step instead of the story")
    p.add_argument("--story-steps", type=int, default=5, help="steps told in full (10 with --slow)")
    p.add_argument("--pause", type=float, default=0.0,
                   help="with --slow and no terminal on stdin: seconds to sleep instead of waiting for Enter")
    args = p.parse_args(argv)
    try:
        args.probs = [float(x) for x in args.probs.split(",")]
    except ValueError:
        p.error(f"--probs must be comma-separated numbers, got {args.probs!r}")
    if len(args.probs) < 2 or not all(0.0 <= x <= 1.0 for x in args.probs):
        p.error(f"--probs needs at least 2 probabilities in [0, 1], got {args.probs}")
    if args.slow and args.story_steps == 5:
        args.story_steps = 10
    return args


@one_torch_thread()
def main(argv: list[str]) -> int:
    args = parse_args(argv)
    console, run = start_run("bandit", args, seed=args.seed)
    probs_true = torch.tensor(args.probs)
    start = time.perf_counter()

    console.print(f"[bold]Bandit[/bold]: K={len(args.probs)} arms, success probabilities {args.probs} "
                  f"(hidden from the learner), best arm {int(probs_true.argmax())}")
    mode = "fast" if args.fast else "slow" if args.slow else "story"
    rows = tell_story(console, probs_true, args.steps, args.lr, args.baseline, args.ema_decay, args.seed,
                      mode, args.story_steps, args.pause, args.reward_offset)
    run.write_jsonl("metrics.jsonl", rows)
    final = rows[-1]["probs"]
    console.print(f"\nstory learner after {args.steps} steps: π = {final}")

    console.print(f"\n[bold]Ablation[/bold]: {args.runs} runs × {args.steps} steps, baseline off vs on")
    curves = {name: run_learners(probs_true, args.runs, args.steps, args.lr, name, args.ema_decay, args.seed + 1,
                                 args.reward_offset)
              for name in BASELINES}
    var = {name: float(c["grad_var"].mean()) for name, c in curves.items()}
    sampled = {name: float(c["grad_var_sampled"].mean()) for name, c in curves.items()}
    ratio = var["none"] / var["running_mean"]
    for name, c in curves.items():
        last = float(c["mean_reward"][-20:].mean())
        console.print(f"  baseline={name:13s} gradient variance {var[name]:.4f} (measured {sampled[name]:.4f})  "
                      f"reward over the last 20 steps {last:.3f}  P(best arm) {float(c['p_best'][-1]):.3f}")

    header = "step,mean_reward_none,mean_reward_running_mean,p_best_none,p_best_running_mean,grad_var_none,grad_var_running_mean\n"
    lines = [f"{t},{curves['none']['mean_reward'][t]:.4f},{curves['running_mean']['mean_reward'][t]:.4f},"
             f"{curves['none']['p_best'][t]:.4f},{curves['running_mean']['p_best'][t]:.4f},"
             f"{curves['none']['grad_var'][t]:.5f},{curves['running_mean']['grad_var'][t]:.5f}\n"
             for t in range(args.steps)]
    (run.path / "bandit_ablation.csv").write_text(header + "".join(lines))
    _plot(run.path / "bandit_ablation.png", curves, probs_true)
    summary = {"grad_var_none": var["none"], "grad_var_running_mean": var["running_mean"], "variance_ratio": ratio,
               "final_reward_none": float(curves["none"]["mean_reward"][-20:].mean()),
               "final_reward_running_mean": float(curves["running_mean"]["mean_reward"][-20:].mean()),
               "seconds": time.perf_counter() - start}
    run.write_json("summary.json", summary)
    finish_run(console, run, "bandit", f"the running-mean baseline cut gradient variance by "
               f"{ratio:.1f}x ({var['none']:.4f} -> {var['running_mean']:.4f}); same expected direction, less noise.")
    return 0
