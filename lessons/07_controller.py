"""Lesson 07 · Controller: one RL step, role by role, with every output on screen."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import copy
    import dataclasses
    import json

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return copy, dataclasses, json, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 07 · Controller: the orchestrator

    ## Why the loop deserves its own file

    Lessons 02–06 took the roles one at a time. None of them decides *when* it runs; the
    controller does. Its job is an ordering, and every step of that ordering is there because
    something specific breaks without it:

    | # | role | reads | writes | if it ran out of order |
    |---:|:---|:---|:---|:---|
    | 1 | sample (rollout) | prompts, engine weights | tokens, `old_logp`, `weight_version` | — |
    | 2 | score (environment) | completion text | `reward`, `details` | advantages of all-zero rewards |
    | 3 | reference | tokens | `ref_logp` | KL against nothing |
    | 4 | advantage (algorithm) | rewards, group ids | `advantages` | — |
    | 5 | update (trainer) | everything above | new weights, metrics | — |
    | 6 | sync | trainer weights | engine weights, version | next batch sampled by stale weights |
    | 7 | log | batch, metrics | `metrics.jsonl`, `samples.jsonl` | an unreproducible run |

    ## The key equation is the loop itself

    ```text
    for step in range(steps):
        episodes = score(sample(prompts(step)))                 # 1, 2
        batch    = collate(episodes, temperature=τ)             # the (B, T) tensors of types.py
        batch.ref_logp = reference.logp(batch)                  # 3  (only if the loss uses it)
        batch    = batch + algo.compute_advantages(batch)       # 4
        metrics  = trainer.update(batch, algo)     # 5
        sync.push()                                             # 6
        log(metrics, episodes)                                  # 7
    ```

    This is `Controller.step` in `posttrain/roles/controller.py`, minus timing and checkpoints. Below,
    the notebook runs exactly these calls once, on a tiny `gpt_mini` (100 SFT steps first, as in
    lesson 05), sampling at τ = 0.8. The slider walks through the seven stages: the ring of six
    roles (lesson 00's picture) lights up the role whose code runs at that stage, with the numbers
    it produced beside it. Sync lights two: the trainer's weights reach the rollout's engine. The
    controller itself lights up only at the log, the one step that is its own work; it called
    every other. The dropdown plants one of three real bugs in the loop.
    """)
    return


@app.cell
def _(mo):
    from posttrain.algorithms import make_algorithm
    from posttrain.algorithms.core import kl_k3, masked_mean, zero_variance_group_fraction
    from posttrain.teach.widgets import tiny_policy
    from posttrain.roles.controller import rollout_metrics
    from posttrain.runs.rundir import sample_row
    from posttrain.roles.environment import score_episodes
    from posttrain.roles.reference import Reference
    from posttrain.roles.engines import make_engine
    from posttrain.config import SamplingParams
    from posttrain.roles.trainer import Trainer
    from posttrain.roles.weight_sync import InProcessWeightSync
    from posttrain.types import RolloutBatch

    with mo.status.spinner(title="Teaching a tiny policy the answer format (100 SFT steps, a few seconds)…"):
        model, tok, env, _ = tiny_policy(sft_steps=100)
    return (InProcessWeightSync, Reference, RolloutBatch, make_engine, SamplingParams, Trainer, env, kl_k3,
            make_algorithm, masked_mean, model, rollout_metrics, sample_row, score_episodes, tok,
            zero_variance_group_fraction)


@app.cell
def _(mo):
    BUGS = {
        "none: the loop as written": "none",
        "compute advantages before scoring": "advantage_before_score",
        "collate without the sampling temperature": "forget_temperature",
        "skip the sync": "skip_sync",
    }
    controls = mo.ui.dictionary({
        "stage": mo.ui.slider(start=1, stop=7, step=1, value=7, label="run up to stage", show_value=True),
        "bug": mo.ui.dropdown(options=BUGS, value="none: the loop as written", label="plant a bug"),
    })
    controls.vstack()  # the panel's controls, one per line (their values stay in `controls`)
    return (controls,)


@app.cell
def _(InProcessWeightSync, Reference, RolloutBatch, make_engine, SamplingParams, Trainer, controls, copy,
      dataclasses, env, make_algorithm, mo, model, score_episodes, tok, torch):
    bug = controls.value["bug"]
    TAU = 0.8
    # The roles, wired as rl_stage wires them: the engine and the reference get their own copies.
    policy = copy.deepcopy(model).requires_grad_(True)
    engine = make_engine(copy.deepcopy(model), tok, SamplingParams(temperature=TAU, max_new_tokens=12,
                                                                   stop_at_newline=True))
    sync = InProcessWeightSync(policy, engine)
    reference = Reference(model)
    algo = make_algorithm("grpo", kl_coef=0.04)  # with a KL term, so stage 3 matters
    trainer = Trainer(policy, lr=1e-4, total_steps=1)
    out = {}

    with mo.status.spinner(title="One controller step by hand: sample 2 prompts × 4, score, reference, advantage, update…"):
        # 1. sample
        prompts = env.sample("train", 2, seed=3)
        episodes = engine.generate(prompts, 4, generator=torch.Generator().manual_seed(0))
        out["sample"] = [dict(group=e.group_id, prompt=e.example.prompt, completion=e.completion,
                              version=e.weight_version, logp=sum(e.response_logp)) for e in episodes]
        _tau = 1.0 if bug == "forget_temperature" else TAU
        if bug == "advantage_before_score":  # 4 before 2: every reward is still the default 0.0
            _early = RolloutBatch.collate(episodes, tok.pad_id, temperature=_tau)
            _early_adv = algo.compute_advantages(_early)
        # 2. score
        score_episodes(env.score, episodes)
        out["score"] = [(e.reward, e.details["reason"]) for e in episodes]
        batch = RolloutBatch.collate(episodes, tok.pad_id, temperature=_tau)
        # 3. reference
        batch.ref_logp = reference.logp(batch)
        # 4. advantage
        batch = dataclasses.replace(batch, **(_early_adv if bug == "advantage_before_score" else algo.compute_advantages(batch)))
        # 5. update
        metrics = trainer.update(batch, algo)
    # 6. sync
    _gap = lambda: max((a - b).abs().max().item() for a, b in zip(policy.parameters(), engine.model.parameters()))
    out["sync_gap_before"] = _gap()
    if bug != "skip_sync":
        sync.push()
    out["sync_gap_after"], out["engine_version"] = _gap(), engine.weight_version
    return TAU, batch, bug, episodes, metrics, out


@app.cell
def _(TAU, batch, bug, controls, episodes, json, kl_k3, masked_mean, metrics, mo, out, rollout_metrics, sample_row,
      zero_variance_group_fraction):
    import html

    from posttrain.teach.diagrams import LOOP_STEPS, six_roles_svg
    from posttrain.teach.tables import markdown_table

    stage = controls.value["stage"]
    NAMES = [name for name, _ in LOOP_STEPS]  # the seven steps of Controller.step, in its order
    running = LOOP_STEPS[stage - 1][1]  # the role(s) whose code runs at this step
    diagram = six_roles_svg(highlight=running, caption=f"{stage} · {NAMES[stage - 1]}")
    strip = " → ".join(
        (f"**▶ {i + 1} {n}**" if i + 1 == stage else f"✓ {i + 1} {n}" if i + 1 < stage else f"· {i + 1} {n}")
        for i, n in enumerate(NAMES)
    )
    _first = int(batch.response_mask.argmax(dim=1)[0])
    _kl_rows = masked_mean(kl_k3(batch.old_logp, batch.ref_logp), batch.response_mask, dim=1)  # (B,)
    _code = lambda s: "<code>" + html.escape(repr(s)).replace("|", "&#124;") + "</code>"
    sections = {
        1: markdown_table(["group", "prompt", "completion", "sampled by version", "Σ old_logp"],
                          [[r["group"], _code(r["prompt"]), _code(r["completion"]), r["version"], f"{r['logp']:.2f}"]
                           for r in out["sample"]]),
        2: markdown_table(["row", "reward", "reason"],
                          [[i, f"{r:g}", why] for i, (r, why) in enumerate(out["score"])], align="rrl"),
        3: f"`ref_logp` from the frozen reference; per-row KL(π_old ‖ π_ref), k3: "
           f"`{[round(v, 4) for v in _kl_rows.tolist()]}` (0 on the first step: nothing has moved yet). "
           f"The reference scores the tokens at the batch's recorded τ = {batch.temperature:g}.",
        4: f"GRPO advantages (first response token of each row): "
           f"`{[round(v, 3) for v in batch.advantages[:, _first].tolist()]}`; groups with zero reward variance: "
           f"{zero_variance_group_fraction(batch.rewards, batch.group_ids):.2f}.",
        5: markdown_table(["metric", "value"], [[k, f"{v:.4g}"] for k, v in metrics.items()
                          if k in ("pg_loss", "kl", "grad_norm", "ratio_mean", "ratio_max", "clipfrac", "approx_kl", "entropy")]),
        6: f"Largest weight difference trainer − engine: {out['sync_gap_before']:.2e} before the push, "
           f"**{out['sync_gap_after']:.2e}** after; engine version now **{out['engine_version']}**.",
        7: "`metrics.jsonl` gets `" + json.dumps({k: round(v, 4) for k, v in rollout_metrics(batch, batch.episodes).items()})
           + "`<br>`samples.jsonl` gets one line per episode, e.g. `"
           + json.dumps(sample_row("rl", 0, episodes[0])) + "`",
    }
    _now = (f"#### {stage} · {NAMES[stage - 1]} ◀ now\n\nRunning: **{' and '.join(running)}** "
            f"(lit in the ring).\n\n{sections[stage]}")
    _before = "\n\n".join(f"#### {i} · {NAMES[i - 1]}\n\n{sections[i]}" for i in range(1, stage))
    mo.vstack([mo.md(f"{strip}\n\nBug planted: **{bug}**. Sampling temperature τ = {TAU}."),
               mo.hstack([mo.Html(diagram), mo.md(_now)], widths=[1, 1], align="start", wrap=True),
               mo.md(("**The steps before it, as they ran:**\n\n" + _before) if _before else "")])
    return diagram, running, stage


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    Set the stage slider to 7 and try each bug; none of them raises an error.

    * **Compute advantages before scoring.** Every reward is still its default 0.0, so every
      advantage is 0: stage 4 shows zeros, stage 5 shows `pg_loss` 0 and a gradient norm of 0
      (the KL term is 0 too on step one). The step ran, took time, and taught nothing.
    * **Collate without the sampling temperature.** The samples came from logits / 0.8, the
      trainer scores them with logits / 1. Stage 5 shows `ratio_mean` ≠ 1, `ratio_max` at the
      edge of the trust region and `approx_kl` > 0 on the *first* update, before a single
      weight moved — lesson 02's bug, caught here by the metrics the controller logs. (The reference stage, which reads the batch's
      temperature too, is silently wrong in the same way.)
    * **Skip the sync.** Stage 6 shows a weight difference that stays after the "push" and
      an engine still at version 0; lesson 06 shows what that does over many steps.

    ## Source files used here

    * `posttrain/roles/controller.py` — `Controller.step`, `rollout_metrics`; `posttrain/runs/rundir.py` — `sample_row`
    * `posttrain/roles/engines/torch_engine.py` — `RolloutEngine.generate` (stage 1)
    * `posttrain/roles/environment.py` — `score_episodes` (stage 2)
    * `posttrain/roles/reference.py` — `Reference.logp` (stage 3)
    * `posttrain/algorithms/grpo.py` — `compute_advantages` and `compute_loss` (stages 4, 5)
    * `posttrain/roles/trainer.py` — `Trainer.update` (stage 5)
    * `posttrain/roles/weight_sync.py` — `InProcessWeightSync.push` (stage 6)
    * `posttrain/types.py` — `RolloutBatch.collate`, where the temperature is recorded
    * `posttrain/teach/diagrams.py` — `six_roles_svg(highlight=...)` and `LOOP_STEPS`: which role runs at each stage

    ## Exercises

    1. Which stages could run in parallel with which, and which must wait? (Hint: 3 and 4 read
       different fields.) Lesson 22c's asynchronous pipeline is built on that answer.
    2. In `rl_stage`, find where dynamic sampling (DAPO) changes stages 1–2. Why must whole
       groups be kept or dropped together?
    3. Using the reads/writes table at the top, list every order of the seven stages that is
       still correct. Which of them would a PPO run (with a critic, lesson 10) rule out?

    Next: [08 · Agentic RL and tool masking](?file=08_agentic_tool_masking.py).
    """)
    return


if __name__ == "__main__":
    app.run()
