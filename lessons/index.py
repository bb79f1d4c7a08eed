"""The lessons of posttrain, in order: one line each, with a link.

Run it:  posttrain lessons            (every lesson, starting here; one lesson: posttrain lessons 02)
Headless: python lessons/index.py     (any lesson likewise: python lessons/02_rollout_and_pi_old.py)
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import marimo as mo
    from pathlib import Path

    # (file, title, one line); tests/test_lessons.py checks it names every lesson file here.
    LESSONS = [
        ("00_orientation.py", "Orientation",
         "a map of the course's five parts, the six roles, the three loops, and the question “which loop am I in?”"),
        ("01_what_is_post_training_rl.py", "What is post-training RL?",
         "why SFT is not enough, and how a reward becomes a gradient: REINFORCE on a bandit, baseline slider"),
        ("02_rollout_and_pi_old.py", "Rollout and π_old",
         "sample K completions from a tiny gpt_mini; old_logp captured at sampling equals a teacher-forced pass"),
        ("03_reward_and_reference.py", "Reward and reference",
         "the strict verifier's reward and reason code for any text, and the KL anchor to a frozen reference"),
        ("04_algorithm_plugin.py", "The algorithm plug-in",
         "compute_advantages and compute_loss: every registered algorithm on the same group of rewards"),
        ("05_trainer.py", "Trainer",
         "one forward, one backward, one step, with the loss as a callable: a learning-rate slider on real GRPO steps"),
        ("06_weight_sync.py", "Weight sync",
         "push the trainer's weights to the sampler every N steps, or never: staleness, ratio drift, clipfrac"),
        ("07_controller.py", "Controller",
         "step through one RL iteration with each role lit as it runs, and plant three real bugs in the loop"),
        ("08_agentic_tool_masking.py", "Agentic RL and tool masking",
         "a two-turn trajectory with a real sandboxed tool call: why tool output gets response_mask 0"),
        ("09_reinforce.py", "REINFORCE",
         "the score-function estimator, its noise, and what a baseline and a reward offset do to it"),
        ("10_ppo.py", "PPO",
         "the clip table: ratio × advantage sign → which branch is active and the gradient; GAE"),
        ("11_grpo.py", "GRPO",
         "the group as baseline: group size K, zero-variance groups, and the exact (K−1)/K bias"),
        ("12_rloo.py", "RLOO",
         "leave one out: each sample's baseline, the K/(K−1) identity, unbiased by enumeration"),
        ("13_dapo.py", "DAPO",
         "remove one of the four fixes and see exactly which numbers change on the same batch"),
        ("14_dr_grpo.py", "Dr. GRPO",
         "two divisors deleted: the length bias against a slider, and the std's difficulty bias"),
        ("15_rlhf.py", "RLHF",
         "train a Bradley–Terry reward model live, then optimise it exactly: proxy up, gold peaks, the KL anchor's two jobs"),
        ("16_dpo.py", "DPO and its family",
         "watch Z(x) cancel with real numbers; DPO, IPO, KTO, ORPO and SimPO on the same pairs, and when each wins"),
        ("17_prm_search.py", "Process rewards and search",
         "greedy, best-of-N (ORM, PRM), PRM beam search and MCTS at one token budget, with a reward model you can blur"),
        ("18_verifiers.py", "Environments and verifiers",
         "five verifier archetypes; a live reward hack against the hackable specs, proxy up while the gold falls"),
        ("18a_data_as_signal.py", "Data as a gradient-signal substrate",
         "p(1 − p): how many GRPO groups a pool can feed, what a pass-rate band and draw weights do, and the eight-stage data pipeline"),
        ("26_three_forces.py", "Why RL is shaping this way today",
         "signal, estimator, cost: a simulator whose corners recover R1, RLHF, DPO and Tülu 3, and a verifier that fools it"),
        ("27_missing_concepts.py", "Missing concepts",
         "twenty-two ideas this course does not develop, where each would go, the code for those posttrain has; "
         "off-policy correction, TRPO against PPO's clip, macro vs micro actions and state vs observation live"),
        ("19_system_topology.py", "System topology",
         "colocated or split, lockstep or async: a 7B GRPO step's idle GPU-seconds, memory per GPU and sync link"),
        ("20_kv_cache.py", "The KV cache and PagedAttention",
         "bytes per token by MHA/GQA/MQA, contiguous vs paged vs prefix tree, the bandwidth bound on decode, our sampler's cache"),
        ("21_scheduling_tricks.py", "Scheduling tricks",
         "continuous batching, prefix caching, chunked prefill, speculative decoding: gains that compose, and one that loses"),
        ("22_memory_and_throughput.py", "Memory and throughput math",
         "16 or 18 bytes a parameter and ZeRO's stages; the decode roofline and why long contexts never turn compute-bound"),
        ("22a_throughput_equation.py", "The throughput equation",
         "an RL step's five terms, summed or maxed by topology: which one binds, and where a speed-up pays"),
    ]
    # ---- lessons 22b, 22c, 24, 25, 28 (systems, part 2) ----
    LESSONS += [
        ("22b_long_tail_rollouts.py", "Long-tail rollouts",
         "a batch waits for its longest answer: the straggler tax, packing, a length cap, dynamic K, the int8 trap"),
        ("22c_async_pipelining.py", "Async pipelining and weight sync",
         "a Gantt chart of rollout, train and sync: the sum becomes a max, staleness, the freshness wall"),
        ("24_rl_infra_engineer.py", "The RL infra engineer",
         "three architectures on a real cluster: which GPU holds which copy, which wire each byte takes"),
        ("25_kernels_for_rl.py", "Kernels for RL",
         "six surfaces, paged attention first, and the silent bug: our sampler's log-probs against the trainer's"),
        ("28_bottlenecks.py", "Bottlenecks and how to find them",
         "the six-step playbook on two real runs, and an allocator that spends an optimization budget"),
    ]
    # ---- end of lessons 22b-28 ----
    LESSONS += [  # lesson 23 (Part IV)
        ("23_recipes_and_failure_modes.py", "Famous recipes and failure modes",
         "six published recipes on five axes (the o-series: known vs speculated), six recipe files to diff, a symptom map"),
    ]
    LESSONS.sort()  # by file name: 14 before 15 before 22a before 22b, whatever order the blocks were added in
    return LESSONS, Path, mo


@app.cell
def _(LESSONS, mo):
    # In `posttrain lessons` (marimo run on this folder) "?file=NAME" opens a sibling notebook.
    _rows = "".join(
        f"| {file.split('_')[0]} | [{title}](?file={file}) | {line} | `lessons/{file}` |\n"
        for file, title, line in LESSONS
    )
    mo.md(
        f"""
    # RL post-training, from first principles

    Interactive lessons on `posttrain`, a small library for RL post-training of language models
    on a CPU. Every widget calls the library's real code on real tensors; every lesson names the
    source files it used, so you can read what you just played with.

    | # | lesson | what you will do | file |
    |---:|:---|:---|:---|
    {_rows}
    Lessons 00–08 are the framework (the six roles around the loss); 09–14 are the algorithms,
    each a small patch on its predecessor; 15–18 are where the reward comes from when there is
    no rule (RLHF, DPO), how test-time search spends it, and how verifiers get hacked; 18a is the
    data those rewards are computed on, as a supply of gradient signal; 22b–22c take a step's
    time apart, 23 reads famous recipes on five axes and maps a sick run's symptoms to their
    monitors and lessons, 24–25 are the engineer's view (the architecture, the kernels);
    26–27 step back: the forces that shaped the field, and what the course leaves out; 28 is the
    playbook that ends the course. Read them in order; every lesson builds on the last. In each,
    find the setting that breaks things — the failures are the lesson.

    Most lessons end with a code exercise: a marked stub in `exercises/` (outside the library, so
    its tests stay green) that you fill in and check with `posttrain check 09`, which compares
    your function with the library's on several cases and says pass or fail, with a hint.

    Open one directly with `posttrain lessons 02`, or edit them with `posttrain lessons --edit`.
    Headless, every lesson also runs as a plain script: `python lessons/02_rollout_and_pi_old.py`.
    """
    )
    return


@app.cell
def _(mo):
    from posttrain.teach.diagrams import six_roles_svg, three_forces_svg

    mo.vstack([mo.md("**The map.** The six roles every RL post-training system has (hover one), and the three "
                     "forces every design answers to:"),
               mo.hstack([mo.Html(six_roles_svg()), mo.Html(three_forces_svg())], wrap=True)])
    return


@app.cell
def _(LESSONS, Path, mo):
    # A lesson file on disk that the table above forgot is a bug in this index: say so.
    _here = Path(mo.notebook_dir() or "lessons")
    _on_disk = sorted(p.name for p in _here.glob("[0-9][0-9]_*.py"))
    _missing = [f for f in _on_disk if f not in {f for f, _, _ in LESSONS}]
    mo.md(f"**Not yet listed above:** {', '.join(_missing)}") if _missing else None
    return


if __name__ == "__main__":
    app.run()
