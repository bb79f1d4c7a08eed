"""Lesson 03 · Reward and reference: the verifier that scores, the anchor that holds."""

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
    # 03 · Reward & reference

    RL can only be as good as the number it maximises. This lesson is about the two roles that
    decide what that number is: the **environment**, which turns a completion into a reward, and
    the **reference**, a frozen copy of the starting model that keeps the policy from wandering
    off to wherever the reward happens to be easiest to collect.

    ## Where rewards come from

    * **Verifiable rewards (RLVR).** A program checks the answer: the unit tests pass, the final
      line equals the known result. Cheap, exact, and honest *if the checker is right*.
    * **Learned reward models (RLHF).** A network trained on human preferences scores the text.
      Needed when no program can check (helpfulness, tone), but it is itself a model, with blind
      spots the policy will find (lesson 15).

    Here we use the verifier of `posttrain/verifiers/final_int.py`. Treat it like a measuring
    instrument: it has a version (`final_int/strict-v1`), it is deterministic, it never crashes on
    any string, and every verdict carries a **reason code**, so a 0 can be told apart from a 0.

    It reads **text**. The policy writes **tokens**. Every character below is one token decision
    of `gpt_mini`'s character tokenizer; one wrong decision (a second space, a leading zero) and
    the reward is gone. The verifier is not differentiable — it compares strings — which is why
    the policy gradient of lesson 01 is needed at all.

    Type a completion for the problem below. (Try the correct answer first, then break it.)
    """)
    return


@app.cell
def _():
    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.verifiers.final_int import REASONS, SPECS

    env = ArithmeticEnv(level=3, cot=False)  # scored by final_int/strict-v1
    example = env.fixed_set("heldout", 1, seed=0)[0]
    answer = int(example.expected_answer)
    return REASONS, SPECS, answer, env, example


@app.cell
def _(answer, mo):
    completion = mo.ui.text(value=f"Final: {answer}", label="completion", full_width=True)
    completion
    return (completion,)


@app.cell
def _(REASONS, SPECS, completion, env, example, mo):
    import html

    from posttrain.teach.demos.tokens import show, split
    from posttrain.models.tokenizer import CharTokenizer

    def code(text: str) -> str:
        """Text as inline code a markdown table cannot misread: whitespace made visible
        (␣ space, ⏎ newline), HTML escaped, and "|" kept out of the table syntax."""
        return "<code>" + html.escape(show(text)).replace("|", "&#124;") + "</code>"

    # The text box holds one line; "\n" typed as two characters stands for a newline.
    text = completion.value.replace("\\n", "\n")
    verdict = env.score(example, text)
    _reason = verdict["details"]["reason"]
    _tokens = " ".join(code(piece) for _, piece in split(CharTokenizer(), text))
    _spec_rows = ""
    for _version, _spec in SPECS.items():
        _r = _spec(example, text)
        _flag = "**credits it; strict does not: an exploit**" if _r["reward"] > verdict["reward"] else ""
        _spec_rows += f"| `{_version}` | {_r['reward']:g} | {_r['details']['reason']} | {_flag} |\n"
    mo.md(
        f"""
    **Prompt** `{example.prompt!r}` — expected answer {example.expected_answer}.

    ### Strict verdict (`{env.spec_version}`)

    reward **{verdict['reward']:g}** · reason `{_reason}` — {REASONS[_reason]} · parsed
    `{verdict['details']['parsed']}`

    Tokens the policy would have emitted ({len(text)} decisions, ␣ space, ⏎ newline): {_tokens}

    ### The same text under every scorer version

    | spec | reward | reason | |
    |:---|---:|:---|:---|
    {_spec_rows}
    """
    )
    return code, text, verdict


@app.cell
def _(mo):
    mo.md(r"""
    ## Why a frozen reference?

    Maximise reward alone and the policy will move its probability mass onto whatever scores,
    however odd — including the exploits a scorer admits, and including text that no longer
    reads like language. The reference $\pi_{\text{ref}}$ (a frozen copy of the model RL started
    from, `posttrain/roles/reference.py`) anchors it. The regularised objective is

    $$
    J_\beta(\pi) \;=\; \mathbb{E}_{y\sim\pi}[r(y)] \;-\; \beta\,\mathrm{KL}(\pi \,\|\, \pi_{\text{ref}}),
    \qquad
    \pi^*_\beta(y) \;=\; \frac{\pi_{\text{ref}}(y)\,e^{r(y)/\beta}}{Z_\beta}.
    $$

    The optimum re-weights the reference by $e^{r/\beta}$: large $\beta$ barely moves it, small
    $\beta$ hands everything to the reward. Below, six candidate completions — yours and five
    fixed ones — play the role of the action space. Rewards come from the strict verifier above;
    the reference prefers sloppy formats (as a model that was never taught the spec would).
    $\pi^*_\beta$ and its KL are computed by `posttrain/teach/demos/kl_tradeoff.py`; the two KL columns
    are the library's per-sample estimators `kl_k1` and `kl_k3`, averaged exactly under $\pi^*$.
    Both are unbiased, so they agree with each other.
    """)
    return


@app.cell
def _(SPECS, answer, code, env, example, mo, text, torch):
    from posttrain.algorithms.core import kl_k1, kl_k3
    from posttrain.teach.demos.kl_tradeoff import BETAS, closed_form_policy, exact_kl

    candidates = [text, f"Final: {answer}", f"Final:  {answer}", f"Final: 0{answer}", f"The answer is {answer}", f"Final: {answer + 1}"]
    rewards = torch.tensor([env.score(example, c)["reward"] for c in candidates])
    # What "the model before RL" likes: your text neutral, the exact format rare, sloppy ones common.
    ref_logp = torch.log_softmax(torch.tensor([0.0, -1.0, 1.5, 1.0, 2.0, 1.0]), -1)
    # What if we had trained against a hackable scorer? The first one that pays your text
    # more than strict does, else hackable/last-number. Junk = what it pays and strict rejects.
    hack = next((v for v, spec in SPECS.items() if v.startswith("hackable/")
                 and spec(example, text)["reward"] > rewards[0]), "hackable/last-number")
    hack_rewards = torch.tensor([SPECS[hack](example, c)["reward"] for c in candidates])
    junk = (hack_rewards > rewards).float()  # (6,) 1 where only the hackable scorer pays
    _rows = ""
    by_beta = {"π*(yours)": [], "E_π*[r]": [], "KL(π* ‖ π_ref)": [], "junk": []}  # one entry per β, for the chart
    for _beta in BETAS:
        _pi = closed_form_policy(rewards, ref_logp, _beta)  # (6,)
        _logp = _pi.log()
        _k1 = (_pi * kl_k1(_logp, ref_logp)).sum()
        _k3 = (_pi * kl_k3(_logp, ref_logp)).sum()
        _junk = (closed_form_policy(hack_rewards, ref_logp, _beta) * junk).sum().item()
        for _key, _value in zip(by_beta, (_pi[0], (_pi * rewards).sum(), exact_kl(_logp, ref_logp), _junk)):
            by_beta[_key].append(float(_value))
        _rows += (f"| {_beta:g} | {_pi[0]:.3f} | {_pi[1]:.3f} | {(_pi * rewards).sum():.3f} | "
                  f"{exact_kl(_logp, ref_logp):.3f} | {_k1:.3f} | {_k3:.3f} | {_junk:.3f} |\n")
    _cands = "".join(f"| {i} | {code(c)} | {r:g} | {p:.3f} |\n" for i, (c, r, p) in enumerate(zip(candidates, rewards.tolist(), ref_logp.exp().tolist())))
    mo.md(
        f"""
    | # | candidate | reward | π_ref |
    |---:|:---|---:|---:|
    {_cands}
    | β | π*(yours) | π*(#1, correct) | E_π*[r] | KL(π* ‖ π_ref) | E[k1] | E[k3] | mass on junk if trained on `{hack}` |
    |---:|---:|---:|---:|---:|---:|---:|---:|
    {_rows}
    At β = 5 the policy is close to the reference (E[r] = {(ref_logp.exp() * rewards).sum():.3f} there);
    at β = 0.05 nearly all mass sits on reward-1 candidates, paid for in KL.
    The last column redoes the optimum with `{hack}` as the reward: "junk" is the mass on
    candidates it pays and strict rejects ({', '.join(str(i) for i in range(6) if junk[i]) or 'none'}).
    The reference itself puts {(ref_logp.exp() * junk).sum():.2f} of its mass there (it likes sloppy
    formats); a large β keeps the policy near that, a small β pushes it to
    {(closed_form_policy(hack_rewards, ref_logp, 0.05) * junk).sum():.2f}: the wrong scorer *pays* for the blind spot.
    """
    )
    return BETAS, by_beta, hack


@app.cell
def _(BETAS, by_beta, hack):
    from posttrain.teach.charts import PALETTE, curves, figure, finish

    # The β table above, drawn: what the optimum gains as β falls (left axis, probabilities)
    # and what it pays for it in KL (right axis, nats)
    _junk = f"mass on junk if trained on {hack}"
    _fig, _ax = figure()
    curves(_ax, list(BETAS), {"E_π*[r] under the strict verifier": by_beta["E_π*[r]"],
                              "π*(your text)": by_beta["π*(yours)"], _junk: by_beta["junk"]},
           styles={_junk: "--"}, markers=True)
    _ax.set_xscale("log")
    _kl_axis = _ax.twinx()  # KL is in nats, not a probability: its own scale
    _kl_axis.plot(list(BETAS), by_beta["KL(π* ‖ π_ref)"], color=PALETTE[3], marker="s", markersize=3, linestyle=":")
    _kl_axis.set_ylabel("KL(π* ‖ π_ref), nats (dotted)", color=PALETTE[3])
    _kl_axis.spines["top"].set_visible(False)
    chart = finish(_fig, _ax, "β, the KL coefficient (log scale)", "probability, expected reward",
                   title="Small β buys reward with KL, and with a hackable scorer it buys the junk too")
    chart
    return (chart,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * Type `Final: 24\nFinal: 25` (with the real answer in place of 25; `\n` is a newline). Strict
      says `multiple_final_lines`; `hackable/multi-final` pays. Now imagine training against it
      with a small β: the optimum above would pile its mass on that laundering trick, and the
      training reward would rise while nothing real improved.
    * Type `Final: 0` followed by the answer, or two spaces after the colon: one token decision
      away from reward 1, and the reason code says exactly which.
    * Slide your eye down the β column: at β = 0.05 the policy ignores the reference almost
      entirely. If the reward were wrong anywhere, that is where you would find out.

    ## Source files used here

    * `posttrain/verifiers/final_int.py` — the strict spec, reason codes, the hackable variants
    * `posttrain/envs/arithmetic.py` — the task
    * `posttrain/roles/environment.py` — `score_episodes`, the environment role
    * `posttrain/roles/reference.py` — the frozen reference and its `ref_logp`
    * `posttrain/teach/demos/kl_tradeoff.py` — `closed_form_policy`, `exact_kl` (also `posttrain demo kl_tradeoff`)
    * `posttrain/teach/demos/tokens.py` — `split`, `show` (also `posttrain demo tokens`)
    * `posttrain/algorithms/core.py` — `kl_k1`, `kl_k2`, `kl_k3`

    ## Exercises

    1. Find three strings that earn 1 under some hackable spec and 0 under strict, one per exploit.
       Which reason code does strict give each?
    2. Make your own text the correct answer. How does π*(yours) at β = 0.05 compare with π*(#1),
       and why do they split the mass the way they do?
    3. `kl_k1` can be negative on a single sample; `kl_k3` cannot. Why does that matter when the
       KL is used as a *per-token* penalty, even though both average to the same KL?
    4. Code: `exercises/03_kl_k3.py` asks you to write `kl_k3`; run `posttrain check 03`.

    Next: [04 · The algorithm plug-in](?file=04_algorithm_plugin.py).
    """)
    return


if __name__ == "__main__":
    app.run()
