"""Lesson 02 · Rollout: sampling K completions, and why old_logp is recorded right then."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import copy

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return copy, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 02 · Rollout: sampling and π_old

    ## What a rollout is

    A language model does not emit a completion in one go. It emits one token, appends it,
    and is asked again: a completion of $n$ tokens is $n$ decisions, each drawn from
    $\pi_\theta(\cdot \mid \text{prompt}, \text{tokens so far})$. The *rollout* role turns prompts
    into such sampled sequences. Three facts about it shape everything after:

    1. **It samples K completions per prompt**, not one. Comparing siblings of the same prompt is
       how GRPO gets a baseline for free (lesson 11), and a group whose K samples all score the
       same teaches nothing.
    2. **It is where the exploration knob lives.** The temperature $\tau$ divides the logits
       before the softmax: $\tau \to 0$ is greedy (always the top token), large $\tau$ flattens
       the distribution toward uniform.
    3. **It records `old_logp`**, the log-probability of every sampled token *under the
       distribution that sampled it*, at the moment it was sampled.

    ## Why `old_logp` must be captured at sampling time

    The update step compares the current policy with the one that produced the data, token by token:

    $$
    \rho_t(\theta) \;=\; \frac{\pi_\theta(y_t \mid x, y_{<t})}{\pi_{\text{old}}(y_t \mid x, y_{<t})}
    \;=\; \exp\big(\log\pi_\theta(y_t\mid\cdot) - \texttt{old\_logp}_t\big).
    $$

    Before any update this ratio must be exactly 1; PPO's clip (lesson 10) then limits how far it
    may move. If `old_logp` were recomputed later, by weights that had already changed, or with a
    different temperature, the "1" would silently be something else and every clip decision would
    be wrong. So `RolloutEngine.generate` keeps the log-prob from the same logits that chose the
    token, and the test suite checks that it equals a fresh teacher-forced pass.

    Below, a tiny `gpt_mini` (dim 32, two layers, ~33k parameters) is first taught the answer
    format with 100 quick SFT steps (about 3 seconds), so that its samples look like answers. Then the slider sets
    the sampling temperature.
    """)
    return


@app.cell
def _(mo):
    from posttrain.roles.trainer import Trainer
    from posttrain.teach.widgets import tiny_policy
    from posttrain.types import RolloutBatch

    # level-1 arithmetic ("Q: 3+4\n" -> "Final: 7", scored by final_int/strict-v1) taught by 100
    # steps of the real SFT path (Trainer + sft_loss): the same policy lessons 05-07 and 16 start from
    with mo.status.spinner(title="Teaching a tiny policy the answer format (100 SFT steps, a few seconds)…"):
        model, tok, env, sft_losses = tiny_policy(sft_steps=100)
    prompt = env.fixed_set("heldout", 1, seed=0)[0]
    return RolloutBatch, Trainer, env, model, prompt, sft_losses, tok


@app.cell
def _(mo, model, prompt, sft_losses):
    mo.md(
        f"""
    SFT: {model.num_params():,} parameters, loss {sft_losses[0]:.2f} → {sft_losses[-1]:.2f} in
    100 steps. The prompt for the rest of the lesson is `{prompt.prompt!r}` (expected answer
    {prompt.expected_answer}, a held-out problem the model never trained on).
    """
    )
    return


@app.cell
def _(mo):
    temperature = mo.ui.slider(start=0.0, stop=3.0, step=0.1, value=1.0, label="sampling temperature τ", show_value=True)
    temperature
    return (temperature,)


@app.cell
def _(RolloutBatch, copy, env, mo, model, prompt, temperature, tok, torch):
    from posttrain.models.logprobs import token_logp
    from posttrain.roles.environment import score_episodes
    from posttrain.roles.engines import make_engine
    from posttrain.config import SamplingParams

    K = 6
    # The engine holds its own copy of the policy, as in a real run (weights reach it by sync).
    with mo.status.spinner(title=f"Sampling {K} answers at temperature {temperature.value:g}…"):
        engine = make_engine(
            copy.deepcopy(model), tok,
            SamplingParams(temperature=temperature.value, max_new_tokens=12, stop_at_newline=True),
        )
        episodes = score_episodes(env.score, engine.generate([prompt], samples_per_prompt=K, generator=torch.Generator().manual_seed(1)))
    # τ = 0 is greedy: its log-probs are those of the untempered (τ = 1) distribution
    batch = RolloutBatch.collate(episodes, tok.pad_id, temperature=temperature.value or 1.0)
    with torch.no_grad():
        _logits = model(batch.tokens)  # (B, T, V): one teacher-forced pass, no cache
        tf_logp = token_logp(_logits, batch.tokens, batch.temperature)  # (B, T)
        tf_logp_tau1 = token_logp(_logits, batch.tokens, 1.0)  # the bug: trainer ignores τ
    _on = batch.response_mask.bool()
    gap = (tf_logp - batch.old_logp)[_on].abs().max().item()
    gap_wrong_tau = (tf_logp_tau1 - batch.old_logp)[_on].abs().max().item()
    return K, batch, episodes, gap, gap_wrong_tau, tf_logp, tf_logp_tau1


@app.cell
def _(K, batch, episodes, gap, gap_wrong_tau, mo, temperature, tf_logp, tf_logp_tau1, tok, torch):
    import html

    from posttrain.teach.demos.tokens import show

    def code(text: str) -> str:
        """Text as inline code a markdown table cannot misread: whitespace made visible
        (␣ space, ⏎ newline), HTML escaped, and "|" kept out of the table syntax."""
        return "<code>" + html.escape(show(text)).replace("|", "&#124;") + "</code>"

    _rows = "".join(
        f"| {i} | {code(e.completion)} | {len(e.response_ids)} | {e.reward:g} | {e.details['reason']} | {sum(e.response_logp):.2f} |\n"
        for i, e in enumerate(episodes)
    )
    _P = len(episodes[0].prompt_ids)
    _tok_rows = "".join(
        f"| {t} | {code(tok.decode([tid], skip_special_tokens=False))} | {batch.old_logp[0, _P + t]:.4f} | "
        f"{tf_logp[0, _P + t]:.4f} | {tf_logp_tau1[0, _P + t]:.4f} | {torch.exp(batch.old_logp[0, _P + t]):.3f} |\n"
        for t, tid in enumerate(episodes[0].response_ids)
    )
    _ratio_range = torch.exp(tf_logp_tau1 - batch.old_logp)[batch.response_mask.bool()]
    mo.md(
        f"""
    ### K = {K} samples at τ = {temperature.value:.1f}

    | # | completion | tokens | reward | reason | Σ old_logp |
    |---:|:---|---:|---:|:---|---:|
    {_rows}
    {len(set(e.completion for e in episodes))} distinct completions out of {K}.

    ### Sample 0, token by token

    | t | token | old_logp (at sampling) | teacher-forced, same τ | teacher-forced, τ = 1 | π_old(token) |
    |---:|:---|---:|---:|---:|---:|
    {_tok_rows}
    Largest |teacher-forced − old_logp| over all {int(batch.response_mask.sum())} response tokens:
    **{gap:.1e}** with the sampling temperature — floating-point noise, so ρ = 1 before the update.
    If the trainer forgot τ: **{gap_wrong_tau:.3f}**, i.e. ratios from {_ratio_range.min():.3f} to
    {_ratio_range.max():.3f} before a single weight moved.
    """
    )
    return


@app.cell
def _(batch, temperature, tf_logp, tf_logp_tau1, torch):
    from posttrain.teach.charts import REFERENCE, curves, figure, finish

    # ρ = π_θ / π_old for every response token of the K samples, before any update: what the
    # first step's clip would see if the trainer scored them with, and without, the temperature
    _on = batch.response_mask.bool()
    _ratio_same_tau = torch.exp(tf_logp - batch.old_logp)[_on]  # (n tokens,)
    _ratio_tau1 = torch.exp(tf_logp_tau1 - batch.old_logp)[_on]  # (n tokens,)
    _fig, _ax = figure()
    curves(_ax, list(range(1, len(_ratio_same_tau) + 1)),
           {f"trainer divides by τ = {temperature.value:.1f} (correct)": _ratio_same_tau.tolist(),
            "trainer forgets τ (the bug)": _ratio_tau1.tolist()}, markers=True)
    _ax.axhspan(0.8, 1.2, color=REFERENCE, alpha=0.12, label="PPO's clip range 1 ± 0.2")
    chart = finish(_fig, _ax, "response token (the K samples, one after another)", "ratio ρ before any update",
                   title=f"Before the first step ρ must be 1: sampled at τ = {temperature.value:.1f}")
    chart
    return (chart,)


@app.cell
def _(Trainer, batch, copy, mo, model, torch):
    import dataclasses

    from posttrain.algorithms import make_algorithm
    from posttrain.algorithms.core import clipped_surrogate, zero_variance_group_fraction

    grpo = make_algorithm("grpo")
    scored = dataclasses.replace(batch, **grpo.compute_advantages(batch))
    # One GRPO step on a copy of the policy, then measure the ratio the next step would see.
    _policy = copy.deepcopy(model).requires_grad_(True)
    with mo.status.spinner(title=f"One GRPO step at η = 1e-2 on {scored.batch_size} samples, then their ratios…"):
        _trainer = Trainer(_policy, lr=1e-2, total_steps=1)
        _metrics = _trainer.update(scored, grpo)
        with torch.no_grad():
            _after = _trainer.forward(scored)
            _, _clip = clipped_surrogate(_after.logp, scored.old_logp, scored.advantages, scored.response_mask, 0.2, 0.2)
    _adv = scored.advantages[:, len(batch.episodes[0].prompt_ids)]  # (B,) first response token
    mo.md(
        f"""
    ### The group, and one update

    Rewards {scored.rewards.tolist()} → GRPO advantages {[round(a, 2) for a in _adv.tolist()]};
    fraction of groups with zero reward variance: **{zero_variance_group_fraction(scored.rewards, scored.group_ids):.0f}**.

    After one GRPO step (lr 1e-2) on a copy of the policy, the same tokens have ratio
    π_θ / π_old with mean **{_clip['ratio_mean']:.3f}** and max **{_clip['ratio_max']:.3f}**;
    {100 * _clip['clipfrac']:.0f}% of tokens are already outside the clip range [0.8, 1.2]
    (approx KL(π_old ‖ π_θ) = {_clip['approx_kl']:.4f}). Those ratios are only meaningful because
    `old_logp` was frozen before the step.
    """
    )
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **τ = 0.** Every sample is the greedy completion, the six are identical, the group's
      rewards have zero variance, and every GRPO advantage is 0: the step does nothing. Greedy
      decoding is right for Loop A (a deterministic measurement) and useless for Loop C.
    * **τ = 3.** The distribution is nearly flat: the format falls apart and almost every reward
      is 0. Also zero variance, for the opposite reason.
    * **Any τ ≠ 1 with a trainer that ignores τ** (the last column of the token table): the ratio
      is not 1 before training starts. This is why `RolloutBatch` carries `temperature` and
      `token_logp` divides by it.

    ## Source files used here

    * `posttrain/roles/engines/torch_engine.py` — `RolloutEngine.generate`, `sample_next_token` (built by `make_engine`, `posttrain/roles/engines/__init__.py`)
    * `posttrain/algorithms/core.py` — `token_logp`, `clipped_surrogate`, `zero_variance_group_fraction`
    * `posttrain/types.py` — `Episode`, `RolloutBatch` (the `(B, T)` layout, `old_logp` alignment)
    * `posttrain/models/gpt_mini.py` — the decoder (its KV cache: `posttrain/models/kv_cache.py`)
    * `posttrain/roles/trainer.py` — `Trainer`, `sft_loss`
    * `posttrain/teach/widgets.py` — `tiny_policy`, the SFT steps that teach the answer format
    * `tests/test_rollout.py` — the sampling-time vs teacher-forced check, as a test

    ## Exercises

    1. Find the lowest τ at which the six samples are no longer all identical. What does that say
       about how peaked this little model already is?
    2. `sample_next_token` returns the log-prob *before* top-p truncation. Read its docstring and
       explain why the other choice would make the ratio ≠ 1 at the start.
    3. In the token table, which positions are nearly certain (π_old ≈ 1) and which are real
       decisions? Relate that to where the reward is won or lost.

    Next: [03 · Reward and reference](?file=03_reward_and_reference.py).
    """)
    return


if __name__ == "__main__":
    app.run()
