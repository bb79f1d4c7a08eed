"""Lesson 15 · RLHF: SFT, a Bradley–Terry reward model, then RL against it on a KL leash."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import collections
    import random

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return collections, mo, random, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 15 · RLHF: the original recipe

    ## Why three stages

    Part II assumed a verifier: a rule that says whether `Final: 25` is right. Most of what we
    want from an assistant has no such rule (is this summary faithful? is this reply kind?),
    but people can say which of two answers they prefer. RLHF (Ziegler et al. 2019; Ouyang et
    al. 2022, InstructGPT) turns those comparisons into a reward in three stages, each needing
    the one before:

    1. **SFT** on demonstrations gives a policy that already writes the right *kind* of text.
       Raters can only compare answers that exist, so SFT also decides what the comparisons
       are about: the reward model will be trained on its samples.
    2. **A reward model** $r_\phi(x, y)$ is fitted to the comparisons: a scalar score that a
       policy-gradient method can use, for any text, at the cost of one forward pass.
    3. **RL** (PPO in the papers) maximises $r_\phi$, with a KL penalty that keeps the policy
       near the SFT model.

    ## The Bradley–Terry likelihood

    Give every answer a hidden strength $e^{r(x,y)}$ and let a rater prefer $y_c$ over $y_r$
    with probability proportional to its strength (Bradley & Terry 1952):

    $$
    P(y_c \succ y_r \mid x) = \frac{e^{r(x,y_c)}}{e^{r(x,y_c)} + e^{r(x,y_r)}}
    = \sigma\big(r(x,y_c) - r(x,y_r)\big).
    $$

    Maximum likelihood on a set of comparisons is then logistic regression on the reward
    *difference*:

    $$
    \mathcal{L}(\phi) = -\frac{1}{B}\sum_{b} \log \sigma\big(r_\phi(x_b, y_{c,b}) - r_\phi(x_b, y_{r,b})\big).
    $$

    Only differences are ever seen, so $r_\phi + c$ fits exactly as well for any constant $c$:
    the library centres the reward on its training data afterwards. Its head starts at zero,
    so every pair starts at $\sigma(0) = \tfrac12$ and the first loss is exactly $\log 2 = 0.6931$.

    ## The KL-regularised objective

    Stage 3 maximises $\;\mathbb{E}_{y\sim\pi}[r_\phi(x,y)] - \beta\,\mathrm{KL}(\pi \,\|\, \pi_{\text{ref}})$.
    PPO climbs it by sampling; on a finite set of answers its maximiser is known exactly,
    $\pi^*_\beta(y) \propto \pi_{\text{ref}}(y)\, e^{r_\phi(y)/\beta}$ (`posttrain demo kl_tradeoff`
    checks that gradient ascent lands there). This lesson computes that end point for every
    β instead of running PPO, so what you see is the objective itself, without sampling noise.

    ## The running example: reviews, with a gold rater

    The raters are `lexicon_sentiment` (`posttrain/data/sentiment_pairs.py`), a transparent
    sentiment score that plays the humans: `sentiment_pairs` draws two reviews of one subject
    from the same review writer and marks the more positive one *chosen*. Because we own the
    raters, every answer also has a **gold** reward (its lexicon score), and we can watch the
    learned **proxy** $r_\phi$ and the gold part ways. The policy RL starts from is the review
    writer itself: 5,000 of its reviews of the soup, $\pi_{\text{ref}}$ their frequencies.

    The panel trains a real `RewardModel` (`train_reward_model`: 100 AdamW steps of 16 pairs
    on a one-layer gpt_mini body) on the number of pairs you choose, then solves the RL stage
    exactly for the β you choose.
    """)
    return


@app.cell
def _(collections, random, torch):
    from posttrain.data.sentiment_pairs import lexicon_sentiment, review, sentiment_pairs

    PROMPT = "Review the soup:\n"
    _writer = random.Random(0)
    _counts = collections.Counter(review(_writer, "soup") for _ in range(5000))
    texts = sorted(_counts)  # every review the SFT policy wrote at least once: π_ref's support
    ref_logp = torch.log(torch.tensor([_counts[t] / 5000 for t in texts]))  # (N,) log π_ref
    gold = torch.tensor([lexicon_sentiment(t) for t in texts])  # (N,) what the raters would say
    heldout = sentiment_pairs(300, seed=1, split="heldout")  # pairs the reward model never sees
    BETAS = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003)  # the sweep, from "stay put" to "optimise hard"
    return BETAS, PROMPT, gold, heldout, ref_logp, sentiment_pairs, texts


@app.cell
def _(mo):
    controls = mo.ui.dictionary({
        "pairs": mo.ui.slider(steps=[30, 100, 300, 1000, 3000], value=3000, label="preference pairs to train on",
                              show_value=True),
        "log_beta": mo.ui.slider(start=-2.5, stop=0.0, step=0.25, value=-1.0, label="KL coefficient β = 10^x, x =",
                                 show_value=True),
    })
    controls.vstack()
    return (controls,)


@app.cell
def _(BETAS, PROMPT, controls, gold, heldout, mo, ref_logp, sentiment_pairs, texts, torch):
    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.rewards.reward_model import pairwise_accuracy, reward_of
    from posttrain.rewards.reward_model_training import train_reward_model
    from posttrain.teach.demos.kl_tradeoff import exact_kl

    n_pairs = controls.value["pairs"]
    beta = round(10 ** controls.value["log_beta"], 4)
    _train = sentiment_pairs(n_pairs, seed=0)
    # a few seconds of training: say so while it runs, or the page looks frozen
    with mo.status.spinner(title=f"Training the reward model on {n_pairs} pairs (100 steps)…"):
        reward_model, history = train_reward_model(_train, steps=100, seed=0)  # the BT loss, 100 steps
        train_acc = pairwise_accuracy(reward_model, _train[:300])
        heldout_acc = pairwise_accuracy(reward_model, heldout)
        proxy = reward_of(reward_model, CharTokenizer(), [PROMPT] * len(texts), texts, batch_size=512)  # (N,) r_φ

    def optimum(b: float) -> dict:
        """π*_β ∝ π_ref · exp(r_φ / β), and what it scores under the proxy and the gold."""
        logp = torch.log_softmax(ref_logp + proxy / b, dim=-1)  # (N,) log π*_β
        pi = logp.exp()
        return {"beta": b, "logp": logp, "proxy": (pi * proxy).sum().item(), "gold": (pi * gold).sum().item(),
                "kl": exact_kl(logp, ref_logp).item(),
                "distinct": torch.exp(-(pi * logp).sum()).item()}  # e^H: how many reviews it spreads over

    sweep = [optimum(b) for b in sorted(set(BETAS) | {beta}, reverse=True)]
    # the same optimum across the slider's range, β = 1 down to 10^-2.5, for the chart: one softmax each
    frontier = [optimum(10 ** (-i / 10)) for i in range(26)]
    chosen = next(row for row in sweep if row["beta"] == beta)
    start = {"proxy": (ref_logp.exp() * proxy).sum().item(), "gold": (ref_logp.exp() * gold).sum().item(),
             "distinct": torch.exp(-(ref_logp.exp() * ref_logp).sum()).item()}
    return beta, chosen, frontier, heldout_acc, history, n_pairs, proxy, start, sweep, train_acc


@app.cell
def _(beta, chosen, gold, heldout_acc, history, mo, n_pairs, proxy, ref_logp, start, sweep, texts, torch,
      train_acc):
    from posttrain.teach.tables import markdown_table

    _peak = max(sweep, key=lambda row: row["gold"])
    _rows = markdown_table(
        ["β", "KL(π\\* ‖ π_ref)", "proxy E[r_φ]", "gold E[lexicon]", "reviews it spreads over (e^H)"],
        [[f"{'**▶ ' if row is chosen else ''}{row['beta']:g}{'**' if row is chosen else ''}", f"{row['kl']:.2f}",
          f"{row['proxy']:+.2f}", f"{row['gold']:+.2f}{' ← gold peaks' if row is _peak else ''}", f"{row['distinct']:.1f}"]
         for row in sweep], align="rrrrr")  # "← gold peaks" is a note on a number
    _top = torch.topk(chosen["logp"], 5).indices.tolist()
    _reviews = markdown_table(
        ["review", "π_ref", "π\\*_β", "proxy r_φ", "gold"],
        [[texts[i], f"{ref_logp[i].exp():.4f}", f"{chosen['logp'][i].exp():.3f}", f"{proxy[i]:+.2f}", f"{gold[i]:+.2f}"]
         for i in _top])
    mo.md(
        f"""
    ### The reward model: {n_pairs} pairs, 100 steps

    Bradley–Terry loss {history[0]['loss']:.4f} → {history[-1]['loss']:.4f} (mean of the last ten
    steps {sum(h['loss'] for h in history[-10:]) / 10:.4f}). Pairwise accuracy: **{train_acc:.2f}** on the
    training pairs, **{heldout_acc:.2f}** on 300 held-out pairs (chance 0.50).

    ### RL against it: the exact optimum for each β ({len(texts)} distinct reviews of the soup)

    The SFT policy scores {start['proxy']:+.2f} under the proxy and {start['gold']:+.2f} under the gold,
    spread over e^H = {start['distinct']:.0f} reviews.

    {_rows}
    ### What π\\* writes at β = {beta:g}: its five most likely reviews

    {_reviews}
    """
    )
    return


@app.cell
def _(beta, chosen, frontier, start):
    from posttrain.teach.charts import curves, figure, finish, legend_right, mark, span

    overopt_fig, _ax = figure()
    _kl = [0.0] + [row["kl"] for row in frontier]  # β → ∞ is π_ref itself: KL 0
    _gold = [start["gold"]] + [row["gold"] for row in frontier]
    curves(_ax, _kl, {"proxy E[r_φ], maximised": [start["proxy"]] + [row["proxy"] for row in frontier],
                      "gold E[lexicon], the raters": _gold})
    # Goodhart's regime, read off the curve: from the gold's peak on, more proxy buys less gold
    hacking_from = _kl[max(range(len(_gold)), key=_gold.__getitem__)]
    if hacking_from < _kl[-1]:
        span(_ax, hacking_from, _kl[-1], "reward-hacking regime: the proxy still rises, the gold is past its peak")
    mark(_ax, chosen["kl"], f"β = {beta:g}: KL {chosen['kl']:.2f} nats")
    finish(overopt_fig, _ax, "KL(π*_β ‖ π_ref) (nats): how far RL moved the policy", "expected reward (score)",
           title="Over-optimisation: the proxy keeps rising, the gold turns over")
    legend_right(overopt_fig, _ax)
    overopt_fig
    return hacking_from, overopt_fig


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **β → 0.003.** The proxy column only ever rises as β falls (a smaller β buys more reward
      with more KL, by construction), but the gold peaks and then falls: the policy piles onto
      the review the reward model scores highest of all, and that is a negated compliment. On
      an Intel Xeon, with the defaults, 71% of the policy is *"The soup was not lovely and not
      pleasant."*, which the raters would call negative (gold below zero); on an AMD EPYC with
      AVX-512, whose float32 rounding trains a slightly different reward model, it is *"The soup
      was never excellent and excellent."*, which the lexicon still scores +1.4 against the best
      reviews' +7.5. Either way the reward model learned that "lovely" or "excellent" are good
      words and never quite learned what "not" and "never" do to them. Over-optimisation (Gao, Schulman & Hilton 2022) is this: the proxy was right
      where its training data lived and wrong where the optimiser went looking.
    * **30 pairs.** Training accuracy runs far ahead of held-out accuracy: the model memorised
      its pairs. The sweep then optimises noise.
    * Change the reward model's seed in the editor (`posttrain lessons 15 --edit`): in most
      seeds the gold rises and then falls, but not in all. Whether optimisation hurts depends on
      what the reward model gets wrong at the very top of its ranking, the one place the
      optimiser looks hardest.

    ## The KL anchor's two jobs

    1. **Keep the policy where the reward model is right.** The reward model was trained on
       π_ref's answers; the KL term is what stops the policy from drifting to answers nobody
       ever compared. Read the sweep: the gold peaks at a moderate KL, and the peak is the
       β you would want.
    2. **Keep the policy a distribution.** Without it the maximiser of E[r_φ] is a single
       answer: the last column falls from hundreds of reviews to about two. Even a perfect reward
       model would make the policy repeat its favourite answer for every prompt; the KL term
       keeps the variety (and the fluency) the SFT model had, at a price in reward you can read
       off the table. (`posttrain demo sentiment_steering` measures this alignment tax on text
       a model actually generates: at β = 0, "… was great!" for every opening.)

    At full scale the same happens with PPO: in [RLHF end to end](../docs/guides/preference.md#rlhf-end-to-end) (the run on the
    arithmetic task, with its commands), with no KL term the reward model's score rose
    [from 0.12 to 0.81](../docs/guides/preference.md#rlhf-end-to-end) while the verifier's fell to [0.24](../docs/guides/preference.md#rlhf-end-to-end) and held-out pass@1 to
    [26.2%](../docs/guides/preference.md#rlhf-end-to-end); with `kl_coef` 0.02 the gold peaked early at [0.75](../docs/guides/preference.md#rlhf-end-to-end) and settled at
    [0.64](../docs/guides/preference.md#rlhf-end-to-end).

    ## Source files used here

    * `posttrain/rewards/reward_model.py` — `RewardModel`, `bt_loss`, `pairwise_accuracy`, `reward_of`
    * `posttrain/rewards/reward_model_training.py` — `train_reward_model`: the BT loss handed to the one `Trainer`
    * `posttrain/data/sentiment_pairs.py` — `review`, `sentiment_pairs`, `lexicon_sentiment` (the raters)
    * `posttrain/teach/demos/kl_tradeoff.py` — the closed-form optimum and `exact_kl`
    * `posttrain/pipelines/rlhf.py` — the whole recipe on the arithmetic task: SFT, reward model, PPO
    * `posttrain/rewards/proxy.py` — `ProxyReward`: train on r_φ, log the verifier's gold beside it
    * `docs/algorithms/rlhf.md` — the recipe, its equations and its outputs

    ## Exercises

    1. Why must the reward model's head start at zero for the first loss to be exactly log 2?
       What would the first loss be with a random head?
    2. Show that adding the same constant to every reward leaves both the Bradley–Terry loss and
       π\*_β unchanged. Which other step of RLHF is unaffected by it, and which is not (think of
       PPO's value function)?
    3. Code: `exercises/15_rlhf.py` asks for the Bradley–Terry loss with a margin; run
       `posttrain check 15`.

    Next: lesson 16 removes the reward model altogether.
    """)
    return


if __name__ == "__main__":
    app.run()
