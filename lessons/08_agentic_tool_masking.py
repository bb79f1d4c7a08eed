"""Lesson 08 · Agentic RL: multi-turn trajectories, and why tool output gets response_mask 0."""

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
    # 08 · Agentic RL: multi-turn and tool masking

    ## Why some tokens in a trajectory are not actions

    So far a completion was one block of tokens, every one of them sampled by the policy. An
    *agent* interleaves: the model writes a tool call, the tool (a Python interpreter, a search
    engine, a test runner) writes back, the model reads that and continues. The trajectory that
    reaches the trainer holds both kinds of tokens in one row:

    ```text
    [ prompt ........ | model: call 17*19 | tool: 323 | model: Final: 323 ⏎ ]
      response_mask 0 |        1          |     0     |         1
    ```

    The policy gradient is a sum over **the policy's own decisions**: $\nabla \log\pi_\theta(y_t)$
    for tokens the policy sampled. The tool's tokens were not sampled from $\pi_\theta$; they are
    part of the *state* the next decisions condition on, exactly like the prompt. So they get
    `response_mask = 0`: they stay in `tokens` (the model must still read them), but no loss,
    no advantage, no KL and no entropy term may touch them.

    ## The key equation

    $$
    \nabla_\theta \mathcal{L} = -\frac{1}{\sum_t m_t}\sum_t m_t\, A_t\, \nabla_\theta \log\pi_\theta(y_t \mid y_{<t}),
    \qquad m_t = \begin{cases}1 & y_t \text{ sampled by the policy}\\ 0 & \text{prompt, tool output, padding}\end{cases}
    $$

    The check that the mask does its job is an **invariance**: change anything at a masked
    position — its log-prob, even to NaN — and the loss must not change. The widget below runs
    that check on two real two-turn episodes of the tool-use task `tool_arithmetic`. The
    environment is the library's (`ToolArithmeticEnv`): its `step` parses the model's turn,
    runs the call on the registry's calculator, and its result becomes the tool tokens, laid
    out exactly as the agent loop (`posttrain/roles/agent.py`) lays out a sampled episode.
    `RolloutBatch.collate` reads each token's author from the episode's turns and masks the
    tool's. The log-probs come from a small, untrained `gpt_mini`'s forward pass, the loss is
    GRPO's `compute_loss`, and the update is the real `Trainer.update`.
    """)
    return


@app.cell
def _(torch):
    from posttrain.envs.tool_arithmetic import ToolArithmeticEnv
    from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.pipelines.sft import demonstration_turns
    from posttrain.roles.engines.contract import encode_prompt
    from posttrain.types import ENVIRONMENT_TURN, MODEL_TURN, Episode, Example

    torch.manual_seed(0)
    tok = CharTokenizer()
    model = GPTMini(GPTMiniConfig(vocab_size=tok.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=96,
                                  max_seq_len=128))
    # the tool-use task of `posttrain run --env.name tool_arithmetic`: a calculator tool, the
    # compact call format, the strict "Final: <int>" verifier on the answer turn
    env = ToolArithmeticEnv(digits=2)
    example = Example(prompt="Q: 17*19\n", expected_answer="323")

    # Two episodes for the same prompt, the model's turns written out: one calls the calculator
    # with the right expression, one with the wrong one. Everything else is the environment's
    # own doing: step() parses each turn, runs the call and returns the result to append.
    trajectories, episodes, segment_of = [], [], []
    for _b, _expression in enumerate(("17*19", "17+19")):
        _state, _segments = env.reset(example), []
        for _turn in (f"<tool_call>calculator: {_expression}</tool_call>", f"Final: {eval(_expression)}"):
            _segments.append((MODEL_TURN, _turn))
            _result = env.step(_state, _turn)
            if _result.observation:
                _segments.append((ENVIRONMENT_TURN, _result.observation))
        # laid out as the agent loop lays out a sampled episode: each model turn ends with EOS
        _turns = demonstration_turns(_segments, tok)
        _ids = [_i for _t in _turns for _i in _t.token_ids]
        episodes.append(Episode(example=example, group_id=0, prompt_ids=encode_prompt(tok, example.prompt),
                                response_ids=_ids, response_logp=[0.0] * len(_ids), reward=_result.reward,
                                turns=_turns))
        segment_of.append([("tool" if _t.source == ENVIRONMENT_TURN else "model") for _t in _turns
                           for _ in _t.token_ids])
        trajectories.append({"turns": _turns, "details": _result.details})
    return episodes, model, segment_of, tok, trajectories


@app.cell
def _(mo):
    controls = mo.ui.dictionary({
        "mask": mo.ui.dropdown(options={"0: tool output is state, not action (correct)": 0.0,
                                        "1: tool output trained as if the model wrote it (the bug)": 1.0},
                               value="0: tool output is state, not action (correct)",
                               label="response_mask on tool tokens"),
        "delta": mo.ui.slider(start=-5.0, stop=5.0, step=0.5, value=2.0, label="perturb log π on tool tokens by δ",
                              show_value=True),
    })
    controls.vstack()  # the panel's controls, one per line (their values stay in `controls`)
    return (controls,)


@app.cell
def _(controls, dataclasses, episodes, mo, model, segment_of, tok, torch):
    from posttrain.algorithms import make_algorithm
    from posttrain.models.logprobs import token_logp
    from posttrain.roles.trainer import Trainer
    from posttrain.types import PolicyOutputs, RolloutBatch

    tool_value = controls.value["mask"]
    delta = controls.value["delta"]
    batch = RolloutBatch.collate(episodes, tok.pad_id)
    tool = torch.zeros_like(batch.response_mask)  # (B, T) 1 on tool-output tokens
    for _b, _e in enumerate(episodes):
        _P = len(_e.prompt_ids)
        for _t, _kind in enumerate(segment_of[_b]):
            tool[_b, _P + _t] = float(_kind == "tool")
    batch.response_mask = torch.where(tool == 1, torch.tensor(tool_value), batch.response_mask)
    def all_logp(net):
        """log π(token | prefix) at *every* position, (B, T) — the trainer computes it only
        where response_mask is 1, and here we also want to look at the tool tokens."""
        with torch.no_grad():
            return token_logp(net(batch.tokens), batch.tokens, batch.temperature)

    logp_now = all_logp(model)  # (B, T)
    batch.old_logp = logp_now * batch.response_mask  # π_old = the current weights: ratio 1 at the start
    grpo = make_algorithm("grpo")
    batch = dataclasses.replace(batch, **grpo.compute_advantages(batch))

    def loss_at(logp):
        """GRPO's loss with the given (B, T) log-probs; returns (loss, ∂loss/∂logp)."""
        logp = logp.detach().clone().requires_grad_(True)
        _loss, _ = grpo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros_like(logp)), batch)
        _loss.backward()
        return _loss.item(), logp.grad

    loss_0, grad_0 = loss_at(logp_now)
    loss_delta, _ = loss_at(logp_now + delta * tool)  # change only the tool tokens
    loss_nan, _ = loss_at(torch.where(tool == 1, torch.tensor(float("nan")), logp_now))  # poison them
    tool_push = -(grad_0 * tool).sum(dim=1)  # (B,) how hard each row's tool tokens are pushed

    # One real update, then: how much more likely did the model make each row's tool output?
    _before = (logp_now * tool).sum(dim=1)
    import copy as _copy

    with mo.status.spinner(title=f"One GRPO update at η = 1e-2 on the {batch.batch_size} tool-use episodes…"):
        _trainer = Trainer(_copy.deepcopy(model).requires_grad_(True), lr=1e-2, total_steps=1)
        _trainer.update(batch, grpo)
        tool_logp_change = (all_logp(_trainer.model) * tool).sum(dim=1) - _before  # (B,)
    return batch, delta, grad_0, loss_0, loss_delta, loss_nan, tool, tool_logp_change, tool_push, tool_value


@app.cell
def _(batch, delta, episodes, grad_0, loss_0, loss_delta, loss_nan, mo, segment_of, tok, tool_logp_change,
      tool_push, tool_value, trajectories):
    import html
    import math

    from posttrain.teach.demos.tokens import show

    def _cell(text):
        return "<code>" + html.escape(show(text)).replace("|", "&#124;") + "</code>"

    _tables = []
    for _b, _e in enumerate(episodes):
        _start, _rows = len(_e.prompt_ids), ""
        for _turn in trajectories[_b]["turns"]:  # one table row per turn: its tokens' mask, advantage, push
            _span = slice(_start, _start + len(_turn.token_ids))
            _who = "tool" if _turn.source == "environment" else "model"
            _rows += (f"| {_cell(tok.decode(_turn.token_ids, skip_special_tokens=False))} | {_who} | "
                      f"{len(_turn.token_ids)} | {batch.response_mask[_b, _span].mean():g} | "
                      f"{batch.advantages[_b, _span].mean():+.3f} | {grad_0[_b, _span].sum():+.4f} |\n")
            _start += len(_turn.token_ids)
        _calls = trajectories[_b]["details"]["tool_calls"]
        _tables.append(
            f"**Row {_b}** — calculator `{_calls[0]['arguments']['expression']}` → {_calls[0]['reason']} in "
            f"{_calls[0]['seconds'] * 1e3:.2f} ms, reward **{_e.reward:g}**\n\n"
            "| turn | who wrote it | tokens | response_mask | advantage (mean) | Σ ∂loss/∂log π |\n"
            "|:---|:---|---:|---:|---:|---:|\n" + _rows
        )
    _same = math.isclose(loss_0, loss_delta, rel_tol=0, abs_tol=1e-7)
    _verdict = ("**unchanged** — the masked positions cannot reach the loss" if _same else
                "**changed** — the tool's tokens are inside the loss")
    mo.md(
        f"""
    ### The perturbation check (response_mask on tool tokens = {tool_value:g})

    | log π on tool tokens | GRPO loss |
    |:---|---:|
    | as computed | {loss_0:+.6f} |
    | + δ = {delta:+.1f} | {loss_delta:+.6f} |
    | NaN | {loss_nan:+.6f} |

    Shifting the tool tokens' log-probs by δ left the loss {_verdict}. (At ratio 1 the loss
    itself is about 0, since GRPO's advantages average to zero within the group; its gradient,
    in the tables below, is not.)

    Push on each row's *tool tokens* (−Σ ∂loss/∂log π over them): `{[round(v, 4) + 0.0 for v in tool_push.tolist()]}`.
    After one real `Trainer.update` (lr 1e-2), the log-probability the model gives each row's
    tool output changed by `{[round(v, 3) for v in tool_logp_change.tolist()]}` (rows 0, 1).

    {_tables[0]}

    {_tables[1]}
    """
    )
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    Switch the dropdown to **1 (the bug)**. Three things go wrong at once, and the widget shows
    each of them:

    * The δ check fails: the loss now depends on what the tool said, as if the model had said it.
    * The tool tokens get an advantage and a direct gradient: row 0's tool output
      (`<tool_result>323</tool_result>`) is pushed *up* and row 1's (`…36…`) *down*, as if they
      were the model's choices. The model is
      being trained to write the observation itself instead of calling the tool — in a long
      agentic run, the classic symptom is a model that starts writing the tool result it
      hoped for. Compare the log-prob change of row 1's tool output after one update, with the
      mask (an indirect effect, next bullet) and without it.
    * Even with the correct mask the tool tokens' log-probs move a little: the weights are
      shared, and row 0's own answer `Final: 323` contains the same characters. The mask
      removes the *direct* gradient, not every correlation; that is the right behaviour.
    * A NaN anywhere in those positions (a tool returned bytes the tokenizer mapped oddly, a
      padded log-prob of −inf) now reaches the loss and the whole step.

    With the correct mask the loss is bit-for-bit unchanged by δ and by NaN: the library's
    masked reductions use `torch.where`, not `x * mask`, precisely because `NaN * 0` is NaN.
    PPO's GAE has the same rule in time: a masked tool span is not a time step, so the running
    advantage passes through it unchanged (`gae` in `posttrain/algorithms/ppo.py`).

    ## Source files used here

    * `posttrain/types.py` — `RolloutBatch.collate` (the mask from each turn's author), `Episode`, `Turn`
    * `posttrain/envs/tool_arithmetic.py`, `posttrain/envs/tool_env.py`, `posttrain/envs/tools.py` — the task,
      `step`, the calculator
    * `posttrain/roles/agent.py` — the multi-turn loop that samples such episodes (token-in/token-out)
    * `posttrain/pipelines/sft.py` — `demonstration_turns`, the layout of a turn (its EOS) and of an observation
    * `posttrain/algorithms/core.py` — `masked_sum`, `masked_mean`, `clipped_surrogate` (the `torch.where` rule)
    * `posttrain/algorithms/grpo.py` — `compute_advantages` (advantage × response_mask), `compute_loss`
    * `posttrain/algorithms/ppo.py` — `gae`, which skips masked positions
    * `posttrain/roles/trainer.py` — `Trainer.update` (its forward pass computes log-probs only where the mask is 1)
    * `tests/test_algorithms_core.py` — the masked-positions-cannot-leak tests

    ## Exercises

    1. With the correct mask, the tool tokens still change the loss *indirectly*. How? (They are
       in `tokens`: the model reads them when it predicts `Final: 323`.) Is that a bug?
    2. A tool that fails returns a traceback. Should the next model turn be rewarded for
       recovering from it? Which tokens would carry that gradient?
    3. Code: `exercises/08_masked_mean.py` asks for a masked mean that NaN in masked positions
       cannot reach — the guarantee this lesson's δ check relies on; run `posttrain check 08`.

    Next: [09 · REINFORCE](?file=09_reinforce.py).
    """)
    return


if __name__ == "__main__":
    app.run()
