"""Lesson 22c · Async pipelining and weight sync: from a sum of terms to a max, and what it costs."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import random

    import marimo as mo

    return mo, random


@app.cell
def _(mo):
    mo.md(r"""
    # 22c · Async pipelining and weight sync

    ## From a sum to a max

    In a synchronous step the roles take turns (lesson 22a):

    $$
    \tau_{\text{step}} = \tau_{\text{rollout}} + \tau_{\text{verifier}} + \tau_{\text{ref}} + \tau_{\text{train}} + \tau_{\text{sync}} .
    $$

    While the engines sample, the trainer's GPUs idle; while the trainer updates, the
    engines idle. Put the two on separate devices and let the engines sample batch $s+1$
    while the trainer trains on batch $s$, and the step becomes the longer of the two lanes:

    $$
    \tau_{\text{step}} \to \max\big(\tau_{\text{rollout}},\; \tau_{\text{verifier}} + \tau_{\text{ref}} + \tau_{\text{train}} + \tau_{\text{sync}}\big).
    $$

    The price is **staleness**. Batch $s+1$ was sampled by the weights of version $s$ (or
    older), but it is trained at version $s+1$: the data is off-policy by one update (by up
    to $k$ when the engines may run $k$ batches ahead).

    ## Versioned weights and the IS correction

    Every batch carries the version that sampled it (`Episode.weight_version`), so staleness
    $= v_{\text{trainer}} - v_{\text{episode}}$ is a number the trainer checks and logs. Three
    policies meet in the update: $\pi_{\text{behaviour}}$ sampled the batch (its `old_logp`),
    $\pi_{\text{old}}$ is the trainer's weights before this update, $\pi_\theta$ is being
    optimised. PPO's clip keeps $\pi_\theta / \pi_{\text{old}}$ in its trust region; a
    truncated importance weight corrects for the batch having come from the wrong policy:

    $$
    w_t = \min\!\Big(\frac{\pi_{\text{old}}(y_t)}{\pi_{\text{behaviour}}(y_t)},\; C\Big) \quad\text{multiplies } A_t .
    $$

    The cap $C$ trades a little bias for bounded variance. The further behind the sampler,
    the wider the weights spread and the less each batch teaches: lesson 06 measured the
    drift one to seven updates behind on a real run.

    ## The freshness wall

    Running further ahead pays only until the slower lane is busy all the time. Past that,
    a larger $k$ buys staleness and nothing else: the **freshness wall**. With steady times
    $k = 1$ already reaches it; when rollout times jump around (the long tail of lesson 22b),
    a second batch in flight smooths the jumps. Which lane binds decides what happens past
    the wall: if the *trainer* is the slower lane, the engines race ahead until the limit
    stops them, and staleness climbs to $k$ for no speed at all.

    The panel drives `posttrain/systems/gantt.py`'s schedule simulator over 12 steps:
    rollouts of 6 s on average (log-normal around it, spread set below), an update of the
    seconds you choose, and a 0.5 s weight sync.
    """)
    return


@app.cell
def _(mo):
    controls = mo.ui.dictionary({
        "topology": mo.ui.dropdown(options=["colocated", "sync", "async"], value="async", label="topology"),
        "k": mo.ui.slider(start=1, stop=6, step=1, value=1, label="async: batches sampled ahead, k (max staleness)",
                          show_value=True),
        "cv": mo.ui.slider(start=0.0, stop=1.5, step=0.1, value=0.5, label="spread of the rollout times, cv",
                           show_value=True),
        "train": mo.ui.slider(start=1.0, stop=10.0, step=0.5, value=3.0, label="seconds per update", show_value=True),
    })
    controls.vstack()  # the panel's controls, one per line (their values stay in `controls`)
    return (controls,)


@app.cell
def _(controls, random):
    from posttrain.systems.gantt import freshness_wall, simulate
    from posttrain.systems.stragglers import lognormal_params
    from posttrain.systems.throughput import RoleTimes, step_seconds

    STEPS, ROLLOUT_MEAN, SYNC = 12, 6.0, 0.5
    topology, k = controls.value["topology"], controls.value["k"]
    _mu, _sigma = lognormal_params(ROLLOUT_MEAN, controls.value["cv"])
    _draw = random.Random(0)  # the same 12 rollout times for every topology, so the charts compare
    rollout_seconds = [_draw.lognormvariate(_mu, _sigma) for _ in range(STEPS)]
    train_seconds = [controls.value["train"]] * STEPS
    chart = simulate(topology, rollout_seconds, train_seconds, SYNC, k)
    lockstep = simulate("sync", rollout_seconds, train_seconds, SYNC)  # the same work, taking turns
    wall = freshness_wall(rollout_seconds, train_seconds, SYNC, range(0, 7))
    # the throughput equation with the mean rollout: the sum, and async's max
    mean_times = RoleTimes(rollout=sum(rollout_seconds) / STEPS, train=controls.value["train"], sync=SYNC)
    predicted = step_seconds(mean_times, topology, k)
    return STEPS, chart, k, lockstep, predicted, rollout_seconds, topology, wall


@app.cell
def _(chart):
    import matplotlib.pyplot as plt

    _lanes = ["rollout", "train", "sync"]
    _colors = plt.get_cmap("tab20").colors
    _fig, _ax = plt.subplots(figsize=(8, 2.4))
    for _bar in chart.bars:
        _y = 2 - _lanes.index(_bar.lane)
        _ax.broken_barh([(_bar.start, _bar.end - _bar.start)], (_y - 0.4, 0.8), color=_colors[_bar.step % 20],
                        edgecolor="white")
        if _bar.lane == "rollout":  # which weights sampled this batch
            _ax.text((_bar.start + _bar.end) / 2, _y, f"v{_bar.weight_version}", ha="center", va="center", fontsize=7)
        elif _bar.lane == "train":
            _ax.text((_bar.start + _bar.end) / 2, _y, str(_bar.step), ha="center", va="center", fontsize=7)
    _ax.set_yticks([2, 1, 0], _lanes)
    _ax.set_xlabel("seconds (rollout bars: the weight version that sampled the batch; train bars: the step)")
    _ax.set_title(f"{chart.topology}: {chart.makespan:.1f} s for {len(chart.staleness)} steps", fontsize=9)
    _fig.tight_layout()
    _fig
    return


@app.cell
def _(STEPS, chart, k, lockstep, mo, predicted, rollout_seconds, topology, wall):
    _wall_rows = "".join(f"| {kk if kk else '0 (sync)'} | {per_step:.2f} | {stale:.2f} |\n" for kk, per_step, stale in wall)
    _ahead = f", k = {k}" if topology == "async" else ""
    mo.md(
        f"""
    ### {topology}{_ahead}: {chart.makespan / STEPS:.2f} s a step over {STEPS} steps

    Taking turns ("sync", the same work on the same devices) would take {lockstep.makespan / STEPS:.2f} s
    a step: **{lockstep.makespan / chart.makespan:.2f}×** the time. The rollout lane is busy
    {chart.busy_fraction("rollout"):.0%} of the time and the train lane {chart.busy_fraction("train"):.0%}.
    The throughput equation with the mean rollout ({sum(rollout_seconds) / STEPS:.2f} s) predicts {predicted:.2f} s
    a step; the simulation's first steps fill the pipeline, and slow rollouts cannot be averaged
    away by a lane that has to wait for them.

    Staleness of each batch (updates between the weights that sampled it and the ones that
    train on it): `{chart.staleness}` — mean {sum(chart.staleness) / STEPS:.2f}, max {max(chart.staleness)}.

    **The freshness wall** for these times: seconds a step and mean staleness against k.

    | k | seconds a step | mean staleness |
    |---:|---:|---:|
    {_wall_rows}
    """
    )
    return


@app.cell
def _():
    from posttrain.systems.gantt import pipeline_bubble, weight_sync
    from posttrain.systems.hardware import DEVICES
    from posttrain.systems.memory import lora_parameter_count
    from posttrain.systems.shapes import PRESETS, parameter_count

    # Llama-3-8B trained on 8 H100s (ZeRO-3), weights sent to engines on other H100s
    _shape, _h100 = PRESETS["llama-3-8b"], DEVICES["h100-80gb"]
    _nvlink = dict(link_bytes_per_second=_h100.link_bytes_per_second, memory_bytes_per_second=_h100.bytes_per_second)
    _p = parameter_count(_shape)
    # a baseline and four ways to shrink a sync, each on top of the ones before it (async is the fifth)
    sync_steps = [
        ("fp32 shards gathered, fp32 weights broadcast over NVLink",
         weight_sync(_p, train_gpus=8, master_bytes=4, engine_bytes=4, **_nvlink)),
        ("cast to bf16 before the broadcast", weight_sync(_p, train_gpus=8, master_bytes=4, engine_bytes=2, **_nvlink)),
        ("gather the bf16 working copy instead: nothing to cast",
         weight_sync(_p, train_gpus=8, master_bytes=2, engine_bytes=2, **_nvlink)),
        ("engines on the trainer's GPUs: no broadcast (CUDA IPC)",
         weight_sync(_p, train_gpus=8, master_bytes=2, engine_bytes=2, colocated=True, **_nvlink)),
        ("LoRA rank 16: sync the adapters only",
         weight_sync(lora_parameter_count(_shape, 16), train_gpus=8, master_bytes=2, engine_bytes=2, colocated=True,
                     **_nvlink)),
    ]
    across_nodes = weight_sync(_p, train_gpus=8, master_bytes=4, engine_bytes=4, link_bytes_per_second=50e9,
                               memory_bytes_per_second=_h100.bytes_per_second)  # 400 Gb/s InfiniBand
    bubbles = {m: pipeline_bubble(4, m) for m in (1, 4, 16, 64)}
    return across_nodes, bubbles, sync_steps


@app.cell
def _(across_nodes, bubbles, mo, sync_steps):
    _sync_rows = "".join(
        f"| {i}. {name} | {s.all_gather * 1e3:.1f} | {s.cast * 1e3:.1f} | {s.broadcast * 1e3:.1f} | "
        f"{s.reshard * 1e3:.2f} | **{s.total * 1e3:.1f}** |\n"
        for i, (name, s) in enumerate(sync_steps)
    )
    _bubble = " · ".join(f"m = {m}: {b:.0%}" for m, b in bubbles.items())
    mo.md(
        rf"""
    ## The four operations of a weight sync

    After each update the engines need the new weights. Under ZeRO-3 or FSDP no GPU holds
    them whole, so a sync is four operations (`gantt.weight_sync`, an α–β model: bytes over
    bandwidth):

    1. **all-gather** the trainer's shards into full tensors (a ring: each GPU receives $(n-1)/n$ of them);
    2. **cast** the fp32 master copy to the engine's dtype (read 4 bytes, write 2, per parameter);
    3. **broadcast** to the engines' devices (a pipelined broadcast moves the weights once, whatever the number of receivers);
    4. **reshard** into the engine's tensor-parallel layout (each engine GPU copies its slice into place).

    Llama-3-8B trained on 8 H100s, milliseconds per sync: row 0 is the plain sync, and each
    row after it adds one optimization to the ones above. The fifth is the async overlap
    above: the sync runs on the trainer's lane while the engines keep sampling, so it leaves
    the step entirely when the rollout binds.

    | | all-gather | cast | broadcast | reshard | total |
    |:---|---:|---:|---:|---:|---:|
    {_sync_rows}
    Over NVLink a whole 8B model moves in about a seventh of a second: against a rollout of a
    minute, sync is rarely the term to fight. It becomes one when the weights cross nodes
    (400 Gb/s InfiniBand: **{across_nodes.total:.2f} s** for row 0), go through Python objects
    instead of NCCL (our Ray workers pickle them through Ray's object store), or belong to a
    model ten times larger.

    ## Pipeline parallelism meets RL: bubbles

    A model too large for one GPU's memory can be cut into $p$ pipeline stages. A pass of
    $m$ micro-batches then takes $m + p - 1$ slots, and each stage idles $p - 1$ of them
    (`gantt.pipeline_bubble`, GPipe's formula). With $p = 4$: {_bubble}. The update has rows
    to spare and makes $m$ large; decoding does not. An engine pipelines decode by keeping
    $m \ge p$ groups of rows in flight, and once only the long tail's few stragglers are left
    (lesson 22b) there is one group, and three of the four stages idle on every token: one
    reason RL rollout engines split a model by tensor parallelism, and scale out with more
    engines, rather than by pipeline stages.
    """
    )
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **Seconds per update = 8, k = 4.** Now the trainer is the slower lane. Async still pays
      (the rollouts hide under the updates), but the batches ahead beyond the first buy
      almost nothing: the freshness wall table's seconds a step go from 9.07 at k = 1 to 8.91
      at k = 2 and stay there, while the mean staleness climbs from 0.92 to 2.58 at k = 4 and
      the last batches are four updates old. Each of them is trained with importance weights
      further from 1. Real systems cap this on purpose (`--dist.max_staleness` here, 1 by
      default; AReaL's `max_head_offpolicyness`).
    * **Topology "colocated" or "sync".** The chart becomes one bar after another: the sum, not
      the max (8.64 s a step at the defaults, against async's 5.68).
    * **cv = 0.** Steady rollouts: k = 1 reaches the wall exactly, and k = 2, 3, ... give the
      same 6.29 s a step. With a spread (cv = 1.5) a second batch in flight gains a little
      (5.10 → 4.98 s, 2 %) for staleness 1.6 instead of 0.9: the wall moves out a step, not far.

    ## Source files used here

    * `posttrain/systems/gantt.py` — `simulate`, `freshness_wall`, `weight_sync`, `pipeline_bubble`
    * `posttrain/systems/throughput.py` — `step_seconds`: the sum and the max
    * `posttrain/distributed/async_rollout.py` — our async topology: workers sample up to
      `max_staleness` batches ahead, pushes never wait
    * `posttrain/roles/off_policy.py` — `staleness_stats` (the check), `truncated_is_weights`;
      `posttrain/roles/mismatch.py` — `MismatchCorrection` (the correction, stale or not)
    * `posttrain/roles/weight_sync.py` — the in-process sync and its version counter
    * `tests/test_systems_measured.py` — the simulator against a real async Ray run on this machine

    ## Exercises

    1. With rollouts of 6 s and a 0.5 s sync, from how many seconds per update on is the
       trainer the slower lane? Predict it from the max, then find it with the panel at cv = 0
       (watch the two lanes' busy fractions).
    2. Our async topology never makes a push wait for the workers (`async_rollout.py`). What
       would a waiting push do to the chart's sync lane, and to staleness?
    3. Code: `exercises/22c_gantt.py` asks for the schedule's step end times (sync and async);
       run `posttrain check 22c`.

    Previous: [22b · Long-tail rollouts](?file=22b_long_tail_rollouts.py). Next:
    [23 · Famous recipes and failure modes](?file=23_recipes_and_failure_modes.py).
    """)
    return


if __name__ == "__main__":
    app.run()
