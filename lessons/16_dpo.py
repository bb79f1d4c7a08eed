"""Lesson 16 · DPO: RL without RL. Z(x) cancels; IPO, KTO, ORPO and SimPO on the same pairs."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import copy
    import math

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return copy, math, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 16 · DPO: RL without RL

    ## Why skip the reward model

    Lesson 15 needed three stages and a PPO loop: sampling, a value function, a frozen
    reference, a reward model, and a β to tune against over-optimisation. Rafailov et al. (2023)
    noticed that for the KL-regularised objective the reward model can be integrated out.

    ## The derivation, in four lines

    1. The objective $\max_\pi \mathbb{E}_{y\sim\pi}[r(x,y)] - \beta\,\mathrm{KL}(\pi\|\pi_{\text{ref}})$
       has the maximiser (lesson 15)
       $\pi^*(y|x) = \pi_{\text{ref}}(y|x)\,e^{r(x,y)/\beta} / Z(x)$, with
       $Z(x) = \sum_y \pi_{\text{ref}}(y|x)\,e^{r(x,y)/\beta}$.
    2. Solve for the reward: $r(x,y) = \beta\log\frac{\pi^*(y|x)}{\pi_{\text{ref}}(y|x)} + \beta\log Z(x)$.
       $Z(x)$ sums over *every* answer: it can never be computed for a language model.
    3. Bradley–Terry only ever reads a *difference* of two rewards for the same $x$:
       $r(x,y_c) - r(x,y_r) = \beta\log\frac{\pi^*(y_c|x)}{\pi_{\text{ref}}(y_c|x)} - \beta\log\frac{\pi^*(y_r|x)}{\pi_{\text{ref}}(y_r|x)}$.
       **$\beta\log Z(x)$ appears in both terms and cancels.**
    4. Put the policy $\pi_\theta$ in the place of $\pi^*$ and maximise the likelihood of the
       comparisons:
       $\;\mathcal{L}_{\text{DPO}} = -\log\sigma\Big(\beta\big[\log\tfrac{\pi_\theta(y_c)}{\pi_{\text{ref}}(y_c)} - \log\tfrac{\pi_\theta(y_r)}{\pi_{\text{ref}}(y_r)}\big]\Big)$.

    No sampling, no critic, no reward model: a classification loss on fixed pairs, whose
    minimiser (with enough clean pairs) is the policy PPO would have been chasing.

    Below, step 3 is done with real numbers. On a finite answer set $Z(x)$ *can* be summed:
    the tiny `gpt_mini` policy of lessons 02–07 is π_ref (100 SFT steps, level-1 sums), its
    answers are `Final: 0` … `Final: 18`, the reward is the verifier's (1 for the right sum, 0
    otherwise). Then the same policy is trained with each loss of the family on the same
    pairs. The slider sets β.
    """)
    return


@app.cell
def _(copy, mo, torch):
    from posttrain.config import SamplingParams
    from posttrain.data.preference_rows import group_by_prompt, pairs_from_verifier
    from posttrain.roles.environment import score_episodes
    from posttrain.roles.engines import make_engine
    from posttrain.teach.widgets import tiny_policy

    with mo.status.spinner(title="Teaching a tiny policy the answer format (100 SFT steps, a few seconds)…"):
        model, tok, env, _ = tiny_policy(sft_steps=100)
    # Pairs the way `posttrain train --algo dpo` builds them: 8 samples per prompt at T = 1.5
    # (the SFT policy is too sure of itself at T = 1 to make mistakes), every right answer
    # paired with every wrong one. Prompts 0-59 train, 60-89 give held-out pairs.
    _sampler = make_engine(copy.deepcopy(model), tok, SamplingParams(temperature=1.5, max_new_tokens=12,
                                                                       stop_at_newline=True))
    problems = env.fixed_set("train", 90)  # every level-1 training problem

    def _pairs(examples, seed):
        drawn = _sampler.generate(examples, 8, generator=torch.Generator().manual_seed(seed))
        return pairs_from_verifier(group_by_prompt(score_episodes(env.score, drawn)))

    with mo.status.spinner(title=f"Sampling 8 answers to each of {len(problems)} problems at T = 1.5 for pairs…"):
        pairs, heldout_pairs = _pairs(problems[:60], 0), _pairs(problems[60:], 1)
    return env, heldout_pairs, model, pairs, problems, tok


@app.cell
def _(mo):
    log_beta = mo.ui.slider(start=-2.0, stop=0.5, step=0.25, value=-1.0, label="β = 10^x (DPO, IPO, KTO and the Z table), x =",
                            show_value=True)
    log_beta
    return (log_beta,)


@app.cell
def _(env, log_beta, model, problems, tok, torch):
    from posttrain.algorithms.preference import PreferenceLogps, make_preference_loss
    from posttrain.data.preference_rows import response_episode
    from posttrain.models.logprobs import sequence_logps
    from posttrain.rewards.reward_model import bt_loss
    from posttrain.types import RolloutBatch

    beta = round(10 ** log_beta.value, 4)
    ANSWERS = [f"Final: {k}" for k in range(19)]  # every sum of two digits, in the strict format

    def answer_table(example) -> dict:
        """π_ref over the 19 answers (renormalised), the verifier's reward, π*, Z and the implicit rewards."""
        rows = [response_episode(tok, example.prompt, a, False, 0, None, "answer") for a in ANSWERS]
        with torch.no_grad():
            logp = sequence_logps(model, RolloutBatch.collate(rows, tok.pad_id))  # (19,) log π_ref(y|x)
        mass = logp.exp().sum().item()  # how much of the policy's probability these 19 answers hold
        ref = logp - torch.logsumexp(logp, 0)  # (19,) π_ref restricted to them
        r = torch.tensor([env.score(example, a)["reward"] for a in ANSWERS])  # (19,)
        log_z = torch.logsumexp(ref + r / beta, 0)  # log Z(x) = log Σ_y π_ref e^{r/β}
        star = ref + r / beta - log_z  # (19,) log π*(y|x)
        implicit = beta * (star - ref)  # (19,) β log π*/π_ref = r − β log Z
        return {"example": example, "mass": mass, "ref": ref, "r": r, "log_z": log_z.item(), "star": star,
                "implicit": implicit}

    tables = [answer_table(problems[0]), answer_table(problems[5])]
    # DPO's loss with π* as the policy, on the pair (right answer, most likely wrong answer) of each
    # prompt, next to the Bradley–Terry loss of the true rewards: the same number, Z nowhere.
    _c = [int(t["r"].argmax()) for t in tables]
    _w = [int((t["ref"] - 1e9 * t["r"]).argmax()) for t in tables]
    _pick = lambda key, idx: torch.stack([t[key][i] for t, i in zip(tables, idx)])  # (2,)
    dpo_at_optimum = make_preference_loss("dpo", beta=beta).loss(PreferenceLogps(
        _pick("star", _c), _pick("star", _w), torch.ones(2), torch.ones(2), _pick("ref", _c), _pick("ref", _w)))[0].item()
    bt_of_rewards = bt_loss(_pick("r", _c), _pick("r", _w)).item()
    best_wrong = _w
    return ANSWERS, beta, best_wrong, bt_of_rewards, dpo_at_optimum, make_preference_loss, tables


@app.cell
def _(ANSWERS, beta, best_wrong, bt_of_rewards, dpo_at_optimum, math, mo, tables):
    def _num(v) -> str:
        return f"{float(v) if abs(float(v)) > 5e-5 else 0.0:+.4f}"  # no "-0.0000"

    def _one(t, w):
        c = int(t["r"].argmax())
        show = [c, w] + [i for i in t["ref"].argsort(descending=True).tolist() if i not in (c, w)][:2]
        rows = "".join(
            f"| `{ANSWERS[i]}` | {t['ref'][i].exp():.4f} | {t['r'][i]:g} | {t['star'][i].exp():.4f} | "
            f"{_num(t['implicit'][i])} | {_num(beta * t['log_z'])} | {_num(t['implicit'][i] + beta * t['log_z'])} |\n"
            for i in show)
        diff = (t["implicit"][c] - t["implicit"][w]).item()
        return (f"**{t['example'].prompt.strip()}** (the 19 answers hold {t['mass']:.1%} of π_ref's probability) · "
                f"log Z(x) = {t['log_z']:.4f}\n\n"
                "| y | π_ref(y) | r(y) | π\\*(y) | β log π\\*/π_ref | β log Z(x) | sum |\n|:---|---:|---:|---:|---:|---:|---:|\n"
                + rows + f"\nRight minus likeliest wrong: β log-ratio difference = **{diff:+.4f}** = "
                f"r(y_c) − r(y_r) = {t['r'][c] - t['r'][w]:+g}; β log Z(x) was {beta * t['log_z']:+.4f} on both sides.\n")

    mo.md(
        f"""
    ### Z(x) cancels, at β = {beta:g}

    {_one(tables[0], best_wrong[0])}
    {_one(tables[1], best_wrong[1])}
    The two prompts have different partition functions, so an implicit reward alone
    (β log π\\*/π_ref) is off by a different constant for each prompt; inside one pair the constant
    is the same and drops out. The DPO loss with π\\* as the policy, on these two pairs:
    **{dpo_at_optimum:.6f}**; the Bradley–Terry loss of the true rewards on the same pairs:
    **{bt_of_rewards:.6f}** (= log(1 + e^−1) = {math.log(1 + math.exp(-1)):.6f}).
    """
    )
    return


@app.cell
def _(beta, copy, env, heldout_pairs, make_preference_loss, mo, model, pairs, problems, tok):
    from posttrain.config import SamplingParams as _SamplingParams
    from posttrain.data.preference_rows import preference_episodes
    from posttrain.eval.evaluate import evaluate_pass_at_1
    from posttrain.pipelines.preference_train import (
        evaluate_preference,
        frozen_copy,
        mean_token_kl,
        preference_batch,
        train_preference,
    )
    from posttrain.roles.engines import make_engine as _make_engine

    LOSSES = ("dpo", "ipo", "kto", "orpo", "simpo")
    reference = frozen_copy(model)
    _greedy = _SamplingParams(temperature=1.0, max_new_tokens=12, stop_at_newline=True)  # pass@1 decodes greedily
    _rows = preference_episodes(heldout_pairs, tok)
    _heldout_batch = preference_batch(_rows, range(len(_rows)), tok.pad_id)

    def _pass(policy) -> float:
        return evaluate_pass_at_1(_make_engine(copy.deepcopy(policy), tok, _greedy), env, problems)["pass@1"]

    def _moved(policy, records) -> dict:
        """Mean change of log π(y_c) and log π(y_r) from π_ref, and the fraction of pairs whose
        log-ratio margin is > 0: DPO's metrics at β = 1 are exactly these."""
        m = evaluate_preference(policy, records, "dpo", {"beta": 1.0}, tok, reference)
        return {"d_chosen": m["rewards_chosen"], "d_rejected": m["rewards_rejected"], "accuracy": m["accuracy"]}

    with mo.status.spinner(title=f"Training {len(LOSSES)} preference losses, 30 steps each on {len(pairs)} pairs, and scoring them…"):
        pass_before = _pass(model)
        results = {}
        for _name in LOSSES:
            _policy = copy.deepcopy(model).requires_grad_(True)
            _params = {"beta": beta} if _name in ("dpo", "ipo", "kto") else {}  # SimPO and ORPO have no π_ref to leash to
            # 30 AdamW steps of 16 pairs at 1e-3: brisk, so that what each loss does shows in seconds
            train_preference(_policy, pairs, _name, steps=30, lr=1e-3, batch_size=16, loss_params=_params, tokenizer=tok,
                             reference=reference, seed=0)
            results[_name] = {"pass@1": _pass(_policy), **_moved(_policy, pairs),
                              "heldout_accuracy": _moved(_policy, heldout_pairs)["accuracy"],
                              "kl": mean_token_kl(_policy, reference, _heldout_batch),
                              "params": make_preference_loss(_name, **_params)}
    return LOSSES, pass_before, results


@app.cell
def _(LOSSES, beta, heldout_pairs, mo, pairs, pass_before, results):
    _rows = "".join(
        f"| {n} | {results[n]['pass@1']:.3f} | {results[n]['d_chosen']:+.2f} | {results[n]['d_rejected']:+.2f} | "
        f"{results[n]['accuracy']:.2f} | {results[n]['heldout_accuracy']:.2f} | {results[n]['kl']:.3f} | "
        f"`{', '.join(f'{k}={v}' for k, v in vars(results[n]['params']).items())}` |\n"
        for n in LOSSES)
    mo.md(
        f"""
    ### Five losses, the same {len(pairs)} pairs (β = {beta:g} where a loss has a reference)

    From the same SFT policy (greedy pass@1 {pass_before:.3f} on the 90 level-1 problems), 30 steps each.
    Δ log π is the mean change of a whole answer's log-probability from π_ref over the training
    pairs; "pairs ranked" counts pairs whose log-ratio margin is positive ({len(heldout_pairs)} held-out
    pairs come from prompts never trained on); KL is per token, exact, on the held-out answers.

    | loss | pass@1 after | Δ log π(chosen) | Δ log π(rejected) | train pairs ranked | held-out pairs ranked | KL to π_ref | hyperparameters |
    |:---|---:|---:|---:|---:|---:|---:|:---|
    {_rows}
    """
    )
    return


@app.cell
def _(LOSSES, beta, pass_before, results):
    from posttrain.teach.charts import PALETTE, REFERENCE, figure, finish

    # The table's two Δ log π columns, drawn: a bar below zero is an answer made less likely
    _fig, _ax = figure()
    for _i, (_key, _label) in enumerate((("d_chosen", "Δ log π(chosen)"), ("d_rejected", "Δ log π(rejected)"))):
        _ax.bar([_x + 0.4 * _i - 0.2 for _x in range(len(LOSSES))], [results[n][_key] for n in LOSSES], width=0.4,
                color=PALETTE[_i], label=_label)
    _ax.axhline(0.0, color=REFERENCE, linewidth=0.8)
    _ax.set_xticks(range(len(LOSSES)), [f"{n.upper()}\npass@1 {results[n]['pass@1']:.2f}" for n in LOSSES],
                   fontsize=8)
    chart = finish(_fig, _ax, f"loss, after 30 steps (β = {beta:g} for DPO, IPO, KTO; pass@1 {pass_before:.2f} before)",
                   "Δ log π (nats an answer)",
                   title="A pair asks only that chosen beat rejected: below 0, an answer made less likely")
    chart
    return (chart,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **Read Δ log π(chosen) first.** Every loss learns to rank most of its training pairs, yet
      DPO, IPO, KTO and SimPO *lower* the likelihood of the chosen answers too: a pair only asks that the
      chosen beat the rejected, and pushing both down satisfies it. The mass goes to answers
      in no pair at all, and greedy pass@1 falls. ORPO is the exception: its SFT term raises
      the chosen answer itself, and it keeps the policy's pass@1.
    * **β = 1.** The leash to π_ref is ten times stronger: DPO, IPO and KTO stay much closer
      to the start (lower KL) and lose less pass@1. SimPO and ORPO do not move: they have no
      reference, so no β leash (SimPO's β scales a length-normalised log-prob instead).
    * **β = 0.01.** IPO's target margin 1/(2β) becomes 50 nats, far out of reach: it pushes the
      pairs apart as hard as DPO does, and its KL more than doubles. DPO's weight σ(−βΔ) stays
      near ½ for longer, so it never eases off.

    ## The family, and when each wins

    | loss | data | reference | the change from DPO | wins when |
    |:---|:---|:---|:---|:---|
    | DPO | pairs | yes | — | pairs are clean and come from (near) the policy being trained, e.g. refreshed each round (online DPO) |
    | IPO | pairs | yes | squared loss to a finite margin 1/(2β) | preferences are near-certain and data is small: DPO's margin has no target and grows without bound |
    | KTO | thumbs up / down, unpaired | yes | each answer against a KL reference point | you have binary feedback, not comparisons, or far more of one kind than the other |
    | ORPO | pairs | no | SFT loss on the chosen + a log-odds-ratio term | the chosen answers are good demonstrations: one stage instead of SFT then DPO, no reference in memory |
    | SimPO | pairs | no | length-normalised log-prob as the reward, margin γ | length exploitation is the problem and the SFT start is strong; nothing anchors it to π_ref |

    [The five losses from one start](../docs/guides/preference.md#the-five-losses-from-one-start) measures the same family on chains of
    thought (arithmetic level 3, 100 steps × 32 pairs): ORPO [69.2%](../docs/guides/preference.md#the-five-losses-from-one-start) and IPO [68.6%](../docs/guides/preference.md#the-five-losses-from-one-start)
    held the start's level while DPO fell to [32.6%](../docs/guides/preference.md#the-five-losses-from-one-start) and SimPO to [18.6%](../docs/guides/preference.md#the-five-losses-from-one-start). A wrong
    chain shares most of its tokens with right ones, and a sequence-level loss pushes all of
    them down.

    ## Source files used here

    * `posttrain/algorithms/preference/dpo.py` — the derivation in its docstring, `DPO.loss`
    * `posttrain/algorithms/preference/ipo.py`, `posttrain/algorithms/preference/kto.py`,
      `posttrain/algorithms/preference/orpo.py`, `posttrain/algorithms/preference/simpo.py` — each a small diff on DPO
    * `posttrain/algorithms/preference/core.py` — `PreferenceLogps`, the one input every loss reads
    * `posttrain/pipelines/preference_train.py` — `train_preference`, `evaluate_preference`, `mean_token_kl`
    * `posttrain/data/preference_rows.py` — `pairs_from_verifier`, `response_episode`
    * `posttrain/rewards/reward_model.py` — `bt_loss`, the loss DPO equals at π\*
    * `docs/algorithms/dpo.md` — offline against online DPO, measured

    ## Exercises

    1. In the Z table, change β and watch β log Z(x). Why does it approach π_ref(right answer)
       when β is large, and 1 + β log π_ref(right answer) when β is small?
    2. DPO's gradient on a pair is weighted by σ(−βΔ). What is that weight for a pair the policy
       already ranks right by a margin of 10 nats, at β = 0.1 and at β = 1?
    3. Code: `exercises/16_dpo.py` asks for the DPO loss; run `posttrain check 16`.

    Next: lesson 17 spends compute at test time instead of training time.
    """)
    return


if __name__ == "__main__":
    app.run()
