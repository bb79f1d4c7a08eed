"""Lesson 05 · Trainer: one forward, one backward, one step, and no algorithm names."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import copy
    import dataclasses

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return copy, dataclasses, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 05 · Trainer: where gradients flow

    ## Why the trainer knows nothing about RL

    By the time a batch reaches the trainer, every RL-specific decision has been made. The
    rollout recorded `old_logp` (lesson 02), the reference scored the tokens (`ref_logp`,
    lesson 03), and the algorithm turned rewards into `advantages` (lesson 04). What is left is
    the oldest loop in deep learning: run the model on the tokens, get a number, differentiate,
    step. So `Trainer` takes the loss as an **object** — `loss.compute_loss(outputs, batch) ->
    (loss, metrics)`, plus `loss.loss_agg`, how that loss averages over the batch — and never
    asks which algorithm wrote it. SFT passes `sft_loss`; GRPO passes the `GRPO` object itself;
    the line that calls them is the same:

    ```python
    metrics = trainer.update(batch, loss)   # forward → compute_loss → backward → clip → AdamW step
    ```

    What the trainer *does* own is everything about optimisation that no paper's pseudocode
    mentions but every run depends on: the learning-rate schedule (warmup, cosine decay), the
    gradient-norm clip, micro-batching, and epochs over one rollout batch.

    ## The key equation

    The forward pass produces the only differentiable thing in the whole step,
    $\log\pi_\theta(y_t \mid x, y_{<t})$ for every token. Everything else the loss reads is a
    constant recorded earlier. For GRPO with a KL anchor:

    $$
    \mathcal{L}(\theta) = -\,\operatorname{agg}_t\!\Big[\min\big(\rho_t A_t,\ \operatorname{clip}(\rho_t, 1\pm\epsilon) A_t\big)\Big]
    + \beta\,\operatorname{agg}_t\big[\mathrm{KL}_t(\pi_\theta \,\|\, \pi_{\text{ref}})\big],
    \qquad \rho_t = e^{\log\pi_\theta - \texttt{old\_logp}_t}
    $$

    and the step is $\theta \leftarrow \operatorname{AdamW}\big(\theta,\ \operatorname{clip}_{\|\cdot\| \le 1}(\nabla_\theta \mathcal{L})\big)$
    with learning rate $\eta$. Below, a tiny `gpt_mini` is taught the answer format with 100
    SFT steps (the same `Trainer`, with `sft_loss`), samples one rollout batch, and then takes
    **four GRPO steps on that batch** with the learning rate you choose.
    """)
    return


@app.cell
def _(copy, dataclasses, mo, torch):
    from posttrain.algorithms import make_algorithm
    from posttrain.teach.widgets import tiny_policy
    from posttrain.roles.environment import score_episodes
    from posttrain.roles.reference import Reference
    from posttrain.roles.engines import make_engine
    from posttrain.config import SamplingParams
    from posttrain.types import RolloutBatch

    with mo.status.spinner(title="Teaching a tiny policy the answer format (100 SFT steps) and sampling 4 prompts × 6…"):
        model, tok, env, sft_losses = tiny_policy(sft_steps=100)
        params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_at_newline=True)
        _engine = make_engine(copy.deepcopy(model), tok, params)
        prompts = env.fixed_set("train", 4, seed=1)
        _episodes = score_episodes(env.score, _engine.generate(prompts, 6, generator=torch.Generator().manual_seed(0)))
    batch = RolloutBatch.collate(_episodes, tok.pad_id, temperature=params.temperature)
    batch.ref_logp = Reference(model).logp(batch)  # the frozen start: KL is 0 before the first step
    grpo = make_algorithm("grpo", kl_coef=0.04)  # the GRPO paper's β, so the KL term is live
    batch = dataclasses.replace(batch, **grpo.compute_advantages(batch))
    heldout = env.fixed_set("train", 90)  # every level-1 training problem, scored greedily
    return make_engine, batch, env, grpo, heldout, model, params, sft_losses, tok


@app.cell
def _(batch, mo, sft_losses):
    mo.md(
        f"""
    SFT (the same `Trainer`, `loss_fn=sft_loss`): loss {sft_losses[0]:.2f} → {sft_losses[-1]:.2f} in
    100 steps. Rollout batch: {batch.batch_size} completions of 4 prompts, rewards
    `{[int(r) for r in batch.rewards.tolist()]}`.
    """
    )
    return


@app.cell
def _(mo):
    log_lr = mo.ui.slider(start=-5.0, stop=0.0, step=0.25, value=-4.0, label="learning rate η = 10^x, x =",
                          show_value=True)
    log_lr
    return (log_lr,)


@app.cell
def _(batch, copy, grpo, log_lr, mo, model, torch):
    from posttrain.roles.trainer import Trainer

    lr = 10 ** log_lr.value
    policy = copy.deepcopy(model).requires_grad_(True)  # start every slider move from the same weights
    # no warmup on purpose: the first AdamW step is what this lesson is about; grad_clip=1.0
    with mo.status.spinner(title=f"Four GRPO steps at η = {lr:.2g} on the {batch.batch_size} samples…"):
        trainer = Trainer(policy, lr=lr, total_steps=4, warmup_steps=0)
        steps, error = [], None
        for _ in range(4):
            try:
                steps.append(trainer.update(batch, grpo))
            except FloatingPointError as err:  # the trainer refuses a non-finite loss, with a message
                error = str(err)
                break
        with torch.no_grad():
            _after = trainer.forward(batch)
    _on = batch.response_mask
    _delta = ((_after.logp - batch.old_logp) * _on).sum(dim=1)  # (B,) change in log π(completion)
    _right = batch.rewards > 0
    delta_right = _delta[_right].mean().item() if _right.any() else float("nan")
    delta_wrong = _delta[~_right].mean().item() if (~_right).any() else float("nan")
    return delta_right, delta_wrong, error, lr, policy, steps


@app.cell
def _(copy, env, heldout, make_engine, mo, model, params, policy, tok):
    from posttrain.eval.evaluate import evaluate_pass_at_1 as _evaluate

    with mo.status.spinner(title=f"Greedy pass@1 on {len(heldout)} problems, before and after the four steps…"):
        pass_before = _evaluate(make_engine(copy.deepcopy(model), tok, params), env, heldout)["pass@1"]
        pass_after = _evaluate(make_engine(copy.deepcopy(policy), tok, params), env, heldout)["pass@1"]
    return pass_after, pass_before


@app.cell
def _(delta_right, delta_wrong, error, lr, mo, pass_after, pass_before, steps):
    from posttrain.teach.tables import markdown_table

    _keys = ("pg_loss", "kl", "grad_norm", "ratio_mean", "ratio_max", "clipfrac", "entropy", "lr")
    _table = markdown_table(["step", *_keys], [[i + 1, *(f"{m.get(k, float('nan')):.4g}" for k in _keys)]
                                                for i, m in enumerate(steps)])
    _err = f"\n**The trainer stopped:** {error}\n" if error else ""
    mo.md(
        f"""
    ### Four `trainer.update(batch, grpo)` calls at η = {lr:.2g}

    {_table}
    {_err}
    Step 1 sees ratio 1 everywhere (the weights are those that sampled); from step 2 on the same
    batch is slightly off-policy, and the clip starts to bite (`clipfrac`). `grad_norm` is
    measured *before* the clip at 1.0.

    After the four steps, the log-probability of the **correct** completions changed by
    **{delta_right:+.3f}** on average, the **wrong** ones by **{delta_wrong:+.3f}**. Greedy
    pass@1 on all 90 level-1 training problems (Loop A): **{pass_before:.3f} → {pass_after:.3f}**.
    """
    )
    return


@app.cell
def _(grpo, lr, pass_after, pass_before, steps):
    from posttrain.teach.charts import REFERENCE, curves, figure, finish

    # The ratio each of the four updates saw on the same batch: 1 at step 1 (on-policy), then
    # as far from 1 as the previous steps moved the policy
    _steps = list(range(1, len(steps) + 1))
    _fig, _ax = figure()
    _ax.axhspan(1 - grpo.clip_eps_low, 1 + grpo.clip_eps_high, color=REFERENCE, alpha=0.12,
                label=f"clip range [{1 - grpo.clip_eps_low:g}, {1 + grpo.clip_eps_high:g}]")
    curves(_ax, _steps, {"largest ratio of any token": [m["ratio_max"] for m in steps],
                         "mean ratio": [m["ratio_mean"] for m in steps]}, markers=True)
    _ax.set_xticks(_steps)
    _ax.set_ylim(0, max([2.0] + [1.1 * m["ratio_max"] for m in steps]))  # one scale as the slider moves
    chart = finish(_fig, _ax, "update on the same rollout batch", "ratio π_θ / π_old",
                   title=f"η = {lr:.2g}: greedy pass@1 {pass_before:.2f} → {pass_after:.2f} after these four steps")
    chart
    return (chart,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **η = 10^-3 and above.** Greedy pass@1 falls from about 0.7 toward 0 in four steps: the RL
      steps undo what 100 SFT steps built. The gradient clip does not save you, because AdamW's
      first step divides the gradient by its own running magnitude: each weight moves by about
      ±η *whatever the gradient's size*. On a 33k-parameter model, η = 10^-3 on every weight at
      once is a large move. The symptoms are all in the metrics — `ratio_max` of 2 or more on
      step 2, `clipfrac` rising, and the KL to the reference (k3 estimator, which grows
      exponentially in the log-ratio) jumping by orders of magnitude. This is why the trainer
      has a warmup (`warmup_cosine`): small steps while Adam's statistics are still a guess.
    * **η = 10^-5.** Nothing breaks, nothing happens: the completions' log-probs barely move.
      A learning rate is a budget for how far one batch may move the policy.
    * The gradient clip itself is a knob: `Trainer(grad_clip=0)` turns it off. With one lucky
      batch of large advantages, an unclipped step can be arbitrarily large.

    ## Source files used here

    * `posttrain/roles/trainer.py` — `Trainer.forward`, `Trainer.update`, `Trainer._step`, `sft_loss`
    * `posttrain/algorithms/grpo.py` — the `compute_loss` passed in
    * `posttrain/algorithms/core.py` — `token_logp`, `token_entropy`, `clipped_surrogate`, `kl_k3`
    * `posttrain/roles/reference.py` — `Reference.logp` (the `ref_logp` the KL term reads)
    * `posttrain/teach/widgets.py` — `tiny_policy`, the SFT warm-up shared by lessons 05–07
    * `posttrain/eval/evaluate.py` — `evaluate_pass_at_1`, the greedy measurement

    ## Exercises

    1. Find the largest η at which greedy pass@1 does not drop. Then give the trainer
       `warmup_steps=4` (edit the notebook: `posttrain lessons 05 --edit`): how much higher can
       η go now?
    2. `Trainer.accumulate` weights each micro-batch's loss by its share of the rows, except
       for `token-mean`, where it uses the share of the response tokens. Why would the row
       share be wrong for `token-mean` when responses differ in length? (Try it: two rows of
       1 and 9 tokens, micro-batches of one row.)
    3. Code: `exercises/05_sft_loss.py` asks you to write the SFT loss yourself; run
       `posttrain check 05`.

    Next: [06 · Weight sync](?file=06_weight_sync.py).
    """)
    return


if __name__ == "__main__":
    app.run()
