"""Lesson 00 · Orientation: the map before the territory."""

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
    # 00 · Orientation

    A language model that has read the internet can continue text. Post-training is everything
    we do afterwards to make it *behave*: answer in a format, get sums right, refuse what it
    should refuse. This course is about one family of post-training methods, reinforcement
    learning (RL), where the model writes something, a scorer grades it, and the model is nudged
    toward what scored well.

    Every lesson follows the same order: **why** the piece exists, the **equation** it computes,
    **one widget** whose numbers come from the real `posttrain` code, a **setting that breaks
    it** (go and find it), and the **source files** to read next.

    ## The running example

    All of Part I uses one verifiable task from `posttrain/envs/arithmetic.py`: add a few small
    numbers and end with one strictly formatted line, `Final: <int>`. The scorer,
    `posttrain/verifiers/final_int.py`, never does the arithmetic; it checks the format and compares
    the integer string with the expected answer, and it always says *why* with a reason code.
    """)
    return


@app.cell
def _(mo):
    from posttrain.teach.diagrams import PARTS, course_map_svg
    from posttrain.teach.lessons import lesson_files, lesson_title

    # Every lesson file in lessons/ with its title, read the way `posttrain lessons --list` reads
    # them: a lesson added tomorrow joins the map without anyone editing it.
    course = {number: (path.name, lesson_title(path)) for number, path in lesson_files().items()}
    course_map = course_map_svg(course)
    _parts = "\n".join(f"* **Part {part} · {name}**: {covers}." for part, name, _, covers in PARTS)
    mo.vstack([mo.md(f"""
    ## The map: five parts

    After this orientation the course runs in five parts, each built on the one before.
    Lessons with a letter (18a, 22a–22c) are inserted where they are needed.

    {_parts}

    Click a lesson to open it; hover for its full title.
    """), mo.Html(course_map)])
    return course, course_map


@app.cell
def _(mo):
    mo.md(r"""
    ## Six roles around one loss

    Every RL post-training system we know of (TRL, verl, OpenRLHF, NeMo-RL) can be drawn as the
    same six boxes. In `posttrain` each is one file you can read in a sitting:

    | role | what it does | produces | file |
    |:---|:---|:---|:---|
    | rollout | samples K completions per prompt from the current policy | tokens, `old_logp` | `posttrain/roles/rollout.py` |
    | environment | grades each completion (text in, number out) | reward, reason | `posttrain/roles/environment.py` |
    | reference | a frozen copy of the starting model | `ref_logp` | `posttrain/roles/reference.py` |
    | algorithm | turns rewards into per-token advantages and a loss | advantages, loss | `posttrain/algorithms/core.py` |
    | trainer | forward, backward, optimizer step | new weights | `posttrain/roles/trainer.py` |
    | controller | runs the loop: sample → score → reference → advantage → update → sync → log | a run directory | `posttrain/roles/controller.py` |

    The data passed between them is defined, with every tensor's shape, in `posttrain/types.py`.
    Lessons 02–07 take the roles one at a time. Hover a box in the picture below for its job,
    its output and its file:
    """)
    return


@app.cell
def _(mo):
    from posttrain.teach.diagrams import six_roles_svg, three_forces_svg

    roles_picture, forces_picture = six_roles_svg(), three_forces_svg()
    mo.Html(roles_picture)
    return forces_picture, roles_picture


@app.cell
def _(forces_picture, mo):
    from posttrain.teach.diagrams import FORCES

    force_lines = [f"* **{force}**: {question}. Met in {lessons}; "
                   "weighed against the other two in [lesson 26](?file=26_three_forces.py)."
                   for force, question, lessons in FORCES]
    _lines = "\n".join(force_lines)
    mo.vstack([mo.md(f"""
    ## Three forces behind every design

    Every choice in this course answers to three forces, one line each:

    {_lines}

    A recipe is a point between them; lesson 26 turns the triangle into a simulator that recovers
    R1, RLHF, DPO and Tülu 3 from its corners. Hover a corner:
    """), mo.Html(forces_picture)])
    return (force_lines,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Three loops you must not mix up

    Almost every confusing result in this field comes from forgetting which of three activities
    produced a number:

    * **Loop A · evaluate.** Generate, score, look at the failures. Nothing changes; you are
      *measuring*. The knob you can turn is the measuring instrument (the scorer and its version).
    * **Loop B · select.** Draw N samples and keep the best one by reward (best-of-N). The answers
      you ship get better, yet the model is exactly the same: you spent *inference compute*.
    * **Loop C · learn.** Score samples and change the weights so that high-reward completions
      become more likely. Only here does the *policy* change, and so does the data you see next.

    Before you read any number, ask: **which loop am I in, and which knob did I turn** — the
    policy, the selection budget, the scorer, or the prompts?

    The widget below runs all three loops on the same eight completions of one real problem,
    each through the library function that implements it.
    """)
    return


@app.cell
def _():
    from posttrain.envs.arithmetic import ArithmeticEnv
    from posttrain.verifiers.final_int import get_spec
    from posttrain.search.best_of_n import Candidate, PromptCandidates, best_of_n
    from posttrain.algorithms.grpo import group_advantages
    from posttrain.teach.demos.tokens import show

    env = ArithmeticEnv(level=3, cot=False)  # spec final_int/strict-v1: the answer line only
    example = env.fixed_set("heldout", 1, seed=0)[0]
    answer = int(example.expected_answer)
    # Eight completions "a model might have written" for this prompt: a frozen set, so the
    # three loops can be compared on identical data (a real run would sample them, lesson 02).
    completions = [
        f"Final: {answer + 1}",
        f"Final:  {answer}",
        f"The answer is {answer - 2}, no wait, {answer}",
        f"Final: {answer}",
        f"Final: 0{answer}",
        f"Final: {answer}.",
        f"Final: {answer - 1}",
        f"Final: {answer}",
    ]
    return (
        Candidate,
        PromptCandidates,
        best_of_n,
        completions,
        env,
        example,
        get_spec,
        group_advantages,
        show,
    )


@app.cell
def _(mo):
    loop = mo.ui.dropdown(
        options=[
            "A · evaluate (strict scorer)",
            "B · select (best of the first 4)",
            "C · learn (GRPO advantages)",
            "A · evaluate with a hackable scorer",
        ],
        value="A · evaluate (strict scorer)",
        label="which loop?",
    )
    loop
    return (loop,)


@app.cell
def _(
    Candidate,
    PromptCandidates,
    best_of_n,
    completions,
    env,
    example,
    get_spec,
    group_advantages,
    loop,
    mo,
    show,
    torch,
):
    import html

    from posttrain.teach.tables import markdown_table

    def code(text: str) -> str:
        """Text as inline code a markdown table cannot misread: whitespace made visible
        (␣ space, ⏎ newline), HTML escaped, and "|" kept out of the table syntax."""
        return "<code>" + html.escape(show(text)).replace("|", "&#124;") + "</code>"

    def _table(rows):
        return markdown_table(["#", "completion", *rows[0][2].keys()],
                              [[i, code(text), *cols.values()] for i, text, cols in rows])

    if loop.value.startswith("A · evaluate with"):
        _spec = get_spec("hackable/last-number")
    else:
        _spec = get_spec(env.spec_version)
    scored = [_spec(example, c) for c in completions]
    rewards = torch.tensor([s["reward"] for s in scored])

    if loop.value.startswith("A"):
        _rows = [(i, c, {"reward": s["reward"], "reason": s["details"]["reason"]})
                 for i, (c, s) in enumerate(zip(completions, scored))]
        _what = (f"**Loop A** with `{_spec.version}`: mean reward (the metric) = "
                 f"**{rewards.mean():.3f}**. Nothing was changed; this is a measurement.")
        if "hackable" in _spec.version:
            _what += ("\n\n**It broke.** The completions are the same, the model is the same, "
                      "and the metric jumped: the *instrument* changed. `hackable/last-number` "
                      "credits the last number anywhere in the text, so a hedged answer counts. "
                      "Numbers measured under different spec versions are not one metric.")
    elif loop.value.startswith("B"):
        _pool = PromptCandidates(example, tuple(Candidate(f"s{i}", c) for i, c in enumerate(completions)))
        _bon = best_of_n([_pool], lambda ex, text: env.score(ex, text), n=4)
        _row = _bon["rows"][0]
        _rows = [(i, c, {"reward": s["reward"], "in the pool": "yes" if i < 4 else "no",
                         "chosen": "←" if f"s{i}" == _row["chosen_id"] else ""})
                 for i, (c, s) in enumerate(zip(completions, scored))]
        _what = (f"**Loop B** (`best_of_n`, n=4): the first sample scores {scored[0]['reward']:g}; "
                 f"the best of four scores **{_row['chosen_select_reward']:g}**. The output "
                 "improved, the model did not: selection spent four times the samples.")
    else:
        _adv = group_advantages(rewards, torch.zeros(len(rewards), dtype=torch.long), "group", 1e-6)
        _rows = [(i, c, {"reward": s["reward"], "advantage": f"{a:+.3f}",
                         "push": "up" if a > 0 else "down" if a < 0 else "-"})
                 for i, (c, s, a) in enumerate(zip(completions, scored, _adv.tolist()))]
        _what = ("**Loop C**: the eight samples form one GRPO group; `group_advantages` says which "
                 "to make more likely (reward above the group mean) and which less. A trainer "
                 "step would now *change the weights*, so the next eight samples would differ.")
    mo.vstack([mo.md(_table(_rows)), mo.md(_what)])
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Find the knob that breaks it

    One of the four options changes the reported number without changing a single completion.
    Which one, and why is that worse than a bug that crashes? (A crash you notice. A metric that
    quietly moves because its definition moved can drive months of "progress".)

    (In the tables, ␣ marks a space and ⏎ a newline: the scorer sees every one of them.)

    ## Text in, tokens out

    The scorer reads **text**; the model emits **tokens**. Between them sits a detokenizer and a
    parser, and both are part of the environment:

    ```
    policy (logits over tokens)      ← gradients live here
        → token ids → detokenize → completion text
        → parse "Final: <int>" → compare → reward      ← the verifier lives here
    ```

    A space too many is one wrong token decision and reward 0 (lesson 03 shows this live).

    ## What comes next

    | lesson | question |
    |---:|:---|
    | 01 | why RL at all, and how a reward turns into a gradient |
    | 02 | what sampling produces, and why `old_logp` is recorded at that moment |
    | 03 | where the reward comes from, and what the frozen reference is for |
    | 04 | the two-function contract every algorithm fills |

    ## Source files used here

    * `posttrain/envs/arithmetic.py` — the task and its splits
    * `posttrain/verifiers/final_int.py` — the strict scorer and its hackable variants
    * `posttrain/search/best_of_n.py` — best-of-N
    * `posttrain/algorithms/grpo.py` — `group_advantages`
    * `posttrain/types.py` — the data between roles
    * `posttrain/teach/diagrams.py` — the pictures: `course_map_svg` and its `PARTS`, the six roles, the three forces
    * `posttrain/teach/lessons.py` — `lesson_files`, `lesson_title`: the lesson list the map is drawn from

    ## Exercises

    1. Switch to Loop B. Which of the eight completions would you have to remove for best-of-4 to
       fail, and what does that tell you about how much selection can buy?
    2. For each completion the strict scorer rejects, write down its reason code before you look.
    3. With the hackable scorer, which completion earns credit that it should not? Write the one
       sentence you would put in that scorer's docstring.

    Next: [01 · What is post-training RL?](?file=01_what_is_post_training_rl.py).
    """)
    return


if __name__ == "__main__":
    app.run()
