"""Lesson 21 · Scheduling tricks: continuous batching, prefix caching, chunked prefill, speculative decoding."""

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
    # 21 · Scheduling tricks

    ## Two terms, four tricks

    A rollout's time is **prefill** (every prompt through the model once) plus **decode** (one
    token per row per step). Inference engines (vLLM, SGLang) stack four tricks on these two
    terms, and each acts on one of them:

    | trick | acts on | decode or prefill becomes |
    |:---|:---|:---|
    | continuous batching (Orca) | decode | × mean length / longest: a finished row's slot takes the next request at once |
    | prefix caching (RadixAttention) | prefill | × (S + G·P) / (G·K·(S + P)): the K samples of a prompt prefill it once |
    | chunked prefill (Sarathi) | prefill | hidden in decode's idle compute: decode steps wait on memory |
    | speculative decoding | decode | × (1 + γc) / E[tokens per pass] |

    Gains multiply within a term and add across terms (Amdahl): a 10× on prefill is worth
    little when prefill is a twentieth of the rollout.

    ## The key equation: speculative decoding

    A small draft model proposes $\gamma$ tokens; the target checks all of them in one pass and
    keeps the longest prefix it agrees with, plus one token of its own. If each draft token is
    accepted with probability $\alpha$ (Leviathan et al., 2023),

    $$
    E[\text{tokens per target pass}] = 1 + \alpha + \dots + \alpha^\gamma = \frac{1 - \alpha^{\gamma+1}}{1 - \alpha},
    $$

    and each pass costs $1 + \gamma c$ target steps, $c$ a draft step's relative cost. The
    output distribution is exactly the target's (the acceptance test is a rejection sampler),
    which matters for RL: the log-probs the trainer recomputes are still those of the policy
    that sampled.

    The baseline is a static batch of Qwen2.5-7B on one H100 (half its FLOP/s, 70% of its
    bandwidth): every sample prefills its own copy of the 256-token prompt, and every row
    decodes until the longest of the batch ends (responses log-normal, mean 1024, cv 1).
    """)
    return


@app.cell
def _(mo):
    spec = mo.ui.dictionary({
        "rows": mo.ui.dropdown(options=["8", "64", "512"], value="64", label="rows in flight (8 samples per prompt)"),
        "alpha": mo.ui.slider(start=0.0, stop=0.95, step=0.05, value=0.7, label="speculation: acceptance rate α",
                              show_value=True),
        "gamma": mo.ui.slider(start=1, stop=10, step=1, value=4, label="speculation: draft tokens γ", show_value=True),
    })
    spec.vstack()
    return (spec,)


@app.cell
def _(spec):
    from posttrain.systems.hardware import device_named
    from posttrain.systems.roofline import decode_step, prefill
    from posttrain.systems.scheduling import (RolloutTime, Tricks, apply_tricks, speculative_decoding_factor,
                                              speculative_tokens_per_pass)
    from posttrain.systems.shapes import PRESETS
    from posttrain.systems.stragglers import expected_max

    SHAPE = PRESETS["qwen2.5-7b"]
    H100 = device_named("h100-80gb").derated(0.5, 0.7)
    K, PROMPT, MEAN, DRAFT_COST = 8, 256, 1024.0, 0.05

    rows = int(spec.value["rows"])
    alpha, gamma = spec.value["alpha"], spec.value["gamma"]
    longest = expected_max(rows, MEAN, 1.0)  # E[the batch's longest response]

    # the static batch: every row's prompt prefilled, every row decoded to the longest
    base = RolloutTime(prefill(SHAPE, H100, rows, PROMPT, 2, 2).seconds,
                       sum(decode_step(SHAPE, H100, rows, PROMPT + t, 2, 2).seconds for t in range(round(longest))))
    _mid = decode_step(SHAPE, H100, rows, PROMPT + MEAN / 2, 2, 2)
    compute_fraction = _mid.compute_seconds / _mid.memory_seconds  # how busy decode keeps the compute units
    steps = apply_tricks(base, Tricks(mean_length=MEAN, max_length=longest, prompt_tokens=PROMPT, samples_per_prompt=K,
                                      prompts=rows // K, decode_compute_fraction=compute_fraction,
                                      acceptance=alpha, draft_tokens=gamma, draft_cost=DRAFT_COST))
    per_pass = speculative_tokens_per_pass(alpha, gamma)
    spec_factor = speculative_decoding_factor(alpha, gamma, DRAFT_COST)
    return (DRAFT_COST, alpha, compute_fraction, gamma, longest, per_pass, rows, spec_factor,
            speculative_decoding_factor, steps)


@app.cell
def _(alpha, compute_fraction, gamma, longest, mo, per_pass, rows, spec_factor, steps):
    _rows = "".join(
        f"| {s.trick} | {s.time.prefill:.2f} | {s.time.decode:.1f} | {s.time.total:.1f} | "
        f"{s.speedup_over(steps[i - 1]) if i else 1.0:.2f}× |\n" for i, s in enumerate(steps))
    _warn = ("" if compute_fraction < 0.5 else
             f"**Decode is already {compute_fraction:.0%} compute-busy at {rows} rows**: checking γ + 1 tokens "
             "costs nearly γ + 1 times a step there, so the speculation row above is optimistic (the formula "
             "assumes a bandwidth-bound step).")
    mo.md(
        f"""
    ### {rows} rows, the longest response ≈ {longest:,.0f} tokens; α = {alpha:.2f}, γ = {gamma}

    | after | prefill s | decode s | rollout s | this trick's speed-up |
    |:---|---:|---:|---:|---:|
    {_rows}
    Total: **{steps[0].time.total / steps[-1].time.total:.1f}×**. Each target pass yields
    {per_pass:.2f} tokens for {1 + gamma * 0.05:.2f} steps' cost: decode × {spec_factor:.2f}
    ({"a gain" if spec_factor < 1 else "**a loss**"}). Decode keeps the compute units
    {compute_fraction:.0%} busy.

    {_warn}
    """
    )
    return


@app.cell
def _(DRAFT_COST, alpha, gamma, spec_factor, speculative_decoding_factor):
    from posttrain.teach.charts import PALETTE, REFERENCE, curves, figure, finish, mark

    # Speculation's decode factor over the slider's range of γ at your α: below 1 it pays,
    # above 1 the draft's cost outruns the tokens it gets accepted
    _gammas = list(range(1, 11))
    _fig, _ax = figure()
    curves(_ax, _gammas, {f"α = {alpha:.2f}, a draft step costing {DRAFT_COST:g} of a target step":
                          [speculative_decoding_factor(alpha, g, DRAFT_COST) for g in _gammas]}, markers=True)
    _ax.plot([gamma], [spec_factor], "o", color=PALETTE[0], markersize=7)  # your γ
    _ax.axhline(1.0, color=REFERENCE, linewidth=1.0, label="1: no gain (plain decoding)")
    mark(_ax, gamma, f"your γ = {gamma}")
    chart = finish(_fig, _ax, "draft tokens γ per target pass", "decode time × (lower is faster)",
                   title=f"Speculative decoding at α = {alpha:.2f}: decode × {spec_factor:.2f} at γ = {gamma}")
    chart
    return (chart,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **α = 0.3, γ = 10.** A draft that agrees rarely yields 1.4 tokens a pass for 1.5 steps'
      cost: speculation is slower than plain decoding (factor above 1). γ should grow with α,
      not be fixed: at α = 0.3, γ = 1 or 2 is the best it does.
    * **α = 0.95, γ = 10.** 8.6 tokens a pass: decode falls by almost 6×. For RL this is a policy
      that has sharpened, late in training, on a draft that was trained with it; early in
      training, or with a stale draft, α falls.
    * **512 rows.** Decode is nearly compute-bound (96%), so speculation cannot deliver what the
      formula promises, and chunked prefill has little idle compute to hide prefill in (here
      prefill is small anyway). The tricks are for the bandwidth-bound regime.
    * **8 rows.** Prefix caching saves 7/8 of the prefill, but prefill was a fraction of a
      second: Amdahl. Continuous batching is the big one at every size, because the static
      batch decodes to its longest response: 2.7 times the mean at 8 rows, 5.4 at 64, 9.4 at
      512 (the more rows, the further out the tail reaches).
    * Caveat on continuous batching: its mean/longest factor assumes a queue of requests to fill
      the freed slots. An RL step samples one batch and then waits for its longest row
      (lesson 22b); our own sampler drops finished rows (less work per step) but still runs until
      the last one ends. Async rollouts and partial rollouts exist to get the factor back.

    ## Source files used here

    * `posttrain/systems/scheduling.py` — `apply_tricks`, `Tricks`, `speculative_tokens_per_pass`,
      `speculative_decoding_factor`, `continuous_batching_factor`, `prefix_caching_factor`
    * `posttrain/systems/roofline.py` — `prefill`, `decode_step`: the baseline's times
    * `posttrain/systems/stragglers.py` — `expected_max`: the longest of the batch
    * `posttrain/roles/engines/torch_engine.py` — our sampler: one prefill per distinct prompt, finished rows dropped

    ## Exercises

    1. For α = 0.8 and c = 0.05, find the γ that minimises decode time. Is it the same for c = 0.2?
    2. A shared 1000-token system prompt in front of each 256-token prompt: what does prefix
       caching save now, for 64 prompts × 8 samples? (`prefix_caching_factor` with
       `shared_system_tokens`.)
    3. Code: `exercises/21_speculative.py` asks for the tokens per pass and the decode factor; run
       `posttrain check 21`.

    **Next:** [lesson 22 · memory and throughput math](?file=22_memory_and_throughput.py) — the
    rooflines under these numbers.
    """)
    return


if __name__ == "__main__":
    app.run()
