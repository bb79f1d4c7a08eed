"""Lesson 13 · DAPO: four practical fixes to GRPO, each a few lines."""

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
    # 13 · DAPO: four practical fixes

    ## Why GRPO needed patching

    GRPO worked, and then long chain-of-thought runs exposed four ways it wastes or distorts
    signal. DAPO (Yu et al., 2025) is GRPO with the KL term dropped and one fix for each:

    | fix | the problem it answers | the change |
    |:---|:---|:---|
    | **clip-higher** | a rare token can barely grow: $\rho \le 1+\epsilon$ lets $p = 0.01$ reach only $0.012$, so exploration dies and entropy collapses | $\epsilon_{\text{high}} = 0.28 > \epsilon_{\text{low}} = 0.2$ |
    | **dynamic sampling** | groups with all-equal rewards have advantage 0 but still fill the batch | drop them, sample more prompts until the batch is full of informative groups |
    | **token-level loss** | GRPO averages within each response first, so a token of a long response weighs less | average over all tokens of the batch (`token-mean`) |
    | **overlong shaping** | a response cut off at the budget scores as wrong, though its reasoning may be sound | a soft length penalty over the last $L_{\text{cache}}$ tokens of the budget |

    ## The key equations

    $$
    \mathcal{L} = -\frac{1}{\sum_i |y_i|}\sum_i\sum_t \min\big(\rho_{i,t}A_i,\ \operatorname{clip}(\rho_{i,t}, 1-\epsilon_{\text{low}}, 1+\epsilon_{\text{high}})A_i\big),
    \qquad
    R_{\text{length}}(|y|) = \operatorname{clip}\!\Big(\frac{(L_{\max} - L_{\text{cache}}) - |y|}{L_{\text{cache}}},\, -1,\, 0\Big)
    $$

    with $A_i$ GRPO's group advantage of the shaped reward $r_i + R_{\text{length}}(|y_i|)$, and only
    groups with $0 < \text{accuracy} < 1$ kept. Here $L_{\max} = 48$, $L_{\text{cache}} = 10$: free up to 38 tokens.

    The dropdown removes one fix at a time from the real `DAPO` class (by its constructor
    arguments) and runs both versions on the same batch: an all-correct group, a mixed group
    with a long wrong answer, and a group with two correct answers, one of which ran long.
    """)
    return


@app.cell
def _(mo):
    ABLATIONS = {
        "none: full DAPO": {},
        "clip-higher (ε_high back to 0.2)": {"clip_eps_high": 0.2},
        "dynamic sampling (keep every group)": {"dynamic_sampling": False},
        "token-level loss (GRPO's per-response mean)": {"loss_agg": "seq-mean-token-mean"},
        "overlong shaping (no length penalty)": {"overlong_cache": 0},
    }
    ablation = mo.ui.dropdown(options=list(ABLATIONS), value="dynamic sampling (keep every group)",
                              label="remove one fix")
    ablation
    return ABLATIONS, ablation


@app.cell
def _(ABLATIONS, ablation, torch):
    from posttrain.algorithms import make_algorithm
    from posttrain.algorithms.core import clipped_surrogate
    from posttrain.algorithms.dapo import overlong_penalty
    from posttrain.teach.widgets import BUDGET, algorithm_pushes, family_markdown, synthetic_batch

    removed = ablation.value
    params = ABLATIONS[removed]
    batch = synthetic_batch([
        [(1, 6), (1, 8), (1, 5), (1, 7)],  # all correct: no signal
        [(1, 6), (0, 30), (0, 8), (1, 12)],  # mixed, with a long wrong answer
        [(1, 10), (1, 44), (0, 9), (0, 14)],  # two correct answers, one of them past 38 tokens
    ])
    results = {"grpo": algorithm_pushes(batch, "grpo"), "dapo": algorithm_pushes(batch, "dapo")}
    label = "dapo" if not params else "dapo minus " + removed.split(" (")[0]
    if params:
        results[label] = algorithm_pushes(batch, "dapo", **params)
    table = family_markdown(batch, results, focus=label, base="dapo")
    algo = make_algorithm("dapo", budget=BUDGET, **params)
    shaped = algo.shaped_rewards(batch)  # (B,) r + R_length

    # Clip-higher: how far can one step raise a token's probability, and is a ratio of 1.25 on
    # a good token still pushed?
    def pushed_at(ratio: float) -> bool:
        logp = torch.log(torch.tensor([[ratio]])).requires_grad_(True)
        loss, _ = clipped_surrogate(logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                                    algo.clip_eps_low, algo.clip_eps_high)
        loss.backward()
        return logp.grad.item() != 0

    ceilings = [(p, min(1.0, p * (1 + algo.clip_eps_high))) for p in (0.01, 0.1, 0.5, 0.9)]
    push_125 = pushed_at(1.25)
    penalties = overlong_penalty(torch.tensor([30, 38, 40, 44, 48]), 48, algo.overlong_cache)
    return algo, batch, ceilings, label, penalties, push_125, removed, results, shaped, table


@app.cell
def _(algo, batch, ceilings, label, mo, penalties, push_125, removed, results, shaped, table):
    _kept = int(results[label][2].get("kept_rows", batch.batch_size))
    _ceil = " · ".join(f"{p:g} → {c:.4f}" for p, c in ceilings)
    mo.md(
        f"""
    ### Removed: {removed}

    `{label}` trains on **{_kept} of {batch.batch_size}** rows. Columns: GRPO for reference, full
    DAPO, and the ablation (▶), whose cells are **bold** wherever they differ from full DAPO.

    {table}

    **Shaped rewards** r + R_length used by `{label}`: `{[round(v, 2) for v in shaped.tolist()]}`
    (R_length at 30, 38, 40, 44, 48 tokens with L_cache = {algo.overlong_cache}: `{[round(v, 2) for v in penalties.tolist()]}`).

    **Clip-higher** with ε_high = {algo.clip_eps_high:g}: the highest probability one step can
    give a token, from p_old: {_ceil}. A good token (A > 0) already at ratio 1.25 is
    {"still pushed up" if push_125 else "**no longer pushed**: the clip has stopped it"}.
    """
    )
    return


@app.cell
def _(batch, label, results):
    from posttrain.teach.charts import figure, finish, grouped_bars, legend_right

    _lengths = batch.response_lengths().int().tolist()
    push_fig, _ax = figure(height=3.0)
    grouped_bars(_ax, [f"g{int(batch.group_ids[b])}\nr={batch.rewards[b]:g}\n{_lengths[b]} tok"
                       for b in range(batch.batch_size)],
                 {name: push.tolist() for name, (_, push, _) in results.items()}, highlight=label)
    finish(push_fig, _ax, "rows 0-11: group, reward, response tokens (an empty slot: dropped)",
           "push −Σ_t ∂loss/∂log π", title="The push on each completion (> 0: made more likely)")
    legend_right(push_fig, _ax)
    push_fig
    return (push_fig,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    Remove each fix in turn and read the bold cells:

    * **dynamic sampling.** The all-correct group is back in the batch with advantage 0: it
      contributes no gradient, yet under `token-mean` its 26 tokens join the denominator, so
      every informative row's push shrinks. In a real run the share of such groups grows as the
      model improves (everything easy becomes all-correct), and the effective batch quietly
      shrinks with it; `posttrain` logs it as `zero_variance_groups`.
    * **overlong shaping.** The 44-token correct answer gets the same advantage as the 10-token
      one instead of a smaller one, so nothing discourages drifting toward the budget. (In the
      other direction, *with* a hard cut-off and no shaping, a correct answer that is truncated
      scores 0 and the policy is punished for reasoning that was merely long.)
    * **token-level loss.** Within a group, the 30-token wrong answer's push becomes exactly the
      8-token wrong answer's: one response, one vote, however many tokens it has — so a long
      wrong answer is penalised *less per token*, the length bias lesson 14 removes another way.
    * **clip-higher.** The good token at ratio 1.25 stops being pushed, and a token at
      p = 0.01 can only reach 0.012 per step: rare but right continuations cannot grow fast,
      and a run's entropy collapses early.
    """)
    return


@app.cell
def _():
    from posttrain.config.files import load_file
    from posttrain.runs.lineage import differing_keys
    from posttrain.teach.lessons import LESSONS_DIR

    # the two start presets, read from the repository's recipes/ (next to lessons/)
    STARTS = {kind: LESSONS_DIR.parent / "recipes" / f"start_from_{kind}.toml" for kind in ("base", "aligned")}
    start_differences = differing_keys(load_file(str(STARTS["base"])), load_file(str(STARTS["aligned"])),
                                       ignore=frozenset({"name"}))
    return STARTS, start_differences


@app.cell
def _(STARTS, mo, start_differences):
    def _toml(value):  # as the files write it: false, not False
        return str(value).lower() if isinstance(value, bool) else str(value)

    # each row indented as the cell's text is, so that mo.md's dedent keeps the table a table
    _rows = "\n    ".join(f"| `{key.replace('rl.algo_params.', 'grpo.')}` | `{_toml(base)}` | `{_toml(aligned)}` |"
                           for key, (base, aligned) in start_differences.items())
    mo.md(f"""
    ## A caveat: tuned on a base model

    DAPO's fixes were tuned on a **base** model (Qwen2.5-32B base, arXiv:2503.14476). A later
    study that re-ran each trick on base and on aligned (instruction-tuned) models,
    arXiv:2508.08221, reports (as this course's spec reads it) that their sign can flip with
    the start: clip-higher helps the aligned model rather than the base one, a token-level loss
    helps the base model and may hurt the aligned one, and aggressive overlong filtering needs
    care on a base model. So
    "DAPO's defaults" are a base-model preset, not a law.

    posttrain keeps the choice in two config files, `{STARTS["base"].name}` and
    `{STARTS["aligned"].name}` in `recipes/`; read from there, they differ in
    **{len(start_differences)}** settings:

    | setting | base start | aligned start |
    |:---|:---|:---|
    {_rows}

    Measured here on gpt_mini (its "base" is the same SFT stopped at 200 of 600 steps), held-out
    pass@1 of clip-higher minus the symmetric clip, on seeds 0, 1 and 2: from the aligned start
    [−3.4 [−6.2, −0.6], +2.2 [−1.0, +5.4] and −2.4 [−5.2, +0.4] points](../docs/guides/base-vs-aligned.md#the-measured-pair-clip-higher-from-each-start),
    from the weak start [+1.4 [−2.6, +5.4], −6.4 [−11.4, −1.4] and −4.0 [−8.6, +0.6]](../docs/guides/base-vs-aligned.md#the-measured-pair-clip-higher-from-each-start).
    The base side leans the study's way; the aligned side does not show its benefit, and on
    both the sign changes with the seed. Here the clip binds on
    [0.4–0.5% of the tokens](../docs/guides/base-vs-aligned.md#the-measured-pair-clip-higher-from-each-start) and the answers are short, so clip-higher has little to
    act on: a caveat runs both ways, and a preset is where to start measuring, not a result.
    [docs/guides/base-vs-aligned.md](../docs/guides/base-vs-aligned.md) has the reasons, the
    sources and the whole table.
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Source files used here

    * `posttrain/algorithms/dapo.py` — `DAPO`, `overlong_penalty`, `informative_groups`, `filter_batch`
    * `posttrain/algorithms/grpo.py` — the parent class
    * `posttrain/algorithms/core.py` — `clipped_surrogate` (eps_low ≠ eps_high), `agg_loss` (`token-mean`)
    * `posttrain/roles/controller.py` — `Controller.informative_episodes`, the dynamic-sampling loop
    * `posttrain/teach/widgets.py` — `synthetic_batch`, `algorithm_pushes`, `family_markdown`
    * `recipes/start_from_base.toml`, `recipes/start_from_aligned.toml` — the two start presets

    ## Exercises

    1. Why must dynamic sampling drop *whole groups*, never single rows?
    2. Dynamic sampling filters on the verifier's reward, before the length penalty. Construct a
       group that would be kept if it filtered on shaped rewards, and say why that is wrong.
    3. Code: `exercises/13_dapo.py` asks for the overlong penalty; run `posttrain check 13`.

    Next: [14 · Dr. GRPO](?file=14_dr_grpo.py), which removes the length bias another way.
    """)
    return


if __name__ == "__main__":
    app.run()
