"""Lesson 04 · The algorithm plug-in: two functions every RL algorithm fills in."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import dataclasses

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return dataclasses, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 04 · The algorithm plug-in

    ## Why a contract

    REINFORCE, PPO, GRPO, RLOO, DAPO, Dr. GRPO... the papers read as if each were a new system.
    They are not: the rollout, the verifier, the reference and the trainer stay the same, and
    what changes is (1) how a reward becomes a per-token **advantage** and (2) which **loss**
    turns advantages into a gradient. So `posttrain` pins exactly those two things down as a
    contract (`posttrain/algorithms/core.py`):

    ```python
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))   # controller, once per batch
    loss, metrics = algo.compute_loss(outputs, batch)                      # trainer, per minibatch
    loss.backward()
    ```

    `compute_advantages` returns at least `{"advantages": (B, T)}`, zero off the response, and
    runs without gradients: advantages are constants. `compute_loss` receives the trainer's
    differentiable `outputs.logp` (and entropy, and values if there is a critic) and returns a
    scalar plus metrics. Because every algorithm has this one shape, the registry is a plain dict,
    `ALGORITHMS` in `posttrain/algorithms/__init__.py`, and the trainer never asks which
    algorithm it is running — there is no `if name == "ppo"` anywhere.

    ## The key equation (the part they share)

    Most of the family uses one advantage per sequence, copied onto each of its tokens, and
    differs in the baseline and the scale. For the $K$ samples of one prompt with rewards $r_i$:

    $$
    \underbrace{A_i = r_i}_{\text{REINFORCE}} \qquad
    \underbrace{A_i = \tfrac{K}{K-1}\,(r_i - \bar r)}_{\text{RLOO}} \qquad
    \underbrace{A_i = \frac{r_i - \bar r}{\operatorname{std}(r) + \epsilon}}_{\text{GRPO}} \qquad
    \underbrace{A_i = r_i - \bar r}_{\text{Dr. GRPO}}
    $$

    The loss then weighs $\log\pi_\theta$ (or the ratio $\rho_t$, lesson 02) of each token by its
    advantage, and aggregates over tokens in a way that differs again (per-sequence mean, token
    mean, or a constant divisor). Lessons 09–14 derive each one; here you only see them side by
    side.

    Type a batch of rewards: numbers separated by commas, groups (prompts) separated by `|`.
    Each row gets a response of 3, 4 or 5 tokens (cycling), so length effects show.
    """)
    return


@app.cell
def _(mo):
    rewards_text = mo.ui.text(value="1, 0, 0, 1 | 0, 0, 0, 1", label="rewards (groups split by |)", full_width=True)
    rewards_text
    return (rewards_text,)


@app.cell
def _(rewards_text, torch):
    from posttrain.types import Episode, Example, RolloutBatch

    def parse_groups(text: str) -> list[list[float]]:
        groups = []
        for part in text.split("|"):
            values = [v.strip() for v in part.split(",") if v.strip()]
            if not values:
                raise ValueError(f"empty group in {text!r}: every group between '|' needs at least one reward")
            try:
                groups.append([float(v) for v in values])
            except ValueError:
                raise ValueError(f"not a number in group {part.strip()!r}; write rewards like '1, 0, 0.5'") from None
        return groups

    try:
        groups = parse_groups(rewards_text.value)
        parse_error = None
    except ValueError as err:
        groups, parse_error = [[1.0, 0.0, 0.0, 1.0]], str(err)

    _example = Example(prompt="Q: 2+2\n", expected_answer="4")
    _episodes, _row = [], 0
    for _g, _rs in enumerate(groups):
        for _r in _rs:
            _n = 3 + _row % 3  # response lengths 3, 4, 5, 3, ...
            _episodes.append(Episode(example=_example, group_id=_g, prompt_ids=[1, 53, 26, 5],
                                     response_ids=[20] * (_n - 1) + [2], response_logp=[-1.0] * _n, reward=_r))
            _row += 1
    batch = RolloutBatch.collate(_episodes, pad_id=0)
    # Stand-ins for the roles this lesson does not run: the reference equals the sampler
    # (KL 0), PPO's critic is untrained (V = 0 everywhere), and PRIME's implicit PRM has not
    # moved from the reference (every process reward 0: PRIME's advantages are RLOO's, whitened).
    # OPD's teacher agrees with the sampler on every token: its per-token advantages are all 0.
    batch.ref_logp = batch.old_logp.clone()
    batch.values = torch.zeros_like(batch.old_logp)
    batch.process_rewards = torch.zeros_like(batch.old_logp)
    batch.teacher_logp = batch.old_logp.clone()
    return batch, groups, parse_error


@app.cell
def _(batch, dataclasses, groups, mo, parse_error, torch):
    import html

    from posttrain.algorithms import ALGORITHMS, make_algorithm
    from posttrain.teach.widgets import BUDGET
    from posttrain.algorithms.core import zero_variance_group_fraction
    from posttrain.types import PolicyOutputs
    from posttrain.teach.tables import markdown_table

    _first = int(batch.response_mask.argmax(dim=1)[0])  # the first response column (prompts share a length)
    adv_cols, push_cols, traits = {}, {}, {}
    for _name in ALGORITHMS:
        _algo = make_algorithm(_name, budget=BUDGET)  # every default, as each paper sets it
        _scored = dataclasses.replace(batch, **_algo.compute_advantages(batch))
        adv_cols[_name] = _scored.advantages[:, _first]  # (B,)
        # The loss at θ = θ_old (ratio 1): what the gradient does to each row's log-probs.
        _logp = batch.old_logp.clone().requires_grad_(True)
        _outputs = PolicyOutputs(logp=_logp, entropy=torch.zeros_like(_logp),
                                 values=torch.zeros_like(_logp) if _algo.uses_critic else None)
        _loss, _metrics = _algo.compute_loss(_outputs, _scored)
        _loss.backward()
        push_cols[_name] = -(_logp.grad * batch.response_mask).sum(dim=1)  # (B,) > 0: made more likely
        traits[_name] = (_algo.uses_reference, _algo.uses_critic, len(_metrics))

    _names = list(ALGORITHMS)
    _lengths = batch.response_lengths().int().tolist()

    def _table(cols, fmt):
        return markdown_table(
            ["row", "group", "reward", "tokens", *_names],
            [[b, int(batch.group_ids[b]), f"{batch.rewards[b]:g}", _lengths[b],
              *(fmt.format(cols[n][b].item()) for n in _names)] for b in range(batch.batch_size)])

    _traits = "".join(f"| `{n}` | {ref} | {critic} | {k} |\n" for n, (ref, critic, k) in traits.items())
    _warn = f"**Could not read the rewards:** {html.escape(parse_error)} (showing `1, 0, 0, 1` instead)\n\n" if parse_error else ""
    mo.md(
        _warn
        + f"""
    {len(groups)} group(s), {batch.batch_size} rows; fraction of groups whose rewards are all
    equal: **{zero_variance_group_fraction(batch.rewards, batch.group_ids):.2f}**.

    ### Advantage of each row (first response token), from `compute_advantages`

    {_table(adv_cols, "{:+.3f}")}

    ### Push on each row, −Σ_t ∂loss/∂log π, from `compute_loss` at ratio 1

    Positive: the trainer's step makes that completion more likely. The size includes each
    algorithm's aggregation over tokens, so row length now matters.

    {_table(push_cols, "{:+.3f}")}

    ### The same two functions, whatever is inside

    | algorithm | needs reference | needs critic | metrics logged |
    |:---|:---|:---|---:|
    {_traits}
    """
    )
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **All rewards equal** (`1, 1, 1, 1`): every algorithm with a group baseline gives advantage
      0 and pushes nothing; the group was wasted compute. REINFORCE without a baseline still
      pushes every row up, correct or not. This is the zero-variance group DAPO's dynamic sampling
      throws away (lesson 13).
    * **One outlier** (`100, 0, 0, 0`): REINFORCE's and Dr. GRPO's push grows with the reward's
      scale; GRPO's division by the group std brings it back to the same size as `1, 0, 0, 0`.
      Good if reward scales are arbitrary, bad if a small difference gets blown up: try
      `0.51, 0.5, 0.5, 0.5`.
    * **A group of one** (`1 | 0, 1`): a single sample is its own baseline, advantage 0.
    * PPO's column differs in kind: its advantages come from an untrained critic (V = 0) and are
      whitened over all tokens of the batch, so even its per-token values depend on lengths.

    ## Source files used here

    * `posttrain/algorithms/core.py` — the `Algorithm` contract, `agg_loss`, `clipped_surrogate`
    * `posttrain/algorithms/__init__.py` — `ALGORITHMS`, `make_algorithm`
    * `posttrain/algorithms/grpo.py` — `group_advantages`, GRPO's loss
    * `posttrain/algorithms/dr_grpo.py` — GRPO with two divisors deleted
    * `posttrain/algorithms/rloo.py`, `posttrain/algorithms/reinforce.py`, `posttrain/algorithms/ppo.py`
    * `posttrain/roles/controller.py` — where `compute_advantages` is called, once per batch
    * `posttrain/roles/trainer.py` — where `compute_loss` is called, per minibatch

    ## Exercises

    1. With `1, 0, 0, 0`, verify GRPO's and RLOO's advantages by hand (unbiased std, K/(K−1)).
    2. Why do GRPO's and GSPO's advantage columns agree while their push columns can differ?
       Read `posttrain/algorithms/gspo.py` for the answer.
    3. Find rewards for which GRPO's and Dr. GRPO's pushes have *different signs* on some row — or
       argue that none exist.
    4. Code: `exercises/04_advantages.py` asks you to write `compute_advantages` for a group-mean
       baseline, the first half of the contract; run `posttrain check 04`. The stub lives outside
       the library, so the library's own tests stay green while you work on it.

    Next: [05 · Trainer](?file=05_trainer.py).
    """)
    return


if __name__ == "__main__":
    app.run()
