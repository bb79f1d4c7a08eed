"""Lesson 01 · What is post-training RL? From a reward to a gradient."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 01 · What is post-training RL?

    ## Why supervised fine-tuning is not the end

    Supervised fine-tuning (SFT) shows the model worked answers and maximises their likelihood.
    It is the fastest way to teach a *format*, and it has three limits:

    1. **It can only copy.** The model learns to reproduce its demonstrations, mistakes and all;
       it never learns which of its own attempts were good.
    2. **It needs answers written out.** For many tasks checking is far cheaper than solving: a
       verifier for "is the last line `Final: 25`?" is ten lines; a teacher for every problem is not.
    3. **It never sees its own errors.** At test time the model conditions on what *it* wrote,
       not on the teacher's text. RL trains on exactly that distribution: its own samples.

    So post-training RL runs a different loop: **sample** a completion from the model, **score**
    it, and **update** the model so that high-scoring completions become more likely.

    ## The bandit lens

    For a single-turn task (one prompt, one completion, one score) this is a *contextual
    bandit*: the prompt is the context, the whole completion is one action, the verifier's score
    is the reward, and nothing happens afterwards. Underneath, the completion is still a sequence
    of token decisions (lesson 02), but the bandit view keeps the first ideas clean.

    Strip away even the context and you have a K-armed bandit: K actions, each paying reward 1
    with a probability the learner does not know. The policy is a softmax over K numbers θ.
    That is the demo in `posttrain/teach/demos/bandit.py`, and it calls the same loss function the
    language-model trainer calls.
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Five words that are not synonyms

    | word | what it is | in this lesson |
    |:---|:---|:---|
    | **reward** $r$ | the number the environment returns for one action | 1 if the arm paid, else 0 |
    | **return** $G$ | the sum of rewards along a trajectory | the same as $r$: one step only |
    | **objective** $J(\theta)$ | expected return under the policy, *for this scorer* | $\sum_a \pi_\theta(a)\,p(a)$ |
    | **metric** | something we measure and track | mean reward over 60 steps, $P(\text{best arm})$ |
    | **surrogate loss** | a function whose gradient points the right way; not the objective itself | $-(r-b)\log\pi_\theta(a)$ |

    The reward is not differentiable (a coin flip, or a string comparison), so we cannot
    backpropagate through it. The surrogate loss sidesteps that.

    ## The key equation

    $$
    \nabla_\theta J(\theta) \;=\; \mathbb{E}_{a\sim\pi_\theta}\big[(r(a) - b)\,\nabla_\theta \log \pi_\theta(a)\big],
    \qquad
    \nabla_\theta \log \pi_\theta(a) = \text{onehot}(a) - \pi_\theta \;\;\text{(softmax)}.
    $$

    Read it as: sample an action; if it did better than the baseline $b$ ($A = r - b > 0$), raise
    its probability, and every other action's falls; if worse, the opposite. Any $b$ that does
    not depend on the action leaves the *expected* gradient unchanged, because
    $\mathbb{E}_\pi[\text{onehot}(a) - \pi] = 0$. What $b$ changes is the **noise**.

    The slider sets a constant baseline $b$. Everything below is computed by
    `posttrain.teach.demos.bandit` — `reinforce_step` (one SGD step on the library's
    `policy_gradient_loss`) and `expected_grad_and_variance` (the exact mean and variance of the
    one-sample gradient).
    """)
    return


@app.cell
def _(mo):
    baseline = mo.ui.slider(start=-1.0, stop=2.0, step=0.05, value=0.0, label="baseline b", show_value=True)
    baseline
    return (baseline,)


@app.cell
def _(torch):
    from posttrain.teach.demos.bandit import DEFAULT_PROBS, expected_grad_and_variance, reinforce_step

    probs_true = torch.tensor(DEFAULT_PROBS)  # hidden from the learner
    K = probs_true.numel()
    best_arm = int(probs_true.argmax())
    lr = 0.5  # the demo's default: a few steps visibly move π
    return K, best_arm, expected_grad_and_variance, lr, probs_true, reinforce_step


@app.cell
def _(K, baseline, lr, mo, probs_true, reinforce_step, torch):
    # One step in slow motion, from a uniform policy: the same draw whatever b is.
    _gen = torch.Generator().manual_seed(2)  # draws the best arm, and it pays
    theta0 = torch.zeros(1, K)
    pi0 = torch.softmax(theta0, -1)
    sampled_arm = torch.multinomial(pi0, 1, generator=_gen)[:, 0]  # (1,)
    _a = sampled_arm
    _r = (torch.rand(1, generator=_gen) < probs_true[_a]).float()  # (1,)
    _adv = _r - baseline.value
    _theta1, _grad = reinforce_step(theta0, _a, _adv, lr)
    pi1 = torch.softmax(_theta1, -1)
    _pi1 = pi1

    _rows = "".join(
        f"| {k}{' ← sampled' if k == int(_a) else ''} | {pi0[0, k]:.3f} | {_pi1[0, k]:.3f} | {(_pi1[0, k] - pi0[0, k]):+.3f} |\n"
        for k in range(K)
    )
    mo.md(
        f"""
    ### One update, in slow motion

    Sampled arm **a = {int(_a)}**, reward **r = {_r.item():g}**, baseline **b = {baseline.value:.2f}**,
    advantage **A = r − b = {_adv.item():+.2f}**, learning rate {lr}.

    | arm | π before | π after | change |
    |:---|---:|---:|---:|
    {_rows}
    Autograd's ascent direction −∇θ loss = `{[round(v, 3) for v in (-_grad[0]).tolist()]}`,
    which is A · (onehot(a) − π).
    """
    )
    return pi0, pi1, sampled_arm, theta0


@app.cell
def _(baseline, expected_grad_and_variance, mo, probs_true, theta0, torch):
    # The exact gradient statistics at the uniform policy, for the slider's b and a few others.
    b_grid = torch.linspace(-1.0, 2.0, 61)  # the slider's range
    grad_means, grad_vars = expected_grad_and_variance(theta0.repeat(len(b_grid), 1), probs_true, b_grid)
    _mean_b, grad_var_at_b = expected_grad_and_variance(theta0, probs_true, torch.tensor([baseline.value]))
    _best = int(grad_vars.argmin())
    mo.md(
        f"""
    ### Same direction, different noise

    Exact expected gradient at your b: `{[round(v, 4) for v in _mean_b[0].tolist()]}`
    — identical for every b (max difference across the grid: {(grad_means - grad_means[0]).abs().max():.1e}).

    Variance of the one-sample gradient: **{grad_var_at_b.item():.4f}** at b = {baseline.value:.2f};
    smallest, {grad_vars[_best]:.4f}, near b = {b_grid[_best]:.2f} (the policy's mean reward is
    {probs_true.mean():.2f}). A baseline is a variance-reduction device, nothing more.
    """
    )
    return b_grid, grad_means, grad_var_at_b, grad_vars


@app.cell
def _(b_grid, baseline, grad_means, grad_var_at_b, grad_vars):
    from posttrain.teach.charts import PALETTE, curves, figure, finish, mark

    # The two statistics of the one-sample gradient over the slider's range: its signal (the
    # squared length of its mean) and its noise (the trace of its covariance).
    _fig, _ax = figure()
    curves(_ax, b_grid.tolist(), {"noise: variance of the one-sample gradient": grad_vars.tolist(),
                                  "signal: ‖expected gradient‖²": grad_means.pow(2).sum(-1).tolist()})
    _ax.plot([baseline.value], [grad_var_at_b.item()], "o", color=PALETTE[0])  # the noise at your b
    mark(_ax, baseline.value, f"your b = {baseline.value:.2f}")
    chart = finish(_fig, _ax, "baseline b (reward units)", "squared gradient length",
                   title="Every b points the same way; b near the mean reward is the least noisy")
    chart
    return (chart,)


@app.cell
def _(K, baseline, best_arm, lr, mo, probs_true, reinforce_step, torch):
    # 300 independent learners, 60 steps each, all with the slider's constant baseline.
    _S, _steps = 300, 60
    _gen = torch.Generator().manual_seed(0)
    _theta = torch.zeros(_S, K)
    _reward_sum = torch.zeros(_S)
    for _t in range(_steps):
        _pi = torch.softmax(_theta, -1)
        _a = torch.multinomial(_pi, 1, generator=_gen)[:, 0]  # (S,)
        _r = (torch.rand(_S, generator=_gen) < probs_true[_a]).float()  # (S,)
        _theta, _ = reinforce_step(_theta, _a, _r - baseline.value, lr)
        _reward_sum += _r
    p_best_final = torch.softmax(_theta, -1)[:, best_arm]
    mean_reward = (_reward_sum / _steps).mean().item()
    mo.md(
        f"""
    ### What it does to learning

    {_S} learners × {_steps} steps with b = {baseline.value:.2f}: mean reward per step
    **{mean_reward:.3f}** (best arm pays {probs_true.max():.2f}), final π(best arm) averaged over
    learners **{p_best_final.mean():.3f}**, and {int((p_best_final < 0.2).sum())} learners ended
    with π(best) < 0.2 — they locked onto a worse arm.
    """
    )
    return


@app.cell
def _(K, best_arm, lr, mo, probs_true, torch):
    from posttrain.teach.demos.bandit import FORMAT_PROBS, flipped_probs, paid_for, reward_noise_table, run_learners

    # Rewards flipped at rate ε: the exact gradient statistics at the uniform policy, and 300
    # learners × 60 steps trained on the flipped rewards (seed 0, as the ablation above).
    flips = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    noise_rows = reward_noise_table(torch.zeros(1, K), probs_true, flips)
    with mo.status.spinner(title=f"Training 300 learners × 60 steps at {len(flips)} flip rates, then on two rewards…"):
        noisy_p_best = [float(run_learners(flipped_probs(probs_true, e), 300, 60, lr, "running_mean", 0.9, 0)
                              ["p_best"][-1]) for e in flips]
        # The format reward: paid when the answer is written as asked, whatever the answer.
        format_probs = torch.tensor(FORMAT_PROBS)
        format_curves = paid_for(format_probs, probs_true, 300, 60, lr, seed=0)
        answer_curves = paid_for(probs_true, probs_true, 300, 60, lr, seed=0)
    _need = ["never" if r["grad_ratio"] < 1e-6 else f"{noise_rows[0]['snr'] / r['snr']:.1f}×" for r in noise_rows]
    _noise = "".join(
        f"| {r['flip']:.1f} | {r['grad_norm']:.4f} | {r['grad_ratio']:.2f} | {1 - 2 * r['flip']:.2f} | "
        f"{r['variance']:.3f} | {r['snr']:.4f} | {need} | {pb:.2f} |\n"
        for r, need, pb in zip(noise_rows, _need, noisy_p_best))
    _steps = [0, 9, 29, 59]
    _format = "".join(
        f"| {t + 1} | {format_curves['reward'][t]:.2f} | {format_curves['accuracy'][t]:.2f} | "
        f"{answer_curves['accuracy'][t]:.2f} |\n" for t in _steps)
    mo.md(
        f"""
    ## When the reward lies

    **Noise.** Suppose the verifier flips each 0/1 reward with probability ε: a mislabelled answer,
    a grader that misreads. An arm that pays with probability p now pays with probability
    ε + (1 − 2ε)p. The ε is added to every arm, and the baseline cancels it. The gaps between
    arms, which are all the gradient can see, shrink by a factor of 1 − 2ε. The variance of one
    sample stays near p(1 − p), because a flipped coin is still a coin.

    | ε | ‖expected gradient‖ | ratio to ε = 0 | 1 − 2ε | variance | signal-to-noise | samples for the clean signal | π(best) after 60 steps |
    |---:|---:|---:|---:|---:|---:|---:|---:|
    {_noise}
    The signal shrinks and the noise does not, so signal-to-noise falls by (1 − 2ε)², a little
    more as the variance creeps up. At ε = 0.2 a learner needs {_need[2]} the samples for the same
    signal, and at ε = 0.5 the reward is a coin that ignores the action: no amount of data helps. The last column trains on the flipped
    rewards (the best arm is arm {best_arm}; π(best) starts at {1 / K:.2f}).

    **A reward for the format.** Read the arms as answer styles, each writing the asked-for
    format ("Final: n") with its own probability {list(FORMAT_PROBS)}. Arm 2 always writes it and is
    right {probs_true[2]:.0%} of the time. Pay for the format alone, whatever the answer, and
    train the same learners:

    | step | paid for the format: reward | paid for the format: accuracy | paid for the answer: reward = accuracy |
    |---:|---:|---:|---:|
    {_format}
    The format-paid reward climbs while accuracy falls. The policy earns the format and skips the
    content, and its reward curve looks like learning. So a format term goes beside an accuracy
    term, never alone, and a reward curve is never read without a held-out accuracy beside it.
    """
    )
    return answer_curves, format_curves, noise_rows, noisy_p_best


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    Drag $b$ to 2. Now *every* advantage is negative: each sampled arm is pushed down, even the one
    that paid. The expected gradient has not changed (check the line above), yet learning is
    worse, because each update is large and mostly noise. Now try $b = -1$: every sampled arm is
    pushed *up*, including the bad ones, and the policy rushes toward whichever arm it happened to
    pick early. Near $b \approx$ the mean reward, the updates are small and signed by whether the
    arm beat the average — which is exactly what GRPO's group mean does for language models
    (lessons 04 and 11).

    ## Source files used here

    * `posttrain/teach/demos/bandit.py` — `reinforce_step`, `expected_grad_and_variance` (also `posttrain demo bandit`),
      and for the lying reward `flipped_probs`, `reward_noise_table`, `paid_for`
    * `posttrain/algorithms/core.py` — `policy_gradient_loss`, the surrogate loss itself
    * `posttrain/algorithms/reinforce.py` — the same estimator for language models, with its baselines

    ## Exercises

    1. The slow-motion step drew a paying arm. Predict the table for the same arm had it paid 0,
       with $b = 0$ and with $b = 0.5$; then check your prediction by setting $b = 1$ (why is
       that the same advantage as "paid 0 with $b = 0$"?).
    2. Find by hand the $b$ that minimises the variance at the uniform policy, and compare with the
       widget. Why is it close to, but not exactly, the mean reward?
    3. Which row of the five-words table does "mean reward over 60 steps" belong to, and which
       does $-(r-b)\log\pi(a)$ belong to? Why must they never be confused in a plot?

    Next: [02 · Rollout and π_old](?file=02_rollout_and_pi_old.py).
    """)
    return


if __name__ == "__main__":
    app.run()
