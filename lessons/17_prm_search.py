"""Lesson 17 · Process rewards and search: greedy, best-of-N, PRM beam search and MCTS at one token budget."""

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
def _():
    from posttrain.config.scoring import SearchConfig
    from posttrain.envs.arithmetic import ArithmeticEnv

    # Every number the page states about the set-up is one of these (the prose is an f-string of them)
    SFT_STEPS = 400  # enough for the chain's format; greedy still misses about half: room for search to pay
    DEMOS = 795  # every level-2 problem of the train split
    TEMPERATURE = 0.5  # every sampled method; greedy is temperature 0
    MAX_NEW = 28  # the longest level-2 chain, "9+9=18,18+9=27\nFinal: 27", is 25 characters + EOS
    settings = SearchConfig()  # expansions, MCTS children, c_uct, step cap: what `posttrain search` uses
    env = ArithmeticEnv(level=2, cot=True)
    # every level-2 problem the policy never trained on (dev and held-out): a set of 40 left each
    # method's gain over greedy inside its own CI; all 205 separate them (on the AMD EPYC; MCTS sits
    # at the edge on the Intel Xeon), and the search is batched,
    # so five times the problems cost about 1.5 times the CPU
    problems = env.fixed_set("dev", 102) + env.fixed_set("heldout", 103)
    return DEMOS, MAX_NEW, SFT_STEPS, TEMPERATURE, env, problems, settings


@app.cell
def _(DEMOS, MAX_NEW, SFT_STEPS, TEMPERATURE, mo, problems, settings):
    intro = mo.md(rf"""
    # 17 · Process rewards, outcome rewards and search

    ## Why spend compute at test time

    Lessons 09–16 change the weights. Loop B (lesson 00) leaves them alone and spends
    inference compute instead: sample more, and let a scorer choose. How much that buys
    depends on two things this lesson puts under your control: **how many tokens** you may
    generate per problem, and **how good the scorer** is.

    ## Outcome and process reward models

    * An **ORM** reads a finished completion and says how likely it is to be right:
      $p(\text{{correct}} \mid x, y)$. It can only rank whole answers.
    * A **PRM** scores every step of a chain of thought: $p(\text{{step}}_k \text{{ right}} \mid x, \text{{steps}}_{{\le k}})$.
      A completion's score aggregates them (here the minimum: a chain is as good as its
      worst step). Because a PRM can score a *partial* solution, it can steer generation
      while it happens.

    ## Five ways to spend a budget of B generated tokens, and a ceiling

    | method | how it spends B | needs |
    |:---|:---|:---|
    | greedy | one completion at temperature 0 | nothing |
    | best-of-N (ORM) | N = B / {MAX_NEW} whole samples, keep the one the ORM ranks first | an ORM |
    | best-of-N (PRM) | the same N samples, keep the one with the best worst step | a PRM |
    | beam search (PRM) | grow B / {MAX_NEW * settings.expansions} partial solutions one step at a time; each samples {settings.expansions} next steps, the PRM keeps the best | a PRM on prefixes |
    | MCTS (PRM) | a tree over steps; each expansion samples {settings.mcts_children} next steps and rolls each out to the end; the PRM's score of the rollout is the node's value (UCT picks where to expand) | a PRM, and budget for rollouts |

    The ceiling is best-of-N by a *perfect verifier*: the same N samples, keep one the task's
    verifier passes. Its accuracy is pass@N, the most any way of choosing among those samples
    can reach; no real method has the answer key, so the table below lists it as a reference.

    Every token is counted by `posttrain/search/budget.py`: a method asks for tokens only
    through it, and it caps every sampled row so that a problem can never spend more than B.
    Prompt re-reading and the scorer's own forward passes are not counted (they are what a KV
    cache and a cheaper scorer would save).

    ## The stand-ins

    The policy is a tiny `gpt_mini` taught level-2 sums with a chain of thought
    (`"Q: 9+5+2"` → `"9+5=14,14+2=16\nFinal: 16"`, {SFT_STEPS} SFT steps on the {DEMOS} problems of the
    train split), sampled at temperature {TEMPERATURE:g}.
    The **ORM** is the task's verifier itself (`OracleOutcomeScorer`: 1 if the answer is right),
    the **PRM** the arithmetic step checker (`OracleStepScorer`: 1 while every step so far holds
    and follows the problem). Both are perfect, so the *noise* knob makes them worse on purpose:
    `NoisyScorer` mixes each score with a uniform draw, score ← (1 − noise)·score + noise·u,
    where u is a fixed hash of the text, so a prefix is always misjudged the same way, as a
    trained model would misjudge it. Every method, and the ceiling, runs on the same
    {len(problems)} problems: every level-2 problem the policy never trained on (the dev and
    held-out splits). Each method's gain over greedy carries a paired 95% CI: the methods answer
    the same problems, so a problem's difficulty cancels in the difference (`paired_bootstrap_diff`).
    """)
    intro
    return (intro,)


@app.cell
def _(DEMOS, SFT_STEPS, mo):
    from posttrain.teach.widgets import tiny_policy

    with mo.status.spinner(title=f"Teaching a tiny model to add in steps ({SFT_STEPS} SFT steps, a few seconds)…"):
        model, tok, _env, sft_losses = tiny_policy(sft_steps=SFT_STEPS, level=2, cot=True, demos=DEMOS)
    return model, sft_losses, tok


@app.cell
def _(MAX_NEW, mo):
    controls = mo.ui.dictionary({
        "budget": mo.ui.slider(steps=[MAX_NEW, 2 * MAX_NEW, 4 * MAX_NEW, 8 * MAX_NEW], value=4 * MAX_NEW,
                               label="budget B: generated tokens per problem", show_value=True),
        "noise": mo.ui.slider(start=0.0, stop=1.0, step=0.1, value=0.0, label="reward-model noise (0 = perfect)",
                              show_value=True),
    })
    controls.vstack()
    return (controls,)


@app.cell
def _(MAX_NEW, TEMPERATURE, env, model, problems, settings, tok, torch):
    import functools

    from posttrain.config import SamplingParams
    from posttrain.eval.stats import paired_bootstrap_diff
    from posttrain.rewards.process_reward_model import AGGREGATIONS, get_step_format
    from posttrain.roles.engines import make_engine
    from posttrain.search.budget import Problem, sample_completions
    from posttrain.search.compare import SEPARATORS
    from posttrain.search.mcts import mcts
    from posttrain.search.methods import (
        NoisyScorer,
        OracleOutcomeScorer,
        OracleStepScorer,
        beam_search,
        greedy,
        pick_highest,
    )

    sampling = SamplingParams(temperature=TEMPERATURE, max_new_tokens=MAX_NEW)
    engine = make_engine(model, tok, sampling)
    fmt, separators = get_step_format("arithmetic"), SEPARATORS["arithmetic"]
    step_checker = OracleStepScorer(problems)
    prompts = [p.prompt for p in problems]

    def grade(answers, spent, greedy_right=None) -> dict:
        """The verifier's verdict (the answer) and the step checker's (every step), per method;
        against greedy's verdicts on the same problems, the gain with its paired 95% CI."""
        right = [float(a is not None and a.done and env.score(e, a.text)["reward"] >= 1.0) for e, a in zip(problems, answers)]
        steps_ok = [float(a is not None and a.done and step_checker.score_outcomes([e.prompt], [a.text])[0] == 1.0)
                    for e, a in zip(problems, answers)]
        row = {"accuracy": sum(right) / len(right), "chain_right": sum(steps_ok) / len(steps_ok),
               "tokens": spent / len(problems), "right": right}
        if greedy_right is not None:
            gain = paired_bootstrap_diff(right, greedy_right)
            row.update(gain=gain["mean_diff"], gain_low=gain["ci_low"], gain_high=gain["ci_high"],
                       verdict=gain["verdict"])
        return row

    def spent_by(batch) -> int:
        return sum(p.budget.spent for p in batch)

    @functools.lru_cache(maxsize=None)  # moving the budget back to a value already seen costs nothing
    def search_rows(budget: int, noise: float) -> dict:
        """Every method on every problem at one budget and one scorer noise: {method: grade}."""
        orm = NoisyScorer(OracleOutcomeScorer(problems, env.score), noise)
        prm = NoisyScorer(step_checker, noise)
        rows = {}
        batch = Problem.of(problems, tok, MAX_NEW)
        rows["greedy"] = grade(greedy(engine, batch, MAX_NEW), spent_by(batch))
        base = rows["greedy"]["right"]
        n = budget // MAX_NEW
        batch = Problem.of(problems, tok, budget)
        drawn = sample_completions(engine, batch, n, MAX_NEW, torch.Generator().manual_seed(0))
        spent = spent_by(batch)  # one set of N samples, three ways of choosing among them
        rows[f"best-of-{n}, perfect verifier"] = grade(
            [pick_highest(c, OracleOutcomeScorer(problems, env.score).score_outcomes([p] * len(c), [x.text for x in c]))
             for p, c in zip(prompts, drawn)], spent, base)
        rows[f"best-of-{n} (ORM)"] = grade(
            [pick_highest(c, orm.score_outcomes([p] * len(c), [x.text for x in c])) for p, c in zip(prompts, drawn)],
            spent, base)
        rows[f"best-of-{n} (PRM, min)"] = grade(
            [pick_highest(c, [AGGREGATIONS["min"](s) for s in prm.score_steps([p] * len(c), [fmt.split(x.text) or [""] for x in c])])
             for p, c in zip(prompts, drawn)], spent, base)
        width = max(1, budget // (MAX_NEW * settings.expansions))
        batch = Problem.of(problems, tok, budget)
        rows[f"beam {width}×{settings.expansions} (PRM)"] = grade(
            beam_search(engine, batch, prm, fmt, separators, width, settings.expansions, settings.step_tokens, MAX_NEW,
                        torch.Generator().manual_seed(1)), spent_by(batch), base)
        batch = Problem.of(problems, tok, budget)
        rows["MCTS (PRM)"] = grade(
            mcts(engine, batch, prm, fmt, separators, settings.mcts_children, settings.step_tokens, MAX_NEW,
                 settings.c_uct, torch.Generator().manual_seed(2)), spent_by(batch), base)
        return rows

    return sampling, search_rows


@app.cell
def _(MAX_NEW, controls, mo, search_rows):
    budget, noise = controls.value["budget"], controls.value["noise"]
    n = budget // MAX_NEW
    BUDGETS = [k * MAX_NEW for k in (1, 2, 4, 8)]  # the slider's steps
    # every budget at this noise, for the chart (each a second or two of search)
    with mo.status.spinner(title=f"Running every method at {len(BUDGETS)} budgets, noise {noise:g}…"):
        by_budget = {b: search_rows(b, noise) for b in BUDGETS}
    rows = by_budget[budget]
    return BUDGETS, budget, by_budget, n, noise, rows


@app.cell
def _(BUDGETS, MAX_NEW, budget, by_budget, noise, problems):
    from posttrain.teach.charts import PALETTE, curves, figure, finish, legend_right, mark

    # the methods in the order the table lists them; "N" in a name is budget ÷ MAX_NEW at each point
    _methods = ["greedy", "best-of-N, perfect verifier", "best-of-N (ORM)", "best-of-N (PRM, min)", "beam (PRM)",
                "MCTS (PRM)"]
    _rows = {m: [list(by_budget[b].values())[i] for b in BUDGETS] for i, m in enumerate(_methods)}
    _greedy = [r["accuracy"] for r in _rows["greedy"]]
    budget_fig, _ax = figure()
    # at noise 0 the ORM is the perfect verifier: dashed, so that both lines show
    curves(_ax, BUDGETS, {m: [r["accuracy"] for r in rs] for m, rs in _rows.items()}, markers=True,
           styles={"greedy": ":", "best-of-N (ORM)": "--"})
    # each gain's paired 95% CI, drawn from greedy's point: greedy + [low, high]. A bar that clears
    # greedy's dotted line is a gain outside the noise. Nudged sideways so that bars do not overlap.
    for _i, _m in enumerate(_methods[1:], start=1):
        _xs = [b * 2 ** (0.04 * (_i - 3)) for b in BUDGETS]
        _ys = [r["accuracy"] for r in _rows[_m]]
        _below = [max(0.0, y - (g + r["gain_low"])) for y, g, r in zip(_ys, _greedy, _rows[_m])]
        _above = [max(0.0, g + r["gain_high"] - y) for y, g, r in zip(_ys, _greedy, _rows[_m])]
        _ax.errorbar(_xs, _ys, yerr=[_below, _above], fmt="none", ecolor=PALETTE[_i % len(PALETTE)], capsize=2,
                     linewidth=0.9)
    mark(_ax, budget, f"B = {budget} tokens")
    _ax.set_xscale("log", base=2)
    _ax.set_xticks(BUDGETS, [str(b) for b in BUDGETS])
    finish(budget_fig, _ax, "budget B: generated tokens per problem (log scale)",
           f"answer right (fraction of {len(problems)})",
           title=f"Scorer noise {noise:g} · bars: paired 95% CI of each gain over greedy")
    legend_right(budget_fig, _ax)
    budget_fig
    return (budget_fig,)


@app.cell
def _(budget, mo, n, noise, problems, rows, sft_losses):
    from posttrain.teach.tables import markdown_table

    def _gain(r) -> str:
        return "—" if "gain" not in r else f"{r['gain']:+.3f} [{r['gain_low']:+.3f}, {r['gain_high']:+.3f}]"

    results_table = markdown_table(
        ["method", "answer right", "vs greedy [paired 95% CI]", "every step right", "tokens spent per problem"],
        [[name, f"**{r['accuracy']:.3f}**", _gain(r), f"{r['chain_right']:.3f}", f"{r['tokens']:.1f}"]
         for name, r in rows.items()])
    # the gains whose CI includes 0, and how many problems would separate each from greedy: the CI's
    # half-width shrinks as 1/√(problems), so it reaches |gain| at problems × (half-width / gain)²
    inside = {name: r for name, r in rows.items() if r.get("verdict") == "within noise"}
    needed = {name: (None if r["gain"] == 0 else
                     round(len(problems) * ((r["gain_high"] - r["gain_low"]) / 2 / abs(r["gain"])) ** 2))
              for name, r in inside.items()}
    if not inside:
        _noise_line = (f"Every gain's CI excludes 0: at B = {budget} and noise {noise:g} each method's gain over "
                       f"greedy is outside the noise of {len(problems)} problems.")
    else:
        _sizes = "; ".join(f"{name}: " + ("no gain to separate" if k is None else f"about {k} problems")
                           for name, k in needed.items())
        _noise_line = (f"**Inside the noise:** {', '.join(inside)} (the CI includes 0). At the gain measured here, "
                       f"the problems a CI would need to exclude 0: {_sizes} (level 2 has {len(problems)} unseen).")
    mo.md(
        f"""
    ### B = {budget} tokens per problem (N = {n} whole samples), noise {noise:g}

    SFT loss {sft_losses[0]:.2f} → {sft_losses[-1]:.3f}. {len(problems)} problems; "answer right" is the
    verifier's verdict, "every step right" the step checker's, "vs greedy" the gain in answer right with
    its paired bootstrap 95% CI.

    {results_table}

    {_noise_line}
    """
    )
    return inside, needed, results_table


@app.cell
def _(BUDGETS, by_budget, mo, noise, problems):
    # What this page measured about spending tokens at test time, at every budget of the chart:
    # the claim the "known" column below is allowed to make
    _low, _high = by_budget[BUDGETS[0]], by_budget[BUDGETS[-1]]
    _best = max(list(_high)[2:], key=lambda name: _high[name]["accuracy"])  # the best method using the page's scorers
    test_time_known = {"greedy": _high["greedy"]["accuracy"],
                       "ceiling_low": list(_low.values())[1]["accuracy"], "ceiling_high": list(_high.values())[1]["accuracy"],
                       "best": _best, "best_accuracy": _high[_best]["accuracy"], "best_tokens": _high[_best]["tokens"],
                       "best_gain_low": _high[_best]["gain_low"]}
    mo.md(
        f"""
    ## Test-time compute: what is known, and what is speculated

    o1, o3 and their kin are said to "think longer" at test time. Part of that is measured,
    part published with numbers, part guessed. Keep the three apart.

    **Measured here** (noise {noise:g}, {len(problems)} problems): greedy answers
    {test_time_known['greedy']:.3f}; with a perfect verifier, best-of-N goes from
    {test_time_known['ceiling_low']:.3f} at {BUDGETS[0]} tokens to {test_time_known['ceiling_high']:.3f} at
    {BUDGETS[-1]}; the best method using the page's ORM or PRM at {BUDGETS[-1]} tokens, {_best},
    answers {test_time_known['best_accuracy']:.3f} for {test_time_known['best_tokens']:.1f} tokens per
    problem (the lower end of its gain's CI: {test_time_known['best_gain_low']:+.3f}). Budget buys
    accuracy exactly as far as the scorer can tell answers apart.

    **Published, with numbers, not reproducible here.** OpenAI's o1 announcement (2024)
    reported AIME 2024 at 74% with one sample, 83% with a consensus of 64, 93% re-ranking
    1,000 samples with a learned scorer, and plots of accuracy rising with the log of
    test-time compute, without absolute units. DeepSeek-R1 (2025, open weights) gets its long
    chains from RL on rule-checked rewards, answers with one sample, and reports its PRM and
    MCTS attempts as unsuccessful. Snell et al. (2024) measured on MATH that a compute-optimal
    mix of PRM-guided search and revisions matches best-of-N with about 4× less compute.

    **Speculated.** Whether o-series models search, vote, or run a PRM inside one answer;
    what a "reasoning effort" setting changes; how long the hidden chains are; whether the
    log-linear plot holds past its range. None of it is disclosed: a claim about it is a
    guess, and this course labels it so.
    """
    )
    return (test_time_known,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **Budget 28.** One completion's worth: best-of-N has N = 1 (no choice at all), and beam
      search and MCTS cannot finish a solution (beam needs room for two partial solutions
      per kept beam, MCTS for its rollouts): they score 0. Tree search needs budget before it
      answers anything.
    * **Noise 0, budget 112 or more.** With perfect scorers, selection pays: best-of-N climbs
      well above greedy, and beam search gets much of that gain while spending fewer tokens,
      because it abandons a chain at its first wrong step instead of paying for the rest of it.
      Every method's gain over greedy there has a paired CI that excludes 0, or touches it: on
      the Intel Xeon this project also runs on, MCTS's lower bound is 0.000, and the line under
      the table names whatever sits inside the noise on your machine.
    * **Noise 1.** The same samples, a judge that scores at random: best-of-N by the ORM keeps
      little of its gain, and the PRM-guided methods gain nothing: on the AMD EPYC their CIs
      include 0, on the Intel Xeon they fall below greedy outright (a random pick among four
      temperature samples is one temperature sample, and that is worse than the greedy answer). More candidates only help a scorer that can tell them apart; with a bad one,
      more candidates mean more wrong ones it likes (`docs/guides/search.md` measures exactly
      this with a trained PRM). Between 0 and 1 the gain fades; at which noise a method's CI
      first includes 0 is what the table's CI column shows as you move the slider.
    * **Read "every step right".** Best-of-N by the verifier often picks a right answer reached
      by wrong steps (a tiny model sometimes knows the sum without the chain), while the
      PRM-guided methods pick chains whose every step holds. An outcome reward cannot tell
      these apart; a process reward can. Which one you want is a choice about what you are
      training for.

    ## At full scale

    [Test-time search at one token budget](../docs/guides/search.md#test-time-search-at-one-token-budget) runs the same methods on `make run`'s
    policy ([77.0%](../docs/getting-started.md#what-make-run-does-and-what-it-shows) held-out pass@1, arithmetic level 3) with a *trained* PRM and ORM,
    200 problems, budgets up to 768 tokens: best-of-N with the verifier climbs
    [from 75% to 82.5%](../docs/guides/search.md#test-time-search-at-one-token-budget), beam search guided by the step checker reaches
    [81.5% with 38% fewer tokens](../docs/guides/search.md#test-time-search-at-one-token-budget), and best-of-N with the trained ORM or PRM *falls*
    ([74.5% → 70.0% and 68.5%](../docs/guides/search.md#test-time-search-at-one-token-budget)) as N grows: their AUROC is [0.66–0.74](../docs/guides/search.md#test-time-search-at-one-token-budget), and
    selection finds their mistakes. The numbers there carry CIs, as the table above does.

    ## Source files used here

    * `posttrain/search/budget.py` — `Budget`, `Problem`, `sample_completions`, `extend_steps`: the token accounting
    * `posttrain/search/methods.py` — `greedy`, `pick_highest`, `beam_search`, `OracleStepScorer`, `OracleOutcomeScorer`, `NoisyScorer`
    * `posttrain/search/mcts.py` — `mcts`, UCT selection and backup
    * `posttrain/search/compare.py` — `posttrain search`, every method at every budget with CIs
    * `posttrain/eval/stats.py` — `paired_bootstrap_diff`, the CI of each gain over greedy
    * `posttrain/verifiers/steps.py` — `split_steps`, `check_arithmetic_steps` (the step labels)
    * `posttrain/rewards/process_reward_model.py` — trained PRMs and ORMs, `AGGREGATIONS`
    * `posttrain/teach/widgets.py` — `tiny_policy`

    ## Exercises

    1. At noise 0, why can best-of-N by the PRM never beat best-of-N by the perfect verifier on
       "answer right", while it can beat it on "every step right"?
    2. Best-of-N with a perfect verifier is pass@N. From n samples with c right, what is the
       unbiased estimate of pass@k for k < n, and why not just c/n or "any of the first k"?
    3. Code: `exercises/17_prm_search.py` asks for the unbiased pass@k estimator; run
       `posttrain check 17`.

    Next: lesson 18 looks at the verifiers themselves, and at what a policy does to a weak one.
    """)
    return


if __name__ == "__main__":
    app.run()
