"""Lesson 20 · The KV cache and PagedAttention: what decoding keeps per token, and how to allocate it."""

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
    # 20 · The KV cache and PagedAttention

    ## Why decoding keeps memory per token

    To sample token $t+1$, attention needs the keys and values of tokens $1..t$ in every layer.
    Recomputing them each step would make decoding quadratic, so the sampler keeps them: the
    **KV cache**. Lesson 02's sampler does this (`posttrain/roles/engines/torch_engine.py`); so does every
    inference engine. Its size is set by the architecture alone:

    $$
    \text{bytes per token} = 2\,(K\text{ and }V) \times n_{\text{layers}} \times n_{\text{kv heads}} \times d_{\text{head}} \times \text{bytes per element}
    $$

    Grouped-query attention (GQA) lets several query heads share one key/value head, so the cache
    shrinks by $n_{\text{heads}} / n_{\text{kv heads}}$; multi-query attention (MQA) keeps a
    single one.

    ## Where it goes wrong: reservation

    A sampler does not know how long a response will be. The simple answer — ours, and every
    server's before vLLM — is to reserve prompt + `max_new_tokens` for every sequence up front,
    in one contiguous tensor. RL makes this bad: a reasoning model's responses have a long tail
    (most short, a few near the budget), so the budget is set by the tail and nearly every
    reservation is mostly empty. **PagedAttention** (Kwon et al., 2023) borrows the operating
    system's answer: the cache is a pool of fixed blocks of $B$ tokens, a sequence takes a new
    block only when it fills the last, and a block table maps positions to blocks. At most one
    partly filled block per sequence is wasted. With a **prefix tree** (SGLang's RadixAttention),
    the $K$ samples of one GRPO prompt also share the prompt's blocks.

    ## Why decoding waits on bandwidth

    Each decode step makes one token for every sequence in flight, and to do it reads **every
    weight once** (shared by all the rows) and **every row's cache** (its own). The arithmetic
    is a couple of FLOPs per byte read, far below what a GPU can do per byte, so the step takes
    about as long as its reads at the memory's bandwidth $BW$:

    $$
    t_{\text{step}} \gtrsim \frac{W + \text{rows} \times \text{context} \times \text{bytes per token}}{BW},
    \qquad \text{tokens/s} = \frac{\text{rows}}{t_{\text{step}}} < \frac{BW}{\text{context} \times \text{bytes per token}}.
    $$

    More rows share the weights' read, so tokens per second rise with the batch, until the
    caches' reads dominate and the rate levels off at a ceiling that only a smaller cache per
    token (GQA, MQA, a shorter context) raises. The memory a cache allocator frees is therefore
    speed: every sequence that fits is another row behind the same weight read.

    Below: a GRPO batch of 64 prompts × 8 samples, 256-token prompts, responses of 1024 tokens on
    average (log-normal, cv 1, cut at the budget), in bf16, how many sequences one GPU keeps in
    flight once the weights are loaded, and how fast it decodes them.
    """)
    return


@app.cell
def _(mo):
    cache = mo.ui.dictionary({
        "model": mo.ui.dropdown(options=["llama-2-7b (MHA)", "llama-3-8b (GQA 4:1)", "gemma-2b (MQA)"],
                                value="llama-3-8b (GQA 4:1)", label="model"),
        "max_new": mo.ui.slider(start=1024, stop=16384, step=1024, value=8192, label="max_new_tokens (the reservation)",
                                show_value=True),
        "block": mo.ui.dropdown(options=["1", "16", "128", "1024"], value="16", label="paged: tokens per block"),
        "device": mo.ui.dropdown(options=["h100-80gb", "h200-141gb", "a100-80gb", "a100-40gb", "l4-24gb"],
                                 value="h100-80gb", label="GPU (its memory and bandwidth)"),
    })
    cache.vstack()
    return (cache,)


@app.cell
def _(cache):
    from posttrain.systems.hardware import GB, device_named
    from posttrain.systems.kv_cache import (kv_bytes_per_token, max_cached_tokens, paged_vs_contiguous,
                                            prefix_sharing)
    from posttrain.systems.memory import inference_weight_bytes
    from posttrain.systems.roofline import decode_step
    from posttrain.systems.shapes import PRESETS, parameter_count
    from posttrain.systems.stragglers import expected_lengths

    PROMPTS, K, PROMPT_TOKENS, MEAN_RESPONSE = 64, 8, 256, 1024.0
    shape = PRESETS[cache.value["model"].split(" ")[0]]
    max_new, block = cache.value["max_new"], int(cache.value["block"])
    device = device_named(cache.value["device"])

    per_token = kv_bytes_per_token(shape, 2)
    responses = [min(round(L), max_new) for L in expected_lengths(PROMPTS * K, MEAN_RESPONSE, 1.0)]
    truncated = sum(L == max_new for L in responses) / len(responses)
    lengths = [PROMPT_TOKENS + L for L in responses]
    alloc = paged_vs_contiguous(shape, lengths, PROMPT_TOKENS + max_new, block, 2)
    shared = prefix_sharing(shape, PROMPTS, K, PROMPT_TOKENS, sum(responses) / len(responses), 2, block_tokens=block)

    # sequences in flight on one GPU: what is left of 90% of its memory after the bf16 weights
    _free = 0.9 * device.memory_bytes - inference_weight_bytes(parameter_count(shape), 2)
    room_tokens = max_cached_tokens(shape, _free, 2)
    in_flight_contiguous = room_tokens // (PROMPT_TOKENS + max_new)
    in_flight_paged = int(room_tokens // (alloc.paged_bytes / per_token / len(lengths)))

    # The bandwidth half: one decode step of the sequences in flight, each attending to the batch's
    # mean length (the cache as the allocation above holds it), bf16 weights and cache. A kernel
    # reads a row's tokens, never its empty reservation, so contiguous rows cost no extra reads:
    # they cost rows.
    context = round(sum(lengths) / len(lengths))
    decode_paged = decode_step(shape, device, in_flight_paged, context, 2, 2)
    decode_contiguous = decode_step(shape, device, in_flight_contiguous, context, 2, 2)
    weight_read_bytes = decode_step(shape, device, 0, context, 2, 2).bytes  # no rows: the weights alone
    rate_ceiling = device.bytes_per_second / ((context + 1) * per_token)  # tokens/s once the caches' reads dominate
    return (GB, alloc, block, context, decode_contiguous, decode_paged, decode_step, device, in_flight_contiguous,
            in_flight_paged, max_new, per_token, rate_ceiling, room_tokens, shape, shared, truncated,
            weight_read_bytes)


@app.cell
def _(mo, torch):
    # This machine: our own sampler's cache, measured, against the formula (gpt_mini, float32)
    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.roles.engines.contract import example_prompt_ids
    from posttrain.systems.kv_cache import sampler_kv_bytes
    from posttrain.systems.shapes import PRESETS as _PRESETS
    from posttrain.teach.measure import sampler_cache_bytes

    _tok = CharTokenizer()
    _examples = ArithmeticEnv().fixed_set("dev", 4)
    torch.manual_seed(0)
    _model = GPTMini(GPTMiniConfig(vocab_size=len(_tok.itos)))
    with mo.status.spinner(title="Sampling 4 prompts × 8 answers to measure the sampler's KV cache…"):
        measured_bytes = sampler_cache_bytes(_model, _tok, _examples, 8, 20)
    _longest = max(len(example_prompt_ids(_tok, e)) for e in _examples)
    formula_bytes = sampler_kv_bytes(_PRESETS["gpt_mini"], 4, 8, _longest, 20, 4)
    return formula_bytes, measured_bytes


@app.cell
def _(GB, alloc, block, device, formula_bytes, in_flight_contiguous, in_flight_paged, max_new, measured_bytes, mo,
      per_token, room_tokens, shape, shared, truncated):
    mo.md(
        f"""
    ### {shape.name}: {shape.n_layers} layers × {shape.n_kv_heads} KV heads × {shape.head_dim} → **{per_token / 1024:.0f} KiB per token**

    The batch's 512 sequences hold **{alloc.used_bytes / GB:.1f} GB** of keys and values
    ({truncated:.1%} of responses hit the budget of {max_new} tokens).

    | allocation | bytes | holds no token | sequences in flight on one {device.name} |
    |:---|---:|---:|---:|
    | contiguous, prompt + {max_new} reserved | {alloc.contiguous_bytes / GB:.1f} GB | **{alloc.contiguous_waste:.0%}** | {in_flight_contiguous} |
    | paged, blocks of {block} | {alloc.paged_bytes / GB:.1f} GB | **{alloc.paged_waste:.1%}** | {in_flight_paged} |
    | paged + prefix tree (the 8 samples share their prompt) | {shared.shared_bytes / GB:.1f} GB | | |

    After the weights, one {device.name} has room for {room_tokens:,} tokens of cache. The prefix tree saves
    {shared.saved_fraction:.0%} of the paged bytes here (the prompt is short beside the responses).

    **This machine, measured:** our sampler's cache for 4 prompts × 8 samples of gpt_mini, 20 new
    tokens, holds {measured_bytes:,} bytes; the formula says {formula_bytes:,}
    ({"equal" if measured_bytes == formula_bytes else "**they differ**"}). Our sampler reserves
    contiguously: every row gets the longest prompt + max_new_tokens.
    """
    )
    return


@app.cell
def _(GB, alloc, block, device, in_flight_contiguous, in_flight_paged, max_new, shape, shared):
    from posttrain.teach.charts import bars, figure, finish

    # The allocation table's bytes, drawn: the same 512 sequences under each allocator
    _labels = ["tokens held\n(what is used)", f"paged, blocks of {block}\n({alloc.paged_waste:.1%} empty)",
               f"paged + prefix tree\n({shared.saved_fraction:.0%} less)",
               f"prompt + {max_new} reserved\n({alloc.contiguous_waste:.0%} empty)"]
    _fig, _ax = figure()
    bars(_ax, _labels, [alloc.used_bytes / GB, alloc.paged_bytes / GB, shared.shared_bytes / GB,
                        alloc.contiguous_bytes / GB])
    chart = finish(_fig, _ax, f"allocation of {shape.name}'s KV cache for the batch", "KV cache (GB)",
                   title=f"One {device.name} keeps {in_flight_paged} sequences in flight paged, "
                         f"{in_flight_contiguous} contiguous")
    chart
    return (chart,)


@app.cell
def _(GB, context, decode_contiguous, decode_paged, decode_step, device, in_flight_contiguous, in_flight_paged,
      mo, per_token, rate_ceiling, shape, weight_read_bytes):
    from posttrain.teach import charts as _charts

    _rate = lambda step, rows: rows / step.seconds if rows else 0.0  # noqa: E731  (tokens a second)
    paged_rate, contiguous_rate = _rate(decode_paged, in_flight_paged), _rate(decode_contiguous, in_flight_contiguous)
    _row = lambda name, rows, step: (  # noqa: E731
        f"| {name} | {rows} | {weight_read_bytes / GB:.1f} + {(step.bytes - weight_read_bytes) / GB:.1f} "
        f"| {step.memory_seconds * 1e3:.1f} ms | {step.bound} | **{_rate(step, rows):,.0f}** |")
    _table = "\n".join([_row("contiguous", in_flight_contiguous, decode_contiguous),
                        _row("paged", in_flight_paged, decode_paged)])

    # tokens a second over the rows in flight at this context: rising while the weights' read
    # binds, levelling off at the ceiling once every row's cache read dominates
    _grid = sorted({max(1, round(in_flight_paged * 1.3 * k / 40)) for k in range(1, 41)})
    _fig, _ax = _charts.figure()
    _charts.curves(_ax, _grid, {"one decode step's bound (weights + caches ÷ bandwidth)":
                        [n / decode_step(shape, device, n, context, 2, 2).seconds for n in _grid],
                        "ceiling: bandwidth ÷ one row's cache": [rate_ceiling] * len(_grid)},
           styles={"ceiling: bandwidth ÷ one row's cache": ":"})
    _charts.mark(_ax, in_flight_paged, f"paged: {in_flight_paged} rows")
    _ax.axvline(in_flight_contiguous, color=_charts.REFERENCE, linestyle="--", linewidth=1.2,
                label=f"contiguous: {in_flight_contiguous} rows")
    bandwidth_chart = _charts.finish(_fig, _ax, f"sequences in flight, each at {context} tokens of context",
                             "decode tokens per second",
                             title=f"{shape.name} on one {device.name}: {device.bytes_per_second / 1e12:.2f} TB/s")
    mo.vstack([mo.md(f"""
    ### The bandwidth half: one decode step of what fits, on one {device.name}

    Every row in flight holds on average **{context} tokens**, so each step reads
    {(context + 1) * per_token / 2**20:.0f} MiB of cache per row beside the weights; the {device.name} reads
    {device.bytes_per_second / 1e12:.2f} TB/s.

    | allocation | rows in flight | GB read a step (weights + caches) | time at full bandwidth | bound | tokens a second |
    |:---|---:|---:|---:|:---|---:|
    {_table}

    Paging makes decoding **{paged_rate / contiguous_rate if contiguous_rate else float("inf"):.1f}×** faster here,
    with no kernel changed: the same weight read now feeds {in_flight_paged} rows instead of only
    {in_flight_contiguous}, though each step takes longer, since it reads more caches. No batch
    can beat **{rate_ceiling:,.0f} tokens a second** at this context: the bandwidth divided by one
    row's cache read.
    """), bandwidth_chart])
    return bandwidth_chart, contiguous_rate, paged_rate


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **max_new_tokens 16384.** The contiguous cache reserves 16.6 k tokens for sequences that
      average 1.3 k: 92% of it holds nothing, and an H100 keeps 25 sequences in flight where
      paging keeps 332. Raising the budget so the tail is not cut is exactly what RL on
      reasoning models does; under contiguous allocation it costs throughput directly.
    * **max_new_tokens 1024.** Waste falls to a quarter, but a third of the responses are cut at
      the budget: you buy memory with truncated answers (DAPO's overlong penalty, lesson 13,
      exists for them).
    * **Blocks of 1024 tokens.** Paging wastes up to one block per sequence: at 1024 that is 27%
      of the cache. Worse, the prefix tree now saves nothing (it costs 2.5% more): the
      prompt's last block is only partly filled, so each of the 8 samples copies it. Blocks of 1
      waste nothing but make the block table as long as the sequence and every attention read a
      gather; vLLM settles on 16.
    * **llama-2-7b (MHA)**: 512 KiB a token, four times Llama-3-8B's 128 KiB at the same width,
      and a quarter of the sequences in flight (87 against 333). **gemma-2b (MQA)**: 18 KiB.
      GQA is a memory decision as much as a modelling one, and a speed one: MHA's ceiling at this
      context is a quarter of GQA's (about 5,000 tokens a second against 20,000 on an H100), because
      every row reads four times the cache a step.
    * **GPU l4-24gb.** After 16 GB of weights, 5 sequences fit contiguously and 32 paged: decoding
      at about 95 and 470 tokens a second. On a small GPU the allocator decides whether decoding is
      worth running at all. **h200-141gb** has both more memory (659 rows paged) and more
      bandwidth (4.8 TB/s): about 25,000 tokens a second.

    ## Source files used here

    * `posttrain/systems/kv_cache.py` — `kv_bytes_per_token`, `paged_vs_contiguous`, `prefix_sharing`,
      `max_cached_tokens`, `sampler_kv_bytes`
    * `posttrain/systems/roofline.py` — `decode_step`: one step's bytes (weights once, every row's cache) and its bound
    * `posttrain/systems/hardware.py` — `DEVICES`, `device_named`: each GPU's memory and bandwidth
    * `posttrain/roles/engines/torch_engine.py` — our sampler: one contiguous cache, prefill once per prompt,
      copied out to its K rows
    * `posttrain/models/kv_cache.py` — `KVCache`, the cache the measurement reads
    * `posttrain/teach/measure.py` — `sampler_cache_bytes`: watches the real sampler's cache
    * `tests/test_systems_measured.py` — the same equality for a GQA Llama and SmolLM2

    ## Exercises

    1. Our sampler prefills each distinct prompt once, then copies the cache out to its K rows.
       While both exist, how many rows does the allocator hold? (Read `sampler_kv_bytes`.)
    2. With a prefix tree, at what prompt length does sharing save half the cache of a group of 8
       whose responses average 1024 tokens?
    3. Code: `exercises/20_paged_cache.py` asks for the used, contiguous and paged bytes of a batch;
       run `posttrain check 20`.

    **Next:** [lesson 21 · scheduling tricks](?file=21_scheduling_tricks.py) — what engines do with
    the memory paging frees.
    """)
    return


if __name__ == "__main__":
    app.run()
