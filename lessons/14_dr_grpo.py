"""Lesson 14 · Dr. GRPO: delete two divisors, remove two biases."""

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
    # 14 · Dr. GRPO: debiasing

    ## Why two innocent-looking divisions are biases

    GRPO's objective divides twice by something that depends on the samples (Liu et al., 2025,
    "Understanding R1-Zero-Like Training"):

    1. **$1/|y_i|$, the response length.** Each response's token losses are averaged, so a
       response's total push is the same however long it is. Spread over more tokens, a long
       *wrong* answer is penalised less per token than a short wrong one — so the cheapest way
       for the policy to lose less on a wrong answer is to make it longer. Response lengths
       creep up during training for a reason that has nothing to do with reasoning.
    2. **$1/\operatorname{std}(r)$, the group's reward spread.** Prompts the model nearly always
       gets right (or wrong) have a small std, so their advantages are blown up: the rare
       success on a hard prompt gets a huge advantage, and such prompts dominate the update.

    ## The key equation: GRPO minus two divisors

    $$
    \text{GRPO:}\quad \frac{1}{K}\sum_i \frac{1}{|y_i|}\sum_t \min(\rho_{i,t}\hat A_i, \ldots),\quad \hat A_i = \frac{r_i - \bar r}{\operatorname{std}(r)}
    \qquad
    \text{Dr. GRPO:}\quad \frac{1}{K}\sum_i \frac{1}{L_{\max}}\sum_t \min(\rho_{i,t}\hat A_i, \ldots),\quad \hat A_i = r_i - \bar r
    $$

    $L_{\max}$ is a constant (the generation budget, 48 here), so it only sets the step size.
    What remains is REINFORCE with a group-mean baseline and PPO's clip — the estimator the
    derivation asks for. In `posttrain` the whole diff is two changed defaults in
    `posttrain/algorithms/dr_grpo.py`.

    The slider sets the length of one wrong answer in a group of four
    (right 8 tokens, wrong **L** tokens, wrong 8 tokens, right 8 tokens).
    """)
    return


@app.cell
def _(mo):
    wrong_len = mo.ui.slider(start=2, stop=48, step=2, value=32, label="length L of the long wrong answer (tokens)",
                             show_value=True)
    wrong_len
    return (wrong_len,)


@app.cell
def _(torch, wrong_len):
    from posttrain.algorithms.grpo import group_advantages
    from posttrain.teach.widgets import family_comparison, family_markdown, synthetic_batch

    L = wrong_len.value
    batch = synthetic_batch([[(1, 8), (0, L), (0, 8), (1, 8)]])
    results = family_comparison(batch)
    table = family_markdown(batch, results, focus="dr_grpo")
    lengths = batch.response_lengths()  # (B,)
    per_token = {n: results[n][1] / lengths for n in ("grpo", "dr_grpo")}  # (B,) push per token

    # The std bias: the advantage of one correct answer in groups of 8 of differing difficulty.
    _rows = []
    for _correct in (1, 4, 7):
        _r = torch.tensor([1.0] * _correct + [0.0] * (8 - _correct))
        _ids = torch.zeros(8, dtype=torch.long)
        _rows.append((_correct, group_advantages(_r, _ids, "group", 1e-6)[0].item(),
                      group_advantages(_r, _ids, "none", 1e-6)[0].item()))
    std_rows = _rows
    return L, per_token, std_rows, table


@app.cell
def _(L, mo, per_token, std_rows, table):
    _g, _d = per_token["grpo"], per_token["dr_grpo"]
    _std = "".join(f"| {c} of 8 | {g:+.3f} | {d:+.3f} | {g / d:.2f} |\n" for c, g, d in std_rows)
    mo.md(
        f"""
    ### The long wrong answer has L = {L} tokens

    {table}

    **Push per token** on the two wrong answers (rows 1 and 2, lengths {L} and 8):

    | | row 1 ({L} tokens) | row 2 (8 tokens) | row 1 ÷ row 2 |
    |:---|---:|---:|---:|
    | GRPO | {_g[1]:+.5f} | {_g[2]:+.5f} | **{_g[1] / _g[2]:.2f}** |
    | Dr. GRPO | {_d[1]:+.5f} | {_d[2]:+.5f} | **{_d[1] / _d[2]:.2f}** |

    Under GRPO each token of the {L}-token wrong answer is pushed down {_g[1] / _g[2]:.2f} times as hard
    as a token of the 8-token one; under Dr. GRPO every wrong token is pushed equally.

    ### The std bias (not affected by the slider)

    Advantage of one correct answer in a group of 8, by how many of the 8 were correct:

    | correct | GRPO (÷ std) | Dr. GRPO | GRPO ÷ Dr. GRPO |
    |:---|---:|---:|---:|
    {_std}
    The std is smallest for prompts at the extremes (1 or 7 of 8 correct), so GRPO scales their
    advantages up by 2.83 against 1.87 for the balanced prompt: nearly-always-wrong and
    nearly-always-right prompts weigh about 1.5 times more in the update, for no reason but
    their difficulty. Dr. GRPO leaves every prompt's advantage at r − mean.
    """
    )
    return


@app.cell
def _(L, per_token):
    from posttrain.teach.charts import PALETTE, REFERENCE, figure, finish

    # The push-per-token table, drawn: each algorithm's push on a token of each answer, in units
    # of its push on a token of the 8-token wrong answer, so the two losses share one scale
    _answers = ["right, 8 tokens", f"wrong, {L} tokens", "wrong, 8 tokens", "right, 8 tokens"]
    _ratio = {_n: (per_token[_n][1] / per_token[_n][2]).item() for _n in ("grpo", "dr_grpo")}
    _fig, _ax = figure()
    for _i, (_name, _label) in enumerate((("grpo", "GRPO (÷ |y|)"), ("dr_grpo", "Dr. GRPO (÷ L_max)"))):
        _relative = (per_token[_name] / per_token[_name][2].abs()).tolist()  # (B,)
        _ax.bar([_x + 0.4 * _i - 0.2 for _x in range(len(_answers))], _relative, width=0.4, color=PALETTE[_i],
                label=_label)
    _ax.axhline(0.0, color=REFERENCE, linewidth=0.8)
    _ax.set_xticks(range(len(_answers)), _answers, fontsize=8)
    chart = finish(_fig, _ax, "the group's four answers (a token of the 8-token wrong one = −1)", "push per token",
                   title=f"The {L}-token wrong answer, per token: GRPO {_ratio['grpo']:.2f}×, "
                         f"Dr. GRPO {_ratio['dr_grpo']:.2f}× the 8-token one's push")
    chart
    return (chart,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **L = 48.** Under GRPO a token of the 48-token wrong answer carries one sixth of the
      penalty of a token in the 8-token wrong answer. Repeat that over thousands of steps and
      the policy learns that *if it is going to be wrong, it should be wrong at length* —
      response length climbs while accuracy does not. Dr. GRPO's per-token push is the same at
      every length (ratio 1.00); GRPO's shrinks as 8/L.
    * **L = 8**, all lengths equal: the two losses differ only by a constant factor, and only the
      std remains as a difference. Length bias needs lengths that differ — which in
      chain-of-thought training they always do.
    * The std column: at 1 of 8 correct, GRPO's advantage is ≈ 2.5, Dr. GRPO's 0.875. A hard
      prompt's rare success steers the step far more than its share of the batch.

    ## Source files used here

    * `posttrain/algorithms/dr_grpo.py` — `DrGRPO`: `adv_norm="none"`, `loss_agg="seq-mean-token-sum-norm"`
    * `posttrain/algorithms/grpo.py` — `GRPO`, `group_advantages` (its `norm` argument)
    * `posttrain/algorithms/core.py` — `agg_loss` (`seq-mean-token-mean` vs `seq-mean-token-sum-norm`)
    * `posttrain/teach/widgets.py` — `synthetic_batch`, `family_comparison`, `family_markdown`
    * `tests/test_dr_grpo.py` — Dr. GRPO as GRPO with two divisors deleted, as tests

    ## Exercises

    1. DAPO (lesson 13) fixes the length bias with `token-mean`, Dr. GRPO with a constant
       divisor. Are they the same? Compare the DAPO and Dr. GRPO push columns above at L = 48,
       and say which depends on the *other* responses in the batch.
    2. Dr. GRPO's `max_len` must equal the rollout's `max_new_tokens`. What goes wrong if it is
       set to 4 while responses are up to 48 tokens? (Read the module docstring.)
    3. Code: `exercises/14_dr_grpo.py` asks for the `seq-mean-token-sum-norm` aggregation; run
       `posttrain check 14`.

    Next: lesson 15 asks where a reward comes from when no rule can check the answer (RLHF).
    """)
    return


if __name__ == "__main__":
    app.run()
