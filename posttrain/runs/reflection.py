"""R1-Zero's two curves over training, read from a run's samples.jsonl.

DeepSeek-R1-Zero (arXiv:2501.12948, Sec. 2.2.4) reported that under RL alone its responses
grew longer step after step, and that at some point it began to write reflections ("Wait,
wait. Wait. That's an aha moment I can flag here.") that re-check earlier steps. The two
numbers that showed it, per RL step:

    mean_length        the mean length of the step's sampled completions, in characters (the
                       stop token not counted; with gpt_mini's tokenizer one character is one
                       token, so it is also the response length in tokens there)
    reflection_share   the share of the step's completions that contain a reflection word of
                       REFLECTION_WORDS (whole words, any case)

`posttrain doctor RUN --reflection true` prints them for each sampling stage and draws them in
`<stage>_reflection.png`. At toy scale no "aha" is to be expected: a 0.8M model that never saw
a reflection word in its demonstrations has no such word to reinforce, and the share stays 0
unless the task's text contains them; the curve is the instrument, not the finding.
"""

from __future__ import annotations

import re
from pathlib import Path

# the words R1-Zero's reflections are made of, in the paper's examples and the replications that
# count them: re-reading ("wait", "let me"), re-checking ("check", "verify", "recheck",
# "re-evaluate", "double-check"), admitting an error ("mistake", "wrong"), and "hmm", "actually"
REFLECTION_WORDS = ("wait", "check", "verify", "recheck", "re-check", "re-evaluate", "reevaluate", "double-check",
                    "let me", "mistake", "wrong", "hmm", "actually")
REFLECTION = re.compile(r"(?<![a-z-])(?:" + "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in REFLECTION_WORDS)
                        + r")(?![a-z-])", re.IGNORECASE)


def has_reflection(completion: str) -> bool:
    """True when the completion holds a reflection word as a whole word ("Wait," yes,
    "waiter" no, "checksum" no)."""
    return REFLECTION.search(completion) is not None


def reflection_trend(samples: list[dict], stage: str) -> list[dict]:
    """Per RL step of `stage`, in step order: {"step", "samples", "mean_length",
    "reflection_share"} over that step's rows of samples.jsonl."""
    by_step: dict[int, list[str]] = {}
    for row in samples:
        if row.get("stage") == stage and isinstance(row.get("step"), int):
            by_step.setdefault(row["step"], []).append(str(row.get("completion", "")))
    return [{"step": step, "samples": len(texts), "mean_length": sum(map(len, texts)) / len(texts),
             "reflection_share": sum(map(has_reflection, texts)) / len(texts)}
            for step, texts in sorted(by_step.items())]


def trend_lines(trend: list[dict], every: int) -> list[str]:
    """A small table of the trend, one row each `every` steps and the last."""
    rows = [t for i, t in enumerate(trend) if i % every == 0 or i == len(trend) - 1]
    return ["  step  samples  mean length (chars)  with a reflection word"] + [
        f"  {t['step']:>4}  {t['samples']:>7}  {t['mean_length']:>19.1f}  {100 * t['reflection_share']:>21.1f}%"
        for t in rows]


def plot_trend(trend: list[dict], path: Path, title: str) -> None:
    """Both curves over the steps, side by side, in a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.pyplot as plt

    steps = [t["step"] for t in trend]
    fig, (length_ax, share_ax) = plt.subplots(1, 2, figsize=(9, 3.2))
    length_ax.plot(steps, [t["mean_length"] for t in trend])
    length_ax.set_title("mean response length (characters)")
    share_ax.plot(steps, [100 * t["reflection_share"] for t in trend], color="tab:red")
    share_ax.set_title("samples with a reflection word (%)")
    share_ax.set_ylim(0, max(5.0, 110 * max(t["reflection_share"] for t in trend)))  # a flat 0 still reads as 0%
    for ax in (length_ax, share_ax):
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
