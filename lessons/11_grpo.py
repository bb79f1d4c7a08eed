"""Lesson 11 · GRPO: drop the critic, use the group as the baseline."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import itertools

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return itertools, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 11 · GRPO: drop the critic

    ## Why a group instead of a critic

    PPO's baseline is a learned critic $V_\phi$, in production a second network as large as the
    policy, with its own optimizer state, its own forward and backward pass, and its own ways to
    be wrong (a bad critic gives bad advantages for every token). For a verifier that pays once
    at the end of a completion, there is a cheaper estimate of "how good was this prompt's
    situation": **sample K completions of the same prompt and use their average**. Rollout
    already samples K per prompt (lesson 02); the baseline costs nothing extra.

    ## The key equation

    $$
    A_i = \frac{r_i - \operatorname{mean}(r_1..r_K)}{\operatorname{std}(r_1..r_K) + \epsilon}
    \quad\text{copied onto every token of } y_i,
    \qquad
    \mathcal{L} = -\frac{1}{K}\sum_i \frac{1}{|y_i|}\sum_t \min\big(\rho_{i,t}A_i,\ \operatorname{clip}(\rho_{i,t})A_i\big) + \beta\,\mathrm{KL}
    $$

    Everything after the advantage is PPO's clipped surrogate (lesson 10). Two consequences of
    the group are worth seeing with numbers:

    * **A group whose K rewards are equal teaches nothing**: every $A_i = 0$. With a small K or a
      prompt that is nearly always right (or wrong), that is most groups.
    * **The O(1/K) bias.** The mean includes $r_i$ itself, so $A_i$ partly rewards $y_i$ for its
      *own* reward relative to a baseline it moved. Without the std (Dr. GRPO's form), the
      expected gradient is exactly $\tfrac{K-1}{K}$ of the true one: a shrink, not a wrong
      direction. With the std the scale also depends on the prompt's difficulty (lesson 14).

    The slider sets the group size K. Everything is computed by `posttrain.algorithms`.
    """)
    return


@app.cell
def _(mo):
    K_slider = mo.ui.slider(start=1, stop=8, step=1, value=4, label="group size K (samples per prompt)",
                            show_value=True)
    K_slider
    return (K_slider,)


@app.cell
def _(K_slider):
    from posttrain.teach.widgets import family_comparison, family_markdown, synthetic_batch

    K = K_slider.value
    # Two prompts' samples as (reward, response length), taken in order: the first K of each.
    STREAMS = [
        [(1, 6), (0, 14), (0, 9), (1, 5), (0, 11), (0, 7), (1, 8), (0, 12)],  # a medium prompt
        [(0, 10), (0, 13), (0, 9), (0, 12), (1, 7), (0, 15), (0, 8), (0, 11)],  # a hard prompt
    ]
    batch = synthetic_batch([s[:K] for s in STREAMS])
    results = family_comparison(batch)
    table = family_markdown(batch, results, focus="grpo")
    return K, batch, results, table


@app.cell
def _(K, itertools, torch):
    from posttrain.algorithms.core import zero_variance_group_fraction
    from posttrain.algorithms.grpo import group_advantages
    from posttrain.algorithms.rloo import leave_one_out_baseline

    # Exact expected gradient on a two-armed "prompt": arm 0 is right (r = 1), arm 1 wrong.
    # Enumerate all 2^K groups of K samples, weigh each by its probability, and average
    # Σ_i A_i ∇_θ log π(a_i) / K with each algorithm's advantages (θ = the two logits).
    pi = torch.tensor([0.3, 0.7])  # the policy is usually wrong on this prompt
    arm_reward = torch.tensor([1.0, 0.0])
    true_grad = (pi[0] * (1 - pi[0])).item()  # d/dθ_0 of E[r] = π_0 for a softmax over two logits

    def bias_at(k: int) -> dict[str, float]:
        """Each advantage's exact expected gradient on the right answer's logit, groups of k."""
        groups = torch.tensor(list(itertools.product([0, 1], repeat=k)))  # (2^k, k) arms
        prob = pi[groups].prod(dim=1)  # (2^k,)
        rewards = arm_reward[groups].reshape(-1)  # (2^k · k,)
        ids = torch.arange(len(groups)).repeat_interleave(k)  # each enumerated group its own id
        score = torch.nn.functional.one_hot(groups, 2).float() - pi  # (2^k, k, 2) ∇ log π(a)

        def expected_grad(adv):
            per_group = (adv.view(len(groups), k, 1) * score).mean(dim=1)  # (2^k, 2)
            return (prob[:, None] * per_group).sum(dim=0)[0].item()  # d/dθ_0, the right arm

        return {
            "GRPO (mean and std)": expected_grad(group_advantages(rewards, ids, "group", 1e-6)),
            "GRPO mean only (= Dr. GRPO)": expected_grad(group_advantages(rewards, ids, "none", 1e-6)),
            "RLOO (leave one out)": expected_grad(rewards - leave_one_out_baseline(rewards, ids)),
        }

    def zero_variance_at(k: int) -> float:
        """How often is a group uninformative? 4000 prompts with pass rates spread over [0, 1]."""
        gen = torch.Generator().manual_seed(0)
        p = torch.rand(4000, generator=gen).repeat_interleave(k)
        r = (torch.rand(4000 * k, generator=gen) < p).float()
        return zero_variance_group_fraction(r, torch.arange(4000).repeat_interleave(k))

    bias_rows, zero_var = bias_at(K), zero_variance_at(K)
    # the same two computations at every group size the slider offers, for the chart
    GROUP_SIZES = list(range(1, 9))
    bias_by_k = [bias_at(k) for k in GROUP_SIZES]
    zero_var_by_k = [zero_variance_at(k) for k in GROUP_SIZES]
    return GROUP_SIZES, bias_by_k, bias_rows, pi, true_grad, zero_var, zero_var_by_k


@app.cell
def _(K, bias_rows, mo, pi, table, true_grad, zero_var):
    from posttrain.teach.tables import markdown_table

    _bias = markdown_table(["advantage", "expected gradient", "÷ true gradient"],
                           [[name, f"{g:+.4f}", f"{g / true_grad:.3f}"] for name, g in bias_rows.items()])
    mo.md(
        f"""
    ### K = {K}: the same batch through the family

    Two prompts, the first {K} samples of each. Bold cells differ from GRPO's.

    {table}

    ### How often a group says nothing

    Over 4000 prompts with pass rates spread evenly over [0, 1], the fraction of groups whose
    K = {K} rewards are all equal (advantage 0 for every sample, zero gradient): **{zero_var:.2f}**.

    ### The bias, exactly (all 2^{K} groups enumerated)

    A prompt the policy gets right with probability {pi[0]:.1f}. True gradient on the right
    answer's logit: {true_grad:+.4f}.

    {_bias}
    """
    )
    return


@app.cell
def _(GROUP_SIZES, K, bias_by_k, mo, true_grad, zero_var_by_k):
    from posttrain.teach.charts import curves, figure, finish, mark

    bias_fig, _ax = figure(width=3.9, height=2.9)
    curves(_ax, GROUP_SIZES, {name: [row[name] / true_grad for row in bias_by_k] for name in bias_by_k[0]},
           markers=True)
    mark(_ax, K, f"K = {K}")
    finish(bias_fig, _ax, "group size K (samples per prompt)", "expected ÷ true gradient",
           title="The bias: mean-only is (K − 1)/K")
    _ax.get_legend().set_frame_on(True)  # a white box: the mark at K runs behind the legend's text
    zero_fig, _ax2 = figure(width=3.6, height=2.9)
    curves(_ax2, GROUP_SIZES, {"groups with all rewards equal": zero_var_by_k}, markers=True)
    mark(_ax2, K, f"K = {K}")
    finish(zero_fig, _ax2, "group size K (samples per prompt)", "share of groups (fraction)",
           title="Groups that teach nothing", legend=False)
    mo.hstack([bias_fig, zero_fig], justify="start")
    return bias_fig, zero_fig


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **K = 1.** Each sample is its own group; its mean is its own reward, so every advantage is
      exactly 0 and every push is 0 (DAPO, which drops such groups, is left with nothing). GRPO
      with one sample per prompt does not train at all — no error, no warning, just a flat
      reward curve. The zero-variance fraction reads 1.00.
    * **K = 2.** Half or more of all groups are uninformative, and the hard prompt's group
      usually is (both wrong). The expected-gradient table shows the mean-only estimator at
      exactly (K−1)/K = 0.5 of the true gradient.
    * Larger K shrinks both problems; the price is K times the rollout compute per prompt.
    """)
    return


@app.cell
def _(mo):
    from posttrain.models.value_head import ValueHead as _ValueHead
    from posttrain.systems.memory import MIXED_ADAMW as _MIXED_ADAMW
    from posttrain.systems.rl_memory import rl_memory as _rl_memory
    from posttrain.systems.shapes import PRESETS as _PRESETS
    from posttrain.systems.shapes import parameter_count as _parameter_count
    from posttrain.teach.sampler_mismatch import make_run_policy as _make_run_policy
    from posttrain.teach.tables import markdown_table as _markdown_table

    # the "four copies" of PPO-based RLHF against GRPO with a verifier, per GPU on one GPU, in
    # mixed precision (bf16 weights and gradients, fp32 master and Adam moments: 16 bytes a
    # trained parameter, 2 a frozen one; lesson 22)
    _model = "llama-3-8b"  # every copy scales with the policy's size, so the share saved is any model's
    _shape = _PRESETS[_model]
    _n_params = _parameter_count(_shape)
    ppo_memory = _rl_memory("ppo", _n_params, _MIXED_ADAMW)
    grpo_memory = _rl_memory("grpo", _n_params, _MIXED_ADAMW)
    critic_saving = 1 - grpo_memory.total_bytes / ppo_memory.total_bytes
    _rows = {copy.role: [f"{copy.bytes_per_gpu / 1e9:,.1f}", "—"] for copy in ppo_memory.copies}
    for _copy in grpo_memory.copies:
        _rows[_copy.role][1] = f"{_copy.bytes_per_gpu / 1e9:,.1f}"
    _table = _markdown_table(["copy", "PPO (GB)", "GRPO (GB)"],
                            [[role, *cells] for role, cells in _rows.items()]
                            + [["total", f"{ppo_memory.total_bytes / 1e9:,.1f}", f"{grpo_memory.total_bytes / 1e9:,.1f}"]])
    # posttrain's own PPO shares the policy's trunk: its critic is one linear layer (value_head.py)
    _policy, _ = _make_run_policy()
    head_params = sum(p.numel() for p in _ValueHead(_policy.config.dim).parameters())
    policy_params = sum(p.numel() for p in _policy.parameters())
    mo.md(f"""
    ## What GRPO saves

    No critic: no second network, no value loss, no GAE. With the separate critic of PPO-based
    RLHF (as large as the policy, and trained: weights, gradients and AdamW state), dropping it
    and the learned reward model for a verifier takes **{_model}**'s job from
    {ppo_memory.total_bytes / 1e9:,.1f} GB to {grpo_memory.total_bytes / 1e9:,.1f} GB unsharded,
    **{critic_saving:.0%} less** (`posttrain/systems/rl_memory.py::rl_memory`, activations and the
    KV cache left out, the same for both):

    {_table}

    The critic alone is the largest piece after the policy: a trained copy costs 16 bytes a
    parameter where a frozen one costs 2. In `posttrain` PPO's critic is a single linear layer on
    the shared trunk (`posttrain/models/value_head.py`): {head_params:,} parameters beside
    make run's gpt_mini's {policy_params:,}, {head_params / policy_params:.2%}, so the saving there
    is nothing; the shared trunk is the laptop's way around the second model.
    """)
    return critic_saving, grpo_memory, head_params, policy_params, ppo_memory


@app.cell
def _(mo):
    mo.md(r"""
    ## Source files used here

    * `posttrain/algorithms/grpo.py` — `group_advantages`, `GRPO.compute_loss`
    * `posttrain/algorithms/core.py` — `group_mean_std`, `zero_variance_group_fraction`, `clipped_surrogate`
    * `posttrain/algorithms/rloo.py` — `leave_one_out_baseline` (for the bias table)
    * `posttrain/teach/widgets.py` — `synthetic_batch`, `family_comparison`, `family_markdown`
    * `posttrain/systems/rl_memory.py` — `rl_memory` (the copies each algorithm holds)
    * `tests/test_grpo.py` — numbers worked by hand, and the shift invariance

    ## Exercises

    1. Shift every reward of a group by +10. Which columns of the table change? (Try it in the
       editor: `posttrain lessons 11 --edit`.) `tests/test_grpo.py` has this as a test.
    2. Why is the mean-only bias exactly (K−1)/K? Write $A_i = r_i - \frac1K\sum_j r_j$ and take
       the expectation of the $j = i$ term separately.
    3. Code: `exercises/11_grpo.py` asks for GRPO's group advantages; run `posttrain check 11`.

    Next: [12 · RLOO](?file=12_rloo.py).
    """)
    return


if __name__ == "__main__":
    app.run()
