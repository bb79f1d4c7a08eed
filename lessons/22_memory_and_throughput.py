"""Lesson 22 · Memory and throughput math: bytes per parameter, ZeRO, activations, and the decode roofline."""

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
    # 22 · Memory and throughput math

    Two back-of-the-envelope calculations decide most of an RL system's design: **does it fit**,
    and **which ceiling does each phase hit**. Both need only the model's shape and four numbers
    of the device.

    ## Memory: 16 bytes a parameter before the first activation

    Training with AdamW in mixed precision keeps, per parameter, bf16 weights (2 bytes) and
    gradients (2), an fp32 master copy (4) and Adam's two fp32 moments (8): **16 bytes**. A 7B
    model's training state is 122 GB, more than one 80 GB GPU. ZeRO (Rajbhandari et al., 2020)
    shards it over $n$ data-parallel GPUs: stage 1 the optimizer's 12 bytes, stage 2 also the
    gradients, stage 3 also the weights,

    $$
    \text{bytes per GPU} = P\left(\frac{2}{s_3} + \frac{2}{s_2} + \frac{12}{s_1}\right),\qquad s_k = n \text{ if stage} \ge k \text{ else } 1.
    $$

    ### 16 or 18?

    The course's outline says **18 bytes a parameter** and gives no breakdown; the ZeRO paper counts
    **16**. Both are the same mixed-precision AdamW, and they differ in one term: where the
    gradients are kept. Above they are bf16, like the weights (2 bytes). Frameworks that
    accumulate the bf16 gradients of several micro-batches in an **fp32 buffer** instead
    (Megatron-LM's `main_grad`; the bf16 optimizer BLOOM was trained with), so that small
    gradients are not rounded away as they are summed, keep 4 bytes there:
    2 + **4** + 4 + 8 = **18**. `posttrain/systems/memory.py` has both (`MIXED_ADAMW`,
    `MIXED_ADAMW_FP32_GRADS`), and the sizer below shows both side by side. The two extra
    bytes are gradients, so ZeRO shards them from stage 2 on: at stage 2 or 3 over $n$ GPUs the
    difference per GPU is $2P/n$, not $2P$.

    Activations are never sharded: each GPU keeps those of its own micro-batch, about
    $n_{\text{layers}}(4h + 3q + 2kv + 4i)$ numbers a token for a Llama block without
    checkpointing, one hidden vector per layer with it (the forward runs again in backward).

    ## Throughput: decoding waits on memory

    A kernel takes at least $\max(\text{FLOPs}/F,\ \text{bytes}/BW)$ — the roofline. One decode
    step of $B$ rows does $B \cdot 2N$ FLOPs (plus attention) but reads all $N$ weights **once**,
    plus every row's KV cache. At small $B$ the weights' read binds and more rows are nearly free;
    compute catches up at the crossover batch

    $$
    B^* = \frac{W / BW}{f/F - c/BW},
    $$

    with $W$ the weight bytes, $f$ the FLOPs and $c$ the cache bytes of one row's token. When a
    row's cache reads cost more time than its FLOPs ($c/BW \ge f/F$, long contexts), $B^*$ is
    infinite: decoding stays memory-bound at any batch. Prefill and training push thousands of
    tokens through each weight read and are compute-bound.

    Below: one model on 8 H100s (bf16, mixed-precision AdamW, a micro-batch of one 4096-token
    row), and one decode step of the widget's batch at the peak ceilings.
    """)
    return


@app.cell
def _(mo):
    knobs = mo.ui.dictionary({
        "model": mo.ui.dropdown(options=["qwen2.5-1.5b", "qwen2.5-7b", "llama-3-70b"], value="qwen2.5-7b",
                                label="model"),
        "zero": mo.ui.slider(start=0, stop=3, step=1, value=3, label="ZeRO stage over 8 GPUs", show_value=True),
        "rows": mo.ui.slider(start=1, stop=1024, step=1, value=64, label="decode batch (rows)", show_value=True),
        "context": mo.ui.slider(start=0, stop=8192, step=256, value=1280, label="context per row (tokens)",
                                show_value=True),
    })
    knobs.vstack()
    return (knobs,)


@app.cell
def _(knobs):
    from posttrain.systems.hardware import GB, device_named
    from posttrain.systems.memory import MIXED_ADAMW, MIXED_ADAMW_FP32_GRADS, activation_bytes, training_state_bytes
    from posttrain.systems.roofline import crossover_rows, decode_step
    from posttrain.systems.shapes import PRESETS, parameter_count

    H100 = device_named("h100-80gb")
    shape = PRESETS[knobs.value["model"]]
    P = parameter_count(shape)
    zero, rows, context = knobs.value["zero"], knobs.value["rows"], knobs.value["context"]

    state = training_state_bytes(P, MIXED_ADAMW, zero, 8)  # the 16-byte count: bf16 gradients
    state_fp32_grads = training_state_bytes(P, MIXED_ADAMW_FP32_GRADS, zero, 8)  # the outline's 18: fp32 gradients
    extra_bytes_per_parameter = MIXED_ADAMW_FP32_GRADS.bytes_per_parameter - MIXED_ADAMW.bytes_per_parameter
    acts = activation_bytes(shape, 1, 4096, 2)
    acts_ckpt = activation_bytes(shape, 1, 4096, 2, checkpointing=True)
    per_gpu = state.total + acts_ckpt
    per_gpu_fp32_grads = state_fp32_grads.total + acts_ckpt
    fits = per_gpu <= 0.9 * H100.memory_bytes
    fits_fp32_grads = per_gpu_fp32_grads <= 0.9 * H100.memory_bytes

    step = decode_step(shape, H100, rows, context, 2, 2)
    tokens_per_second = rows / step.seconds
    crossover = crossover_rows(shape, H100, context, 2, 2)
    return (GB, H100, MIXED_ADAMW, MIXED_ADAMW_FP32_GRADS, P, acts, acts_ckpt, context, crossover, decode_step,
            extra_bytes_per_parameter, fits, fits_fp32_grads, per_gpu, per_gpu_fp32_grads, rows, shape, state,
            state_fp32_grads, step, tokens_per_second, zero)


@app.cell
def _(mo, torch):
    # This machine: a real Trainer step on gpt_mini (float32), and what autograd saves
    from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.roles.trainer import Trainer
    from posttrain.systems.memory import FP32_ADAMW
    from posttrain.systems.memory import activation_bytes as _activation_bytes
    from posttrain.systems.memory import training_state_bytes as _training_state_bytes
    from posttrain.systems.shapes import PRESETS as _PRESETS
    from posttrain.teach.measure import saved_activation_bytes, training_state_held

    torch.manual_seed(0)
    with mo.status.spinner(title="One AdamW step on make run's gpt_mini, measuring the bytes it holds…"):
        _model = GPTMini(GPTMiniConfig(vocab_size=len(CharTokenizer().itos)))
        _trainer = Trainer(_model, lr=1e-4, total_steps=1)
        _ids = torch.randint(0, 20, (4, 64), generator=torch.Generator().manual_seed(0))  # (B, T)
        _model(_ids).float().pow(2).mean().backward()  # any loss: the state's size does not depend on it
        _trainer.optimizer.step()
        held = training_state_held(_model, _trainer.optimizer)
        trained = sum(p.numel() for p in _model.parameters() if p.requires_grad)
        held_formula = _training_state_bytes(trained, FP32_ADAMW)
        saved = saved_activation_bytes(_model, _ids)
    saved_formula = _activation_bytes(_PRESETS["gpt_mini"], 4, 64, 4)
    return held, held_formula, saved, saved_formula, trained


@app.cell
def _(GB, H100, MIXED_ADAMW, MIXED_ADAMW_FP32_GRADS, P, acts, acts_ckpt, context, crossover, extra_bytes_per_parameter,
      fits, fits_fp32_grads, held, held_formula, mo, per_gpu, per_gpu_fp32_grads, rows, saved, saved_formula, shape,
      state, state_fp32_grads, step, tokens_per_second, trained, zero):
    _fit = lambda ok: "fits" if ok else "**does not fit**"  # noqa: E731
    _cross = "never (the cache's reads grow as fast as the FLOPs)" if crossover == float("inf") else f"{crossover:.0f} rows"
    mo.md(
        f"""
    ### {shape.name}: {P / 1e9:.2f} B parameters, ZeRO stage {zero} over 8 H100s

    | per GPU, GB | {MIXED_ADAMW.bytes_per_parameter:.0f} B a parameter (bf16 gradients) | {MIXED_ADAMW_FP32_GRADS.bytes_per_parameter:.0f} B (fp32 gradients) |
    |:---|---:|---:|
    | weights | {state.weights / GB:.1f} | {state_fp32_grads.weights / GB:.1f} |
    | gradients | {state.grads / GB:.1f} | {state_fp32_grads.grads / GB:.1f} |
    | master copy + Adam moments | {state.optimizer / GB:.1f} | {state_fp32_grads.optimizer / GB:.1f} |
    | activations, one 4096-token row (checkpointed; {acts / GB:.1f} GB without) | {acts_ckpt / GB:.1f} | {acts_ckpt / GB:.1f} |
    | **total** | **{per_gpu / GB:.1f}** — {_fit(fits)} in 90% of 80 GB | **{per_gpu_fp32_grads / GB:.1f}** — {_fit(fits_fp32_grads)} |

    The outline's 18 bytes cost {extra_bytes_per_parameter:g} more a parameter, all of it gradients:
    **{(state_fp32_grads.total - state.total) / GB:.1f} GB** more per GPU at ZeRO stage {zero}
    ({"sharded over the 8 GPUs" if zero >= 2 else "every GPU holds all of it"}).

    ### One decode step: {rows} rows at {context} tokens of context

    | | |
    |:---|:---|
    | FLOPs | {step.flops:.3g} → {step.compute_seconds * 1e3:.2f} ms at {H100.flops_per_second / 1e12:.0f} TFLOP/s |
    | bytes (weights once + every row's cache) | {step.bytes / GB:.2f} GB → {step.memory_seconds * 1e3:.2f} ms at {H100.bytes_per_second / 1e12:.2f} TB/s |
    | bound | **{step.bound}**, {step.flops_per_byte:.0f} FLOPs a byte (the H100's ridge: {H100.balance_flops_per_byte:.0f}) |
    | tokens per second | **{tokens_per_second:,.0f}** |
    | compute-bound from | {_cross} |

    **This machine, measured (gpt_mini, float32):** after one step of our `Trainer`, weights
    {held["weights"]:,} + gradients {held["grads"]:,} + AdamW moments {held["optimizer"]:,} bytes
    = {(held["weights"] + held["grads"] + held["optimizer"]) / trained:.0f} bytes for each of its
    {trained:,} parameters; the formula says {held_formula.total:,.0f} bytes in all. Autograd saved
    {saved:,} bytes of activations for 4 × 64 tokens; the count says {saved_formula:,.0f}
    ({saved / saved_formula:.2f}×).
    """
    )
    return


@app.cell
def _(H100, context, decode_step, rows, shape, step, tokens_per_second):
    from matplotlib.ticker import ScalarFormatter

    from posttrain.teach.charts import PALETTE, curves, figure, finish, mark

    # The roofline of one decode step over the slider's range of rows, at your context: the
    # step takes the longer of its two times, and only the compute time grows with the rows
    _grid = [2 ** k for k in range(11)]  # 1 … 1024 rows
    _steps = [decode_step(shape, H100, n, context, 2, 2) for n in _grid]
    _fig, _ax = figure()
    curves(_ax, _grid, {"memory: weights + every row's cache ÷ bandwidth": [s.memory_seconds * 1e3 for s in _steps],
                        "compute: FLOPs ÷ peak FLOP/s": [s.compute_seconds * 1e3 for s in _steps]})
    _ax.plot([rows], [step.seconds * 1e3], "o", color=PALETTE[0], markersize=6)  # your step
    _ax.set_xscale("log", base=2)
    _ax.xaxis.set_major_formatter(ScalarFormatter())  # 64, not 2^6
    _ax.set_yscale("log")
    mark(_ax, rows, f"your batch: {rows} rows")
    chart = finish(_fig, _ax, f"decode batch (rows, each at {context} tokens of context)", "time of one step (ms)",
                   title=f"{shape.name}: {step.bound}-bound at {rows} rows, {tokens_per_second:,.0f} tokens a second")
    chart
    return (chart,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **ZeRO stage 0 with Qwen2.5-7B.** Every GPU holds all 16 bytes of every parameter: 122 GB
      of training state before an activation (137 GB in the 18-byte count). Stage 1 alone brings
      it to 42 GB: the optimizer's 12 bytes are three quarters of the state. In the 18-byte count
      stage 1 leaves 57 GB, because the fp32 gradients stay whole on every GPU; stage 2 shards
      them, and the two counts close to within 2 GB.
    * **Llama-3-70B.** Even fully sharded (stage 3) the state is 141 GB per GPU on 8 GPUs:
      no stage fixes it, only more GPUs (or LoRA, lesson 24).
    * **Decode batch 1.** About 240 tokens a second for a 7B model: the H100 reads 15 GB of
      weights to produce one token and does almost no arithmetic. At 64 rows the step costs a
      third more time and makes 64 tokens. A sampler with one request at a time wastes the GPU.
    * **Context 0 and 1024 rows**: decode crosses to compute-bound near 300 rows (the H100's
      ridge of 295 FLOPs a byte divided by 2 FLOPs per 2-byte weight, give or take). **Context
      1280 or more**: it never does, because each row's cache read grows with the context as
      fast as its attention FLOPs, and a GQA model does few FLOPs per cached byte. Long
      reasoning traces make RL's rollout a memory-bandwidth problem at any batch.
    * The measured activations come out a little above the count (about 1.1×): the count keeps
      what a Llama block needs and leaves out small tensors (norm statistics, masks).

    ## Source files used here

    * `posttrain/systems/memory.py` — `training_state_bytes` (ZeRO), `activation_bytes`, `MIXED_ADAMW` (16 bytes),
      `MIXED_ADAMW_FP32_GRADS` (18), `FP32_ADAMW`
    * `posttrain/systems/roofline.py` — `decode_step`, `crossover_rows`, `Roofline`
    * `posttrain/systems/hardware.py` — `device_named`: the H100's published ceilings
    * `posttrain/roles/trainer.py` — `Trainer`: the AdamW whose state is measured
    * `posttrain/teach/measure.py` — `training_state_held`, `saved_activation_bytes`
    * `tests/test_systems_measured.py` — the same measurements for a GQA Llama and SmolLM2

    ## Exercises

    1. By hand: Qwen2.5-7B has 7.6 B parameters. What does each GPU hold at ZeRO stage 2 over 8
       GPUs? Check against the widget.
    2. At 1024 rows and context 0 decoding is compute-bound. Raise the context one step at a time:
       where does "compute-bound from" turn to "never", and why does a model with fewer KV heads
       stay compute-bound longer?
    3. Code: `exercises/22_decode_roofline.py` asks for one decode step's compute and memory
       times; run `posttrain check 22`.

    **Next:** [lesson 22a · the throughput equation](?file=22a_throughput_equation.py) — the five
    terms of an RL step, composed.
    """)
    return


if __name__ == "__main__":
    app.run()
