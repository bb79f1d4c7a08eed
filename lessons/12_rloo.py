"""Lesson 12 · RLOO: the leave-one-out baseline, unbiased for free."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import itertools

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread
    from posttrain.teach.tables import markdown_table

    torch = torch_on_one_thread()
    return itertools, markdown_table, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 12 · RLOO: leave one out

    ## Why leave one out

    Lesson 11 ended with a wrinkle: GRPO's group mean includes the sample's own reward, so the
    baseline is not independent of the sample it judges, and the expected gradient comes out
    scaled by $(K-1)/K$. The REINFORCE derivation (lesson 09) needs $b$ *independent* of $y_i$ to
    drop out in expectation. The fix is one line: judge each sample against the mean of the
    **other** $K-1$.

    ## The key equation

    $$
    b_i = \frac{1}{K-1}\sum_{j \ne i} r_j,
    \qquad A_i = r_i - b_i = \frac{K}{K-1}\,\big(r_i - \bar r\big),
    \qquad \mathcal{L} = -\frac{1}{K}\sum_i A_i \sum_t \log\pi_\theta(y_{i,t})
    $$

    The middle identity is the whole algebra of RLOO: it is GRPO without the std, times the
    constant $K/(K-1)$. So the *direction* of each step is the mean-only GRPO direction, the
    scale is exactly right, and the estimate is unbiased. RLOO's second choice (Ahmadian et
    al., "Back to Basics") is to keep REINFORCE's loss — no ratio, no clip — arguing that
    with one on-policy step per batch the clip is rarely active; and no std either.

    Set the reward of sample 0 and the group size; the group's other rewards are fixed
    (`1, 0, 0, 1, 0, 0, 0` in order).
    """)
    return


@app.cell
def _(mo):
    controls = mo.ui.dictionary({
        "r0": mo.ui.slider(start=0.0, stop=1.0, step=0.1, value=1.0, label="reward of sample 0", show_value=True),
        "K": mo.ui.slider(start=1, stop=8, step=1, value=4, label="group size K", show_value=True),
    })
    controls.vstack()  # the panel's controls, one per line (their values stay in `controls`)
    return (controls,)


@app.cell
def _(controls, torch):
    from posttrain.algorithms.grpo import group_advantages
    from posttrain.algorithms.rloo import leave_one_out_baseline
    from posttrain.teach.widgets import family_comparison, family_markdown, synthetic_batch

    r0, K = controls.value["r0"], controls.value["K"]
    OTHERS = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    rewards = torch.tensor([r0] + OTHERS[: K - 1])  # (K,)
    ids = torch.zeros(K, dtype=torch.long)
    loo = leave_one_out_baseline(rewards, ids)  # (K,)
    mean = rewards.mean().expand(K)  # GRPO's baseline, the same for every sample
    centred = group_advantages(rewards, ids, "none", 1e-6)  # r − mean, Dr. GRPO's advantage
    rloo_adv = rewards - loo
    scale = K / (K - 1) if K > 1 else float("nan")
    batch = synthetic_batch([[(r, 4 + 3 * i) for i, r in enumerate(rewards.tolist())]])
    table = family_markdown(batch, family_comparison(batch), focus="rloo")
    return K, centred, loo, mean, r0, rewards, rloo_adv, scale, table


@app.cell
def _(K, centred, loo, markdown_table, mean, mo, r0, rewards, rloo_adv, scale, table):
    _rows = markdown_table(
        ["sample", "reward", "GRPO's baseline (mean of all)", "RLOO's baseline (mean of others)", "r − mean",
         "RLOO advantage", "ratio"],
        [[str(i), f"{rewards[i]:g}", f"{mean[i]:.3f}", f"{loo[i]:.3f}", f"{centred[i]:+.3f}", f"{rloo_adv[i]:+.3f}",
          f"{(rloo_adv[i] / centred[i]).item() if abs(centred[i]) > 1e-9 else float('nan'):.3f}"] for i in range(K)])
    mo.md(
        f"""
    ### K = {K}, r₀ = {r0:g}

    {_rows}
    Every ratio is K/(K−1) = **{scale:.3f}** (NaN where r − mean is 0). Move r₀: GRPO's baseline
    for sample 0 moves with its own reward; RLOO's baseline for sample 0 does not move at all.

    ### The same group through the family (RLOO marked ▶, cells that differ from GRPO in bold)

    {table}
    RLOO's push grows with response length (its loss sums over tokens, `seq-mean-token-sum`);
    GRPO's does not (it averages within each response first).
    """
    )
    return


@app.cell
def _(itertools, torch):
    from posttrain.algorithms.grpo import group_advantages as _group_advantages
    from posttrain.algorithms.rloo import leave_one_out_baseline as _loo

    # Exact expected gradient, as in lesson 11: all 2^K groups of a two-armed prompt.
    _pi, _arm_reward = torch.tensor([0.3, 0.7]), torch.tensor([1.0, 0.0])
    _true = (_pi[0] * (1 - _pi[0])).item()
    UNBIASED_KS = list(range(2, 9))
    unbiased = {"mean of all (GRPO without std)": [], "leave one out (RLOO)": []}  # ÷ true gradient, per K
    for _K in UNBIASED_KS:
        _groups = torch.tensor(list(itertools.product([0, 1], repeat=_K)))  # (2^K, K)
        _prob = _pi[_groups].prod(dim=1)
        _r = _arm_reward[_groups].reshape(-1)
        _ids = torch.arange(len(_groups)).repeat_interleave(_K)
        _score = torch.nn.functional.one_hot(_groups, 2).float() - _pi  # (2^K, K, 2)

        def _expected(adv):
            return (_prob[:, None] * (adv.view(-1, _K, 1) * _score).mean(dim=1)).sum(dim=0)[0].item()

        unbiased["mean of all (GRPO without std)"].append(_expected(_group_advantages(_r, _ids, "none", 1e-6)) / _true)
        unbiased["leave one out (RLOO)"].append(_expected(_r - _loo(_r, _ids)) / _true)
    return UNBIASED_KS, unbiased


@app.cell
def _(K, UNBIASED_KS, markdown_table, mo, unbiased):
    from posttrain.teach.charts import curves, figure, finish, mark

    unbiased_fig, _ax = figure()
    curves(_ax, UNBIASED_KS, unbiased, markers=True)
    mark(_ax, K, f"K = {K}")
    finish(unbiased_fig, _ax, "group size K (samples per prompt)", "expected ÷ true gradient",
           title="Leave one out is unbiased at every K; the mean of all shrinks the step by (K − 1)/K")
    _table = markdown_table(["K", *unbiased], [[str(k), *(f"{v[i]:.3f}" for v in unbiased.values())]
                                               for i, k in enumerate(UNBIASED_KS)])
    mo.vstack([mo.md("### Unbiased, exactly: expected gradient ÷ true gradient"), unbiased_fig, mo.md(_table)])
    return (unbiased_fig,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **K = 1.** There are no "others": RLOO's baseline would be 0 / 0. `leave_one_out_baseline`
      gives the sample its own reward as baseline instead, so the advantage is 0 — no signal, no
      NaN. The ratio column reads NaN because K/(K−1) is undefined. RLOO, like GRPO, needs K ≥ 2.
    * **Rewards on a large scale.** RLOO divides by nothing: multiply every reward by 100 and
      every push is 100 times larger (GRPO's std would undo it). With a verifier in {0, 1} that
      is fine; with a learned reward model of arbitrary scale, the learning rate must absorb it.
    * **Long completions.** Because RLOO sums log-probs over tokens, a 40-token completion gets
      10 times the push of a 4-token one with the same advantage. That is the unbiased
      estimator of the *sequence* probability's gradient — and a reason to keep lengths in view.

    ## Source files used here

    * `posttrain/algorithms/rloo.py` — `leave_one_out_baseline`, `RLOO` (REINFORCE with one method changed)
    * `posttrain/algorithms/reinforce.py` — the loss RLOO inherits
    * `posttrain/algorithms/grpo.py` — `group_advantages` (the mean-only comparison)
    * `posttrain/teach/widgets.py` — `synthetic_batch`, `family_comparison`, `family_markdown`
    * `tests/test_rloo.py` — the K/(K−1) identity as a test

    ## Exercises

    1. Prove $r_i - b_i = \frac{K}{K-1}(r_i - \bar r)$ in two lines.
    2. RLOO is unbiased and GRPO-without-std is biased by $(K-1)/K$. Since the bias is a constant
       factor, does it matter in practice with Adam? When would it?
    3. Code: `exercises/12_rloo.py` asks for the leave-one-out baseline; run `posttrain check 12`.

    Next: [13 · DAPO](?file=13_dapo.py).
    """)
    return


if __name__ == "__main__":
    app.run()
