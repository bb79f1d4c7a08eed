"""Lesson 27 · Missing concepts: what this curriculum does not develop, and where each would go."""

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
def _():
    # The map. Each concept: where it would slot in (after which lesson of the full series),
    # what it is, and where posttrain has it, as (file, name defined in it). Empty when
    # posttrain does not implement it. tests/test_lessons.py checks that every file exists
    # and defines the name.
    CONCEPTS = [
        {"concept": "PRM training", "after": "17",
         "what": "labelling steps (by hand, or by rolling out from each prefix and checking the end) and training "
                 "a model to score them",
         "code": [("posttrain/rewards/monte_carlo_labels.py", "monte_carlo_step_labels"),
                  ("posttrain/rewards/process_reward_model.py", "train_step_reward_model"),
                  ("posttrain/pipelines/prm.py", "run_prm")]},
        {"concept": "Reward-model internals", "after": "15",
         "what": "the scalar head on a language model, the margin, calibration, pairwise accuracy, and the length "
                 "bias a reward model learns",
         "code": [("posttrain/rewards/reward_model.py", "RewardModel"),
                  ("posttrain/rewards/reward_model.py", "pairwise_accuracy"),
                  ("posttrain/eval/calibration.py", "expected_calibration_error")]},
        {"concept": "RLAIF", "after": "16",
         "what": "a model, not a person, labels the preferences or scores the answers (constitutional AI, self-"
                 "critique)",
         "code": [("posttrain/rewards/judge.py", "Judge"),
                  ("posttrain/rewards/judge.py", "self_critique_rubric")]},
        {"concept": "GAE (λ-returns)", "after": "10",
         "what": "advantages as a λ-weighted sum of TD errors: λ = 0 trusts the critic, λ = 1 the Monte-Carlo "
                 "return",
         "code": [("posttrain/algorithms/ppo.py", "gae"),
                  ("posttrain/algorithms/ppo.py", "explained_variance")]},
        {"concept": "KL estimator choice", "after": "03",
         "what": "k1, k2 or k3 per token, in the reward or in the loss: which are unbiased, which never go "
                 "negative, which have a gradient that is the KL's",
         "code": [("posttrain/algorithms/core.py", "kl_estimate"),
                  ("posttrain/algorithms/reinforce_pp.py", "REWARD_KL_ESTIMATORS")]},
        {"concept": "Entropy regularisation", "after": "13",
         "what": "a bonus for the policy's entropy, and why RL for reasoning mostly watches entropy instead of "
                 "paying for it",
         "code": [("posttrain/algorithms/contract.py", "entropy_coef"),
                  ("posttrain/models/logprobs.py", "token_entropy")]},
        {"concept": "Off-policy correction", "after": "22c",
         "what": "importance weights π_trainer / π_sampler for rollouts from stale or differently-computed "
                 "weights, truncated so they cannot explode (the widget below)",
         "code": [("posttrain/roles/off_policy.py", "truncated_is_weights"),
                  ("posttrain/roles/mismatch.py", "MismatchCorrection")]},
        {"concept": "FP8", "after": "22b",
         "what": "8-bit floats for rollout (and training): twice the throughput, and a sampler whose log-probs "
                 "differ from the trainer's",
         "code": []},
        {"concept": "Mixture of experts", "after": "22",
         "what": "a router sends each token to a few experts: memory for all, compute for few, and routing that "
                 "must agree between sampler and trainer",
         "code": []},
        {"concept": "KV-cache offload", "after": "20",
         "what": "moving the KV cache of paused sequences to CPU memory, so long agentic rollouts fit",
         "code": []},
        {"concept": "Checkpointing and resume", "after": "24",
         "what": "saving policy, optimizer and data order so a run killed at step 900 continues as if it had not "
                 "been",
         "code": [("posttrain/runs/checkpoints.py", "save_checkpoint"),
                  ("posttrain/runs/checkpoints.py", "delete_and_resume")]},
        {"concept": "Multi-LoRA", "after": "22",
         "what": "many low-rank adapters over one frozen base, served and trained side by side",
         "code": [("posttrain/models/lora_checkpoint.py", "save_adapters")]},
        {"concept": "Implicit process rewards", "after": "17",
         "what": "token-level rewards from a model trained only on outcomes: log π_prm − log π_ref per token "
                 "(PRIME)",
         "code": [("posttrain/rewards/implicit_prm.py", "implicit_process_rewards"),
                  ("posttrain/algorithms/prime.py", "PRIME")]},
        {"concept": "Sequence-level ratios and other trust regions", "after": "14",
         "what": "one importance ratio per sequence (GSPO), or the geometric mean of log-clipped token ratios "
                 "(GMPO); a clipped, detached weight on every token (CISPO); a soft gate on the ratio instead of "
                 "the clip (SAPO); a bound on how far the sampled token's probability moved (DPPO)",
         "code": [("posttrain/algorithms/gspo.py", "sequence_log_ratio"),
                  ("posttrain/algorithms/gmpo.py", "gmpo_loss"),
                  ("posttrain/algorithms/cispo.py", "cispo_loss"),
                  ("posttrain/algorithms/sapo.py", "sapo_gate"),
                  ("posttrain/algorithms/dppo.py", "binary_tv_trust_region")]},
        {"concept": "Data curation by pass rate", "after": "18a",
         "what": "keep prompts the policy sometimes solves: a group all right or all wrong has no gradient",
         "code": [("posttrain/algorithms/core.py", "zero_variance_group_fraction")]},
        {"concept": "Model parallelism", "after": "22",
         "what": "sharding weights and optimizer state (ZeRO, FSDP), tensors, or layers across devices, beyond "
                 "data parallel",
         "code": []},
        {"concept": "On-policy distillation", "after": "23",
         "what": "a teacher's log-probs on the student's own samples as a dense, per-token reward",
         "code": [("posttrain/algorithms/opd.py", "OPD")]},
        {"concept": "TRPO", "after": "10",
         "what": "the trust region PPO's clip replaced: maximise the surrogate subject to KL ≤ δ, by a natural-"
                 "gradient step (conjugate gradient on Fisher-vector products) and a line search (live below)",
         "code": [("posttrain/teach/trust_region.py", "trpo_step"),
                  ("posttrain/teach/trust_region.py", "conjugate_gradient")]},
        {"concept": "The RL family tree", "after": "09",
         "what": "value-based, policy-gradient, actor-critic and model-based methods, and where each registered "
                 "algorithm sits (lesson 09 draws it from the registry)",
         "code": [("posttrain/algorithms/__init__.py", "ALGORITHMS")]},
        {"concept": "Macro vs micro actions", "after": "09",
         "what": "the action as the whole completion (a contextual bandit) or as the next token (a sequential "
                 "problem): GSPO's one ratio per row against GRPO's one per token (live below)",
         "code": [("posttrain/algorithms/gspo.py", "sequence_log_ratio")]},
        {"concept": "State vs observation", "after": "08",
         "what": "the policy sees its context (prompt, its tokens, tool outputs); the environment also holds what "
                 "the context never shows: the expected answer, the turn count, the malformed-call tally",
         "code": [("posttrain/envs/tool_env.py", "ToolEpisode")]},
        {"concept": "Test-time compute, known and speculated", "after": "17",
         "what": "what search buys at a token budget, measured in lesson 17, apart from what is guessed about "
                 "how o-series systems spend theirs",
         "code": [("posttrain/search/compare.py", "run_search"),
                  ("posttrain/search/thinking_curve.py", "run_think")]},
    ]
    return (CONCEPTS,)


@app.cell
def _(CONCEPTS, mo):
    _rows = "".join(
        f"| {c['concept']} | {c['after']} | {c['what']} | "
        + ("<br>".join(f"`{path}` — `{name}`" for path, name in c["code"]) if c["code"] else "*not implemented*")
        + " |\n" for c in CONCEPTS)
    mo.md(
        f"""
    # 27 · Missing concepts

    ## What this curriculum leaves out

    The lessons so far follow one path through the field: the six roles, the algorithm
    family from REINFORCE to Dr. GRPO, the preference lineage, search and verifiers, the
    three forces. Many ideas were named on the way and never developed. Here are
    {len(CONCEPTS)} of them, each with the lesson it would follow (numbers from the full
    series, which includes the systems lessons 19-25 and 18a) and, when posttrain has it,
    the code to read instead of a lesson. **{sum(bool(c['code']) for c in CONCEPTS)}** of the
    {len(CONCEPTS)} are in the library. Of the rest, three need hardware or model shapes this
    project does not have (an FP8 GPU, a mixture-of-experts model, several devices), and one
    (KV-cache offload) is a plain gap.

    | concept | after lesson | what it is | in posttrain |
    |:---|---:|:---|:---|
    {_rows}
    ## One of them, live: off-policy correction

    An RL step assumes its rollouts came from the policy being trained. They often did not:
    an asynchronous sampler runs a few versions behind (lesson 22c), a quantized sampler
    computes slightly different probabilities (lesson 22b, and posttrain's int8 rollout). A
    sample drawn from the sampler's π_b but used to estimate something about the trainer's
    π is off by the factor w = π / π_b. Three choices:

    * **ignore it**: average the rewards as they come. Biased: it estimates π_b's value.
    * **full importance sampling**: weight each sample by w. Unbiased, and its variance
      grows without bound as the two policies part: a few samples get huge weights.
    * **truncated importance sampling** (TIS): weight by min(w, C). A little bias where the
      cap binds, bounded variance. This is what `truncated_is_weights` computes, and what
      `MismatchCorrection` applies to a real batch when the sampler is int8, bf16 or stale.

    The demo: six possible answers, one right; the trainer's π puts 0.40 on it. The sampler
    is π_b = π pushed away from the right answer by the slider's distance in logits (how
    stale, or how badly quantized). Each estimate of E_π[reward] = 0.40 uses 32 samples from
    π_b; it is repeated 4,000 times to measure its bias and spread.
    """
    )
    return


@app.cell
def _(mo):
    # one panel for the page's two demos: the sampler's distance (off-policy correction, here)
    # and the two trust regions (TRPO's δ, PPO's ε, further down)
    controls = mo.ui.dictionary({
        "drift": mo.ui.slider(start=0.0, stop=3.0, step=0.25, value=1.0,
                              label="how far the sampler is from the trainer (logits)", show_value=True),
        "max_kl": mo.ui.slider(start=0.001, stop=0.05, step=0.001, value=0.01,
                               label="TRPO's δ (max KL, nats)", show_value=True),
        "clip_eps": mo.ui.slider(start=0.05, stop=1.0, step=0.05, value=0.2,
                                 label="PPO's ε (clip)", show_value=True),
    })
    controls.vstack()  # the panel's controls, one per line (their values stay in `controls`)
    return (controls,)


@app.cell
def _(controls, torch):
    from posttrain.roles.off_policy import truncated_is_weights

    CAP, N, TRIALS = 2.0, 32, 4_000
    theta = torch.log(torch.tensor([0.40, 0.12, 0.12, 0.12, 0.12, 0.12]))  # (6,) the trainer's π; answer 0 is right
    logp = torch.log_softmax(theta, dim=0)  # (6,)
    behaviour = torch.log_softmax(theta - controls.value["drift"] * torch.eye(6)[0], dim=0)  # (6,) the sampler's π_b
    true_value = logp[0].exp().item()

    gen = torch.Generator().manual_seed(0)
    draws = torch.multinomial(behaviour.exp(), TRIALS * N, replacement=True, generator=gen).view(TRIALS, N)  # (T, N)
    reward = (draws == 0).float()  # (T, N)
    mask = torch.ones(TRIALS, N)  # (T, N) every sample is a response token here
    weights = {
        "ignore it": torch.ones(TRIALS, N),
        "full importance sampling": truncated_is_weights(logp[draws], behaviour[draws], mask, float("inf")),
        f"truncated, cap {CAP:g}": truncated_is_weights(logp[draws], behaviour[draws], mask, CAP),
    }
    results = {}
    for name, w in weights.items():
        est = (w * reward).mean(dim=1)  # (T,) one estimate per batch of 32
        results[name] = {"mean": est.mean().item(), "bias": est.mean().item() - true_value, "std": est.std().item(),
                         "rmse": ((est - true_value) ** 2).mean().sqrt().item(), "max_w": w.max().item()}
    _w = weights["full importance sampling"]
    ess = ((_w.sum(dim=1) ** 2) / (N * (_w ** 2).sum(dim=1))).mean().item()  # effective sample share, 1 = on-policy
    pi_b_right = behaviour[0].exp().item()
    return CAP, ess, pi_b_right, results, true_value


@app.cell
def _(controls, ess, mo, pi_b_right, results, true_value):
    _drift = controls.value["drift"]
    _rows = "".join(f"| {name} | {r['mean']:.3f} | {r['bias']:+.3f} | {r['std']:.3f} | {r['rmse']:.3f} | {r['max_w']:.2f} |\n"
                    for name, r in results.items())
    mo.md(
        f"""
    ### The sampler {_drift:g} logits away

    The trainer's π puts **{true_value:.2f}** on the right answer, the sampler's π_b
    **{pi_b_right:.3f}**. Full importance weights leave an effective sample share of
    **{ess:.2f}** (1 when on-policy: the batch of 32 is worth about {ess * 32:.0f} on-policy samples).

    | estimator | mean estimate | bias | std | RMSE | largest weight |
    |:---|---:|---:|---:|---:|---:|
    {_rows}
    """
    )
    return


@app.cell
def _(controls, results, true_value):
    from posttrain.teach.charts import REFERENCE, bars, figure, finish

    # The table, drawn: each bar is an estimator's mean estimate over the 4,000 batches, its
    # whisker one standard deviation; bias is the gap to the dashed line, variance the whisker
    _fig, _ax = figure()
    bars(_ax, list(results), [r["mean"] for r in results.values()], errors=[r["std"] for r in results.values()])
    _ax.axhline(true_value, color=REFERENCE, linestyle="--", linewidth=1.2,
                label=f"the trainer's true value {true_value:.2f}")
    _ax.set_ylim(0, 1.2)  # one scale as the slider moves
    chart = finish(_fig, _ax, "estimator (one batch of 32 sampled by π_b)", "expected reward estimate ± 1 std",
                   title=f"The sampler {controls.value['drift']:g} logits away from the trainer")
    chart
    return (chart,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Another, live: TRPO, the trust region PPO's clip replaced

    Plain policy gradient takes one step along the gradient of the surrogate
    L(θ) = mean_t ρ_t · A_t (ρ_t = π_θ(token) / π_old(token)), and nothing says how far the
    policy may move. **TRPO** (Schulman et al. 2015) makes the limit explicit: maximise L
    subject to KL(π_old ‖ π_θ) ≤ δ. It solves that approximately: the gradient g of L, the
    Fisher matrix F (the KL's curvature), the natural direction F⁻¹g by conjugate gradient
    (ten Fisher-vector products, never F itself), a step scaled so ½ΔᵀFΔ = δ, then halved
    until the real KL is within δ and L improved. **PPO** (lesson 10) drops the second-order
    solve: clip ρ to [1 − ε, 1 + ε] and take a few plain Adam epochs. ε is not a KL bound; it
    only stops the push on tokens already past the edge.

    Below, both run on the same real batch: the tiny SFT policy of lesson 05 (`tiny_policy`),
    24 sampled completions of 4 prompts, GRPO's advantages. TRPO gets δ, PPO gets ε and 8
    full-batch Adam epochs at lr 3e-4; both report the exact KL over the vocabulary, averaged
    over response tokens, and the gain in L. Code: `posttrain/teach/trust_region.py`.
    """)
    return


@app.cell
def _(mo, torch):
    import copy as _copy
    import dataclasses as _dataclasses

    from posttrain.algorithms import make_algorithm
    from posttrain.config import SamplingParams
    from posttrain.roles.engines import make_engine
    from posttrain.roles.environment import score_episodes
    from posttrain.teach.widgets import tiny_policy
    from posttrain.types import RolloutBatch

    with mo.status.spinner(title="Teaching a tiny policy the answer format (100 SFT steps) and sampling 4 prompts × 6…"):
        policy, _tok, _env, _ = tiny_policy(sft_steps=100)
        _params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_at_newline=True)
        _engine = make_engine(_copy.deepcopy(policy), _tok, _params)
        _episodes = score_episodes(_env.score, _engine.generate(_env.fixed_set("train", 4, seed=1), 6,
                                                               generator=torch.Generator().manual_seed(0)))
        rl_batch = RolloutBatch.collate(_episodes, _tok.pad_id, temperature=_params.temperature)
        rl_batch = _dataclasses.replace(rl_batch, **make_algorithm("grpo").compute_advantages(rl_batch))
    return policy, rl_batch


@app.cell
def _(controls, mo, policy, rl_batch):
    from posttrain.teach.trust_region import ppo_step, trpo_step

    max_kl, clip_eps = controls.value["max_kl"], controls.value["clip_eps"]
    with mo.status.spinner(title=f"A TRPO step and a PPO step on {rl_batch.batch_size} samples, then both over 5 settings…"):
        _, trpo = trpo_step(policy, rl_batch, max_kl)
        ppo_policy, ppo = ppo_step(policy, rl_batch, clip_eps)
        # the frontier each knob traces: KL reached and gain bought, on the same batch
        DELTAS, EPSILONS = (0.002, 0.005, 0.01, 0.02, 0.05), (0.05, 0.1, 0.2, 0.5, 1.0)
        trpo_sweep = [trpo_step(policy, rl_batch, d)[1] for d in DELTAS]
        ppo_sweep = [ppo_step(policy, rl_batch, e)[1] for e in EPSILONS]
    return DELTAS, EPSILONS, clip_eps, max_kl, ppo, ppo_policy, ppo_sweep, trpo, trpo_sweep


@app.cell
def _(DELTAS, EPSILONS, clip_eps, max_kl, mo, ppo, ppo_sweep, trpo, trpo_sweep):
    from posttrain.teach.charts import curves as _curves, figure as _figure, finish as _finish, mark as _mark

    trust_fig, _ax = _figure()
    _curves(_ax, [m["kl"] for m in trpo_sweep], {"TRPO, δ = " + ", ".join(f"{d:g}" for d in DELTAS):
                                                 [m["gain"] for m in trpo_sweep]})
    _curves(_ax, [m["kl"] for m in ppo_sweep], {"PPO, ε = " + ", ".join(f"{e:g}" for e in EPSILONS):
                                                [m["gain"] for m in ppo_sweep]})
    _mark(_ax, max_kl, f"δ = {max_kl:g}")
    _finish(trust_fig, _ax, "KL(π_old ‖ π_new) reached (nats, exact, per response token)",
            "gain in the surrogate L", title="The same batch: a KL budget vs a clipped ratio")
    mo.vstack([mo.md(
        f"""
    | step | knob | KL reached | gain in L | note |
    |:---|:---|---:|---:|:---|
    | TRPO | δ = {max_kl:g} | {trpo['kl']:.4f} | {trpo['gain']:+.4f} | predicted ½ΔᵀFΔ = {trpo['predicted_kl']:.4f}, line search kept {trpo['step_fraction']:g} of the step |
    | PPO | ε = {clip_eps:g} | {ppo['kl']:.4f} | {ppo['gain']:+.4f} | clipfrac {ppo['clipfrac']:.2f} at the last epoch |
    """), trust_fig])
    return (trust_fig,)


@app.cell
def _(clip_eps, mo, ppo_policy, rl_batch, torch):
    from posttrain.algorithms.gspo import sequence_log_ratio
    from posttrain.models.logprobs import response_logp

    # Macro vs micro, on PPO's updated policy: the action is a token (one ratio each, GRPO's
    # clip) or the whole completion (one ratio per row, GSPO's geometric mean)
    with torch.no_grad():
        _logp = response_logp(ppo_policy, rl_batch)  # (B, T)
    _on = rl_batch.response_mask.bool()
    token_log_ratio = (_logp - rl_batch.old_logp)[_on]  # (n,) one per micro action
    seq_log_ratio = sequence_log_ratio(_logp, rl_batch.old_logp, rl_batch.response_mask)  # (B,) one per macro action
    _outside = lambda r: ((r.exp() < 1 - clip_eps) | (r.exp() > 1 + clip_eps)).float().mean().item()  # noqa: E731
    macro_micro = {"tokens": int(_on.sum()), "rows": rl_batch.batch_size,
                   "token_ratio": (token_log_ratio.exp().min().item(), token_log_ratio.exp().max().item()),
                   "seq_ratio": (seq_log_ratio.exp().min().item(), seq_log_ratio.exp().max().item()),
                   "token_clipped": _outside(token_log_ratio), "seq_clipped": _outside(seq_log_ratio)}
    mo.md(
        f"""
    ## Macro vs micro actions, on the same batch

    One reward per completion, two ways to say what the action was. **Micro**: the state is
    the prompt plus the tokens so far, the action is the next token; this batch holds
    **{macro_micro['tokens']}** of them, each with its own ratio after PPO's step, from
    {macro_micro['token_ratio'][0]:.3f} to {macro_micro['token_ratio'][1]:.3f}, and
    {macro_micro['token_clipped']:.0%} outside 1 ± {clip_eps:g}: GRPO's clip credits or stops
    each token apart. **Macro**: the state is the prompt, the action is the whole completion
    (a contextual bandit); **{macro_micro['rows']}** actions, and GSPO's one ratio per row (the
    geometric mean of its token ratios) spans only {macro_micro['seq_ratio'][0]:.3f} to
    {macro_micro['seq_ratio'][1]:.3f}, {macro_micro['seq_clipped']:.0%} outside the same band.
    Evaluation, best-of-N and reward design reason in the macro view; the gradient is taken
    in the micro one. Know which one a claim is in.
    """
    )
    return (macro_micro,)


@app.cell
def _(mo):
    from posttrain.envs.tool_arithmetic import ToolArithmeticEnv

    # State vs observation: one demonstration episode of the calculator task, step by step.
    # At each of the model's decisions, what is in its context, and what only the environment holds
    _env = ToolArithmeticEnv()
    _example = _env.fixed_set("train", 1)[0]
    _state, _context, decisions = _env.reset(_example), _example.prompt, []
    for _turn in _env.demonstration_turns(_example):
        _hidden = {"the expected answer": _example.expected_answer, "the example's id": _example.id,
                   "its split": _example.meta["split"],
                   "each call's latency": ", ".join(f"{c['seconds']:g} s" for c in _state.tool_calls) or None}
        decisions.append({"turn": _state.turns + 1, "context_chars": len(_context),
                          "turns_left": _env.max_turns - _state.turns,
                          "in_context": {k: v in _context for k, v in _hidden.items() if v}})
        _result = _env.step(_state, _turn)
        _context += _turn + (_result.observation or "")
    _rows = "".join(f"| {d['turn']} | {d['context_chars']} | {d['turns_left']} | "
                    + ", ".join(f"{k}: {'seen' if seen else '**hidden**'}" for k, seen in d["in_context"].items())
                    + " |\n" for d in decisions)
    mo.md(
        f"""
    ## State vs observation, in a tool episode

    The clean mental model calls the prompt the state. At the token level the state the
    policy acts on is its whole context: the prompt, its own tokens so far, and whatever the
    environment wrote back. The environment's state is larger, and the policy never sees the
    rest: its *observation* is the context. Here is `ToolArithmeticEnv`'s demonstration of
    `{_example.prompt.strip()}`, decision by decision (`ToolEpisode` is the environment's state):

    | model turn | context (characters) | turns the environment still allows | the environment's state, in the context? |
    |---:|---:|---:|:---|
    {_rows}
    The expected answer is hidden at the first decision and in the context at the second:
    the tool's result revealed it, which is the point of calling a tool. The turn budget is
    never written down: a call in the last allowed turn ends the episode with reward 0, by a
    rule the policy can only learn from rewards. A policy that must act on part of the state
    is acting in a partially observed problem, and what the environment writes back is
    observation, not action, which is why lesson 08 masks it out of the loss.
    """
    )
    return (decisions,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    The sampler's distance, for off-policy correction:

    * **0**: the sampler is the trainer; every weight is exactly 1 and the three rows agree.
    * **1** (the default): the sampler puts 0.20 on the right answer, and ignoring the
      mismatch estimates about 0.20 for a true 0.40. Full importance sampling is unbiased, at
      twice the spread; TIS at cap 2 barely binds (the largest weight is 2.03) and matches it.
    * **3**: the sampler almost never writes the right answer (0.03). Ignoring it estimates
      about 0.03: a run that trusted it would believe its policy almost never answers right. Full IS is still unbiased on
      average, but each right sample now carries a weight of about 12, so one batch's estimate
      has a spread (about 0.39) as large as the value itself, and the effective sample share
      is down to about half. TIS caps those weights at 2 and is biased low (about 0.06),
      because the cap binds on every right answer: truncation helps while the policies are
      close. Past that no reweighting rescues the batch (every RMSE is above 0.3); the fix is
      fresher rollouts, a tighter staleness bound (lesson 22c), which is why
      `posttrain/roles/off_policy.py` also refuses batches staler than allowed
      (`staleness_stats`).


    The two trust regions:

    * **δ** (TRPO): the KL reached never exceeds it; that is the constraint, checked on the
      real KL after the step, not on its quadratic model. At δ = 0.01 the full step's KL
      overshoots and the line search keeps half of it (KL about 0.0025); at 0.05 the whole
      step fits (about 0.047). The quadratic model is only trusted where it was checked.
    * **ε** (PPO): the KL reached is not ε and is not bounded by it. At the default 0.2 eight
      Adam epochs reach a KL of about 0.0095; at ε = 1 (almost no clip) about 0.032. The
      clip sets the KL only through how many tokens it stops, and the learning rate and the
      epoch count move it as much. At the same KL (about 0.005) TRPO's natural-gradient step
      gains about twice what PPO's does (0.027 against 0.013): the second-order solve buys
      surrogate per nat. PPO won anyway, because its step is a first-order loss any trainer
      can minibatch, and TRPO's is a whole-batch solve per update.
    * **ε** again, for macro vs micro: at 0.2 a few percent of the tokens' ratios fall outside
      the band after PPO's step, and none of the sequences' geometric means do: a completion's
      ratio averages away the tokens that moved most.

    ## Source files used here

    * `posttrain/roles/off_policy.py` — `truncated_is_weights` (the widget), `staleness_stats`;
      `posttrain/roles/mismatch.py` — `MismatchCorrection`
    * `posttrain/models/int8.py` — the int8 sampler whose log-probs differ from the trainer's
    * `posttrain/teach/trust_region.py` — `trpo_step`, `ppo_step`, `conjugate_gradient`, `mean_kl` (the TRPO demo);
      `posttrain/algorithms/gspo.py` — `sequence_log_ratio` (macro vs micro)
    * `posttrain/envs/tool_env.py` — `ToolEpisode`, the environment's state; `posttrain/envs/tool_arithmetic.py` —
      `ToolArithmeticEnv`, the episode of the state-vs-observation table
    * every file in the table above; `tests/test_lessons.py` checks each exists and defines the name listed

    ## Exercises

    1. Pick a concept marked *not implemented*. Which role of lesson 00's six would it change,
       and which test would you write first?
    2. In the demo, what cap makes TIS's RMSE smallest at distance 1? At 3? Why does the
       answer move?
    3. Set δ to 0.05 and move ε until PPO's KL matches TRPO's. Which gains more in L, and
       what does each step cost in gradient evaluations?
    4. Code: `exercises/27_missing_concepts.py` asks for `truncated_is_weights` itself;
       `posttrain check 27` compares it with the library on ratios far above and below the cap.

    Next: [28 · Bottlenecks, optimizations, and how to find them](?file=28_bottlenecks.py), the
    playbook that closes the course.
    """)
    return


if __name__ == "__main__":
    app.run()
