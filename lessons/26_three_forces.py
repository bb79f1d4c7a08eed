"""Lesson 26 · Why RL is shaping this way today: three forces (signal, estimator, cost)."""

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
    # 26 · Why RL is shaping this way today

    ## Three forces

    Strip any post-training method down and three questions are left.

    * **Signal.** Where does the reward come from, and how much of the truth does it carry?
      A verifier (lessons 03, 18) is exact where it can check and silent where it cannot. A
      learned reward model (lesson 15) answers everywhere, approximately, and its errors are
      searchable. Preference pairs (lesson 16) are a reward model's labels without the model,
      collected once, from a policy that is not the one being trained.
    * **Estimator.** How is the reward turned into a gradient, and how noisy or biased is the
      result? No baseline (REINFORCE, lesson 09), a learned critic (PPO with GAE, lesson 10),
      the group as baseline (GRPO, RLOO, lessons 11-12), or no sampling at all (DPO's closed
      form, lesson 16: no noise, but the gradient of a loss on someone else's pairs).
    * **Cost.** What must be resident, and what must be generated every step? The policy
      and its frozen reference always; a reward model and a critic if the design needs
      them; and, for online methods, a fresh batch of rollouts, which is most of an RL step's
      wall clock.

    A method is an answer to all three, so it is a point in a triangle whose corners are
    "I care only about signal", "only about the estimator", "only about cost". The recipes the
    field went through are what happens at the corners:

    * **RLHF (InstructGPT, 2022).** "Helpful" has no checker, so the signal is a reward model.
      A noisy, expensive signal deserves the best estimator money buys: a critic, per-token
      advantages, PPO. Four model copies resident: the estimator corner.
    * **DPO (2023).** Drop the reward model and the sampling: one closed-form loss on pairs,
      two copies, nothing generated. The cost corner.
    * **R1-Zero and R1 (2025).** Math and code *can* be checked, so the reward is exact and
      nearly free. With an exact, sequence-level reward, a critic's advantage over a group
      baseline is small (measured below) while it costs a whole model copy: drop it, sample a
      group of 16, GRPO. The signal corner. R1 adds a reward model for the prompts no
      verifier can check.
    * **Tülu 3 (2024).** Pay for online RL only where a verifier makes it worth it: DPO on
      everything, then RL with verifiable rewards where they exist. Signal and cost together.

    ## The simulator

    `posttrain/teach/forces.py` scores eight designs. Two inputs are **measured live by the
    library** in this notebook: the verifier's fidelity (the chosen spec of
    `posttrain/verifiers/final_int.py` on the golden correct pack and the golden exploit pack)
    and each estimator's noise (the per-sample relative variance of a policy-gradient estimate
    on a Bernoulli reward, with the library's `leave_one_out_baseline` for the group and a
    perfect critic for PPO). The rest are **assumptions**, named in the module with their
    reasons: a reward model's fidelity (0.6), the discount on pairs another policy wrote
    (0.75), DPO's estimator loss (0.5), and what generating costs (two model copies' worth).
    A design applies one method to the prompts a verifier can check and one to the rest, so
    the share of checkable prompts is a knob too.
    """)
    return


@app.cell
def _(mo):
    from posttrain.teach import forces as _forces

    mo.md(rf"""
    ## The score, its tie-break, and when two designs tie

    Each design gets a loss in [0, 1] per force (0 is best). With your weights normalised to a
    point w of the triangle, its score is

    $$\text{{score}} = \underbrace{{\textstyle\sum_f w_f \cdot \text{{loss}}_f}}_{{\text{{weighted loss}}}}
    \; + \; \underbrace{{{_forces.TIE:g} \cdot \textstyle\sum_f \text{{loss}}_f}}_{{\text{{tie-break}}}}$$

    and the lowest score ranks first. The **tie-break** is there for designs equal on the forces
    you weighed: of two designs with the same signal loss under "all signal", the one worse on
    the estimator or on cost ranks second. It is at most {3 * _forces.TIE:g} (three losses of at
    most 1), so it orders designs and never separates them.

    **Two designs tie** when their weighted losses differ by less than
    **{_forces.TOLERANCE:g}**: about twice the most that such a difference moves when the
    estimator noise below is measured again with another seed. The page then names every design
    in the tie, in the tie-break's order, rather than a winner; the first of them is a
    preference for the forces you gave no weight, not a finding.
    """)
    return


@app.cell
def _(mo):
    controls = mo.ui.dictionary({
        "signal": mo.ui.slider(start=0.0, stop=1.0, step=0.1, value=1.0, label="weight on signal", show_value=True),
        "estimator": mo.ui.slider(start=0.0, stop=1.0, step=0.1, value=0.0, label="weight on the estimator",
                                  show_value=True),
        "cost": mo.ui.slider(start=0.0, stop=1.0, step=0.1, value=0.0, label="weight on cost", show_value=True),
        "coverage": mo.ui.slider(start=0.0, stop=1.0, step=0.1, value=1.0,
                                 label="share of prompts a verifier can check", show_value=True),
        "spec": mo.ui.dropdown(options=["final_int/cot-v1", "hackable/multi-final", "hackable/last-number",
                                        "hackable/substring"],
                               value="final_int/cot-v1", label="the verifier"),
    })
    controls.vstack()
    return (controls,)


@app.cell
def _():
    from posttrain.teach.forces import (
        TOLERANCE,
        corner_ties,
        corners,
        estimator_noise,
        normalised,
        rank,
        tied_at_top,
        verifier_fidelity,
    )

    # Measured once: 20,000 groups of 16 samples, pass rate 0.3, the same draws for every estimator
    noise = estimator_noise(p=0.3, k=16, groups=20_000, seed=0)
    return TOLERANCE, corner_ties, corners, noise, normalised, rank, tied_at_top, verifier_fidelity


@app.cell
def _(controls, corner_ties, corners, noise, normalised, rank, tied_at_top, verifier_fidelity):
    weights = (controls.value["signal"], controls.value["estimator"], controls.value["cost"])
    coverage = controls.value["coverage"]
    fidelity = verifier_fidelity(controls.value["spec"])
    try:
        point = normalised(weights)
        ranking = rank(weights, coverage, fidelity, noise)
        winner = ranking[0]["design"]  # the tie-break's first when the top is a tie
        tied = [row["design"] for row in tied_at_top(ranking)]  # [winner] alone when the top is clear
        error = None
    except ValueError as exc:  # every weight at 0: nothing can be preferred
        point, ranking, winner, tied, error = None, [], None, [], str(exc)
    recipes = corners(fidelity, noise)
    recipe_ties = corner_ties(fidelity, noise)
    return coverage, error, fidelity, point, ranking, recipe_ties, recipes, tied, winner


@app.cell
def _(TOLERANCE, controls, coverage, error, fidelity, mo, noise, point, ranking, recipe_ties, recipes, tied, winner):
    from posttrain.teach.tables import markdown_table

    _noise = markdown_table(["REINFORCE, no baseline", "perfect critic", "group, leave-one-out",
                             "GRPO, divided by the group std"],
                            [[f"{noise[k]:.2f}" for k in ("none", "critic", "group", "grpo")]])
    _measured = f"""
    **Measured.** `{controls.value['spec']}` pays the golden correct pack and refuses the exploit
    pack for a fidelity of **{fidelity:.3f}**. Per-sample relative variance of the gradient
    estimate (lower is steadier):

    {_noise}    """
    if error is not None:
        _body = f"**The simulator refuses:** {error}"
    else:
        _in_tie = {d.name for d in tied}
        _rows = markdown_table(
            ["recipe", "design", "signal loss", "estimator loss", "cost loss", "weighted loss", "tie-break",
             "score", f"within {TOLERANCE:g} of the top"],
            [[f"**{r['design'].recipe}**" if i == 0 else r["design"].recipe, r["design"].name]
             + [f"{r['losses'][f]:.3f}" for f in ("signal", "estimator", "cost")]
             + [f"{r['weighted']:.4f}", f"{r['score'] - r['weighted']:.4f}", f"{r['score']:.4f}",
                "tie" if r["design"].name in _in_tie else ""]
             for i, r in enumerate(ranking)])
        if len(tied) > 1:
            _verdict = (f"**A tie: {len(tied)} designs within {TOLERANCE:g}** of each other on the forces you "
                        f"weighed: {', '.join(d.recipe for d in tied)}. The simulator cannot tell them apart; "
                        f"the tie-break lists {winner.recipe} first because it is better on the forces you gave "
                        "no weight.")
        else:
            _margin = ranking[1]["weighted"] - ranking[0]["weighted"]
            _verdict = (f"**The winner: {winner.recipe}** ({winner.name}), ahead of {ranking[1]['design'].recipe} "
                        f"by {_margin:.3f} in weighted loss, more than the {TOLERANCE:g} that makes a tie.")
        _body = f"""
    **The point** (signal, estimator, cost) = ({point[0]:.2f}, {point[1]:.2f}, {point[2]:.2f}), with
    {coverage:.0%} of prompts checkable. {_verdict}

    {_rows}"""
    _corners = markdown_table(["slider setting", "the recipe it recovers", f"tied with it (within {TOLERANCE:g})"],
                              [[name, recipe, ", ".join(recipe_ties[name][1:]) or "nothing: a clear winner"]
                               for name, recipe in recipes.items()])
    mo.md(_measured + _body + f"""

    **The corners, with this verifier** (recomputed from the same measured inputs):

    {_corners}""")
    return


@app.cell
def _(TOLERANCE, coverage, fidelity, noise, point, rank, tied, tied_at_top, winner):
    from posttrain.teach.forces import DESIGNS
    from posttrain.teach.charts import (
        PALETTE,
        figure,
        finish,
        legend_right,
        mark_point,
        scatter,
        ternary,
        ternary_xy,
    )

    # The simulator's verdict over the whole triangle (weights on a grid of twentieths), at this
    # verifier and coverage: each region is where one recipe wins, a hollow point where it only
    # leads a tie (within TOLERANCE), by the tie-break.
    _grid = [(i / 20, j / 20, (20 - i - j) / 20) for i in range(21) for j in range(21 - i)]
    _regions: dict[str, tuple[list[float], list[float]]] = {d.recipe: ([], []) for d in DESIGNS}  # fixed colours
    _ties: dict[str, tuple[list[float], list[float]]] = {d.recipe: ([], []) for d in DESIGNS}
    for _shares in _grid:
        _x, _y = ternary_xy(_shares)
        _ranking = rank(_shares, coverage, fidelity, noise)
        _group = _ties if len(tied_at_top(_ranking)) > 1 else _regions
        _xs, _ys = _group[_ranking[0]["design"].recipe]
        _xs.append(_x)
        _ys.append(_y)
    triangle_fig, _ax = figure(width=7.5, height=3.6)
    ternary(_ax, ["signal", "estimator", "cost"])
    scatter(_ax, _regions, size=22)
    for _index, (_recipe, (_xs, _ys)) in enumerate(_ties.items()):  # hollow, in the colour of the tie-break's first
        if _xs:  # named in the legend when it has no solid point to be named by
            _ax.scatter(_xs, _ys, s=22, facecolors="none", edgecolors=PALETTE[_index % len(PALETTE)], linewidths=0.9,
                        label=None if _regions[_recipe][0] else _recipe)
    _ax.scatter([], [], s=22, facecolors="none", edgecolors="#7f7f7f", label=f"hollow: tie within {TOLERANCE:g}")
    if point is not None:  # every weight at 0 has no point to mark
        mark_point(_ax, *ternary_xy(point), f"you: {winner.recipe}" if len(tied) == 1 else
                   f"you: {winner.recipe} (tie of {len(tied)})")
    finish(triangle_fig, _ax, "", "", title=f"Which recipe wins where, {coverage:.0%} of prompts checkable, "
                                            f"verifier fidelity {fidelity:.2f}")
    legend_right(triangle_fig, _ax)
    triangle_fig
    return (triangle_fig,)


@app.cell
def _(mo):
    mo.md(r"""
    ## What the numbers say

    * A **perfect critic** is the steadiest unbiased estimator here (about 0.77 against 2.35
      with no baseline); the **group of 16** is within about 20% of it (about 0.90) without a
      model copy. A real critic is a network that must be trained and lags the policy, so
      0.77 is the critic's best case. That gap, and a whole copy saved, is R1's argument.
    * **GRPO's std division** looks steadier still (about 0.32), and that is not a free win:
      dividing each group by its own spread rescales every group's estimate to about the same
      size whatever its draws. Within one prompt that steadies the step; across prompts it
      weights them by difficulty, which is lesson 14's bias. It is a different gradient, so the
      simulator scores the group baseline by the unbiased leave-one-out number.
    * With every prompt checkable, R1-Zero and R1 are the same design, and under "all signal" a
      perfect verifier gives every verifier design a signal loss of 0: R1-Zero, R1, PPO-RLVR,
      Tülu 3 and REINFORCE tie, and the page says so. The signal corner alone does not choose
      GRPO; the tie-break, which prefers the steadier, cheaper design on the forces you did not
      weigh, lists R1-Zero first. Take a fifth of the prompts away from the verifier and R1's
      reward model for the rest pulls ahead of every other design by more than the tolerance:
      that is the recipe the R1 report describes.
    * The corners table names what each corner's recipe ties with. Under "all estimator" the
      critic is the steadiest estimator, and RLHF ties PPO on a verifier, which uses the same
      critic (nothing is checkable there, but that corner does not weigh signal). Under signal
      and cost, Tülu 3 leads DPO by less than the tolerance with this verifier: the assumed
      numbers, not a measurement, decide which is first.

    ## Find the knob that breaks it

    * **The verifier, `hackable/multi-final`.** Its measured fidelity is 0.75 (it refuses 18 of
      the 24 golden exploits), so under "all signal" the simulator still recommends a verifier
      (the same five designs tie, R1-Zero first). Lesson 18 ran exactly that: GRPO on `hackable/multi-final` found the one
      exploit it pays and drove the gold reward to about 0 within 40 steps. A fidelity measured
      on a fixed pack is not the fidelity under optimisation pressure: the optimiser does not
      sample exploits at the pack's rate, it converges on the ones that pay. The simulator,
      like any static scorecard, cannot see that. `hackable/last-number` (0.625) is the
      opposite lesson: equally leaky on paper, and lesson 18's optimiser stayed honest on it.
    * **The verifier, `hackable/substring`.** It pays every exploit, fidelity 0, and the signal
      corner abandons verifiers for a reward model (RLOO and PPO on a reward model tie; the
      tie-break lists RLOO, the cheaper, first). That is the right call; the point is that the simulator only gets it right when the measurement already
      shows the hole.
    * **Every weight at 0.** There is no point in the triangle; the simulator says so rather
      than pick a design for no reason.
    * **The assumptions.** Set `RM_FIDELITY` in `posttrain/teach/forces.py` to 0.9 and the
      reward model beats a 0.75-fidelity verifier on signal: the corners move. The recipes are
      recovered by these numbers, not proved by them.

    ## Source files used here

    * `posttrain/teach/forces.py` — the designs, the measured inputs, the assumptions, the scoring
    * `tests/test_forces.py` — every loss and score worked by hand; the measured noise against its closed form
    * `posttrain/algorithms/rloo.py` — `leave_one_out_baseline`; `posttrain/algorithms/grpo.py` — `group_advantages`
    * `posttrain/verifiers/final_int.py` — the honest spec and the hackable ones
    * `posttrain/eval/packs.py` — `load_pack`, `example_of`; the packs in `posttrain/data/packs/README.md`
    * `posttrain/algorithms/ppo.py` — the critic's side: `gae`, `clipped_value_loss`
    * `posttrain/algorithms/preference/__init__.py` — DPO and its family, the cost corner

    ## Exercises

    1. Where would lesson 17's search (best-of-N, PRM beam) sit in the triangle? It changes no
       weights: which force does it spend, and which does it buy?
    2. The estimator noise is measured at pass rate 0.3. Call `estimator_noise(p=0.02)`:
       what happens to every sampled estimator when most groups are all wrong, and which
       corner's recipe changes? (This is why RL data is filtered by pass rate.)
    3. Code: `exercises/26_three_forces.py` asks for the simulator's scoring rule on a table
       of designs; `posttrain check 26` compares it with `forces.score`, including weights that
       do not sum to 1 and an exact tie.

    Next: lesson 27 lists what this curriculum leaves out, and where each piece would go.
    """)
    return


if __name__ == "__main__":
    app.run()
