"""Lesson 10 · PPO: a critic, an importance ratio, and the clip table."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread
    from posttrain.teach.tables import markdown_table

    torch = torch_on_one_thread()
    return markdown_table, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 10 · PPO: the classical RLHF workhorse

    ## Why REINFORCE was not enough

    REINFORCE (lesson 09) has two costs. Its gradient is noisy, and its samples are good for
    exactly one step: after the update they come from the *old* policy, and the estimator
    $A\,\nabla\log\pi_\theta$ assumes they came from the current one. Sampling is the expensive
    part of RL for language models, so throwing a batch away after one step hurts. PPO makes
    three patches:

    1. **A learned baseline.** A critic $V_\phi(s_t)$ predicts the return from each prefix, and
       GAE turns rewards and values into a per-token advantage $A_t$ (`gae` in `ppo.py`).
    2. **Importance sampling.** Weigh each token by $\rho_t = \pi_\theta(y_t)/\pi_{\text{old}}(y_t)$,
       so the same batch can feed several epochs of minibatch steps.
    3. **A pessimistic clip.** $\rho_t$ is only trustworthy near 1, so the objective stops
       rewarding moves that take it outside $[1-\epsilon, 1+\epsilon]$.

    ## The key equation

    $$
    \mathcal{L}^{\text{clip}} = -\operatorname{agg}_t \min\big(\rho_t A_t,\ \operatorname{clip}(\rho_t, 1-\epsilon, 1+\epsilon)\,A_t\big)
    $$

    The `min` makes it pessimistic. Read it as a table: for each sign of $A_t$ and each side of
    the trust region, one of the two terms wins, and if the winner is the clipped (constant)
    one, **the token's gradient is exactly zero** — the objective has stopped caring about it.
    The four corners are the whole of PPO's clip:

    | | $\rho < 1-\epsilon$ | inside | $\rho > 1+\epsilon$ |
    |:---|:---|:---|:---|
    | $A > 0$ (make it likelier) | unclipped: keep pushing up | unclipped | **clipped**: enough |
    | $A < 0$ (make it rarer) | **clipped**: enough | unclipped | unclipped: keep pushing down |

    Set a token's ratio, its advantage's sign and ε; the widget evaluates the library's
    `clipped_surrogate` on that token, differentiates it with autograd, and shows which branch
    was active and the gradient $\partial\mathcal{L}/\partial\log\pi$.
    """)
    return


@app.cell
def _(mo):
    controls = mo.ui.dictionary({
        "ratio": mo.ui.slider(start=0.5, stop=1.5, step=0.05, value=1.3, label="ratio ρ = π_θ / π_old",
                              show_value=True),
        "sign": mo.ui.dropdown(options={"A = +1 (better than expected)": 1.0, "A = −1 (worse than expected)": -1.0},
                               value="A = +1 (better than expected)", label="advantage"),
        "eps": mo.ui.slider(start=0.05, stop=2.0, step=0.05, value=0.2, label="clip ε", show_value=True),
    })
    controls.vstack()  # the panel's controls, one per line (their values stay in `controls`)
    return (controls,)


@app.cell
def _(controls, torch):
    from posttrain.algorithms.core import clipped_surrogate

    def clip_cell(ratio: float, adv: float, eps: float) -> dict:
        """One token through clipped_surrogate: loss, active branch, ∂loss/∂log π."""
        old_logp = torch.tensor([[-1.0]])  # (1, 1) any value: only the ratio matters
        logp = (old_logp + torch.log(torch.tensor(ratio))).requires_grad_(True)  # (1, 1)
        loss, metrics = clipped_surrogate(logp, old_logp, torch.tensor([[adv]]), torch.ones(1, 1), eps, eps)
        loss.backward()
        return {"loss": loss.item(), "clipped": metrics["clipfrac"] > 0, "grad": logp.grad.item()}

    ratio, adv, eps = controls.value["ratio"], controls.value["sign"], controls.value["eps"]
    cell = clip_cell(ratio, adv, eps)
    RATIOS = [0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5]
    table = {(r, a): clip_cell(r, a, eps) for r in RATIOS for a in (1.0, -1.0)}
    return RATIOS, adv, cell, clip_cell, eps, ratio, table


@app.cell
def _(RATIOS, adv, cell, eps, markdown_table, mo, ratio, table):
    def _fmt(c, here):
        text = f"{'clipped' if c['clipped'] else 'unclipped'} · {c['grad']:+.2f}"
        return f"**▶ {text}**" if here else text

    _table = markdown_table(
        ["A"] + [f"ρ = {r:g}" for r in RATIOS],
        [[f"{a:+g}"] + [_fmt(table[(r, a)], abs(r - ratio) < 1e-9 and a == adv) for r in RATIOS] for a in (1.0, -1.0)])
    _branch = "the **clipped** branch: the gradient through this token is **zero**" if cell["clipped"] else \
        "the **unclipped** branch: the gradient is −A·ρ, pushing " + ("up" if adv > 0 else "down")
    mo.md(
        f"""
    ### ρ = {ratio:.2f}, A = {adv:+g}, ε = {eps:.2f} → {_branch}

    Loss on this token **{cell['loss']:+.4f}**; ∂loss/∂log π = **{cell['grad']:+.4f}**
    (a negative value means gradient descent raises log π). Trust region: [{1 - eps:.2f}, {1 + eps:.2f}].

    The full table at ε = {eps:.2f}: each cell is the active branch · ∂loss/∂log π (your setting
    marked ▶; move the ratio to another column):

    {_table}
    """
    )
    return


@app.cell
def _(adv, clip_cell, eps, ratio):
    from posttrain.teach.charts import curves, figure, finish, legend_right, mark, span

    # The objective PPO maximises on one token, −loss from clipped_surrogate, across the ratio:
    # the clip is the flat stretch where the min picks the constant branch. ε = 10^6 is the
    # same call with no clip: ρ·A without PPO's pessimism, for comparison.
    objective_ratios = [round(0.3 + 0.02 * i, 2) for i in range(71)]  # 0.3 .. 1.7
    objective = {f"clipped, A = {a:+g}": [-clip_cell(r, a, eps)["loss"] for r in objective_ratios]
                 for a in (1.0, -1.0)}
    unclipped = {f"no clip, A = {a:+g}": [-clip_cell(r, a, 1e6)["loss"] for r in objective_ratios]
                 for a in (1.0, -1.0)}
    objective_fig, _ax = figure()
    span(_ax, 1 - eps, 1 + eps, f"trust region, ε = {eps:.2f}")
    curves(_ax, objective_ratios, objective)
    curves(_ax, objective_ratios, unclipped, styles={k: ":" for k in unclipped})  # the same colours, dotted
    mark(_ax, ratio, f"your token: ρ = {ratio:.2f}, A = {adv:+g}")
    _ax.set_xlim(objective_ratios[0], objective_ratios[-1])
    finish(objective_fig, _ax, "ratio ρ = π_θ / π_old (dimensionless)", "objective min(ρA, clip(ρ)A)",
           title="Where the objective goes flat, the token's gradient is zero")
    legend_right(objective_fig, _ax)
    objective_fig
    return objective, objective_fig, objective_ratios


@app.cell
def _(eps, markdown_table, mo, torch):
    from posttrain.algorithms.core import clipped_surrogate as _surrogate

    # Several epochs on ONE batch: a free (B, T, V) table of logits plays the policy, so the
    # only thing stopping it from running away from π_old is the clip.
    _gen = torch.Generator().manual_seed(0)
    _B, _T, _V = 8, 4, 6
    _logits0 = torch.randn(_B, _T, _V, generator=_gen)
    _tokens = torch.multinomial(torch.softmax(_logits0, -1).view(-1, _V), 1, generator=_gen).view(_B, _T)
    _old = torch.log_softmax(_logits0, -1).gather(-1, _tokens[..., None])[..., 0]  # (B, T) old_logp
    _adv = torch.where(torch.rand(_B, 1, generator=_gen) < 0.5, 1.0, -1.0).expand(_B, _T)  # (B, T) ±1 per row
    _mask = torch.ones(_B, _T)
    _logits = _logits0.clone().requires_grad_(True)
    epochs = []
    for _epoch in range(8):
        _logp = torch.log_softmax(_logits, -1).gather(-1, _tokens[..., None])[..., 0]  # (B, T)
        _loss, _m = _surrogate(_logp, _old, _adv, _mask, eps, eps)
        epochs.append(_m)
        (_grad,) = torch.autograd.grad(_loss, _logits)
        with torch.no_grad():
            _logits -= 5.0 * _grad  # plain SGD, big steps: the clip, not the step size, must hold it
    _table = markdown_table(["epoch", "ratio max", "approx_kl(π_old ‖ π_θ)", "clipfrac"],
                            [[i + 1, f"{m['ratio_max']:.2f}", f"{m['approx_kl']:.4f}", f"{m['clipfrac']:.2f}"]
                             for i, m in enumerate(epochs)])
    mo.md(
        f"""
    ### Eight epochs on one batch with ε = {eps:.2f}

    8 rows × 4 tokens, advantage ±1 per row, plain SGD (lr 5) on `clipped_surrogate`, measured
    at the start of each epoch:

    {_table}
    """
    )
    return (epochs,)


@app.cell
def _(markdown_table, mo, torch):
    from posttrain.algorithms.ppo import gae, token_level_rewards

    # PPO's other patch, for one 5-token response with reward 1 at its end and a critic's guesses.
    _mask = torch.ones(1, 5)
    _values = torch.tensor([[0.2, 0.3, 0.5, 0.6, 0.9]])  # V(s_t) from the critic at sampling time
    _rewards = token_level_rewards(torch.tensor([1.0]), _mask)  # (1, 5): the reward on the last token
    _adv, _ret = gae(_rewards, _values, _mask, gamma=1.0, lam=0.95)
    _table = markdown_table(["t", "0", "1", "2", "3", "4"], [
        ["token reward r_t"] + [f"{v:g}" for v in _rewards[0].tolist()],
        ["critic V(s_t)"] + [f"{v:g}" for v in _values[0].tolist()],
        ["advantage A_t"] + [f"{v:+.3f}" for v in _adv[0].tolist()],
    ])
    mo.md(
        f"""
    ### The critic's part: GAE on one response (γ = 1, λ = 0.95)

    {_table}
    Unlike REINFORCE's one number per sequence, each token gets its own advantage, built from
    how much the critic's estimate changed after it, $\\delta_t = r_t + \\gamma V(s_{{t+1}}) - V(s_t)$,
    smoothed over the following tokens by λ. The price is a second network to train
    (the value loss in `PPO.compute_loss`) — the memory GRPO saves in lesson 11.
    """
    )
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **ε = 2 (no effective clip).** In the eight-epoch table the ratio runs away — `ratio max`
      past 3 and `approx_kl` more than ten times what it reaches at ε = 0.2 — because nothing
      stops the optimiser from exploiting the same eight samples again and again. That is
      exactly the over-fitting to stale samples that the clip exists to prevent. At ε = 0.2 the
      clip engages (`clipfrac` rises toward 1) and the drift stalls. Notice it stalls at a
      `ratio max` *above* 1.2: the clip cannot undo the step that crossed the boundary, it
      only withholds the gradient from then on.
    * **The asymmetric corners.** With A = −1 and ρ = 1.5, the token is *unclipped*: a token
      we wanted to make rarer has become more likely, and PPO keeps pushing it down, with a
      gradient that grows with ρ. Very large ratios on negative-advantage tokens are what
      *dual-clip* PPO caps (`dual_clip` in `clipped_surrogate`).
    * **ε → 0.** Every token outside an ever-thinner band gets no gradient: training stalls.

    ## Source files used here

    * `posttrain/algorithms/core.py` — `clipped_surrogate` (the table), `importance_ratio`
    * `posttrain/algorithms/ppo.py` — `PPO`, `gae`, `token_level_rewards`, `clipped_value_loss`
    * `posttrain/models/value_head.py` — the critic, one linear layer on the policy's hidden state
    * `posttrain/teach/demos/gridworld_ppo.py` — PPO on a classic control task (`posttrain demo gridworld_ppo`)

    ## Exercises

    1. Derive ∂L/∂log π for the unclipped branch and check it against the widget: why is it
       −A·ρ and not −A?
    2. In which two corners of the table does the clip *not* protect you, and why is that a
       deliberate choice (pessimism) rather than an oversight?
    3. Code: `exercises/10_ppo.py` asks you to write the clipped surrogate loss (token mean);
       run `posttrain check 10`.
    """)
    return


if __name__ == "__main__":
    app.run()
