"""Lesson 18a · Data as a gradient-signal substrate: p(1 − p), the pass-rate band, and the data pipeline."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import json

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return json, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 18a · Data as a gradient-signal substrate

    ## A prompt is worth what its group disagrees about

    In supervised learning a training example is a target: every one moves the weights
    toward its label. In RL with a group baseline a prompt is not a target, it is a place
    where the policy's samples *might* disagree. GRPO (lesson 11) scores each of K samples
    against the mean of its own group. A group that is all right or all wrong has advantage
    0 in every row, and contributes nothing, however much compute its K samples cost.

    For a prompt the policy passes with probability p, two numbers say how much it carries:

    * the chance that a group of K disagrees at all: **1 − p^K − (1 − p)^K**;
    * how much it disagrees by: the expected squared advantage before any division,
      E[(r − r̄)²] = **(K − 1)/K · p(1 − p)**, the reward's variance p(1 − p) with the
      (K − 1)/K that lesson 11 found in the group mean.

    Both are zero at p = 0 and p = 1 and largest at p = ½. That curve, p(1 − p), is the axis
    every data decision in RL moves along: which prompts to collect, which to keep, how
    often to draw each, and when to measure again. Data is a **substrate for gradient
    signal**, and a pool is good when its prompts sit near the middle of that curve for the
    policy being trained *now*.

    ## Real pools are U-shaped

    `lessons/data/18a_pass_rates/pass_counts.json` holds two measurements the curation code
    made before RL (`posttrain/pipelines/curation.py`, 8 samples of each of 1,024 training
    prompts): the level-3 SFT checkpoint ([69.8%](../docs/guides/your-task.md#data-curation) held-out) and the mixed-level one
    (`--env.arithmetic.levels 2,3,5`, [13.6%](../docs/guides/your-task.md#data-curation)). The notebook rebuilds the very prompts from the task and
    checks their fingerprint. Below, each prompt's measured rate is taken as its true pass
    rate; the simulator draws prompts the way a training run does (`PromptPool.draw` in
    `posttrain/data/curation.py`), samples K Bernoulli rewards per group, and runs the
    library's `group_advantages` on them. The measured columns are those draws; the formula
    columns are the expectations above, weighted by the pool's draw probabilities.

    The rows are the three draw weights of `rl.curation.weights`, with and without the
    pass-rate band: **uniform**, **failure** (P ∝ 1 − p: what the policy fails, most) and
    **signal** (P ∝ p(1 − p): the curve itself).
    """)
    return


@app.cell
def _(mo):
    POOLS = {"levels 2,3,5, after SFT (13.6%)": "levels 2,3,5", "level 3, after SFT (69.8%)": "level 3",
             "synthetic: every prompt at 4/8": "half"}
    BANDS = {"1/8..7/8 (drop the solved and the hopeless)": (0.125, 0.875), "0..1 (no filter)": (0.0, 1.0),
             "3/8..5/8 (only the middle)": (0.375, 0.625), "0..0 (only the hopeless)": (0.0, 0.0)}
    controls = mo.ui.dictionary({
        "pool": mo.ui.dropdown(options=list(POOLS), value="levels 2,3,5, after SFT (13.6%)", label="the pool"),
        "K": mo.ui.slider(start=1, stop=32, step=1, value=8, label="K, samples per group", show_value=True),
        "band": mo.ui.dropdown(options=list(BANDS), value="1/8..7/8 (drop the solved and the hopeless)",
                               label="pass-rate band"),
    })
    controls.vstack()
    return BANDS, POOLS, controls


@app.cell
def _(json):
    from posttrain.algorithms.grpo import group_advantages
    from posttrain.data.curation import KEPT, PromptPool, band_verdict, difficulty
    from posttrain.data.decontamination import screen
    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.seeds import derive_seed
    from posttrain.teach.lessons import LESSONS_DIR
    from posttrain.types import Example

    # the repository's lessons/, wherever this notebook runs from
    MEASURED = json.loads((LESSONS_DIR / "data" / "18a_pass_rates" / "pass_counts.json").read_text())
    TRIES = 8  # samples per prompt in the measurement

    def measured_pool(name: str):
        """The pool's prompts, rebuilt as the runs built them, and its measured pass counts."""
        record = MEASURED[name]
        mixed = "," in record["levels"]
        env = ArithmeticEnv(levels=record["levels"]) if mixed else ArithmeticEnv(level=int(record["levels"]))
        examples = env.fixed_set("train", len(record["passes"]), seed=derive_seed(0, "curation-pool"))
        if PromptPool(examples, seed=0, steps=1).fingerprint() != record["pool_fingerprint"]:
            raise ValueError(f"the {name} pool rebuilt from envs/arithmetic.py is not the one measured: "
                             "the task's fixed set changed since pass_counts.json was made")
        return env, examples, list(record["passes"])

    return (KEPT, MEASURED, PromptPool, TRIES, band_verdict, difficulty, group_advantages, measured_pool, screen,
            Example)


@app.cell
def _(KEPT, PromptPool, TRIES, band_verdict, group_advantages, torch):
    GROUPS = 4000  # groups drawn per row: the measured share's standard error is under 0.008

    def simulate(examples, passes, band, weights, K, seed=0):
        """Draw GROUPS prompts the way a run does, sample K rewards each, run GRPO's advantages."""
        pool = PromptPool(examples, seed=seed, steps=1, band=band, weights=weights)
        pool.set_measurement(passes, TRIES)
        P = torch.tensor(pool.probabilities(0), dtype=torch.float64)  # (N,) each prompt's share of the draws
        p = torch.tensor(passes, dtype=torch.float64) / TRIES  # (N,) taken as each prompt's true pass rate
        idx = torch.tensor([pool.index[e.prompt] for e in pool.draw(0, 0, GROUPS)])  # (G,)
        gen = torch.Generator().manual_seed(seed)
        rewards = torch.bernoulli(p[idx].repeat_interleave(K), generator=gen)  # (G·K,) 0/1 verdicts
        group_ids = torch.arange(GROUPS).repeat_interleave(K)  # (G·K,) K samples per group
        adv = group_advantages(rewards, group_ids, "group", 1e-6)  # (G·K,) GRPO
        centred = group_advantages(rewards, group_ids, "none", 1e-6)  # (G·K,) r − r̄, before any division
        group_passes = rewards.view(GROUPS, K).sum(dim=1)  # (G,)
        return {
            "weights": weights, "band": band,
            "prompts": int((P > 0).sum()),
            "hopeless": float(P[p == 0].sum()), "solved": float(P[p == 1].sum()),
            "share": float((adv.view(GROUPS, K).abs() > 0).any(dim=1).double().mean()),
            "share_formula": float((P * (1 - p ** K - (1 - p) ** K)).sum()),
            "signal": float((centred ** 2).mean()),
            "signal_formula": float((P * (K - 1) / K * p * (1 - p)).sum()),
            "online_kept": sum(band_verdict(int(n), K, *band) == KEPT for n in group_passes) / GROUPS,
            "P": P, "pool": pool,
        }

    return GROUPS, simulate


@app.cell
def _(BANDS, POOLS, controls, measured_pool, simulate):
    pool_name, K, band = POOLS[controls.value["pool"]], controls.value["K"], BANDS[controls.value["band"]]
    env, examples, passes = measured_pool("levels 2,3,5" if pool_name == "half" else pool_name)
    if pool_name == "half":
        passes = [4] * len(passes)
    schemes = [((0.0, 1.0), w) for w in ("uniform", "failure", "signal")]
    schemes += [(band, w) for w in ("uniform", "failure", "signal") if band != (0.0, 1.0)]
    rows = [simulate(examples, passes, b, w, K) for b, w in schemes]
    return K, band, env, examples, passes, pool_name, rows


@app.cell
def _(K, TRIES, band, mo, passes, rows):
    from posttrain.teach.tables import markdown_table

    # per measured pass count j of 8: how many prompts, the signal p(1 − p) at p = j/8, and the
    # share of K-sample groups that disagree (a nonzero advantage somewhere)
    by_count = [{"passed": j, "prompts": passes.count(j), "signal": j / TRIES * (1 - j / TRIES),
                 "disagree": 1 - (j / TRIES) ** K - (1 - j / TRIES) ** K} for j in range(TRIES + 1)]
    _hist = markdown_table(
        ["passed", "prompts", "p(1 − p)", "share of groups that disagree, 1 − p^K − (1 − p)^K"],
        [[f"{c['passed']}/{TRIES}", str(c["prompts"]), f"{c['signal']:.3f}", f"{c['disagree']:.3f}"] for c in by_count])
    _fmt = lambda b: "none" if b == (0.0, 1.0) else f"{b[0]:g}..{b[1]:g}"
    _rows = markdown_table(
        ["band", "weights", "prompts drawn", "share of draws hopeless / solved", "groups with a nonzero advantage, measured",
         "formula", "mean squared advantage (r − r̄)², measured", "formula (K − 1)/K · p(1 − p)"],
        [[_fmt(r["band"]), r["weights"], str(r["prompts"]), f"{r['hopeless']:.2f} / {r['solved']:.2f}",
          f"**{r['share']:.3f}**", f"{r['share_formula']:.3f}", f"**{r['signal']:.4f}**", f"{r['signal_formula']:.4f}"]
         for r in rows])
    mo.md(f"""
    ### The pool's measured pass counts, and what each is worth at K = {K}

    {_hist}
    ### Six ways to draw from it (band {_fmt(band)} where a row applies one)

    {_rows}""")
    return (by_count,)


@app.cell
def _(K, TRIES, band, by_count, passes):
    from posttrain.teach.charts import bars, curves, figure, finish, legend_right, mark, span

    signal_fig, _ax = figure()
    _counts = [c["passed"] for c in by_count]
    bars(_ax, [f"{j}/{TRIES}" for j in _counts], [c["prompts"] / len(passes) for c in by_count])
    _ax.patches[0].set_label("share of the pool's prompts")  # the bars' legend entry
    curves(_ax, _counts, {"signal p(1 − p)": [c["signal"] for c in by_count],
                          f"groups of K = {K} that disagree": [c["disagree"] for c in by_count]}, markers=True)
    _ax.lines[0].set_color("#D55E00")
    _ax.lines[1].set_color("#009E73")
    span(_ax, band[0] * TRIES - 0.5, band[1] * TRIES + 0.5, "kept by the band")
    mark(_ax, band[0] * TRIES - 0.5, f"band {band[0]:g}..{band[1]:g}")
    mark(_ax, band[1] * TRIES + 0.5, "_")  # the band's other edge: one legend entry for both
    finish(signal_fig, _ax, f"passes out of {TRIES} measured tries (pass rate p = passes / {TRIES})", "fraction",
           title="Where the signal is: p(1 − p) peaks at ½, the pool may not")
    legend_right(signal_fig, _ax)
    signal_fig
    return (signal_fig,)


@app.cell
def _(mo):
    mo.md(r"""
    ## What the numbers say

    * **The mixed-level pool is mostly dead.** 750 of its 1,024 prompts passed 0 of 8 and
      118 passed 8 of 8. Drawn uniformly, about 12% of GRPO groups of 8 carry any gradient
      (0.119 measured, 0.125 by the formula); the rest are sampled, scored and thrown away.
      The band 1/8..7/8 keeps 156 prompts, and the share rises to about 0.83 (not 1: a prompt
      at 1/8 still draws eight failures 34% of the time, (7/8)^8).
    * **Failure weighting is the wrong medicine for a pool of hopeless prompts.** P ∝ 1 − p
      sends 89% of the draws to prompts at 0/8, and the share of live groups *falls* below
      uniform's, to 0.084. [Data curation](../docs/guides/your-task.md#data-curation) measured what that does: a 20-step run with
      failure weights, from the same checkpoint on a 256-prompt pool, lost
      [3.2 points of held-out pass@1 (one seed, CI [−6.2, −0.2])](../docs/guides/your-task.md#data-curation). Switch the pool to level 3 (597 solved, 219
      hopeless) and the same weights *help* (0.24 against 0.17): 1 − p moves draws off the
      solved, which dominate there. A draw weight is only as good as the shape of the pool.
    * **Signal weighting needs no band**: p(1 − p) gives the solved and the hopeless weight 0
      by itself, and it puts the most draws near p = ½. Its mean squared advantage is 0.164,
      against 0.022 for uniform draws from the whole pool: seven times the signal per sampled
      completion, at the same rollout cost.
    * The measured columns agree with the formulas to within the sampling error of 4,000
      groups: the library's advantages are zero on exactly the groups the formula counts.

    Two things the simulator leaves out. A pass rate from 8 samples is noisy: a prompt at
    true p = 0.05 reads 0/8 two times in three (0.95^8 = 0.66). And a pool filtered once is
    learnt: in the [Data curation](../docs/guides/your-task.md#data-curation) runs the policy had learnt its band's prompts
    [within 20 to 50 steps](../docs/guides/your-task.md#data-curation), so a band of 156 prompts is soon a band of solved prompts. The filter must be repeated
    (`rl.curation.remeasure_every`, or `online`), which is the last stage of the pipeline below.
    """)
    return


@app.cell
def _(env, examples, mo):
    pipeline_intro = mo.md(r"""
    ## The eight-stage data pipeline, on real prompts

    **source → license → verifier-check → dedup/decon → stratify → mix → online filter →
    recycle.** Each stage answers one question, and the order matters: a row that cannot be
    verified should not be counted as a duplicate, and a held-out prompt must be gone before
    anything is measured on it. The table runs the stages on the chosen pool's 1,024 prompts
    (`envs/arithmetic.py`'s train split), with four rows planted at the end so that every
    screening stage has something to find: arithmetic's splits are a hash of the expression,
    so by construction its own prompts never leak.
    """)
    held = env.fixed_set("heldout", 500, seed=0) + env.fixed_set("dev", 200, seed=0)  # what a run is scored on
    planted = [
        ("a held-out prompt, retyped", held[0].prompt.replace(": ", ":   ").upper(), held[0].expected_answer),
        ("a dev prompt, retyped", "  " + held[-1].prompt.lower(), held[-1].expected_answer),
        ("a pool prompt, twice", examples[7].prompt.rstrip() + "  \n", examples[7].expected_answer),
        ("an answer no verdict can match", "Q: 4+4+4\n", "12.0"),
    ]
    return held, pipeline_intro, planted


@app.cell
def _(Example, K, band, difficulty, env, examples, held, mo, passes, pipeline_intro, planted, rows, screen):
    # 1 · source: the pool as a run draws it, and the planted rows
    source = list(examples) + [Example(text, answer, id=f"planted-{i}", meta={"planted": why})
                               for i, (why, text, answer) in enumerate(planted)]
    # 2 · license: every row here is generated by envs/arithmetic.py; posttrain records no license field
    licensed = source
    # 3 · verifier-check: the reference answer is paid, and a different integer is not
    def verifiable(e):
        right = env.score(e, f"Final: {e.expected_answer}")["reward"] == 1.0
        wrong = env.score(e, f"Final: {e.expected_answer}1")["reward"] == 0.0
        return right and wrong
    checked = [e for e in licensed if verifiable(e)]
    # 4 · dedup/decon: against what the run is scored on, then against the pool's earlier rows
    matches = screen([e.prompt for e in checked], [e.prompt for e in held], "exact")
    screened = [e for e, m in zip(checked, matches) if m is None]
    decon = sum(m is not None and m.against == "heldout" for m in matches)
    dedup = sum(m is not None and m.against == "pool" for m in matches)
    assert [e.prompt for e in screened] == [e.prompt for e in examples], "the planted rows should all be gone"
    # 5 · stratify: by difficulty label and by measured pass count
    levels = sorted({difficulty(e) for e in screened})
    strata = {lv: [n for e, n in zip(screened, passes) if difficulty(e) == lv] for lv in levels}
    # 6 · mix: each label's share of the draws under the band and each weight
    banded = [r for r in rows if r["band"] == band]
    mix = {r["weights"]: {lv: float(sum(P for e, P in zip(screened, r["P"].tolist()) if difficulty(e) == lv))
                          for lv in levels} for r in banded}
    # 7 · online filter: of the groups the band's uniform draws sample, the share inside the band
    online_kept = banded[0]["online_kept"]
    # 8 · recycle: the prompts out of the band, waiting for a re-measurement to bring them back
    waiting = sum(s != "kept" for s in banded[0]["pool"].status)

    _fmt = lambda b: f"{b[0]:g}..{b[1]:g}"
    _strata = "; ".join(f"level {lv:g}: {len(ns)} prompts, {ns.count(0)} at 0/8, {ns.count(8)} at 8/8"
                        for lv, ns in strata.items())
    _mix = "; ".join(f"{w}: " + ", ".join(f"L{lv:g} {s:.0%}" for lv, s in shares.items())
                     for w, shares in mix.items())
    _why_dropped = ", ".join(why for why, *_ in planted)
    _table = f"""
    | stage | the question | in posttrain | on these prompts |
    |:---|:---|:---|:---|
    | 1 source | where do prompts come from? | `env.fixed_set("train", n, seed)`, `posttrain/envs/arithmetic.py`; JSONL tasks in `posttrain/envs/dataset_files.py` | {len(source)} rows: the pool's {len(examples)} and 4 planted ({_why_dropped}) |
    | 2 license | may we train on them? | *not in posttrain*: generated tasks need no licence; a real corpus would carry one per source and drop what it may not use | {len(licensed)} kept (all generated here) |
    | 3 verifier-check | can the verifier tell right from wrong on this row? | `env.score` (`posttrain/verifiers/final_int.py`): the reference answer paid, another integer not | {len(checked)} kept; dropped {len(licensed) - len(checked)}: an answer of "12.0" that no `Final:` line can match, a prompt that would read as hopeless forever |
    | 4 dedup/decon | is it a held-out prompt, or a copy? | `screen` in `posttrain/data/decontamination.py`, exact match after normalising case and spaces | {decon} held-out/dev copies and {dedup} duplicate dropped; {len(screened)} left |
    | 5 stratify | which difficulty, which pass rate? | `difficulty` and the measurement of `posttrain/pipelines/curation.py` | {_strata} |
    | 6 mix | how often is each drawn? | `PromptPool.probabilities`, band {_fmt(band)} and `rl.curation.weights` | {_mix} |
    | 7 online filter | is this step's group still informative? | `PromptPool.keep_groups` with `rl.curation.online`; the controller refills the step (`posttrain/roles/controller.py`) | at K = {K}, {online_kept:.0%} of the groups drawn (band, uniform) are inside the band; the rest would be resampled |
    | 8 recycle | has a dropped prompt become useful again? | `rl.curation.remeasure_every`: measure the pool again, and the band readmits what moved | {waiting} prompts out of the band now, each one a re-measurement away from coming back |
    """
    pipeline = {"source": len(source), "license": len(licensed), "verifier-check": len(checked),
                "decontaminated": decon, "deduplicated": dedup, "screened": len(screened), "strata": strata,
                "mix": mix, "online_kept": online_kept, "waiting": waiting}
    mo.vstack([pipeline_intro, mo.md(_table)])
    return (pipeline,)


@app.cell
def _(mo):
    mo.md(r"""
    Every stage above is a place where data can break a run without any error. We name four
    failure modes (the course outline promises four and does not list them; these are ours),
    each with the stage that guards against it:

    1. **Dead signal** (stratify, mix, recycle): the pool sits at p = 0 or 1 for this policy,
       so most groups are uniform and most rollout compute buys nothing. The training reward
       looks flat, or perfect, and nothing moves. Measure the pass rates; band or weight by
       them; measure again as the policy changes.
    2. **Leaked evaluation** (dedup/decon): held-out or dev prompts in the training pool.
       Held-out pass@1 rises for the wrong reason, and no training metric shows it. Screen
       before anything is measured, against exactly the sets the run is scored on.
    3. **Unverifiable rows** (verifier-check): a reference answer the verifier cannot match
       (the planted "12.0"), or a wrong one. The prompt reads as hopeless forever, and failure
       weighting draws it *more*. Check that the verifier pays the reference and refuses
       a near miss.
    4. **A skewed mix** (mix): duplicates, or weights that pile the draws onto one stratum
       (89% onto the hopeless above; the easy → hard curriculum spending its first third on
       level 2). The policy gets good at what it saw most and the rest decays: the
       failure-weighted run in [Data curation](../docs/guides/your-task.md#data-curation) lost [13.6 points on level 2](../docs/guides/your-task.md#data-curation) this way.

    ## Find the knob that breaks it

    * **K = 1.** One sample per prompt is not a group: its mean is itself, every advantage
      is 0, and every row of the table reads 0 whatever the pool and the weights. The online
      filter cannot keep anything either (a pass rate of 0/1 or 1/1 is never inside 1/8..7/8).
      GRPO's signal needs K ≥ 2, and at K = 2 a prompt at p = ½ disagrees only half the time.
    * **Band 0..0 (only the hopeless).** Every draw is a prompt that passed 0 of 8: the share
      of live groups and the signal are exactly 0, and the draw weights make no difference.
      (Under the simulator's assumption that the measured rate is the true one. A real
      policy would pass some of them by chance, and the band is what PRIME's and DAPO's
      online filters use to find them again.)
    * **A larger K** raises the share of live groups, but only up to the share of prompts
      that are not at 0/8 or 8/8: at K = 32 the uniform mixed pool reaches about 0.15 (its 156
      such prompts), and the signal per sample barely moves ((K − 1)/K · p(1 − p): 0.023 at
      K = 8, 0.025 at K = 32). More samples of a hopeless prompt are more compute for the
      same nothing.
    * **Synthetic, every prompt at 4/8.** The ceiling: nearly every group disagrees (1 − 2/2^K)
      and the mean squared advantage is (K − 1)/K · ¼ = 0.219 at K = 8. Band and weights change
      nothing, because every prompt is already where they try to draw.

    ## Source files used here

    * `posttrain/data/curation.py` — `PromptPool` (`probabilities`, `draw`, `keep_groups`), `band_verdict`, `curriculum_weights`, `difficulty`
    * `posttrain/pipelines/curation.py` — how a run builds, screens, measures and records the pool
    * `posttrain/data/decontamination.py` — `screen`: exact and n-gram matching, against held-out then against the pool
    * `posttrain/algorithms/grpo.py` — `group_advantages`, the advantages the simulator runs
    * `posttrain/envs/arithmetic.py` — the prompts, the splits, `--env.arithmetic.levels` and its difficulty labels
    * `posttrain/verifiers/final_int.py` — the verifier the verifier-check stage calls
    * `lessons/data/18a_pass_rates/README.md` — where the two measured pools came from
    * `tests/test_curation.py`, `tests/test_decontamination.py` — the band, the weights' draw frequencies and the matches, checked by hand

    ## Exercises

    1. The simulator takes a measured 0/8 as p = 0. With 8 samples, what is the chance that
       a prompt at true p = 0.1 reads 0/8, and how many of the mixed pool's 750 "hopeless"
       prompts might be live? What would `rl.curation.remeasure_every` cost to find them?
    2. Both curves in this lesson assume a 0/1 reward. For a reward in [0, 1] (a partial
       credit), what replaces p(1 − p)? Which prompts does a band on the pass rate then miss?
    3. Code: `exercises/18a_draw_probabilities.py` asks for the probability that each prompt
       is drawn, given its pass count, the band and the weights; `posttrain check 18a`
       compares it with `PromptPool.probabilities`, including a band nothing is in and a pool
       that is all solved.

    Next: lesson 19 leaves the data for the machines that turn it into rollouts, starting
    with where the roles sit: [19 · System topology](?file=19_system_topology.py).
    """)
    return


if __name__ == "__main__":
    app.run()
