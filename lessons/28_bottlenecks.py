"""Lesson 28 · Bottlenecks, optimizations, and how to find them: the playbook, on real runs."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import copy
    import dataclasses
    import json

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return copy, dataclasses, json, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 28 · Bottlenecks, optimizations, and how to find them

    ## Where the wall-clock goes

    On GPUs, published RL systems report the same split again and again: the rollout takes
    most of the step (60–80 %), the update 10–25 %, and the reference, the verifier and the
    weight sync share what is left. Lesson 22a wrote the step as five terms, 22b and 22c took
    the rollout and the sync apart, and 25 ranked the kernels. This lesson is the procedure
    you run on a *real* run to decide what to change first.

    ## The playbook, in six steps

    1. **Wall-clock attribution.** Average each role's logged time (`time/*` in
       `metrics.jsonl`) and walk a decision tree: is the time in the roles at all, which term
       binds, why is it large, what would the topology buy (`posttrain/systems/wallclock.py`,
       `posttrain systems --run`).
    2. **Is the device busy?** `nvidia-smi` on a GPU: a rollout at 30 % utilisation waits on
       something else. Here: compare a worker's own sampling time with the controller's wait.
    3. **Profile the binding role** (`torch.profiler`): which operations take its time.
    4. **Memory peak**: what limits the batch, and so the throughput of decode.
    5. **Kernel timeline** (Nsight Systems on a GPU): gaps between kernels, launches, syncs.
    6. **The ρ-histogram**: once it is fast, is it still right? Every token's ratio π_θ/π_old
       against the clip range, and the importance weights at the start of each step, show
       stale or mismatched data.

    ## The per-role optimization menu

    | role | levers (each from a lesson) |
    |:---|:---|
    | rollout | continuous batching, prefix caching, paged KV (21, 25); a length cap, packing, dynamic K (22b); speculative decoding; low-precision weights with the mismatch corrected (22b, 25); async overlap (22c) |
    | reference | share each group's prompt (`rl.update.share_prompt`); drop it when β = 0 and nothing logs the KL; compute ref log-probs in the engine |
    | train | leave out rows with no gradient (`rl.update.skip_inert_rows`); share the prompt; fewer epochs; LoRA (less optimizer work, not fewer FLOPs) |
    | verifier | score in parallel processes, or while the next batch samples; bound its tail with timeouts |
    | sync | colocate (read in place), send bf16, send LoRA adapters only, NCCL instead of an object store (22c) |

    ## The widget: an optimization-budget allocator

    You can afford a few optimizations. Which, in which order? The allocator
    (`throughput.allocate_levers`) spends the budget one lever at a time, each time on the one
    that saves the most seconds **of the step as the previous levers left it**: after a big
    rollout win, the next rollout lever is worth less (Amdahl), and once the step is async's
    max, a lever on the side that does not bind is worth nothing. It spends only the levers a
    run has not already pulled (`wallclock.open_levers` reads its `config.json`).

    Three steps to choose from: two real run directories made on this machine (make run's
    gpt_mini, 12 GRPO steps of 32 prompts × 8; colocated, and async with 2 Ray workers;
    `lessons/data/28_runs/README.md` has the commands), and Llama-3-8B GRPO on 8 H100s as
    `posttrain systems` plans it. The panel's last slider belongs to step 6 further down: the
    learning rate of the one update whose per-token ratios the ρ-histogram draws.
    """)
    return


@app.cell
def _(mo):
    STEPS = {
        "our colocated run (measured)": "colocated",
        "our async run, 2 Ray workers (measured)": "async",
        "Llama-3-8B GRPO on 8 H100s (planned)": "plan",
    }
    controls = mo.ui.dictionary({
        "step": mo.ui.dropdown(options=STEPS, value="our colocated run (measured)", label="whose step"),
        "budget": mo.ui.slider(start=0, stop=6, step=1, value=3, label="optimizations you can afford",
                               show_value=True),
        # step 6's knob: how far one update moves the policy away from the one that sampled
        "log_lr": mo.ui.slider(start=-5.0, stop=-2.0, step=0.5, value=-4.0,
                               label="step 6: learning rate of the update η = 10^x, x =", show_value=True),
    })
    controls.vstack()  # the panel's controls, one per line (their values stay in `controls`)
    return STEPS, controls


@app.cell
def _(json):
    from posttrain.config.files import upgraded
    from posttrain.runs.rundir import read_jsonl
    from posttrain.teach.lessons import LESSONS_DIR

    RUNS = LESSONS_DIR / "data" / "28_runs"  # the repository's lessons/, wherever this notebook runs from
    # upgraded: these runs were written before settings moved into sections (rl.update.share_prompt, ...)
    runs = {name: (upgraded(json.loads((RUNS / name / "config.json").read_text(encoding="utf-8"))),
                   read_jsonl(RUNS / name / "metrics.jsonl")) for name in ("colocated", "async")}
    return (runs,)


@app.cell
def _(controls, dataclasses, runs):
    from posttrain.systems.hardware import DEVICES, Cluster
    from posttrain.systems.plan import JobSettings, plan
    from posttrain.systems.shapes import PRESETS
    from posttrain.systems.throughput import DEFAULT_LEVERS, Workload, allocate_levers, rank_levers, step_seconds
    from posttrain.systems.wallclock import open_levers, render, where_time_goes

    source, budget = controls.value["step"], controls.value["budget"]
    if source == "plan":
        _planned = plan(PRESETS["llama-3-8b"], Cluster(DEVICES["h100-80gb"], 8), JobSettings(),
                        Workload(prompts=64, samples_per_prompt=8, prompt_tokens=512, mean_response_tokens=1024))
        clock = None
        times, topology = _planned.times, "colocated"
        levers = [g.lever for g in _planned.levers]  # DEFAULT_LEVERS with the length cap priced for this workload
    else:
        _config, _rows = runs[source]
        clock = where_time_goes([r for r in _rows if r.get("stage") == "rl"])
        topology = clock.topology
        # under async the step is the longer of the workers' own sampling and the trainer side
        times = dataclasses.replace(clock.roles, rollout=clock.rollout_compute_seconds) if topology == "async" \
            else clock.roles
        levers = open_levers(_config, _rows, DEFAULT_LEVERS)
    chosen = allocate_levers(times, topology, levers, budget)
    alone = rank_levers(times, topology, levers)
    before = step_seconds(times, topology)
    report = render(clock) if clock else ""
    return alone, before, budget, chosen, clock, report, source, times, topology


@app.cell
def _(STEPS, alone, before, budget, chosen, mo, report, source, times, topology):
    _terms = " · ".join(f"{role} {s:.2f} s" for role, s in times.as_dict().items())
    _after = chosen[-1].after_seconds if chosen else before
    from posttrain.teach.tables import markdown_table as _markdown_table

    _spent = _markdown_table(
        ["#", "lever", "step (s)", "saved (s)", "speed-up so far", "why this factor"],
        [[str(i + 1), g.lever.name, f"{g.before_seconds:.2f} → {g.after_seconds:.2f}", f"{g.saved_seconds:.2f}",
          f"{before / g.after_seconds:.2f}×", g.lever.note] for i, g in enumerate(chosen)], align="rlrrrl")
    _alone = _markdown_table(["lever", "saved alone (s)"], [[g.lever.name, f"{g.saved_seconds:.2f}"] for g in alone])
    _step1 = (f"**Step 1, wall-clock attribution** (`wallclock.where_time_goes` on its `metrics.jsonl`):\n\n{report}"
              if report else "**Step 1** for a planned job is the plan itself: the five terms at the devices' "
                             "derated ceilings (`posttrain systems`).")
    mo.md(
        f"""
    ### {next(label for label, key in STEPS.items() if key == source)}: {topology}, {before:.2f} s a step by the throughput equation

    {_step1}

    The terms the allocator reads: {_terms}.

    #### A budget of {budget}: spent one lever at a time

    {_spent}
    **{before:.2f} → {_after:.2f} s a step, {before / _after:.2f}×.** Each lever *alone*, on the step as it
    is now (what a one-at-a-time ranking would tell you):

    {_alone}
    """
    )
    return


@app.cell
def _(before, chosen):
    from posttrain.teach import charts as _charts  # several chart cells: a cell-private name in each

    _labels = ["as it is"] + [g.lever.name for g in chosen]
    _values = [before] + [g.after_seconds for g in chosen]
    levers_fig, _ax = _charts.figure(height=0.9 + 0.3 * len(_values))
    _charts.hbars(_ax, _labels, _values)
    _charts.finish(levers_fig, _ax, "seconds a step, after each lever on top of the ones above (s)", "",
           title=f"A budget of {len(chosen)}: {before:.2f} → {_values[-1]:.2f} s a step", legend=False)
    levers_fig
    return (levers_fig,)


@app.cell
def _(mo, runs, torch):
    from posttrain.config import SamplingParams
    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.roles.engines import make_engine
    from posttrain.teach.sampler_mismatch import make_run_policy

    # step 2: the workers' own sampling against the same sampling done in the trainer's process
    sampling = {name: sum(r.get("time/rollout_compute", r["time/rollout"]) for r in rows if "time/step" in r)
                / sum(1 for r in rows if "time/step" in r) for name, (_, rows) in runs.items()}
    # step 3: profile the binding role, our sampler, on make run's gpt_mini shape. The autograd
    # profiler records the same operator times as torch.profiler without starting its tracer
    # (measured here: 0.1 s of CPU against 3 s), and a lesson has 30 s
    with mo.status.spinner(title="Profiling one call of the sampler…"):
        _model, _tok = make_run_policy()
        _engine = make_engine(_model, _tok, SamplingParams(max_new_tokens=8))
        _prompts = ArithmeticEnv(level=3, cot=True).fixed_set("heldout", 2, seed=0)
        _engine.generate(_prompts, 2, generator=torch.Generator().manual_seed(0))  # warm-up: first-call allocations
        with torch.autograd.profiler.profile() as _prof:
            _engine.generate(_prompts, 2, generator=torch.Generator().manual_seed(0))
    _ops = sorted(_prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    _total = sum(e.self_cpu_time_total for e in _ops)
    profile_top = [(e.key, e.count, e.self_cpu_time_total / _total) for e in _ops[:6]]
    # step 6: the ratios and importance weights each step started from
    # every RL step's logged ratio statistics; the table shows the last four, the chart all of them
    ratio_steps = {name: [(r["step"], r["ratio_max"], r["clipfrac"], r.get("staleness_max", 0),
                           r.get("tis_weight_mean", 1.0), r.get("behaviour_kl", 0.0))
                          for r in rows if r.get("stage") == "rl"]
                   for name, (_, rows) in runs.items()}
    health = {name: steps[-4:] for name, steps in ratio_steps.items()}
    return health, profile_top, ratio_steps, sampling


@app.cell
def _(copy, dataclasses, mo, torch):
    from posttrain.algorithms import make_algorithm
    from posttrain.config import SamplingParams as _SamplingParams
    from posttrain.roles.engines import make_engine as _make_engine
    from posttrain.roles.environment import score_episodes
    from posttrain.teach.widgets import tiny_policy
    from posttrain.types import RolloutBatch

    # step 6, live: the runs above log only per-step summaries of ρ, so the histogram needs a
    # policy of its own. A tiny gpt_mini taught the answer format by 100 SFT steps answers
    # about a third of its samples right: groups with both rewards, so GRPO has a gradient
    RHO_PROMPTS, RHO_SAMPLES = 8, 8
    with mo.status.spinner(title=f"Step 6: teaching a tiny policy arithmetic (100 SFT steps) and sampling "
                                 f"{RHO_PROMPTS} prompts × {RHO_SAMPLES} answers, a few seconds…"):
        rho_policy, _tok, _env, _ = tiny_policy(sft_steps=100)
        _params = _SamplingParams(temperature=1.0, max_new_tokens=12, stop_at_newline=True)
        # the engine holds (and freezes) its own copy, as in a run: it records old_logp = log π_old
        _engine = _make_engine(copy.deepcopy(rho_policy), _tok, _params)
        _episodes = _engine.generate(_env.fixed_set("train", RHO_PROMPTS, seed=1), RHO_SAMPLES,
                                     generator=torch.Generator().manual_seed(0))
        rho_batch = RolloutBatch.collate(score_episodes(_env.score, _episodes), _tok.pad_id,
                                         temperature=_params.temperature)
        grpo = make_algorithm("grpo")  # ε = 0.2 either side, β = 0: the loss the controller would use
        rho_batch = dataclasses.replace(rho_batch, **grpo.compute_advantages(rho_batch))
    return RHO_PROMPTS, RHO_SAMPLES, grpo, rho_batch, rho_policy


@app.cell
def _(controls, copy, grpo, mo, rho_batch, rho_policy, torch):
    from posttrain.models.logprobs import response_logp
    from posttrain.roles.trainer import Trainer as _Trainer

    rho_lr = 10 ** controls.value["log_lr"]
    with mo.status.spinner(title=f"Step 6: one GRPO update at η = {rho_lr:.2g} on {rho_batch.batch_size} answers, "
                                 "then every token's ratio…"):
        _policy = copy.deepcopy(rho_policy).requires_grad_(True)  # every slider move starts from π_old
        rho_update = _Trainer(_policy, lr=rho_lr, total_steps=1).update(rho_batch, grpo)  # one controller step
        with torch.no_grad():
            _new_logp = response_logp(_policy, rho_batch)  # (B, T) log π_θ of the sampled tokens, after the step
    _on = rho_batch.response_mask.bool()  # (B, T)
    ratios = (_new_logp - rho_batch.old_logp)[_on].exp()  # (n response tokens,) ρ = π_θ / π_old
    clip_low, clip_high = 1 - grpo.clip_eps_low, 1 + grpo.clip_eps_high
    outside_clip = ((ratios < clip_low) | (ratios > clip_high)).float().mean().item()
    return clip_high, clip_low, outside_clip, ratios, rho_lr, rho_update


@app.cell
def _(RHO_PROMPTS, RHO_SAMPLES, mo, profile_top, ratios, rho_lr, rho_policy, sampling):
    from posttrain.teach.tables import markdown_table as _markdown_table

    _size = sum(p.numel() for p in rho_policy.parameters())

    _ops = _markdown_table(["operation", "calls", "share of the CPU time"],
                          [[f"`{key}`", str(count), f"{share:.0%}"] for key, count, share in profile_top])
    mo.md(
        rf"""
    ## The other five steps, on the same runs

    **Step 2, is the device busy?** Sampling took **{sampling["colocated"]:.1f} s a step** in the
    colocated run and **{sampling["async"]:.1f} s** on the async run's workers: the same batch size, the same
    starting model. On a GPU cluster the two sides of async are separate devices; on these 2 shared cores
    the workers and the trainer compete for the same cores, so sampling stretches to fill what
    the trainer leaves. `nvidia-smi` (or `top` here) answers the question the metrics cannot: is
    the hardware the overlap assumes actually there?

    **Step 3, profile the binding role.** PyTorch's operator profiler on one call of our sampler (make
    run's gpt_mini shape, 2 prompts × 2 answers × ≤ 8 tokens), the operations with the most
    CPU time of their own:

    {_ops}
    The matrix multiplies themselves (`aten::mm`) take a quarter or so; the rest is spread over
    hundreds of small operations per token (views, transposes, concatenations, elementwise): at
    this size a decode step is paid for in per-operation overhead, the $a$ of lesson 22b, which
    batching more rows amortises and compiling the decode step (`rl.sampling.compile`,
    [17% faster](../BENCHMARKS.md#generation-posttrains-sampler-vs-transformers-generate) on make run's batch) partly removes.

    **Step 4, the memory peak.** `posttrain systems` adds up the copies, activations and KV cache
    (lesson 24); on this machine the envelope of a SmolLM2 GRPO step came [within 5%](../docs/guides/scaling-out.md#the-formulas-against-this-machine) of
    its measured peak RSS (`tests/test_systems_measured.py`). The peak decides the largest decode
    batch, and so where decode stops being bandwidth-bound.

    **Step 5, the kernel timeline.** Nsight Systems shows gaps between GPU kernels (launch
    overhead, host syncs, a Python loop between steps). On a CPU, `prof.export_chrome_trace` of
    the profile above gives the same picture in a browser.

    **Step 6, the ρ-histogram.** Fast is worthless if the update is wrong. Every response token
    carries a ratio $\rho_t = \pi_\theta(y_t)/\pi_{{\text{{old}}}}(y_t)$, and the clip in GRPO's loss
    only trusts tokens with $\rho_t$ inside $[1-\epsilon, 1+\epsilon]$. The first minibatch of a
    colocated step sees $\rho = 1$ everywhere, since the weights are those that sampled; every
    later look at the same tokens (a second epoch or minibatch, or an async trainer one update
    ahead of its sampler) sees the policy after one or more updates. The histogram below is that
    look, computed now: a tiny policy ({_size:,} parameters, 100 SFT steps) samples
    {RHO_PROMPTS} prompts × {RHO_SAMPLES} answers with the library's engine, which records
    `old_logp`; `Trainer.update(batch, grpo)` takes **one step at η = {rho_lr:.2g}** (the panel's
    last slider); `models/logprobs.response_logp` recomputes the log-probs of the same
    {len(ratios)} response tokens; each bar counts tokens by $e^{{\log\pi_\theta - \texttt{{old\_logp}}}}$.
    """
    )
    return


@app.cell
def _(clip_high, clip_low, outside_clip, ratios, rho_lr):
    from posttrain.teach import charts as _charts  # several chart cells: a cell-private name in each

    # fixed bins, so the axes stay put as the slider moves; ρ past the last edge lands in the
    # last bar (clamped) rather than off the chart
    RHO_RANGE = (0.0, 2.5)
    rho_fig, _ax = _charts.figure()
    _ax.hist(ratios.clamp(*RHO_RANGE).tolist(), bins=50, range=RHO_RANGE, color=_charts.PALETTE[0])
    _charts.span(_ax, clip_low, clip_high, label=f"clip range [{clip_low:g}, {clip_high:g}]")
    _ax.set_yscale("log")  # the tails are the point: a handful of tokens next to hundreds at ρ ≈ 1
    _charts.finish(rho_fig, _ax, f"ratio ρ = π_θ / π_old of a response token (dimensionless; > {RHO_RANGE[1]:g} "
                                 "in the last bar)", "tokens (log scale)",
                   title=f"One GRPO step at η = {rho_lr:.2g}: {outside_clip:.1%} of {len(ratios)} tokens outside "
                         f"the clip range, largest ρ {ratios.max().item():.2f}")
    rho_fig
    return RHO_RANGE, rho_fig


@app.cell
def _(health, mo, outside_clip, ratios, rho_lr, rho_update):
    from posttrain.teach.tables import markdown_table as _markdown_table

    _health = _markdown_table(
        ["run", "step", "ratio max", "clipfrac", "staleness", "TIS weight mean", "behaviour KL"],
        [[name, str(s), f"{rmax:.4f}", f"{clip:.3f}", str(stale), f"{w:.4f}", f"{kl:.1e}"]
         for name, rows in health.items() for s, rmax, clip, stale, w, kl in rows])
    mo.md(
        f"""
    At η = {rho_lr:.2g}, **{outside_clip:.1%}** of the tokens lie outside the clip range after one
    step, and ρ runs from {ratios.min().item():.3f} to {ratios.max().item():.3f}. (The update itself
    logged `clipfrac` {rho_update["clipfrac"]:.3f} and `ratio_max` {rho_update["ratio_max"]:.3f}: it
    measured them at ρ = 1, before its own step moved anything.) The runs above trained with
    η = 10⁻⁴: at that setting the histogram is a spike at 1 with thin tails, and a second look
    at the batch is nearly on-policy. Move η up: the spike spreads, and the share outside the
    band bounds the share the clip can switch off on the next look: a token that went past the
    band in the direction its advantage pushes gets no more gradient from it. A wide histogram means the data no longer describes
    the policy being trained: too large a step, too many epochs, or a sampler too far behind.

    **The same check on a real run, as logged.** A run does not log every token's ρ; the
    controller logs summaries: the largest ratio and the clipped share *at the first
    minibatch*, the staleness, and under async the importance weights. The last steps of both
    runs:

    {_health}
    Colocated, every step starts on-policy (ratio 1, nothing clipped). Async, every batch is one
    update stale, and the importance weights stay within a fraction of a percent of 1: the
    correction is small and trustworthy. A mean weight drifting from 1, a growing clipped share
    or a behaviour KL rising step by step is the alarm. The chart below draws those summaries
    for every RL step of both runs.
    """
    )
    return


@app.cell
def _(ratio_steps):
    from posttrain.teach import charts as _charts  # several chart cells: a cell-private name in each

    # The runs log per-step statistics of ρ (its max, the clipped share, the TIS weights'
    # mean), not every token's ratio (the histogram above computes those live): this chart
    # draws the summaries, every RL step of both runs.
    _steps = [row[0] for row in ratio_steps["async"]]
    if [row[0] for row in ratio_steps["colocated"]] != _steps:
        raise ValueError("the two runs in lessons/data/28_runs logged different RL steps; "
                         "the chart draws them on one step axis")
    ratio_fig, _ax = _charts.figure()
    _charts.curves(_ax, _steps, {"colocated: ratio max": [row[1] for row in ratio_steps["colocated"]],
                         "async: ratio max": [row[1] for row in ratio_steps["async"]],
                         "async: TIS weight mean": [row[4] for row in ratio_steps["async"]]},
           markers=True, styles={"async: ratio max": "--"})
    # on-policy is ρ = 1: a reference line, not data
    _ax.axhline(1.0, color=_charts.REFERENCE, linewidth=0.8, linestyle=":").set_gid(_charts.DECORATION)
    _charts.finish(ratio_fig, _ax, "RL step", "ratio π_θ / π_old (dimensionless)",
           title="Step 6 on the runs: the ratios each step started from, as logged")
    _charts.legend_right(ratio_fig, _ax)
    ratio_fig
    return (ratio_fig,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **Our colocated run, budget 1.** The allocator's first pick is async one step ahead,
      hiding the 7.6 s rollout behind the 10.6 s trainer side. (Its second, dropping the
      reference, costs this run only its KL log, since GRPO's default β is 0; with a KL term
      in the loss it would change the algorithm. Not every lever is free.) The async run made with exactly
      that change took **longer** a step (20.3 s against 19.6 s): the lever's factor assumes the
      rollout gets its own hardware, and on 2 shared cores it does not (step 2 above). A lever is
      a hypothesis about your hardware; measure after each one.
    * **Our async run, any budget.** The workers' sampling binds (17.4 s against a 13.7 s trainer
      side), so the reference and update levers save exactly nothing, however good they are —
      until the rollout levers bring sampling under the trainer side, and only then do they
      start to count. Read the "saved alone" table: zeros.
    * **The planned GPU job, budget 6.** Speculative decoding and the length cap halve the
      step twice (76 → 39 → 25 s), and async one step ahead hides the trainer under the
      rollout (→ 14 s). Now the step is a max, and the binding side switches as you spend: the
      fourth lever has to be on the rollout (int8, → 11 s), which brings it under the trainer
      side, so the fifth has to be on the trainer (skip inert rows, → 8 s), and then the rollout
      binds again with no rollout lever left: the sixth slot stays unspent. A ranking made once,
      before you start, would have told you none of this.
    * **Step 6, η = 10^-2.5.** One step on the tiny policy puts over a tenth of the tokens
      outside the clip range, and the largest ρ in the tens: a second epoch, or an async trainer
      one step ahead, would learn from tokens the policy no longer samples, and the clip would
      switch many of them off. At the runs' η = 10^-4, 99 % or more stay inside.

    ## Source files used here

    * `posttrain/systems/wallclock.py` — `where_time_goes` (the decision tree), `open_levers`
    * `posttrain/systems/throughput.py` — `allocate_levers`, `rank_levers`, `DEFAULT_LEVERS`, `step_seconds`
    * `posttrain/systems/plan.py` — `plan`: the GPU job's terms and its priced length cap
    * `posttrain/roles/controller.py` — where each `time/*` is measured
    * `posttrain/roles/off_policy.py` — the staleness and importance-weight metrics of step 6
    * `posttrain/roles/trainer.py` — `Trainer.update`, the one step the ρ-histogram measures
    * `posttrain/models/logprobs.py` — `response_logp`, the log-probs the histogram recomputes
    * `lessons/data/28_runs/README.md` — the two run directories and the commands that made them

    ## Exercises

    1. Run `posttrain systems --run lessons/data/28_runs/async`. Which finding tells you the
       reference lever is worthless for that run, and what would have to change first for it
       to count?
    2. In the colocated run, the reference takes 4.3 s against the update's 6.3 s, though the
       update does three times the FLOPs per token. Look at `skipped_rows` in its
       `metrics.jsonl`: what explains it?
    3. Code: `exercises/28_levers.py` asks for the seconds each lever saves alone, colocated and
       async; run `posttrain check 28`.

    Previous: [27 · Missing concepts](?file=27_missing_concepts.py).
    Back to the start: [the index](?file=index.py).
    """)
    return


if __name__ == "__main__":
    app.run()
