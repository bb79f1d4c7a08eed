"""Lesson 22a · The throughput equation: an RL step's five terms, and how the topology composes them."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import marimo as mo

    return (mo,)


@app.cell
def _(mo):
    mo.md(r"""
    # 22a · The throughput equation

    ## Five terms

    Every RL step, in every framework, spends its time in five places: the **rollout** (prefill
    and decode on the sampler), the **verifier** (scoring: a regex, a unit-test sandbox, a reward
    model), the **reference** (a forward pass of the frozen model for the KL term), the **train**
    pass (forward, backward, optimizer) and the weight **sync**. Our controller logs each as
    `time/*` in `metrics.jsonl`; `posttrain systems --run` reads them back. How they add up
    depends on the topology (lesson 19):

    $$
    \tau_{\text{step}} = \tau_{\text{rollout}} + \tau_{\text{verifier}} + \tau_{\text{ref}} + \tau_{\text{train}} + \tau_{\text{sync}}
    \quad\text{(colocated, or split in lockstep)}
    $$
    $$
    \tau_{\text{step}} = \max\big(\tau_{\text{rollout}},\ \tau_{\text{verifier}} + \tau_{\text{ref}} + \tau_{\text{train}} + \tau_{\text{sync}}\big)
    \quad\text{(async, one step ahead)}
    $$

    Under a sum every term counts, in proportion to its size (Amdahl). Under a max only the side
    that binds counts; shortening the other side buys nothing until it becomes the longer one.

    ## Why the rollout is usually the big term

    Decoding a token costs $2N$ FLOPs, training on it $6N$ — yet the rollout dominates, because
    decode runs at a few percent of the GPU's FLOP/s (memory-bound, lesson 22) and waits on the
    longest response of the batch (lesson 22b), while the update pushes every token through each
    weight read at once. The terms below are the rooflines of `posttrain/systems/throughput.py`
    for a GRPO step of Qwen2.5-7B on 8 H100s at half their FLOP/s and 70% of their bandwidth:
    64 prompts × 8 samples, 256-token prompts, responses log-normal with cv 1.
    """)
    return


@app.cell
def _(mo):
    knobs = mo.ui.dictionary({
        "topology": mo.ui.dropdown(options=["colocated", "sync", "async"], value="colocated", label="topology"),
        "mean": mo.ui.slider(start=128, stop=4096, step=128, value=1024, label="mean response (tokens)",
                             show_value=True),
        "verifier": mo.ui.dropdown(options=["regex, 0 s", "sandboxed tests, 0.1 s", "sandboxed tests, 2 s"],
                                   value="regex, 0 s", label="verifier, per sample on 8 CPU workers"),
    })
    knobs.vstack()
    return (knobs,)


@app.cell
def _(knobs):
    from posttrain.systems.hardware import device_named
    from posttrain.systems.shapes import PRESETS
    from posttrain.systems.throughput import (Workload, bottleneck, decode_flops_share, roofline_role_times,
                                              step_seconds, trained_tokens)

    SHAPE = PRESETS["qwen2.5-7b"]
    H100 = device_named("h100-80gb").derated(0.5, 0.7)
    VERIFIER = {"regex, 0 s": 0.0, "sandboxed tests, 0.1 s": 0.1, "sandboxed tests, 2 s": 2.0}

    topology = knobs.value["topology"]
    w = Workload(prompts=64, samples_per_prompt=8, prompt_tokens=256, mean_response_tokens=float(knobs.value["mean"]),
                 response_cv=1.0, verifier_seconds_per_sample=VERIFIER[knobs.value["verifier"]], verifier_workers=8)
    times = roofline_role_times(SHAPE, H100, w, gpus=8, colocated=topology == "colocated")
    step = step_seconds(times, topology)
    binding = bottleneck(times, topology)
    decode_share = decode_flops_share(SHAPE, w)
    rollout_share = times.rollout / sum(times.as_dict().values())
    tokens_per_second = trained_tokens(w) / step
    return binding, decode_share, rollout_share, step, times, tokens_per_second, topology


@app.cell
def _(binding, decode_share, mo, rollout_share, step, times, tokens_per_second, topology):
    _rows = "".join(f"| {'**' + r + '**' if r == binding else r} | {s:.2f} s | {s / step:.0%} |\n"
                    for r, s in times.as_dict().items())
    _side = (f"max(rollout {times.rollout:.1f} s, trainer side {times.trainer_side:.1f} s)" if topology == "async"
             else "the sum of the five")
    mo.md(
        f"""
    ### {topology}: τ_step = {_side} = **{step:.1f} s**

    | term | seconds | of the step |
    |:---|---:|---:|
    {_rows}
    The bottleneck — the term whose speed-up shortens the step most — is **{binding}**.
    The rollout is {rollout_share:.0%} of the five terms' time but only {decode_share:.0%} of the step's FLOPs.
    Throughput: {tokens_per_second:,.0f} trained tokens a second.
    """
    )
    return


@app.cell
def _(binding, step, times, topology):
    from posttrain.teach.charts import PALETTE, REFERENCE, figure, finish

    # One step laid out in time: the five terms one after another (colocated, sync), or the
    # trainer side beside the next rollout (async). Where the step ends is the equation's answer.
    _terms = times.as_dict()  # rollout, verifier, reference, train, sync (seconds)
    _trainer_starts = 0.0 if topology == "async" else _terms["rollout"]
    _fig, _ax = figure()
    _ax.barh([1], [_terms["rollout"]], left=[0.0], height=0.6, color=PALETTE[0], label="rollout")
    _left = _trainer_starts
    for _i, _role in enumerate(("verifier", "reference", "train", "sync"), start=1):
        _ax.barh([0], [_terms[_role]], left=[_left], height=0.6, color=PALETTE[_i], label=_role)
        _left += _terms[_role]
    _ax.axvline(step, color=REFERENCE, linestyle=":", linewidth=1.5, label=f"τ_step = {step:.1f} s")
    _ax.set_yticks([1, 0], ["rollout", "trainer side"])
    _ax.set_ylim(-0.5, 2.4)  # room above the lanes for the legend
    _ax.grid(False, axis="y")
    _ax.legend(ncol=6, loc="upper left", fontsize=8, frameon=False)
    chart = finish(_fig, _ax, "seconds into the step", "lane", legend=False,
                   title=f"{topology}: the step is {'the longer lane' if topology == 'async' else 'the sum'}; "
                         f"{binding} binds")
    chart
    return (chart,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **Colocated, the defaults.** The rollout is 88% of the step while doing a fifth of the
      FLOPs: making the update twice as fast saves 3 s of 65.
    * **Async.** The step becomes the rollout alone, 57 s: the trainer side (8 s) hides
      completely. Now a faster update saves *nothing*; only the rollout matters.
    * **Async with sandboxed tests at 2 s a sample.** 512 samples on 8 workers are 128 s of
      scoring: the trainer side binds, the step is 136 s, and now a faster rollout saves
      nothing. Which side of the max binds decides where engineering pays (lesson 28).
    * **Mean response 128 tokens.** The step falls eightfold (8.2 s colocated), yet the rollout
      is still 84% of it: shorter responses shrink every token-proportional term together, and
      the longest response of the batch still sets the rollout.
    * What this equation cannot see: staleness (async trains on batches sampled by weights one
      update old; lesson 22c) and the memory that decides whether the topology runs at all
      (lessons 19, 22).

    ## Source files used here

    * `posttrain/systems/throughput.py` — `RoleTimes`, `step_seconds`, `bottleneck`,
      `roofline_role_times`, `decode_flops_share`, `role_times_from_metrics`
    * `posttrain/roles/controller.py` — the controller that logs the five terms as `time/*`
    * `posttrain/systems/wallclock.py` — `where_time_goes`: the same equation on a real run
    * `tests/test_systems_measured.py` — time/step against the logged terms composed by topology,
      on this machine (colocated, sync, async)

    ## Exercises

    1. Run a few steps of your own (`posttrain train --algo grpo --rl.steps 3`, which writes
       `runs/<id>/metrics.jsonl`), read the `time/*` terms and check that `time/step` is close to
       their sum (the rest is logging and bookkeeping). Then run `posttrain systems --run runs/<id>`.
    2. Under async with the 2 s verifier, how many verifier workers make the rollout bind again?
    3. Code: `exercises/22a_step_time.py` asks for τ_step and the bottleneck; run
       `posttrain check 22a`.

    **Next:** [lesson 22b · long-tail rollouts](?file=22b_long_tail_rollouts.py) — why the
    rollout's time is set by its longest response.
    """)
    return


if __name__ == "__main__":
    app.run()
