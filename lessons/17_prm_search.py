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
def _(mo):
    mo.md(r"""
    # 17 · Process rewards, outcome rewards and search

    ## Why spend compute at test time

    Lessons 09–16 change the weights. Loop B (lesson 00) leaves them alone and spends
    inference compute instead: sample more, and let a scorer choose. How much that buys
    depends on two things this lesson puts under your control: **how many tokens** you may
    generate per problem, and **how good the scorer** is.

    ## Outcome and process reward models

    * An **ORM** reads a finished completion and says how likely it is to be right:
      $p(\text{correct} \mid x, y)$. It can only rank whole answers.
    * A **PRM** scores every step of a chain of thought: $p(\text{step}_k \text{ right} \mid x, \text{steps}_{\le k})$.
      A completion's score aggregates them (here the minimum: a chain is as good as its
      worst step). Because a PRM can score a *partial* solution, it can steer generation
      while it happens.

    ## Four ways to spend a budget of B generated tokens

    | method | how it spends B | needs |
    |:---|:---|:---|
    | greedy | one completion at temperature 0 | nothing |
    | best-of-N (ORM) | N = B / 28 whole samples, keep the one the ORM ranks first | an ORM |
    | best-of-N (PRM) | the same N samples, keep the one with the best worst step | a PRM |
    | beam search (PRM) | grow B / 56 partial solutions one step at a time; each samples 2 next steps, the PRM keeps the best | a PRM on prefixes |
    | MCTS (PRM) | a tree over steps; each expansion samples 3 next steps and rolls each out to the end; the PRM's score of the rollout is the node's value (UCT picks where to expand) | a PRM, and budget for rollouts |

    Every token is counted by `posttrain/search/budget.py`: a method asks for tokens only
    through it, and it caps every sampled row so that a problem can never spend more than B.
    Prompt re-reading and the scorer's own forward passes are not counted (they are what a KV
    cache and a cheaper scorer would save).

    ## The stand-ins

    The policy is a tiny `gpt_mini` taught level-2 sums with a chain of thought
    (`"Q: 9+5+2"` → `"9+5=14,14+2=16\nFinal: 16"`, 250 SFT steps), sampled at temperature 0.7.
    The **ORM** is the task's verifier itself (`OracleOutcomeScorer`: 1 if the answer is right),
    the **PRM** the arithmetic step checker (`OracleStepScorer`: 1 while every step so far holds
    and follows the problem). Both are perfect, so the *noise* knob makes them worse on purpose:
    `NoisyScorer` mixes each score with a uniform draw, score ← (1 − noise)·score + noise·u,
    where u is a fixed hash of the text, so a prefix is always misjudged the same way, as a
    trained model would misjudge it. All five methods run on the same 40 held-out (dev) problems.
    """)
    return


@app.cell
def _(mo):
    from posttrain.teach.widgets import tiny_policy

    with mo.status.spinner(title="Teaching a tiny model to add in steps (400 SFT steps, a few seconds)…"):
        model, tok, env, sft_losses = tiny_policy(sft_steps=400, level=2, cot=True, demos=795)
    problems = env.fixed_set("dev", 40)
    MAX_NEW = 28  # the longest level-2 chain, "9+9=18,18+9=27\nFinal: 27", is 25 characters + EOS
    return MAX_NEW, env, model, problems, sft_losses, tok


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
def _(MAX_NEW, env, model, problems, tok, torch):
    import functools

    from posttrain.config import SamplingParams
    from posttrain.rewards.process_reward_model import AGGREGATIONS, get_step_format
    from posttrain.roles.engines import make_engine
    from posttrain.config.scoring import SearchConfig
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

    settings = SearchConfig()  # expansions, MCTS children, c_uct, step cap: what `posttrain search` uses
    engine = make_engine(model, tok, SamplingParams(temperature=0.5, max_new_tokens=MAX_NEW))
    fmt, separators = get_step_format("arithmetic"), SEPARATORS["arithmetic"]
    step_checker = OracleStepScorer(problems)
    prompts = [p.prompt for p in problems]

    def grade(answers, spent) -> dict:
        """The verifier's verdict (the answer) and the step checker's (every step), per method."""
        right = [float(a is not None and a.done and env.score(e, a.text)["reward"] >= 1.0) for e, a in zip(problems, answers)]
        steps_ok = [float(a is not None and a.done and step_checker.score_outcomes([e.prompt], [a.text])[0] == 1.0)
                    for e, a in zip(problems, answers)]
        return {"accuracy": sum(right) / len(right), "chain_right": sum(steps_ok) / len(steps_ok),
                "tokens": spent / len(problems)}

    def spent_by(batch) -> int:
        return sum(p.budget.spent for p in batch)

    @functools.lru_cache(maxsize=None)  # moving the budget back to a value already seen costs nothing
    def search_rows(budget: int, noise: float) -> dict:
        """Every method on the 40 problems at one budget and one scorer noise: {method: grade}."""
        orm = NoisyScorer(OracleOutcomeScorer(problems, env.score), noise)
        prm = NoisyScorer(step_checker, noise)
        rows = {}
        batch = Problem.of(problems, tok, MAX_NEW)
        rows["greedy"] = grade(greedy(engine, batch, MAX_NEW), spent_by(batch))
        n = budget // MAX_NEW
        batch = Problem.of(problems, tok, budget)
        drawn = sample_completions(engine, batch, n, MAX_NEW, torch.Generator().manual_seed(0))
        spent = spent_by(batch)  # one set of N samples, three ways of choosing among them
        rows[f"best-of-{n}, perfect verifier"] = grade(
            [pick_highest(c, OracleOutcomeScorer(problems, env.score).score_outcomes([p] * len(c), [x.text for x in c]))
             for p, c in zip(prompts, drawn)], spent)
        rows[f"best-of-{n} (ORM)"] = grade(
            [pick_highest(c, orm.score_outcomes([p] * len(c), [x.text for x in c])) for p, c in zip(prompts, drawn)], spent)
        rows[f"best-of-{n} (PRM, min)"] = grade(
            [pick_highest(c, [AGGREGATIONS["min"](s) for s in prm.score_steps([p] * len(c), [fmt.split(x.text) or [""] for x in c])])
             for p, c in zip(prompts, drawn)], spent)
        width = max(1, budget // (MAX_NEW * settings.expansions))
        batch = Problem.of(problems, tok, budget)
        rows[f"beam {width}×{settings.expansions} (PRM)"] = grade(
            beam_search(engine, batch, prm, fmt, separators, width, settings.expansions, settings.step_tokens, MAX_NEW,
                        torch.Generator().manual_seed(1)), spent_by(batch))
        batch = Problem.of(problems, tok, budget)
        rows["MCTS (PRM)"] = grade(
            mcts(engine, batch, prm, fmt, separators, settings.mcts_children, settings.step_tokens, MAX_NEW,
                 settings.c_uct, torch.Generator().manual_seed(2)), spent_by(batch))
        return rows

    return (search_rows,)


@app.cell
def _(MAX_NEW, controls, mo, search_rows):
    budget, noise = controls.value["budget"], controls.value["noise"]
    n = budget // MAX_NEW
    BUDGETS = [k * MAX_NEW for k in (1, 2, 4, 8)]  # the slider's steps
    # every budget at this noise, for the chart (each a few hundred ms to seconds of search)
    with mo.status.spinner(title=f"Running five search methods at {len(BUDGETS)} budgets, noise {noise:g}…"):
        by_budget = {b: search_rows(b, noise) for b in BUDGETS}
    rows = by_budget[budget]
    return BUDGETS, budget, by_budget, n, noise, rows


@app.cell
def _(BUDGETS, budget, by_budget, noise):
    from posttrain.teach.charts import curves, figure, finish, legend_right, mark

    # the methods in the order the table lists them; "N" in a name is budget ÷ 28 at each point
    _methods = ["greedy", "best-of-N, perfect verifier", "best-of-N (ORM)", "best-of-N (PRM, min)", "beam (PRM)",
                "MCTS (PRM)"]
    _accuracy = {m: [list(by_budget[b].values())[i]["accuracy"] for b in BUDGETS] for i, m in enumerate(_methods)}
    budget_fig, _ax = figure()
    # at noise 0 the ORM is the perfect verifier: dashed, so that both lines show
    curves(_ax, BUDGETS, _accuracy, markers=True, styles={"greedy": ":", "best-of-N (ORM)": "--"})
    mark(_ax, budget, f"B = {budget} tokens")
    _ax.set_xscale("log", base=2)
    _ax.set_xticks(BUDGETS, [str(b) for b in BUDGETS])
    finish(budget_fig, _ax, "budget B: generated tokens per problem (log scale)", "answer right (fraction of 40)",
           title=f"Accuracy against token budget, scorer noise {noise:g}")
    legend_right(budget_fig, _ax)
    budget_fig
    return (budget_fig,)


@app.cell
def _(budget, mo, n, noise, problems, rows, sft_losses):
    from posttrain.teach.tables import markdown_table

    _greedy = rows["greedy"]["accuracy"]
    _table = markdown_table(
        ["method", "answer right", "vs greedy", "every step right", "tokens spent per problem"],
        [[name, f"**{r['accuracy']:.3f}**", f"{r['accuracy'] - _greedy:+.3f}", f"{r['chain_right']:.3f}", f"{r['tokens']:.1f}"]
         for name, r in rows.items()])
    mo.md(
        f"""
    ### B = {budget} tokens per problem (N = {n} whole samples), noise {noise:g}

    SFT loss {sft_losses[0]:.2f} → {sft_losses[-1]:.3f}. {len(problems)} dev problems; "answer right" is the
    verifier's verdict, "every step right" the step checker's.

    {_table}
    """
    )
    return


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
    * **Noise 1.** The same samples, a judge that scores at random: best-of-N by the ORM keeps
      little of its gain, and the PRM-guided methods fall to about greedy's level. More
      candidates only help a scorer that can tell them apart; with a bad one, more candidates
      mean more wrong ones it likes (`docs/guides/search.md` measures exactly this with a trained PRM).
      Between 0 and 1 the gain fades: how much of it survives at 0.8 depends on the draw (with
      40 problems, an AMD EPYC with AVX-512 kept 0.675 of the verifier's 0.725, the machines
      this lesson was first measured on lost more than 0.1), the noise the section below warns of.
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
    selection finds their mistakes. The numbers there carry CIs; here, with 40 problems, a
    difference under ~0.15 is noise.

    ## Source files used here

    * `posttrain/search/budget.py` — `Budget`, `Problem`, `sample_completions`, `extend_steps`: the token accounting
    * `posttrain/search/methods.py` — `greedy`, `pick_highest`, `beam_search`, `OracleStepScorer`, `OracleOutcomeScorer`, `NoisyScorer`
    * `posttrain/search/mcts.py` — `mcts`, UCT selection and backup
    * `posttrain/search/compare.py` — `posttrain search`, every method at every budget with CIs
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
