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
    from posttrain.teach.forces import corners, estimator_noise, normalised, rank, verifier_fidelity

    # Measured once: 20,000 groups of 16 samples, pass rate 0.3, the same draws for every estimator
    noise = estimator_noise(p=0.3, k=16, groups=20_000, seed=0)
    return corners, noise, normalised, rank, verifier_fidelity


@app.cell
def _(controls, corners, noise, normalised, rank, verifier_fidelity):
    weights = (controls.value["signal"], controls.value["estimator"], controls.value["cost"])
    coverage = controls.value["coverage"]
    fidelity = verifier_fidelity(controls.value["spec"])
    try:
        point = normalised(weights)
        ranking = rank(weights, coverage, fidelity, noise)
        winner = ranking[0]["design"]
        error = None
    except ValueError as exc:  # every weight at 0: nothing can be preferred
        point, ranking, winner, error = None, [], None, str(exc)
    recipes = corners(fidelity, noise)
    return coverage, error, fidelity, point, ranking, recipes, winner


@app.cell
def _(controls, coverage, error, fidelity, mo, noise, point, ranking, recipes, winner):
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
        _rows = markdown_table(
            ["recipe", "design", "signal loss", "estimator loss", "cost loss", "weighted score"],
            [[f"**{r['design'].recipe}**" if i == 0 else r["design"].recipe, r["design"].name]
             + [f"{r['losses'][f]:.3f}" for f in ("signal", "estimator", "cost")] + [f"{r['score']:.4f}"]
             for i, r in enumerate(ranking)])
        _body = f"""
    **The point** (signal, estimator, cost) = ({point[0]:.2f}, {point[1]:.2f}, {point[2]:.2f}), with
    {coverage:.0%} of prompts checkable. **The winner: {winner.recipe}** ({winner.name}).

    {_rows}"""
    _corners = markdown_table(["slider setting", "the recipe it recovers"], list(recipes.items()))
    mo.md(_measured + _body + f"""

    **The corners, with this verifier** (recomputed from the same measured inputs):

    {_corners}""")
    return


@app.cell
def _(coverage, fidelity, noise, point, rank, winner):
    from posttrain.teach.forces import DESIGNS
    from posttrain.teach.charts import figure, finish, legend_right, mark_point, scatter, ternary, ternary_xy

    # The simulator's verdict over the whole triangle (weights on a grid of twentieths), at this
    # verifier and coverage: each region is where one recipe wins.
    _grid = [(i / 20, j / 20, (20 - i - j) / 20) for i in range(21) for j in range(21 - i)]
    _regions: dict[str, tuple[list[float], list[float]]] = {d.recipe: ([], []) for d in DESIGNS}  # fixed colours
    for _shares in _grid:
        _x, _y = ternary_xy(_shares)
        _xs, _ys = _regions[rank(_shares, coverage, fidelity, noise)[0]["design"].recipe]
        _xs.append(_x)
        _ys.append(_y)
    triangle_fig, _ax = figure(width=7.5, height=3.6)
    ternary(_ax, ["signal", "estimator", "cost"])
    scatter(_ax, _regions, size=22)
    if point is not None:  # every weight at 0 has no point to mark
        mark_point(_ax, *ternary_xy(point), f"you: {winner.recipe}")
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
    * With every prompt checkable, R1-Zero and R1 are the same design (ties keep the listed
      order). Take a fifth of the prompts away from the verifier and R1's reward model for the
      rest pulls ahead: that is the recipe the R1 report describes.

    ## Find the knob that breaks it

    * **The verifier, `hackable/multi-final`.** Its measured fidelity is 0.75 (it refuses 18 of
      the 24 golden exploits), so under "all signal" the simulator still recommends GRPO on
      it, R1-Zero. Lesson 18 ran exactly that: GRPO on `hackable/multi-final` found the one
      exploit it pays and drove the gold reward to about 0 within 40 steps. A fidelity measured
      on a fixed pack is not the fidelity under optimisation pressure: the optimiser does not
      sample exploits at the pack's rate, it converges on the ones that pay. The simulator,
      like any static scorecard, cannot see that. `hackable/last-number` (0.625) is the
      opposite lesson: equally leaky on paper, and lesson 18's optimiser stayed honest on it.
    * **The verifier, `hackable/substring`.** It pays every exploit, fidelity 0, and the signal
      corner abandons verifiers for a reward model (RLOO on a reward model). That is the right
      call; the point is that the simulator only gets it right when the measurement already
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
