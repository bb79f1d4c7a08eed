"""Lesson 06 · Weight sync: the trainer's fresh weights must reach the sampler."""

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
    # 06 · Weight sync: closing the loop

    ## Why there are two copies of the policy

    In every real system the model that *samples* and the model that *learns* are different
    objects. The rollout engine wants the weights laid out for fast generation (a KV cache,
    often another process or another GPU, often a different library such as vLLM); the trainer
    wants them with gradients and optimizer state. After each update the trainer has new
    weights and the engine still has the old ones. **Weight sync** is the copy between them,
    and it is easy to get subtly wrong: forget it, or do it late, and the engine keeps sampling
    from a policy the trainer has already left behind.

    Nothing crashes when that happens. The algorithm still computes its ratio
    $\rho_t = \pi_\theta / \pi_{\text{old}}$, but $\pi_{\text{old}}$ is now the *stale* policy, several
    updates behind. The ratio starts the step far from 1, PPO's clip (lesson 10) zeroes the
    gradient on every token outside $[1-\epsilon, 1+\epsilon]$, and training quietly stops
    learning from most of its data.

    ## The key equation: staleness

    `InProcessWeightSync.push()` copies the state dict and bumps a version; the engine stamps
    that version on every episode it samples. So staleness is a number you can log:

    $$
    \text{staleness} = v_{\text{trainer}} - v_{\text{episode}},
    \qquad
    \text{approx\_kl} = \mathbb{E}_{\pi_{\text{old}}}\!\big[(\rho_t - 1) - \log \rho_t\big]
    \text{ measured before the update}
    $$

    On-policy training has staleness 0 and approx_kl exactly 0 at the start of every step.

    Three deployment patterns use the same `push() -> version` interface: **colocated** (one
    process, an in-memory copy — what runs here), **disaggregated** (engine on other devices,
    weights broadcast over the network after each step), and **asynchronous** (the engine
    never waits; episodes arrive up to *k* versions stale and the ratio corrects for it).

    Below: 8 GRPO steps from the same starting weights. The slider sets how often the trainer
    pushes its weights to the engine.
    """)
    return


@app.cell
def _(mo):
    from posttrain.algorithms import make_algorithm
    from posttrain.teach.widgets import tiny_policy
    from posttrain.roles.environment import score_episodes
    from posttrain.roles.engines import make_engine
    from posttrain.config import SamplingParams
    from posttrain.roles.trainer import Trainer
    from posttrain.roles.weight_sync import InProcessWeightSync
    from posttrain.types import RolloutBatch

    with mo.status.spinner(title="Teaching a tiny policy the answer format (100 SFT steps, a few seconds)…"):
        model, tok, env, _ = tiny_policy(sft_steps=100)
    return (InProcessWeightSync, RolloutBatch, make_engine, SamplingParams, Trainer, env, make_algorithm, model,
            score_episodes, tok)


@app.cell
def _(mo):
    sync_every = mo.ui.slider(start=0, stop=8, step=1, value=1, label="push weights every N steps (0 = never)",
                              show_value=True)
    sync_every
    return (sync_every,)


@app.cell
def _(InProcessWeightSync, RolloutBatch, make_engine, SamplingParams, Trainer, copy, dataclasses, env,
      make_algorithm, model, score_episodes, sync_every, tok, torch):
    from posttrain.algorithms.core import clipped_surrogate, importance_ratio, masked_mean

    STEPS = 8
    policy = copy.deepcopy(model).requires_grad_(True)  # the trainer's copy
    engine = make_engine(copy.deepcopy(model), tok, SamplingParams(temperature=1.0, max_new_tokens=12,
                                                                   stop_at_newline=True))
    sync = InProcessWeightSync(policy, engine)
    trainer = Trainer(policy, lr=1e-3, total_steps=STEPS, warmup_steps=3)  # brisk, so drift shows in 8 steps
    grpo = make_algorithm("grpo")
    trainer_version = 0  # how many updates the trainer's weights have seen
    with mo.status.spinner(title=f"{STEPS} GRPO steps of 4 prompts × 6, weights pushed every {sync_every.value} (0 = never)…"):
        log = []
        for _step in range(STEPS):
            _prompts = env.sample("train", 4, seed=_step)
            _episodes = score_episodes(env.score, engine.generate(_prompts, 6, generator=torch.Generator().manual_seed(_step)))
            _batch = RolloutBatch.collate(_episodes, tok.pad_id)
            _batch = dataclasses.replace(_batch, **grpo.compute_advantages(_batch))
            with torch.no_grad():  # the ratio the first minibatch of this step will see
                _logp = trainer.forward(_batch).logp  # (B, T)
                _, _before = clipped_surrogate(_logp, _batch.old_logp, _batch.advantages, _batch.response_mask, 0.2, 0.2)
                _, _ratio = importance_ratio(_logp, _batch.old_logp, _batch.response_mask)  # (B, T)
                _before["outside"] = masked_mean(((_ratio - 1).abs() > 0.2).float(), _batch.response_mask).item()
            _metrics = trainer.update(_batch, grpo)
            trainer_version += 1
            pushed = sync_every.value > 0 and (_step + 1) % sync_every.value == 0
            if pushed:
                sync.push()
            log.append({"step": _step, "episode_version": _episodes[0].weight_version,
                        "staleness": trainer_version - 1 - _episodes[0].weight_version,
                        "reward": _batch.rewards.mean().item(), "pushed": pushed, **_before})
    return STEPS, log, sync


@app.cell
def _(STEPS, log, mo, sync, sync_every):
    _rows = "".join(
        f"| {r['step']} | {r['episode_version']} | {r['staleness']} | {r['reward']:.2f} | {r['ratio_mean']:.3f} | "
        f"{r['ratio_max']:.2f} | {r['outside']:.3f} | {r['clipfrac']:.3f} | {abs(r['approx_kl']):.4f} | {'push' if r['pushed'] else ''} |\n"
        for r in log
    )
    _mode = "never" if sync_every.value == 0 else f"every {sync_every.value} step(s)"
    mo.md(
        f"""
    ### {STEPS} steps, weights pushed {_mode}; the engine ended at version {sync.version}

    Columns 5–9 are measured at the start of each step, *before* the update: the trainer's
    current policy against the `old_logp` the engine recorded.

    | step | episodes sampled by version | staleness | reward mean | ratio mean | ratio max | outside [0.8, 1.2] | clipfrac | approx_kl | after the update |
    |---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|
    {_rows}
    Worst staleness: **{max(r['staleness'] for r in log)}** updates; largest approx_kl at the
    start of a step: **{max(r['approx_kl'] for r in log):.4f}**; tokens starting a step outside the
    trust region, averaged over the run: **{sum(r['outside'] for r in log) / len(log):.3f}**.
    """
    )
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **0 (never push).** The engine samples all eight batches from the starting weights. The
      staleness column counts up, and from step 1 on the ratio starts each step away from 1:
      `ratio max` up to about 3, a few percent of tokens already outside the trust region before the
      update has begun, approx_kl no longer 0. On those tokens the clip (`clipfrac`) withholds
      the gradient, because they "have already moved too far" — moved by updates the sampler
      never saw. And the reward cannot improve, since the policy that samples never changes.
      Here the drift is small because the run is short and the learning rate modest; it
      compounds with every step a real run takes.
    * **1 (every step)** is on-policy: ratio exactly 1, approx_kl 0, at the start of every
      step. Anything else is off-policy by design, and needs the ratio and clip to be safe.
    * In an asynchronous system the same numbers are the health check: log staleness and the
      start-of-step approx_kl, and alarm when they grow.

    ## Source files used here

    * `posttrain/roles/weight_sync.py` — `InProcessWeightSync.push`, the version counter
    * `posttrain/roles/engines/torch_engine.py` — `RolloutEngine` (its own model copy, `weight_version`, `load_weights`)
    * `posttrain/types.py` — `Episode.weight_version`
    * `posttrain/roles/trainer.py` — `Trainer.update`, `Trainer.forward`
    * `posttrain/algorithms/core.py` — `clipped_surrogate` (ratio, clipfrac, approx_kl)
    * `posttrain/roles/controller.py` — step 6 of `Controller.step`, and `Controller.load_state_dict`, which must push too

    ## Exercises

    1. Read `Controller.load_state_dict` in `posttrain/roles/controller.py`. What would go wrong after a resume
       if it did not call `sync.push()`? Which column of this lesson's table would show it?
    2. With a push every 4 steps, which steps are on-policy? Predict, then check the table.
    3. An asynchronous trainer accepts episodes up to 2 versions stale. Which column of the
       table would you alarm on, and at what value, to catch a sampler that has stopped
       receiving weights altogether?

    Next: [07 · Controller](?file=07_controller.py).
    """)
    return


if __name__ == "__main__":
    app.run()
