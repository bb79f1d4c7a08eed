"""Lesson 19 · System topology: which GPUs hold which role, and what each placement costs."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import dataclasses

    import marimo as mo

    return dataclasses, mo


@app.cell
def _(mo):
    mo.md(r"""
    # 19 · System topology: where the roles live

    ## From one process to a cluster

    Lessons 00–14 ran every role in one process on one CPU: the sampler, the verifier, the
    reference and the trainer took turns, and "weight sync" was the sampler reading the
    trainer's tensors in place. At scale the same six roles are spread over GPUs, and the first
    design decision of an RL system is **where each one lives**. There are two answers, and a
    variant of the second:

    * **Colocated** (verl's default, OpenRLHF's `--colocate_all_models`): every GPU holds a shard
      of the policy's training state *and* a rollout engine *and* its KV cache. The roles run in
      turn on the same devices; no GPU idles while another role works, and the sync is a copy in
      place. The price is memory: everything must fit on each GPU at once.
    * **Split** (disaggregated): some GPUs train, the others sample. Each pool holds only what its
      role needs, but in **lockstep** each pool waits while the other works, and every update
      must cross a link to reach the engines.
    * **Split, async**: the sampling pool runs a batch ahead with weights one update old, so the
      two pools overlap and the step becomes the longer of the two sides (lesson 22c draws the
      schedule; lesson 22a writes it as an equation).

    ## The key equation: idle GPU-seconds

    With $G_r$ rollout and $G_t$ trainer GPUs, a lockstep step of rollout time $\tau_r$ and
    trainer time $\tau_t$ (reference + update + sync) wastes

    $$
    \text{idle} = G_r\,\tau_t + G_t\,\tau_r \quad\text{GPU-seconds per step,}
    $$

    colocated wastes none of it (it pays in memory instead), and async wastes
    $G_r(\tau - \tau_r) + G_t(\tau - \tau_t)$ with $\tau = \max(\tau_r, \tau_t)$: only the faster
    side waits.

    The numbers below are the roofline model of `posttrain/systems/` (lesson 22) for a GRPO step
    of Qwen2.5-7B on one node of 8 H100s at half their FLOP/s and 70% of their bandwidth: 64
    prompts × 8 samples, 256-token prompts, responses of 1024 tokens on average with a
    reasoning model's long tail (log-normal, cv 1). Nothing here runs on a GPU; the point is the
    bookkeeping.
    """)
    return


@app.cell
def _(mo):
    placement = mo.ui.dictionary({
        "placement": mo.ui.dropdown(options=["colocated", "split, lockstep", "split, async"], value="split, async",
                                    label="placement"),
        "trainer_gpus": mo.ui.slider(start=1, stop=7, step=1, value=4, label="split: GPUs that train (the rest sample)",
                                     show_value=True),
        "link": mo.ui.dropdown(options=["NVLink, 450 GB/s", "InfiniBand, 50 GB/s", "25 Gb Ethernet, 3.1 GB/s"],
                               value="NVLink, 450 GB/s", label="split: the link the weights cross"),
    })
    placement.vstack()
    return (placement,)


@app.cell
def _(dataclasses, placement):
    from posttrain.systems.gantt import simulate
    from posttrain.systems.hardware import GB, device_named
    from posttrain.systems.kv_cache import paged_vs_contiguous
    from posttrain.systems.memory import MIXED_ADAMW
    from posttrain.systems.rl_memory import rl_memory
    from posttrain.systems.shapes import PRESETS, parameter_count
    from posttrain.systems.stragglers import expected_lengths
    from posttrain.systems.throughput import RoleTimes, Workload, roofline_role_times, step_seconds

    GPUS = 8
    SHAPE = PRESETS["qwen2.5-7b"]
    N = parameter_count(SHAPE)
    H100 = device_named("h100-80gb").derated(0.5, 0.7)
    W = Workload(prompts=64, samples_per_prompt=8, prompt_tokens=256, mean_response_tokens=1024.0, response_cv=1.0)
    LINKS = {"NVLink, 450 GB/s": 450e9, "InfiniBand, 50 GB/s": 50e9, "25 Gb Ethernet, 3.1 GB/s": 3.125e9}

    where = placement.value["placement"]
    colocated = where == "colocated"
    topology = {"colocated": "colocated", "split, lockstep": "sync", "split, async": "async"}[where]
    trainers = GPUS if colocated else placement.value["trainer_gpus"]
    samplers = GPUS if colocated else GPUS - trainers
    device = dataclasses.replace(H100, link_bytes_per_second=LINKS[placement.value["link"]])

    # times: the rollout on the sampling GPUs, everything else on the training GPUs
    _rollout = roofline_role_times(SHAPE, device, W, samplers, colocated=colocated)
    _trainer = roofline_role_times(SHAPE, device, W, trainers, colocated=colocated)
    times = RoleTimes(_rollout.rollout, _trainer.verifier, _trainer.reference, _trainer.train, _trainer.sync)
    step = step_seconds(times, topology)
    trainer_side = times.trainer_side
    if colocated:
        idle = 0.0
    else:
        idle = samplers * (step - times.rollout) + trainers * (step - trainer_side)

    # memory per GPU: the policy's ZeRO-3 shards and the reference on the trainers; the engine's
    # bf16 weights and its paged KV cache (every row at its final length) on the samplers
    _lengths = [W.prompt_tokens + L for L in expected_lengths(W.rows, W.mean_response_tokens, W.response_cv)]
    kv_per_gpu = paged_vs_contiguous(SHAPE, _lengths, max(_lengths), 16, W.kv_bytes).paged_bytes / samplers
    _copies = {c.role: c.bytes_per_gpu for c in rl_memory("grpo", N, MIXED_ADAMW, 3, trainers).copies}
    trainer_gb = (_copies["policy"] + _copies["reference"]) / GB
    sampler_gb = (_copies["rollout engine"] + kv_per_gpu) / GB
    per_gpu_gb = {"colocated": trainer_gb + sampler_gb} if colocated else {"trainer": trainer_gb, "sampler": sampler_gb}
    fits = all(gb <= 0.9 * H100.memory_bytes / GB for gb in per_gpu_gb.values())

    schedule = simulate(topology, [times.rollout] * 4, [trainer_side - times.sync] * 4, times.sync)
    return fits, idle, per_gpu_gb, samplers, schedule, step, times, trainers, where


@app.cell
def _(fits, idle, mo, per_gpu_gb, samplers, step, times, trainers, where):
    _mem = "".join(f"| {pool} | {gb:.1f} GB |\n" for pool, gb in per_gpu_gb.items())
    _t = "".join(f"| {role} | {s:.2f} s |\n" for role, s in times.as_dict().items())
    _gpus = "all 8 GPUs, in turn" if where == "colocated" else f"{trainers} train, {samplers} sample"
    mo.md(
        f"""
    ### {where}: {_gpus}

    | role | seconds per step |
    |:---|---:|
    {_t}
    **Step: {step:.1f} s**, idle **{idle:.0f} GPU-seconds** per step
    ({idle / (8 * step):.0%} of the node's time).

    | memory per GPU | |
    |:---|---:|
    {_mem}
    {"Fits in 90% of an 80 GB H100." if fits else "**Does not fit** in 90% of an 80 GB H100: this placement cannot run."}

    Four steps of the schedule, drawn below: a gap in a lane is its GPUs waiting.
    """
    )
    return


@app.cell
def _(idle, samplers, schedule, step, trainers, where):
    from posttrain.teach.charts import PALETTE, figure, finish

    # The simulated schedule, one lane per role: the bars are busy GPUs, the gaps idle ones
    _pools = ("all 8 GPUs", "all 8 GPUs") if where == "colocated" else (f"{samplers} GPUs", f"{trainers} GPUs")
    _lanes = {"rollout": f"rollout\n({_pools[0]})", "train": f"ref + update\n({_pools[1]})",
              "sync": f"weight sync\n({_pools[1]})"}
    _fig, _ax = figure()
    for _i, _lane in enumerate(_lanes):
        _bars = [b for b in schedule.bars if b.lane == _lane]
        _ax.barh([len(_lanes) - 1 - _i] * len(_bars), [b.end - b.start for b in _bars], left=[b.start for b in _bars],
                 height=0.7, color=PALETTE[_i], edgecolor="white")
        for _b in _bars:  # the step each bar belongs to
            if _b.end - _b.start > 0.04 * schedule.makespan:
                _ax.text((_b.start + _b.end) / 2, len(_lanes) - 1 - _i, str(_b.step + 1), ha="center", va="center",
                         fontsize=8, color="white")
    _ax.set_yticks(range(len(_lanes)), list(_lanes.values())[::-1], fontsize=8)
    _ax.grid(False, axis="y")
    chart = finish(_fig, _ax, "seconds (numbers: the step a bar belongs to)", "role (GPUs)",
                   title=f"{where}: {step:.1f} s a step, {idle:.0f} GPU-seconds idle a step", legend=False)
    chart
    return (chart,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **Split, lockstep.** The 4 sampling GPUs wait through the reference pass, the update and
      the sync, the 4 training GPUs through the whole rollout: with equal pools that is exactly
      half the node's time (300 GPU-seconds a step), and the step (75 s) is longer than
      colocated's (65 s). This is why the first RL systems at scale colocated.
    * **Split, async** (the default) keeps the step at the rollout's 59 s, faster than colocated,
      but the 4 trainers still wait 43 s of every 59: async overlaps the pools, it does not
      balance them.
    * **Split, async, 1 GPU trains.** The step moves little (63 s) but the trainer's memory
      does: ZeRO-3 spreads the policy's 16 bytes a parameter over 1 GPU instead of 4, and with
      the reference that is 137 GB on an 80 GB device. A placement is first a memory question.
    * **Split, async, 7 GPUs train.** One engine now samples all 512 rows: the rollout slows to
      72 s and three quarters of the node waits for it.
    * **Split, lockstep, 25 Gb Ethernet.** Sending 7.6 B bf16 weights at 3.1 GB/s costs 12 s
      per step, on the critical path (87 s a step). Switch to async and the same 12 s hide
      behind the rollout — for as long as the trainer side stays shorter than it.
    * Surprise: the rollout takes about as long on 4 engines as on 8 (59 s against 57 s),
      because it is set by the longest response (lesson 22b), not by the rows per engine. That is
      why splitting the node costs so little sampling time here.

    ## Source files used here

    * `posttrain/systems/throughput.py` — `roofline_role_times` (the five terms), `step_seconds`
    * `posttrain/systems/rl_memory.py` — `rl_memory`: the copies an RL job keeps per GPU
    * `posttrain/systems/kv_cache.py` — `paged_vs_contiguous`: the engine's cache
    * `posttrain/systems/gantt.py` — `simulate` (the schedule drawn above), and `weight_sync` (the sync's four parts)
    * `posttrain/systems/hardware.py` — `device_named`, `Device.derated`: the H100's ceilings
    * `posttrain/roles/controller.py` — our own controller, which runs the roles colocated,
      lockstep or async (`--dist.topology`)

    ## Exercises

    1. Colocated holds the engine's weights and the training shards on every GPU. At which model
       size does colocated stop fitting on 8 H100s while split (4 + 4) still does? Try
       `posttrain systems --model llama-3-70b --gpus 8` and read which copy dominates.
    2. In split async the sync can hide behind the rollout. Write the condition on
       $\tau_{\text{sync}}$ under which it stops hiding, in terms of the other four terms.
    3. Code: `exercises/19_weight_sync.py` asks for the sync's four parts (all-gather, cast,
       broadcast, reshard); run `posttrain check 19`.

    **Next:** [lesson 20 · the KV cache and PagedAttention](?file=20_kv_cache.py) — the memory the
    sampling GPUs spend on the tokens in flight.
    """)
    return


if __name__ == "__main__":
    app.run()
