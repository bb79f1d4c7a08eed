"""Lesson 18 · Environments and verifiers: five archetypes, and what optimisation does to a weak one."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import html

    import marimo as mo

    from posttrain.teach.lesson_setup import torch_on_one_thread

    torch = torch_on_one_thread()
    return html, mo, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 18 · Environments and verifiers

    ## The verifier is the task

    An RL run does not optimise what you meant; it optimises what the scorer pays for. Any
    text the verifier pays for without deserving it is a direction the policy gradient will
    find, and the better the optimiser, the sooner. That is Goodhart's law with an RL flavour:
    the measure does not merely drift from the target, it is *searched* for its flaws. So a
    verifier is written like a security boundary: every way to be paid must be a way to be
    right.

    ## Five archetypes

    | archetype | what it checks | in posttrain | what gets hacked | the defence here |
    |:---|:---|:---|:---|:---|
    | **math** | the final answer equals the reference | `posttrain/verifiers/final_int.py` (one strict `Final: <int>` line), `posttrain/verifiers/math_answer.py` (math-verify equivalence, in a killable worker with a deadline) | lenient parsing: several answers, hedges, the last number anywhere, answers math-verify misreads (`\boxed{5 = 4}` once scored right for 4) | one strictly parsed answer line; versioned specs (`math/boxed-or-final-v2` refuses what v1 paid) |
    | **code** | the model's code passes the example's tests | `posttrain/verifiers/code.py` in `posttrain/guards/sandbox.py` | special-casing the tests, an object whose `__eq__` always says yes, rebinding builtins, forging the harness's report, reading the answer key | the sandbox only computes values; the trusted parent compares them (`tests/test_code_attacks.py`: 15 tricks that paid 1.0 now score 0) |
    | **tool use** | the final answer of a multi-turn episode with tool calls | `posttrain/envs/tool_env.py`, `posttrain/envs/tools.py`, `posttrain/rewards/agentic.py` | calling tools for their own sake, burning turns, malformed calls that crash an environment, training on the tool's output as if the model wrote it | every tool call returns a result and never raises; costs per call and per malformed call, never bonuses; tool tokens masked out (lesson 08) |
    | **web** | an answer found by searching, checked against a reference | offline, with no network: `posttrain/envs/search_qa.py` (`--env.name search_qa`), a `search` tool doing BM25 over a bundled corpus of 1,000 invented towns (`posttrain/envs/corpus_search.py`), then a calculator ([the search archetype, offline](../docs/guides/agents.md#the-search-archetype-offline)) | a number copied from the retrieved snippet: grounded in the evidence, so an "is it supported by what was retrieved?" check (`used_tool_result`) pays it | the verifier recomputes the answer from the question and pays only that; the corpus is generated so that no copied count is ever the answer. What a real search task would add: a frozen snapshot of pages and a checker that reads the cited passage |
    | **LLM-as-judge** | a model's opinion of the answer on a rubric | `posttrain/rewards/judge.py`, `posttrain/rewards/rubric.py` | length, flattery, confident tone, an answer that tells the judge it is correct | soft labels from one forward pass, a fixed versioned prompt, a judgement that puts little mass on the labels scores 0; still a learned proxy, so it drifts like lesson 15's reward model |

    The first four are checkers; the judge (and lesson 15's reward model) is a *proxy*:
    right on average where it was built, and searchable for its blind spots.

    ## The live demo

    `final_int.py` ships four deliberately hackable specs, each a shortcut someone might
    plausibly write, with the exploit it admits in its docstring, and a golden exploit pack
    (`posttrain/data/packs/golden_exploits.jsonl`) that the tests keep winning on them and
    losing on the honest specs. The dropdown picks the spec that **pays** the reward. Below:
    which exploits it pays, what it does to a measured pass rate, and then an optimiser let
    loose on it.

    The optimiser is a policy that chooses *how* to answer each of the 100 problems of the
    frozen-rollouts pack: honestly (the pack's own completion, a realistic mix that is right 49%
    of the time) or with one of two exploits copied from the golden pack: every number from 0
    to 45 on one line, or one `Final:` line per number. It starts almost always honest (90%)
    and takes 40 GRPO steps: 16 problems × 8 samples, advantages from the library's
    `group_advantages` within each problem's group, its `policy_gradient_loss`, a plain
    gradient step on the three logits, reward from the chosen spec. The **gold** is the honest spec,
    `final_int/cot-v1`, which the policy never sees. A real policy would have to discover these
    strategies token by token, far more slowly; here they are handed to it, so that the
    dynamics take a second.
    """)
    return


@app.cell
def _(mo):
    SPECS = ["final_int/cot-v1", "hackable/substring", "hackable/last-number",
             "hackable/case-insensitive-prefix", "hackable/multi-final"]
    paid_by = mo.ui.dropdown(options=SPECS, value="hackable/substring", label="the reward is paid by")
    paid_by
    return (paid_by,)


@app.cell
def _(paid_by, torch):
    from posttrain.algorithms.core import policy_gradient_loss
    from posttrain.algorithms.grpo import group_advantages
    from posttrain.eval.packs import example_of, load_pack
    from posttrain.verifiers.final_int import get_spec

    proxy, gold = get_spec(paid_by.value), get_spec("final_int/cot-v1")
    exploits = load_pack("exploits")
    pack_rows = [(r["exploit"], r["exploits_spec"], r["completion"], proxy(example_of(r), r["completion"])["reward"],
                  gold(example_of(r), r["completion"])["reward"]) for r in exploits]
    rollouts = load_pack("frozen")
    problems = [example_of(r) for r in rollouts]
    inflation = {name: sum(spec(e, r["completion"])["reward"] for e, r in zip(problems, rollouts)) / len(rollouts)
                 for name, spec in (("proxy", proxy), ("gold", gold))}

    # The three ways to answer: the pack's own completion, or an exploit text from the golden pack
    STRATEGIES = ("answer honestly", "every number 0-45", "a Final: line per number")
    _first = lambda kind: next(r["completion"] for r in exploits if r["exploit"] == kind)
    _texts = [None, _first("enumerate_numbers"), _first("enumerate_final_lines")]

    def answer(strategy: int, k: int) -> str:
        return rollouts[k]["completion"] if strategy == 0 else _texts[strategy]

    STEPS, PROMPTS, K = 40, 16, 8
    logits = torch.log(torch.tensor([0.90, 0.05, 0.05])).requires_grad_(True)  # the policy RL starts from
    LR = 3.0  # plain gradient steps on three logits: no optimizer state needed
    gen = torch.Generator().manual_seed(0)
    curve = []
    for _step in range(STEPS):
        _logp = torch.log_softmax(logits, dim=0)  # (3,)
        _prompts = torch.randperm(len(rollouts), generator=gen)[:PROMPTS]  # (16,)
        _choice = torch.multinomial(_logp.exp().detach(), PROMPTS * K, replacement=True, generator=gen)  # (128,)
        _ks = _prompts.repeat_interleave(K)  # (128,) each prompt's K samples are one group
        _texts_now = [answer(int(s), int(k)) for s, k in zip(_choice, _ks)]
        _r = torch.tensor([proxy(problems[int(k)], t)["reward"] for k, t in zip(_ks, _texts_now)])  # (128,)
        _g = torch.tensor([gold(problems[int(k)], t)["reward"] for k, t in zip(_ks, _texts_now)])  # (128,)
        _adv = group_advantages(_r, _ks, "group", 1e-6)  # (128,) GRPO: within each prompt's group
        # each sample is a one-token "completion": the strategy it chose
        _loss = policy_gradient_loss(_logp[_choice][:, None], _adv[:, None], torch.ones(len(_choice), 1),
                                     "seq-mean-token-sum")
        _loss.backward()
        with torch.no_grad():
            logits -= LR * logits.grad
            logits.grad = None
        curve.append({"step": _step, "pi": _logp.exp().tolist(), "proxy": _r.mean().item(), "gold": _g.mean().item()})
    final_pi = torch.softmax(logits.detach(), dim=0).tolist()
    return STRATEGIES, curve, final_pi, inflation, pack_rows, proxy


@app.cell
def _(STRATEGIES, curve, final_pi, html, inflation, mo, pack_rows, proxy):
    from posttrain.teach.tables import markdown_table

    _short = lambda t: "<code>" + html.escape(t[:34].replace("\n", "⏎")).replace("|", "&#124;") + ("…" if len(t) > 34 else "") + "</code>"
    _kinds = {}
    for kind, spec, text, paid, honest in pack_rows:
        _kinds.setdefault((kind, spec), []).append((text, paid, honest))
    _pack = markdown_table(
        ["exploit", "written against", "example", f"paid by `{proxy.version}`", "paid by `final_int/cot-v1`"],
        [[kind, f"`{spec}`", _short(rows[0][0]), f"**{sum(p for _, p, _ in rows):g} / {len(rows)}**",
          f"{sum(h for _, _, h in rows):g} / {len(rows)}"] for (kind, spec), rows in _kinds.items()])
    _marks = {0, 4, 9, 14, 19, 29, 39}
    _curve = markdown_table(
        ["step", "π(honest)", "π(numbers)", "π(Final lines)", "proxy reward", "gold reward"],
        [[str(c["step"])] + [f"{p:.2f}" for p in c["pi"]] + [f"{c['proxy']:.2f}", f"{c['gold']:.2f}"]
         for c in curve if c["step"] in _marks])
    mo.md(
        f"""
    ### Paid by `{proxy.version}`

    **The golden exploit pack** (every exploit kind, how many of its examples each spec pays):

    {_pack}
    **A measurement, inflated.** The 100 frozen rollouts pass at **{inflation['proxy']:.2f}** under
    `{proxy.version}` and {inflation['gold']:.2f} under `final_int/cot-v1`: same completions, different instrument.

    **An optimiser on it** (the probability of each strategy, and the mean reward of that step's 128 samples):

    {_curve}
    After 40 steps: {", ".join(f"π({s}) = {p:.3f}" for s, p in zip(STRATEGIES, final_pi))}.
    """
    )
    return


@app.cell
def _(curve, proxy):
    from posttrain.teach.charts import curves, figure, finish, legend_right

    hacking_fig, _ax = figure()
    curves(_ax, [c["step"] + 1 for c in curve], {
        "proxy (pays, GRPO sees it)": [c["proxy"] for c in curve],
        "gold (cot-v1, never seen)": [c["gold"] for c in curve],
        "π(answer honestly)": [c["pi"][0] for c in curve],
    }, styles={"π(answer honestly)": ":"})
    _ax.set_ylim(-0.03, 1.03)
    finish(hacking_fig, _ax, "GRPO step (16 problems × 8 samples)", "mean reward / probability",
           title=f"Paid by {proxy.version}: proxy against gold")
    legend_right(hacking_fig, _ax)
    hacking_fig
    return (hacking_fig,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    * **`hackable/substring`** (the default) pays any text that *contains* the answer. "Every
      number from 0 to 45" contains every answer, so it is paid on every problem, where an
      honest answer is paid about half the time. GRPO sees the difference inside every group
      where both were sampled, and within a few dozen steps the policy writes almost nothing
      else: the proxy reward climbs to about 1 while the gold falls to about 0. Nothing in the training
      metrics looks wrong; only the gold, which training never sees, says so.
    * **`hackable/multi-final`** pays any text with one `Final:` line that matches: the same
      collapse, onto the other exploit.
    * **`hackable/last-number`** and **`hackable/case-insensitive-prefix`** are hackable too (the
      pack proves it, and the frozen rollouts' pass rate is inflated under them), yet the
      optimiser stays honest: their exploits need the right number, so none pays more reliably
      than answering. A hole is only found if it pays more than the honest path, and only the
      holes that pay get found. Do not conclude that a spec is safe because a run did not break
      it.
    * **`final_int/cot-v1`**: both exploits score 0, and the policy unlearns them.

    ## The same curve from a real run

    In lesson 15 the proxy was a learned reward model. [RLHF end to end](../docs/guides/preference.md#rlhf-end-to-end)
    runs the whole recipe on the arithmetic task (`make run`'s SFT policy, a Bradley–Terry reward
    model trained on its verifier-ranked samples, then PPO against it) and logs the
    verifier's verdict beside the reward model's score at every step. With the KL term off
    (`posttrain rlhf --ppo.kl_coef 0.0`), the reward model's score of the policy's samples rose
    [from 0.12 to 0.81](../docs/guides/preference.md#rlhf-end-to-end) while the verifier's fell to [0.24](../docs/guides/preference.md#rlhf-end-to-end) and held-out pass@1
    [from 69.0% to 26.2%](../docs/guides/preference.md#rlhf-end-to-end): the policy steered its sums toward a few answers the reward
    model liked, with a wrong addition the verifier caught and the reward model did not.

    ## Source files used here

    * `posttrain/verifiers/final_int.py` — the honest specs and the four hackable ones, each docstring naming its exploit
    * `posttrain/data/packs/golden_exploits.jsonl` and `posttrain/data/packs/README.md` — the exploit pack and the other packs
    * `posttrain/eval/packs.py` — `load_pack`, `example_of`
    * `posttrain/algorithms/grpo.py` — `group_advantages`; `posttrain/algorithms/core.py` — `policy_gradient_loss`
    * `posttrain/verifiers/contract.py` — the contract every verifier keeps (deterministic, total, explains itself)
    * `posttrain/verifiers/code.py`, `posttrain/guards/sandbox.py`, `tests/test_code_attacks.py` — the code archetype's threat model and its attacks
    * `posttrain/rewards/judge.py` — LLM-as-judge with soft labels
    * `posttrain/runs/monitors.py` — the run monitor that warns when a proxy rises while dev pass@1 falls

    ## Exercises

    1. For each hackable spec, write the one-line docstring warning you would want a colleague
       to read before using it, then compare with the spec's own docstring.
    2. The optimiser never sees the gold. Which numbers could a run log so that this collapse is
       caught without a gold reward? (`posttrain/runs/monitors.py` has one answer; response
       length and the share of distinct answers are others.)
    3. Code: `exercises/18_verifiers.py` asks for the honest spec itself, `final_int/cot-v1`;
       `posttrain check 18` runs it on the golden correct set (everything must pass), the
       golden exploit pack (nothing may) and the frozen rollouts.

    Next: lesson 18a turns from the scorer to what it scores: which prompts carry gradient
    signal at all, and the pipeline that chooses them: [18a · Data as a gradient-signal
    substrate](?file=18a_data_as_signal.py).
    """)
    return


if __name__ == "__main__":
    app.run()
