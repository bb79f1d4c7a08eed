"""Lesson 22b · Long-tail rollouts: a batch waits for its longest answer — max-of-K, packing, dynamic K."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import math

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return math, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 22b · Long-tail rollouts: max-of-K, packing, dynamic K

    ## Why the rollout term is a maximum

    Lesson 22a wrote a step as five terms and found the rollout term the largest. This lesson
    looks inside it. A synchronous step samples $K$ completions for each of $B$ prompts and
    cannot score, train or sync until **all** $n = K \cdot B$ of them have ended. Decoding
    emits one token per live row per step, so the batch takes as many decode steps as its
    *longest* answer has tokens:

    $$
    \tau_{\text{rollout}} \;\propto\; \max_{i \le n} L_i \quad\text{not}\quad \tfrac{1}{n}\textstyle\sum_i L_i .
    $$

    How long is the longest of $n$? That depends on the shape of the length distribution.
    Reasoning models' answer lengths are close to **log-normal**: an answer's length is the
    product of many independent "keep going" factors (one more sub-problem, one more check,
    one more retry), so its logarithm is a sum, and sums are near-normal. A log-normal with
    mean $m$ and spread $\text{cv} = \text{std}/\text{mean}$ has $\sigma^2 = \ln(1 + \text{cv}^2)$,
    and a long right tail: most answers are short, a few run many times the mean.

    ## The straggler tax

    $$
    \text{tax}(n, \text{cv}) = \frac{\mathbb{E}[\max_{i\le n} L_i]}{m},
    \qquad
    \mathbb{E}[\max] = \int e^{\mu + \sigma z}\; n\,\Phi(z)^{n-1}\varphi(z)\,dz
    $$

    (the density of the largest of $n$ standard normals, pushed through the exponential;
    `stragglers.expected_max` integrates it numerically). What the wait costs depends on the
    engine. A decode step costs $a$ whatever its rows (every weight is read once) plus $b$
    per live row (its FLOPs and its KV cache). Keep every row to the end and a batch costs
    $(a + b\,n)\max L$; let finished rows leave and it costs

    $$
    \text{seconds} = a \cdot \max_i L_i + b \cdot \textstyle\sum_i L_i ,
    $$

    which is what our sampler does (`roles/engines/torch_engine.py` drops finished rows). On this machine
    `tests/test_systems_measured.py` fitted [$a = 6.5$ ms and $b = 0.20$ ms](../docs/guides/scaling-out.md#the-formulas-against-this-machine) for our
    sampler on gpt_mini, and the formula predicted three fresh batches [within 16 %](../docs/guides/scaling-out.md#the-formulas-against-this-machine); the
    widget uses those two numbers and answers of 20 tokens on average. (The tax itself has no unit: a
    reasoning model's 2,000-token answers pay the same multiple.)

    ## Three patches, in the order they compose

    1. **Packing.** A finished row gives its slot away: the engine refills it (continuous
       batching) and the update packs rows end to end. The $b$ term pays for $\sum L$ instead
       of $n \max L$; the $a \cdot \max L$ term stays.
    2. **A length cap with a shaped penalty.** Truncate at $C$ tokens, and teach the policy to
       stop before it with DAPO's overlong penalty (lesson 13): $\max L \le C$.
    3. **Dynamic K.** Launch $n/\text{keep}$ rows and end the step when $n$ have finished: the
       batch waits for the $n$-th shortest of $n/\text{keep}$, not the longest of $n$. The
       price: the rows you keep are the short ones.

    The panel sets the spread, the batch and the two patches' knobs; every number below is
    `posttrain/systems/stragglers.py`.
    """)
    return


@app.cell
def _(mo):
    controls = mo.ui.dictionary({
        "cv": mo.ui.slider(start=0.0, stop=2.0, step=0.1, value=1.0, label="spread of the lengths, cv = std / mean",
                           show_value=True),
        "rows": mo.ui.dropdown(options={"16": 16, "64": 64, "256": 256, "1024": 1024}, value="256",
                               label="rows per step, n = K·B"),
        "cap": mo.ui.slider(start=0.0, stop=8.0, step=0.5, value=4.0, label="length cap, × the mean (0 = none)",
                            show_value=True),
        "keep": mo.ui.slider(start=0.5, stop=1.0, step=0.05, value=0.9,
                             label="dynamic K: wait for this share of the launched rows", show_value=True),
    })
    controls.vstack()  # the panel's controls, one per line (their values stay in `controls`)
    return (controls,)


@app.cell
def _(controls, math):
    from posttrain.systems.stragglers import (expected_lengths, expected_max, overlong_penalty, simulated_max,
                                              straggler_patches, straggler_tax)

    MEAN = 20.0  # tokens per answer on average: make run's answers (chain of thought included)
    A, B = 6.5e-3, 0.20e-3  # seconds per decode step and per row-token: our sampler, fitted on this machine
    cv, n, keep = controls.value["cv"], controls.value["rows"], controls.value["keep"]
    cap = controls.value["cap"] * MEAN or None  # None: no cap
    patches = straggler_patches(n, MEAN, cv, A, B, cap=cap, keep_fraction=keep)
    tax = straggler_tax(n, cv)
    monte_carlo = simulated_max(n, MEAN, cv, trials=300) / MEAN  # the check on the quadrature
    lengths = expected_lengths(n, MEAN, cv)  # a typical batch, shortest first
    # the cap: the rows it cuts, and the mean shaped reward with DAPO's ramp over its last quarter
    truncated = sum(L > cap for L in lengths) / n if cap else 0.0
    penalty = sum(overlong_penalty(L, cap, cap / 4) for L in lengths) / n if cap else 0.0
    # dynamic K keeps the n shortest of n / keep launched rows: how long are the answers it trains on?
    launched = math.ceil(n / keep)
    drawn = [min(L, cap) if cap else L for L in expected_lengths(launched, MEAN, cv)]
    kept_mean = sum(drawn[:n]) / n
    expected_longest = expected_max(n, MEAN, cv)
    return (MEAN, cap, cv, expected_longest, kept_mean, keep, launched, lengths, monte_carlo, n, patches, penalty,
            tax, truncated)


@app.cell
def _(MEAN, cap, cv, expected_longest, kept_mean, keep, launched, mo, monte_carlo, n, patches, penalty, tax,
      truncated):
    _rows = "".join(
        f"| {s.patch} | {s.decode_steps:,.0f} | {s.seconds:.2f} | "
        + ("" if i == 0 else f"{s.speedup_over(patches[i - 1]):.2f}×") + f" | {patches[0].seconds / s.seconds:.2f}× |\n"
        for i, s in enumerate(patches)
    )
    mo.md(
        f"""
    ### {n} rows, lengths log-normal with mean {MEAN:g} tokens and cv {cv:g}

    The batch waits for **E[max] = {expected_longest:.0f} tokens, {tax:.2f}× the mean** — the straggler tax
    (Monte Carlo over 300 batches: {monte_carlo:.2f}×).

    | after the patch | decode steps the batch waits for | seconds | × faster than the row above | × faster than none |
    |:---|---:|---:|---:|---:|
    {_rows}
    (Decode steps of a typical batch: its longest row, a quantile a little below E[max].)

    * **The cap** {"is off" if not cap else f"at {cap:g} tokens cuts **{truncated:.1%}** of the answers; with DAPO's ramp over its last quarter, the mean shaped reward is {penalty:+.3f}"}.
    * **Dynamic K** launches {launched} rows and keeps the first {n} to finish: their mean length is
      **{kept_mean:.1f} tokens, {kept_mean / MEAN:.0%} of the policy's {MEAN:g}** (keep = {keep:g}).
    """
    )
    return


@app.cell
def _(MEAN, cap, expected_longest, lengths, patches):
    import matplotlib.pyplot as plt

    _fig, _ax = plt.subplots(figsize=(7.5, 2.6))
    _ax.hist(lengths, bins=40, color="#8fb3d9")
    _ax.axvline(MEAN, color="black", linestyle="--", label=f"mean {MEAN:g}")
    _ax.axvline(expected_longest, color="#c0392b", label=f"E[max] {expected_longest:.0f}")
    if cap:
        _ax.axvline(cap, color="#27ae60", label=f"cap {cap:g}")
    _ax.axvline(patches[-1].decode_steps, color="#8e44ad", linestyle=":", label="where the last patch stops")
    _ax.set_xlabel("answer length (tokens)")
    _ax.set_ylabel("rows")
    _ax.legend(fontsize=8)
    _fig.tight_layout()
    _fig
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The FP8 trap (int8 on this CPU)

    The $a$ term is the weights' read: decoding a few rows is bound by memory bandwidth, so
    weights stored in 8 bits instead of 16 make each step up to twice as fast. Every large
    RL system samples in low precision for that reason. The trap: **the sampler is then a
    different policy from the one you train.** The log-probs it records as `old_logp` are
    $\log\pi_{\text{int8}}$, not the $\log\pi_{\text{old}}$ the update's ratio assumes, and
    nothing crashes. Below, the roofline says what the trick buys on a GPU, and the real
    int8 sampler (`posttrain/models/int8.py`) on make run's gpt_mini shape says what it
    costs: the same tokens scored by the trainer's float32 pass.
    """)
    return


@app.cell
def _(mo):
    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.systems.hardware import DEVICES
    from posttrain.systems.roofline import low_precision_decode_speedup
    from posttrain.systems.shapes import PRESETS
    from posttrain.teach.sampler_mismatch import make_run_policy, mismatch, sample_and_score

    # bf16 → int8 weights for Llama-3-8B on an H100, 1,024 tokens into the answer: the bytes bound only
    speedups = {rows: low_precision_decode_speedup(PRESETS["llama-3-8b"], DEVICES["h100-80gb"], rows, 1024, 2, 1, 2)
                for rows in (1, 16, 256)}
    with mo.status.spinner(title="Sampling 4 prompts × 8 in int8 and in float32, and the trainer's pass over each…"):
        _model, _tok = make_run_policy()
        _prompts = ArithmeticEnv(level=3, cot=True).fixed_set("heldout", 4, seed=0)
        _batch, _trainer = sample_and_score(_model, _tok, _prompts, 8, "int8")
        int8_mismatch, int8_worst = mismatch(_batch, _trainer)
        _batch, _trainer = sample_and_score(_model, _tok, _prompts, 8, "float32")
        float_mismatch, float_worst = mismatch(_batch, _trainer)
    tokens_compared = int(_batch.response_mask.sum())
    return float_mismatch, float_worst, int8_mismatch, int8_worst, speedups, tokens_compared


@app.cell
def _(float_mismatch, float_worst, int8_mismatch, int8_worst, mo, speedups, tokens_compared):
    _speed = " · ".join(f"{rows} rows: {s:.2f}×" for rows, s in speedups.items())
    mo.md(
        rf"""
    **What it buys** (roofline, bf16 → int8 weights, Llama-3-8B on an H100): {_speed}. The
    gain is large only while the weights' read binds the step; with many rows the KV cache's
    reads and the FLOPs take over.

    **What it costs**, on {tokens_compared} sampled tokens of 4 prompts × 8 samples:

    | sampler | mean \|log π_trainer − log π_sampler\| | worst token | KL(sampler ‖ trainer), k3 | importance weights kept (ESS) |
    |:---|---:|---:|---:|---:|
    | float32 (the trainer's own kernels) | {float_mismatch.mean_abs_logp_diff:.1e} | {float_worst:.1e} | {float_mismatch.kl_k3:.1e} | {float_mismatch.effective_sample_fraction:.6f} |
    | int8 weights | {int8_mismatch.mean_abs_logp_diff:.1e} | {int8_worst:.1e} | {int8_mismatch.kl_k3:.1e} | {int8_mismatch.effective_sample_fraction:.6f} |

    On a model this small the gap is thousandths of a nat. It grows with the model: SmolLM2-135M's
    int8 log-probs are **[0.80 nats per token](../BENCHMARKS.md#sampling-with-int8-weights-issue-18)** from its float32 ones, so
    far that the importance weights meant to correct it are themselves too noisy to trust.
    posttrain therefore recomputes $\pi_{{\text{{old}}}}$ with the trainer and weighs each token by
    $w = \min(\pi_{{\text{{old}}}} / \pi_{{\text{{int8}}}}, C)$ (`posttrain/roles/mismatch.py`),
    logs the mismatch every step (`mismatch/logp_diff_mean`), and warns above 0.05 nats. Lesson 25
    turns this into a knob.
    """
    )
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **Keep = 0.5.** Dynamic K finishes fast, because it waits only for the shorter half of
      twice the rows — and the answers it trains on average 40 % of the policy's length. Every
      long answer is cut from the batch *before it is scored*, so the gradient never sees a long
      answer succeed or fail: the update learns about a policy that only writes short answers.
      Even the default keep = 0.9 trains on answers ~25 % shorter than the policy writes, because
      a long tail holds a lot of the tokens. Correct for it (reweight, or keep the dropped rows
      for the next step) or accept it knowingly.
    * **Cap = 1 × the mean.** A third of the answers are cut off and the mean shaped reward turns
      sharply negative: the penalty now punishes ordinary answers, not runaway ones. A cap is a
      guard against the tail, set well above what a good answer needs.
    * **cv = 0** (every answer the same length): the tax is 1, packing and the cap change
      nothing, and dynamic K only *adds* work (it decodes rows it then throws away). The patches
      pay exactly in proportion to the spread.
    * **cv = 2, 1,024 rows**: the batch waits for ~31× the mean. This is why long-reasoning
      runs spend most of their wall-clock waiting on a handful of rows.

    ## Source files used here

    * `posttrain/systems/stragglers.py` — `expected_max`, `straggler_tax`, `expected_lengths`,
      `straggler_patches`, `overlong_penalty`, `logprob_mismatch`
    * `posttrain/roles/engines/torch_engine.py` — the sampler that drops finished rows (the $a \max L + b \sum L$ it pays)
    * `tests/test_systems_measured.py` — the sampler's time against $a \max L + b \sum L$ on this machine
    * `posttrain/systems/roofline.py` — `low_precision_decode_speedup`
    * `posttrain/models/int8.py` — the int8 sampler; `posttrain/teach/sampler_mismatch.py` — the comparison
    * `posttrain/roles/mismatch.py` — `MismatchCorrection`, `importance_weights`: the correction
    * `posttrain/algorithms/dapo.py` — the overlong penalty the trainer actually uses

    ## Exercises

    1. With 256 rows, which cv makes the tax 4×? Which makes it 16×? Is the tax more sensitive
       to the spread or to the number of rows?
    2. Why does packing leave the $a \cdot \max L$ term untouched, and which of the other two
       patches attacks it?
    3. Code: `exercises/22b_stragglers.py` asks for a batch's decode time before and after
       packing and a cap; run `posttrain check 22b`.

    Previous: lesson 22a, the throughput equation (`posttrain lessons 22a`). Next:
    [22c · Async pipelining and weight sync](?file=22c_async_pipelining.py).
    """)
    return


if __name__ == "__main__":
    app.run()
