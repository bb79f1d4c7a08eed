"""Lesson 25 · Kernels for RL: six surfaces, the first kernel to write, and the silent bug."""

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
    # 25 · Kernels for RL: six surfaces

    ## Where an RL engineer writes kernels

    A kernel is the code that runs on the device for one operation: an attention, a matmul,
    a softmax over the vocabulary. An RL job runs its kernels on six surfaces, and each has
    its own way of being slow and its own way of being wrong:

    | surface | what runs there | slow when | wrong when | in posttrain |
    |:---|:---|:---|:---|:---|
    | **rollout / inference** | decode attention over the KV cache, sampling | bandwidth-bound at small batches; waits for stragglers | the sampled token's log-prob is not the one recorded | `posttrain/roles/engines/torch_engine.py` |
    | **log-prob matching** | the trainer's log π of the sampled tokens: a log-softmax over the vocabulary | the (rows, tokens, vocab) logits do not fit | it differs from the sampler's (below) | `posttrain/models/logprobs.py` |
    | **training** | forward, backward, optimizer, the loss | small micro-batches; the prompt recomputed K times | masked tokens leak into the loss | `posttrain/roles/trainer.py`, `posttrain/models/shared_prefix.py` |
    | **weight sync** | all-gather, cast, broadcast, reshard | weights cross nodes or an object store | the engine keeps old weights (lesson 06) | `posttrain/roles/weight_sync.py` |
    | **memory & scheduling** | KV blocks, prefix trees, continuous batching | contiguous reservations waste the cache | a shared block is written by two rows | `posttrain/systems/kv_cache.py` |
    | **agentic primitives** | tool calls, sandboxes, stop strings | tools block the batch | tool output is trained as if the model wrote it (lesson 08) | `posttrain/roles/agent.py`, `posttrain/guards/sandbox.py` |

    ## The first kernel: prefix-aware paged attention

    GRPO samples $K$ answers to each prompt. A cache that reserves every row's prompt plus its
    whole token budget up front (what our sampler does, and what servers did before vLLM)
    holds mostly empty space once most answers stop early; a cache of fixed-size blocks taken
    as a row grows (PagedAttention) holds what the rows use; and a prefix tree stores each
    prompt's blocks once for its $K$ rows (RadixAttention). The attention kernel must then
    read a row's keys from scattered blocks, some shared: that is the first kernel an RL
    engine needs, because it decides how many rows fit, and so how fast decode runs.
    """)
    return


@app.cell
def _():
    from posttrain.systems.hardware import DEVICES, Cluster
    from posttrain.systems.kv_cache import paged_vs_contiguous, prefix_sharing
    from posttrain.systems.plan import JobSettings, plan
    from posttrain.systems.shapes import PRESETS
    from posttrain.systems.stragglers import expected_lengths
    from posttrain.systems.throughput import Lever, Workload, decode_flops_share, rank_levers

    # Llama-3-8B, GRPO: 64 prompts × 8 answers, 512-token prompts, answers log-normal around
    # 1,024 tokens (cv 1) under a 16,384-token budget, bf16 cache, vLLM's 16-token blocks
    _shape, _G, _K, _P, _BUDGET = PRESETS["llama-3-8b"], 64, 8, 512, 16384
    _answers = [min(L, _BUDGET) for L in expected_lengths(_G * _K, 1024, 1.0)]
    cache = paged_vs_contiguous(_shape, [_P + round(L) for L in _answers], _P + _BUDGET, 16, 2)
    shared = prefix_sharing(_shape, _G, _K, _P, sum(_answers) / len(_answers), 2, block_tokens=16)
    # the ROI of a 2× faster kernel on each role, for the step `posttrain systems` plans on 8 H100s
    _w = Workload(prompts=_G, samples_per_prompt=_K, prompt_tokens=_P, mean_response_tokens=1024)
    step_plan = plan(_shape, Cluster(DEVICES["h100-80gb"], 8), JobSettings(), _w)
    roi = rank_levers(step_plan.times, "colocated",
                      [Lever(f"2× faster {role}", {role: 0.5}) for role in ("rollout", "reference", "train", "sync")])
    decode_share = decode_flops_share(_shape, _w)
    return cache, decode_share, roi, shared, step_plan


@app.cell
def _(cache, decode_share, mo, roi, shared, step_plan):
    from posttrain.systems.hardware import GB

    _roi = "".join(f"| {g.lever.name} | {g.saved_seconds:.1f} | {g.speedup:.2f}× |\n" for g in roi)
    _total = sum(step_plan.times.as_dict().values())
    mo.md(
        f"""
    For Llama-3-8B, 64 prompts × 8 answers (`posttrain/systems/kv_cache.py`):

    | allocation | KV cache | share holding no token |
    |:---|---:|---:|
    | contiguous: prompt + the 16,384-token budget reserved per row | {cache.contiguous_bytes / GB:,.0f} GB | {cache.contiguous_waste:.0%} |
    | paged, 16-token blocks | {cache.paged_bytes / GB:,.0f} GB | {cache.paged_waste:.1%} |
    | paged, each prompt's blocks shared by its 8 rows | {shared.shared_bytes / GB:,.0f} GB | {shared.saved_fraction:.0%} less again |

    ## The ROI hierarchy

    Which kernel pays first? The one under the largest term of the step. For the same job on
    8 H100s, `posttrain systems` plans a {_total:.0f} s step, {step_plan.times.rollout / _total:.0%} of it
    rollout — though decode is only **{decode_share:.0%} of the step's FLOPs**: it is slow
    because it is bandwidth-bound, not because it computes much. A kernel twice as fast on each
    role, alone:

    | kernel | seconds saved a step | step speed-up |
    |:---|---:|---:|
    {_roi}
    So the order is decode first (paged attention with prefix sharing, then low-precision
    weights and speculative decoding), then the update's kernels, the reference's, and weight
    sync last. Each gain is Amdahl's: a 2× kernel on a tenth of the step saves a twentieth.
    """
    )
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The silent bug: log-prob mismatch

    The sampler and the trainer compute $\log\pi(y_t \mid x, y_{<t})$ for the same tokens with
    different kernels: the sampler one token at a time against a KV cache, the trainer in one
    pass over the whole sequence (`models/logprobs.py`, a chunked log-softmax). With the same
    weights in float32 they agree to rounding (~$10^{-6}$), and the test suite holds them to
    $10^{-5}$. Give the sampler any faster kernel — bf16 matmuls, int8 weights, a fused
    attention that sums in another order — and it becomes a slightly different policy. No
    error is raised; the ratio $\pi_\theta / \pi_{\text{old}}$ simply stops starting at 1, the
    KL estimates pick up a bias, and the update corrects for an off-policyness nobody asked for.

    Below, make run's gpt_mini shape (~0.8M parameters), freshly initialised, samples 4
    arithmetic prompts × 8 answers with the real `RolloutEngine`, and the trainer's float32
    pass scores the same tokens. (Untrained, it writes random characters: the mismatch is a
    property of the kernels, not of what a model has learnt.) Choose the sampler's kernels:
    """)
    return


@app.cell
def _(mo):
    sampler = mo.ui.dropdown(options={"float32: the trainer's own kernels": "float32",
                                      "bfloat16 matmuls (autocast)": "bfloat16",
                                      "int8 weights (models/int8.py)": "int8"},
                             value="float32: the trainer's own kernels", label="the sampler decodes with")
    sampler
    return (sampler,)


@app.cell
def _(mo, sampler, torch):
    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.teach.sampler_mismatch import make_run_policy, mismatch, sample_and_score

    precision = sampler.value
    _model, tok = make_run_policy()
    _prompts = ArithmeticEnv(level=3, cot=True).fixed_set("heldout", 4, seed=0)
    with mo.status.spinner(title=f"Sampling 4 prompts × 8 with the sampler in {precision}, then the trainer's float32 pass…"):
        batch, trainer_logp = sample_and_score(_model, tok, _prompts, 8, precision)
    stats, worst = mismatch(batch, trainer_logp)
    _on = batch.response_mask.bool()
    # the ratio π_trainer / π_sampler each token would start the update at, if old_logp were trusted
    start_ratio = torch.exp(trainer_logp - batch.old_logp)[_on]  # (n tokens,)
    return batch, precision, start_ratio, stats, tok, trainer_logp, worst


@app.cell
def _(batch, mo, precision, start_ratio, stats, tok, trainer_logp, worst):
    import html

    from posttrain.teach.demos.tokens import show

    def _code(text: str) -> str:
        """A token as inline code a markdown table cannot misread (whitespace made visible, "|" escaped)."""
        return "<code>" + html.escape(show(text)).replace("|", "&#124;") + "</code>"

    _P = len(batch.episodes[0].prompt_ids)
    _tokens = "".join(
        f"| {t} | {_code(tok.decode([tid], skip_special_tokens=False))} | {batch.old_logp[0, _P + t]:.6f} | "
        f"{trainer_logp[0, _P + t]:.6f} | "
        f"{(trainer_logp[0, _P + t] - batch.old_logp[0, _P + t]).item():+.1e} |\n"
        for t, tid in enumerate(batch.episodes[0].response_ids[:8])
    )
    _verdict = ("within the test suite's 1e-5: the sampler *is* the policy being trained" if worst < 1e-5 else
                f"**{worst / 1e-5:,.0f}× the test suite's 1e-5**: the sampler is another policy")
    mo.md(
        f"""
    ### Sampler in {precision}, trainer in float32: {int(batch.response_mask.sum())} tokens compared

    | | value |
    |:---|:---|
    | mean \\|log π_trainer − log π_sampler\\| per token | {stats.mean_abs_logp_diff:.2e} nats |
    | worst token | {worst:.2e} nats — {_verdict} |
    | KL(sampler ‖ trainer), k3 estimate | {stats.kl_k3:.2e} |
    | ratio π_trainer / π_sampler before any update, min … max | {start_ratio.min():.5f} … {start_ratio.max():.5f} |
    | share of the importance weights' sample kept (ESS) | {stats.effective_sample_fraction:.6f} |

    Answer 0, its first tokens:

    | t | token | old_logp (sampler) | trainer | difference |
    |---:|:---|---:|---:|---:|
    {_tokens}
    """
    )
    return


@app.cell
def _(batch, precision, stats, trainer_logp):
    import numpy as np

    from posttrain.teach.charts import PALETTE, REFERENCE, figure, finish

    # Every response token's |log π_trainer − log π_sampler| on one fixed log scale for the three
    # kernels; a token the two agree on exactly (a gap of 0, which a log scale cannot show) sits at 1e-9
    _gap = (trainer_logp - batch.old_logp)[batch.response_mask.bool()].abs().double().clamp(min=1e-9)  # (n,) nats
    _fig, _ax = figure()
    _ax.hist(_gap.tolist(), bins=np.logspace(-9.5, 0, 58), color=PALETTE[0], label=f"sampler in {precision}")
    _ax.axvline(1e-5, color=REFERENCE, linestyle="--", linewidth=1.2, label="the test suite's tolerance, 1e-5")
    _ax.set_xscale("log")
    chart = finish(_fig, _ax, "|log π_trainer − log π_sampler| per token (nats, log scale; 0 drawn at 1e-9)", "tokens",
                   title=f"Sampler in {precision}, trainer in float32: mean gap {stats.mean_abs_logp_diff:.1e} nats")
    chart
    return (chart,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **bfloat16 matmuls.** The gap jumps from ~$10^{-6}$ to ~$10^{-3}$ nats a token: a few
      hundred times the suite's tolerance. bf16 keeps 8 bits of mantissa, and every matmul of
      every layer rounds its inputs to them before the logits exist.
    * **int8 weights.** Larger again (~$5\times10^{-3}$ here, worst tokens above $10^{-2}$). The
      ratio before any update now ranges up to 2 % either side of 1. On this tiny model
      that is inside PPO's clip; on SmolLM2-135M the same int8 kernels are
      [0.80 nats a token](../BENCHMARKS.md#sampling-with-int8-weights-issue-18) away, and ratios of $e^{\pm 0.8}$ are clipped outright.

    What to do about it, in the order posttrain does it: never trust the sampler's log-probs as
    $\pi_{\text{old}}$ when its kernels differ (recompute with the trainer,
    `off_policy.current_logp`); weigh each token by the truncated ratio
    $\min(\pi_{\text{old}}/\pi_{\text{sampler}}, C)$ (`mismatch.importance_weights`); log the mismatch
    every step (`mismatch/logp_diff_mean`) and warn when it passes 0.05 nats (`posttrain/runs/monitors.py`);
    and keep a float32 parity test between the two code paths (`tests/test_rollout.py`).

    ## Source files used here

    * `posttrain/teach/sampler_mismatch.py` — the sampler against the trainer, token by token
    * `posttrain/roles/engines/torch_engine.py` — `RolloutEngine`: KV-cached decode, `old_logp` captured at sampling
    * `posttrain/models/logprobs.py` — `response_logp`: the trainer's chunked log-softmax
    * `posttrain/models/int8.py` — the int8 sampler; `posttrain/models/device.py` — bf16 autocast
    * `posttrain/systems/stragglers.py` — `logprob_mismatch`: the statistics above
    * `posttrain/roles/off_policy.py` — `current_logp`; `posttrain/roles/mismatch.py` — `MismatchCorrection`
    * `posttrain/systems/kv_cache.py` — `paged_vs_contiguous`, `prefix_sharing`
    * `posttrain/systems/throughput.py` — `rank_levers`, `decode_flops_share`: the ROI table
    * `tests/test_int8_rollout.py` — int8 log-probs within 2e-2 of float32's, and the corrected gradient

    ## Exercises

    1. Our sampler prefills each distinct prompt once and copies its cache to the K rows
       (`roles/engines/torch_engine.py`). Which of the three allocations above does that make it, and what
       would a prefix-aware kernel save on top?
    2. Why is the mismatch a *bias* and not just noise? (Which way does the sampler's own
       rounding push the tokens it chose to sample?)
    3. Code: `exercises/25_mismatch.py` asks for the four mismatch statistics from two lists of
       log-probs; run `posttrain check 25`.

    Previous: [24 · The RL infra engineer](?file=24_rl_infra_engineer.py). Next: the synthesis,
    [26 · Why RL is shaping this way today](?file=26_three_forces.py), then the playbook that
    closes the course, [28 · Bottlenecks, optimizations, and how to find them](?file=28_bottlenecks.py).
    """)
    return


if __name__ == "__main__":
    app.run()
