"""Lesson 24 · The RL infra engineer: five layers, four paths, three architectures, and the traps."""

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
    # 24 · The RL infra engineer

    ## What the job is

    An RL post-training run is an inference server, a training job, a sandbox farm and a
    data pipeline that must agree on every token. The engineer who owns it owns five layers:

    | layer | the question it answers | where it lives in posttrain |
    |:---|:---|:---|
    | **framework** | which role runs when, on what, with which weights | `posttrain/roles/controller.py`, `posttrain/distributed/` |
    | **environment** | what is a prompt, how is an answer scored, what may untrusted code do | `posttrain/envs/`, `posttrain/verifiers/`, `posttrain/guards/sandbox.py` |
    | **performance** | where the time and the memory go, and what to change first | `posttrain/systems/`, `benchmarks/`, `posttrain/models/int8.py` |
    | **correctness** | are the numbers the math says they are: log-probs, masks, staleness | `posttrain/roles/off_policy.py`, `tests/`, `posttrain/runs/monitors.py` |
    | **operations** | a run that is killed resumes to the same numbers; a dead worker loses nothing | `posttrain/runs/`, `posttrain/guards/processes.py`, `tests/test_distributed_faults.py` |

    ## Four paths a step's bytes take

    1. **Weights**, trainer → engines, after every update (all-gather, cast, broadcast,
       reshard: lesson 22c).
    2. **Trajectories**, engines → trainer: every row's token ids and `old_logp`.
    3. **Collectives** inside the trainer: gradients reduced across data-parallel GPUs, and
       under ZeRO-3 the weights gathered for every forward and backward.
    4. **Control**: the controller sends prompts and gets back text, rewards and metrics; the
       verifier reads completions as text.

    The first and third are the big ones, and which wire they ride (GPU memory, NVLink,
    InfiniBand, an object store) is decided by the architecture.

    ## Three reference architectures

    * **Colocated — verl's hybrid engine.** verl ([HybridFlow](https://arxiv.org/abs/2409.19256))
      puts the actor's trainer and its rollout engine on the same GPUs and switches each
      iteration between the training layout (FSDP or Megatron shards) and the inference
      layout (vLLM or SGLang), resharding the weights in place; no GPU idles for lack of a
      role, and weights never leave the node. (It also has a one-step-off and a fully async
      recipe with separate pools.) [docs](https://verl.readthedocs.io)
    * **Disaggregated on Ray — OpenRLHF.** OpenRLHF ([report](https://arxiv.org/abs/2405.11143))
      has Ray place the actor, critic, reward and reference models on separate GPU groups, with
      vLLM engines for generation and NCCL (or CUDA IPC when colocated) to move the weights; a
      hybrid-engine option lets all of them share the GPUs instead.
      [repository](https://github.com/OpenRLHF/OpenRLHF)
    * **Fully async — AReaL.** AReaL runs generation and training concurrently on
      disaggregated GPUs; rollouts may be up to `max_head_offpolicyness` versions behind, and
      one trajectory may even span several versions (partial rollouts), corrected in the loss.
      [docs](https://inclusionai.github.io/AReaL/algorithms/async.html)

    posttrain has all three, small: colocated in one process (`--dist.topology colocated`),
    sync and async over Ray workers (`--workers 2 --dist.topology async`). The widget does the
    arithmetic for a real cluster with `posttrain/systems/placement.py`: pick an architecture,
    a model, a cluster and an algorithm, and see which GPUs hold which copy, what crosses which
    wire each step, and what the step costs. GRPO or PPO, 64 prompts × 8 samples, 512-token
    prompts, answers of 1,024 tokens on average (cv 1), bf16 with fp32 master weights, ZeRO-3,
    kernels at half the peak FLOP/s and 70 % of the bandwidth.
    """)
    return


@app.cell
def _(mo):
    CLUSTERS = {"8 × H100-80GB": ("h100-80gb", 8), "16 × H100-80GB": ("h100-80gb", 16),
                "64 × H100-80GB": ("h100-80gb", 64), "8 × A100-40GB": ("a100-40gb", 8)}
    controls = mo.ui.dictionary({
        "architecture": mo.ui.dropdown(options={"colocated (verl's hybrid engine)": "colocated",
                                                "disaggregated (OpenRLHF on Ray)": "disaggregated",
                                                "fully async (AReaL)": "async"},
                                       value="colocated (verl's hybrid engine)", label="architecture"),
        "model": mo.ui.dropdown(options=["qwen2.5-1.5b", "qwen2.5-7b", "llama-3-8b", "qwen2.5-32b", "llama-3-70b"],
                                value="llama-3-8b", label="model (published config numbers)"),
        "cluster": mo.ui.dropdown(options=list(CLUSTERS), value="8 × H100-80GB", label="cluster"),
        "algo": mo.ui.dropdown(options=["grpo", "ppo"], value="grpo", label="algorithm"),
    })
    controls.vstack()  # the panel's controls, one per line (their values stay in `controls`)
    return CLUSTERS, controls


@app.cell
def _(CLUSTERS, controls):
    from posttrain.systems.hardware import DEVICES, Cluster
    from posttrain.systems.placement import ARCHITECTURES, place
    from posttrain.systems.plan import JobSettings
    from posttrain.systems.shapes import PRESETS
    from posttrain.systems.throughput import Workload

    WORKLOAD = Workload(prompts=64, samples_per_prompt=8, prompt_tokens=512, mean_response_tokens=1024)
    architecture, model = controls.value["architecture"], controls.value["model"]
    _device, _gpus = CLUSTERS[controls.value["cluster"]]
    cluster = Cluster(DEVICES[_device], _gpus)
    job = JobSettings(algo=controls.value["algo"])
    placements = {a: place(a, PRESETS[model], cluster, job, WORKLOAD) for a in ARCHITECTURES}
    placement = placements[architecture]
    return architecture, cluster, job, model, placement, placements


@app.cell
def _(architecture, cluster, job, mo, model, placement, placements):
    from posttrain.systems.hardware import GB

    def _pool_table(pool):
        m = pool.memory
        rows = "".join(f"| {c.role} | {c.parameters / 1e9:.2f}B | {'yes' if c.trained else 'no'} | "
                       f"{c.bytes_per_gpu / GB:.1f} |\n" for c in m.copies)
        if m.activation_bytes:
            rows += f"| activations (one row, checkpointed) | | | {m.activation_bytes / GB:.1f} |\n"
        if m.kv_cache_bytes:
            rows += f"| KV cache (paged, every row at full length) | | | {m.kv_cache_bytes / GB:.1f} |\n"
        verdict = ("fits" if pool.fit.fits else "**does not fit**")
        return (f"**{pool.name}: {pool.gpus} GPUs** — {m.total_bytes / GB:.1f} of {pool.fit.usable_bytes / GB:.0f} GB "
                f"usable per GPU: {verdict}\n\n| copy | parameters | trained | GB per GPU |\n|:---|---:|:---|---:|\n{rows}")

    _paths = "".join(f"| {p.name} | {p.source} → {p.destination} | {p.wire} | {p.bytes / GB:,.3f} | "
                     f"{p.seconds * 1e3:,.1f} |\n" for p in placement.paths)
    _times = " · ".join(f"{role} {s:.1f} s" for role, s in placement.times.as_dict().items())
    _compare = "".join(f"| {a} | {'yes' if all(p.fit.fits for p in pl.pools) else 'no'} | {pl.step_seconds:.1f} | "
                       f"{pl.max_staleness} |\n" for a, pl in placements.items())
    _compose = "the longer of the rollout and the trainer side" if architecture == "async" else "the sum of the five"
    mo.md(
        f"""
    ### {job.algo.upper()} on {model}, {cluster.describe()}, {architecture}

    #### Where each copy lives

    {"".join(_pool_table(p) + chr(10) for p in placement.pools)}
    #### Which path each byte takes (per step; collectives per trainer GPU)

    | path | from → to | wire | GB | ms at the wire's bandwidth |
    |:---|:---|:---|---:|---:|
    {_paths}
    #### What the step costs

    {_times}: the step is {_compose}, **{placement.step_seconds:.1f} s**.

    | architecture | everything fits | seconds a step | staleness |
    |:---|:---|---:|---:|
    {_compare}
    """
    )
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The correctness traps

    Performance bugs announce themselves in a profile. Correctness bugs in RL do not: the run
    trains, the reward moves, and the numbers are quietly wrong. The ones a senior engineer
    checks first, and where posttrain checks them:

    1. **`old_logp` from the sampling logits**, at sampling time, at the sampling temperature
       — not recomputed later by weights that have moved (`posttrain/roles/engines/torch_engine.py`; the
       parity test in `tests/test_rollout.py`; lesson 02).
    2. **The sampler's kernels are not the trainer's**: bf16, int8 or a fused attention make
       log π_sampler ≠ log π_trainer (lesson 25; `posttrain/roles/mismatch.py`'s
       `MismatchCorrection` measures and corrects it every step).
    3. **Weight versions**: every episode carries the version that sampled it, and a batch
       staler than allowed is an error, not a warning (`staleness_stats`).
    4. **A resume must push the weights** to the engine, or it samples from the pre-resume
       policy (`Controller.load_state_dict` in `posttrain/roles/controller.py`; lesson 06).
    5. **Masks**: prompt, padding and tool output never reach the loss, even when they hold
       NaN (lesson 08).
    6. **The same prompt tokens** in the sampler and the trainer: one `encode_prompt` for
       sampling, SFT and preference pairs (`posttrain/roles/engines/contract.py`).
    7. **Reproducible draws across topologies**: the rollout shard, not the worker, owns a
       seed, so two workers draw what one process draws (`tests/test_distributed.py`), and a
       killed worker loses no episode (`tests/test_distributed_faults.py`).

    ## The whiteboard question

    *"You have 64 H100s and a 70B model to train with GRPO on math, answers of about a
    thousand tokens. Draw the system: where each copy lives, what crosses which wire each step,
    how long a step takes, and what you would fix first."* Set the panel to llama-3-70b on
    64 H100s and answer it: colocated, every GPU holds a 1/64 share of the policy's training
    state and the reference, a tensor-parallel slice of the engine and its KV cache; the
    biggest traffic is the trainer's own collectives, not the weight sync; and the step is
    nearly all decode waiting for the longest answers — which no number of GPUs shortens
    (lessons 22b and 28 say what does).

    ## Find the knob that breaks it

    * **PPO, disaggregated, llama-3-8b on 8 H100s.** Colocated it fits (69.5 of 72 GB a GPU).
      Split the cluster in half and the trainer pool's 4 GPUs each hold twice the share of the
      policy's *and the critic's* training state: 76.7 GB, over the limit. Disaggregation is
      not free memory: every copy that trains is sharded over fewer GPUs.
    * **llama-3-70b on 8 H100s.** Nothing fits in any architecture: 70B × 16 bytes of training
      state is 1.1 TB before activations, 141 GB per GPU even sharded eight ways; no ZeRO stage
      helps, and `posttrain systems --model llama-3-70b --gpus 8 --gpu h100-80gb` answers "add
      GPUs".
    * **More GPUs for llama-3-8b: 8 → 64.** Colocated, the step only drops from 76 to 62 s: the
      training terms shrink 8×, the rollout hardly at all, because each engine still waits for
      its longest answer.

    ## Source files used here

    * `posttrain/systems/placement.py` — `place`: pools, copies, the four paths, the step
    * `posttrain/systems/plan.py` — `job_memory`, `engine_tensor_parallel`: what each pool holds
    * `posttrain/systems/rl_memory.py` — the copies of PPO and GRPO, and whether they fit
    * `posttrain/systems/gantt.py` — `weight_sync`, the weights path's four operations
    * `posttrain/systems/throughput.py` — the five terms per pool, summed or maxed
    * `posttrain/distributed/rollout_workers.py`, `posttrain/distributed/async_rollout.py` — our sync and async topologies

    ## Exercises

    1. For GRPO on qwen2.5-7b with 8 A100-40GB, which architecture fits? Why does the other
       one not, when the same copies are stored?
    2. The collectives path carries more bytes than the weights path in these placements. Why does
       weight sync still get more engineering attention in RL systems? (Hint: which of the two
       can overlap with compute, and which sits between two roles?)
    3. Code: `exercises/24_copies.py` asks for the per-GPU bytes of GRPO's three copies under
       ZeRO; run `posttrain check 24`.

    Previous: [23 · Famous recipes and failure modes](?file=23_recipes_and_failure_modes.py).
    Next: [25 · Kernels for RL](?file=25_kernels_for_rl.py).
    """)
    return


if __name__ == "__main__":
    app.run()
