"""Lesson 09 · REINFORCE: the policy gradient in one line, and why it is noisy."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import dataclasses

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return dataclasses, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 09 · REINFORCE: the starting point

    ## Why we need an estimator at all

    The verifier reads text and returns a number. There is no derivative of "the answer is
    correct" with respect to a weight, so we cannot backpropagate through the reward. What we
    *can* differentiate is the probability of the text the model produced. The trick: make
    completions that scored well more probable, in proportion to how well they scored.

    ## The key equation (the score-function identity)

    For a prompt $x$ and a sampled response $y$,

    $$
    \nabla_\theta\, \mathbb{E}_{y\sim\pi_\theta}[R(y)]
    \;=\; \mathbb{E}_{y\sim\pi_\theta}\big[R(y)\,\nabla_\theta \log \pi_\theta(y\mid x)\big]
    \;=\; \mathbb{E}\Big[(R(y) - b)\sum_t \nabla_\theta \log\pi_\theta(y_t \mid x, y_{<t})\Big].
    $$

    Derivation in two lines: $\nabla \sum_y \pi(y) R(y) = \sum_y \pi(y)\,\nabla\log\pi(y)\,R(y)$,
    because $\nabla \pi = \pi \nabla \log \pi$. The baseline $b$ can be subtracted for free,
    since $\mathbb{E}[\nabla \log \pi(y)] = \nabla \sum_y \pi(y) = \nabla 1 = 0$. As a loss the
    trainer can minimise: $\mathcal{L} = -\operatorname{agg}\big[(R - b)\log\pi_\theta(y_t)\big]$,
    `policy_gradient_loss` in `posttrain/algorithms/core.py`.

    **Why it is structurally noisy.** One sample of $R \cdot \nabla\log\pi(y)$ points wherever
    that one sample went, scaled by its raw reward. If every reward is positive (say 10 for
    wrong, 11 for right), *every* completion is pushed up, the right ones just slightly more;
    the signal is the small difference between two large, random pushes. Every algorithm in
    Part II is a patch on this line, and most of them patch the baseline.

    ## The widget

    A two-step decision problem (`posttrain/teach/demos/two_step_mdp.py`): two "tokens", reward only
    at the end, $R = [[0.5, 0.5], [0, 1]]$ — the best path is first action 1, then 1. The
    completions are a (B, T = 2) batch pushed through the library's `REINFORCE` class exactly as
    the LLM trainer would. Choose the baseline, and add a constant $c$ to every reward (which
    changes nothing about which path is best).
    """)
    return


@app.cell
def _(mo):
    controls = mo.ui.dictionary({
        "baseline": mo.ui.dropdown(options=["none", "running_mean", "group_mean"], value="none", label="baseline b"),
        "offset": mo.ui.slider(start=0.0, stop=5.0, step=0.5, value=0.0, label="reward offset c (R → R + c)",
                               show_value=True),
    })
    controls.vstack()  # the panel's controls, one per line (their values stay in `controls`)
    return (controls,)


@app.cell
def _(controls, dataclasses, mo, torch):
    from posttrain.models.logprobs import entropy_from_logits
    from posttrain.algorithms.reinforce import REINFORCE
    from posttrain.teach.demos.two_step_mdp import REWARD, TwoStepPolicy, as_rollout_batch
    from posttrain.types import PolicyOutputs

    baseline, offset = controls.value["baseline"], controls.value["offset"]
    B = 16  # episodes per batch (one group)

    def reinforce_grad(policy, algo, gen):
        """Sample B episodes, run compute_advantages + compute_loss + backward; return the
        ascent direction on the logits of the second action after a1 = 1 (the decision
        with a clear right answer at the start: a2 = 1 pays 1, a2 = 0 pays 0), and the batch."""
        actions = policy.sample(B, gen)  # (B, 2)
        rewards = REWARD[actions[:, 0], actions[:, 1]] + offset  # (B,)
        logits = policy.step_logits(actions)  # (B, 2, 2)
        logp = torch.log_softmax(logits, -1).gather(-1, actions[..., None])[..., 0]  # (B, 2)
        batch = as_rollout_batch(actions, logp, rewards)
        batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
        loss, _ = algo.compute_loss(PolicyOutputs(logp=logp, entropy=entropy_from_logits(logits)), batch)
        for p in policy.parameters():
            p.grad = None
        loss.backward()
        return -policy.theta2.grad[1].clone(), batch

    # 1. The noise: 300 independent batches at the uniform starting policy.
    with mo.status.spinner(title=f"REINFORCE with baseline {baseline}: 300 batches of {B}, then 8 learners × 60 steps…"):
        _gen = torch.Generator().manual_seed(0)
        _policy, _algo = TwoStepPolicy(), REINFORCE(baseline=baseline)
        _grads = torch.stack([reinforce_grad(_policy, _algo, _gen)[0] for _ in range(300)])  # (300, 2)
        one_batch_grads = _grads[:, 1]  # (300,) the a2 = 1 logit's ascent direction, one per batch
        grad_mean, grad_std = one_batch_grads.mean().item(), one_batch_grads.std().item()
        wrong_sign = (one_batch_grads < 0).float().mean().item()

        # 2. What the noise does to learning: 8 learners × 60 steps, plain SGD with lr 1.
        _finals, _rewards = [], []
        for _seed in range(8):
            _gen = torch.Generator().manual_seed(100 + _seed)
            _policy, _algo = TwoStepPolicy(), REINFORCE(baseline=baseline)
            for _step in range(60):
                _, _batch = reinforce_grad(_policy, _algo, _gen)
                with torch.no_grad():
                    for _p in _policy.parameters():
                        _p -= 1.0 * _p.grad
            _finals.append(_policy.p_best_first())
            _rewards.append((_batch.rewards - offset).mean().item())
        p_best_final = sum(_finals) / len(_finals)
        stuck = sum(f < 0.5 for f in _finals)
    example_batch = reinforce_grad(TwoStepPolicy(), REINFORCE(baseline=baseline), torch.Generator().manual_seed(1))[1]
    return B, baseline, example_batch, grad_mean, grad_std, offset, one_batch_grads, p_best_final, stuck, wrong_sign


@app.cell
def _(B, baseline, example_batch, grad_mean, grad_std, mo, offset, p_best_final, stuck, wrong_sign):
    _rows = "".join(
        f"| {int(example_batch.tokens[b, 0])} | {int(example_batch.tokens[b, 1])} | {example_batch.rewards[b]:.1f} | "
        f"{example_batch.advantages[b, 0]:+.3f} |\n"
        for b in range(6)
    )
    mo.md(
        f"""
    ### Baseline `{baseline}`, rewards shifted by c = {offset:g}

    **The one-batch gradient on "a2 = 1 after a1 = 1"** (B = {B}, 300 independent batches at
    the uniform policy; the true direction is up): mean **{grad_mean:+.4f}**, standard deviation
    **{grad_std:.4f}**; it pointed the wrong way (down) in **{100 * wrong_sign:.0f}%** of batches.

    **Learning** (8 learners × 60 SGD steps, lr 1): P(best first action) ends at
    **{p_best_final:.2f}** on average; {stuck} of 8 learners end below 0.5.

    The first rows of one batch (the advantage is copied onto both tokens):

    | a1 | a2 | reward (+ c) | advantage A = R − b |
    |---:|---:|---:|---:|
    {_rows}
    """
    )
    return


@app.cell
def _(baseline, grad_mean, offset, one_batch_grads, wrong_sign):
    from posttrain.teach.charts import PALETTE, REFERENCE, figure, finish

    # The 300 one-batch gradients above as a distribution: where its mass sits against zero,
    # on one fixed scale so that moving c or b moves the picture, not the axis
    _fig, _ax = figure()
    _ax.hist(one_batch_grads.clamp(-1.5, 1.5).tolist(), bins=60, range=(-1.5, 1.5), color=PALETTE[0], alpha=0.8,
             label=f"300 batches of 16 ({wrong_sign:.0%} point down)")
    _ax.axvline(0.0, color=REFERENCE, linewidth=1.0)
    _ax.axvline(grad_mean, color=PALETTE[1], linewidth=1.5,
                label=f"their mean {grad_mean:+.3f} (the true direction: up)")
    chart = finish(_fig, _ax, "one batch's gradient on the logit of a2 = 1 after a1 = 1 (clamped to ±1.5)",
                   "batches", title=f"baseline {baseline}, rewards shifted by c = {offset:g}")
    chart
    return (chart,)


@app.cell
def _(mo):
    from posttrain.algorithms import ALGORITHMS, make_algorithm
    from posttrain.teach.widgets import BUDGET

    # The RL family tree, drawn from the registry so it cannot drift from the code: a branch
    # is whether the algorithm trains a critic; "builds on" is the registered class it
    # subclasses (a small diff on its parent), blank where it starts from the contract itself
    _registered = {name: cls for name, cls in ALGORITHMS.items()}
    _parent = {name: next((p for p, k in _registered.items() if k is cls.__mro__[1]), "")
               for name, cls in _registered.items()}
    family_tree = {
        "value-based (learn Q(s, a), act greedily: Q-learning, DQN)": [],
        "policy gradient, no critic (REINFORCE and its descendants)": [],
        "actor-critic (a policy and a learned value V(s))": [],
        "model-based (learn the environment, plan in it: MuZero, Dreamer)": [],
    }
    for _name in _registered:
        _critic = make_algorithm(_name, budget=BUDGET).uses_critic
        family_tree[list(family_tree)[2 if _critic else 1]].append(_name)
    _rows = "".join(
        f"| {branch} | {len(names)} | "
        + (", ".join(f"`{n}`" + (f" (on `{_parent[n]}`)" if _parent[n] else "") for n in names)
           or "*none: not covered*") + " |\n"
        for branch, names in family_tree.items())
    mo.md(
        f"""
    ## Where REINFORCE sits: the RL family tree

    RL is a family, not one method. **Value-based** methods learn how good each action is
    and act greedily on it; **policy-gradient** methods, REINFORCE first, push up the
    log-probability of what scored well; **actor-critic** methods do both, a learned value
    as the baseline (PPO, lesson 10); **model-based** methods learn the environment and plan.
    Language-model post-training lives almost entirely on the policy-gradient side: the
    action space is a vocabulary per token and a combinatorial space per completion, where
    a Q-table or a planner's model has nothing to hold on to, and the verifier is the
    environment. posttrain's {len(_registered)} registered algorithms, placed by their own code:

    | branch | algorithms | posttrain's (on = the class it extends) |
    |:---|:---|:---|
    {_rows}
    """
    )
    return (family_tree,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **Baseline `none`, offset c = 5.** The expected gradient is the same as at c = 0 (a
      constant times $\mathbb{E}[\nabla\log\pi] = 0$), but its standard deviation is many times
      larger, a large share of single batches point the wrong way, and learning slows down or
      goes wrong. Nothing about the task changed — only where zero is on the reward scale.
      Real verifiers have this problem whenever rewards are all ≥ 0.
    * Switch to **`group_mean`** at c = 5: the offset cancels exactly (every advantage is
      shifted by the same c, then the group mean removes it), and the noise is back to its
      c = 0 level. **`running_mean`** cancels it too, after a few batches of warm-up, since the
      average of past rewards learns the offset.
    * Lesson 01 did this with a constant slider baseline on a bandit; here the baseline is the
      library's, and the "completion" has two tokens sharing one reward.

    ## Source files used here

    * `posttrain/algorithms/reinforce.py` — `REINFORCE`, its three baselines, `ema_update`
    * `posttrain/algorithms/core.py` — `policy_gradient_loss`, `agg_loss`
    * `posttrain/teach/demos/two_step_mdp.py` — `TwoStepPolicy`, `REWARD`, `as_rollout_batch` (also `posttrain demo two_step_mdp`)
    * `posttrain/types.py` — `RolloutBatch`, `PolicyOutputs`
    * `posttrain/algorithms/__init__.py` — `ALGORITHMS`, the registry the family tree is drawn from

    ## Exercises

    1. With baseline `none` and c = 0, is the estimator unbiased? With `group_mean`? Read the
       docstring of `REINFORCE` for the answer, then lesson 12 for the fix.
    2. Why is REINFORCE's default aggregation `seq-mean-token-sum`, not `token-mean`? What
       would `token-mean` do to a long completion's gradient?
    3. Code: `exercises/09_reinforce.py` asks for the REINFORCE loss
       $-\frac{1}{B}\sum_b \sum_t m_{bt} A_{bt} \log\pi_{bt}$; run `posttrain check 09`.

    Next: [10 · PPO](?file=10_ppo.py).
    """)
    return


if __name__ == "__main__":
    app.run()
