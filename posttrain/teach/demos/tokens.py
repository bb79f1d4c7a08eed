"""See the micro-actions: how a tokenizer splits near-miss answers (spec Milestone 3).

The scorer reads text; the optimiser reads token log-probs. This demo puts the two views
side by side for a few strings that differ by one character, e.g.

    "Final: 323"    "Final:  323"    "Final: 0323"    "Final:\\n323"

For each it prints the tokens the policy would have had to emit, one decision per token,
and what the strict scorer (final_int/strict-v1) says: reward and reason code. With the
default character tokenizer every string is one token per character; a BPE tokenizer
(`--tokenizer PATH`, any local transformers tokenizer directory) may merge " 323" into
one token, so the same text is a different sequence of decisions. One wrong decision at
one token boundary (a second space, a newline) turns reward 1 into reward 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from posttrain.teach.demos.common import demo_parser, finish_run, pyplot, save_figure, start_run
from posttrain.verifiers.final_int import get_spec
from posttrain.models.tokenizer import CharTokenizer
from posttrain.types import Example

if TYPE_CHECKING:  # for annotations only: transformers takes seconds to import
    from transformers import PreTrainedTokenizerBase

NEAR_MISSES = ("Final: 323", "Final:  323", "Final: 0323", "Final:\n323")
SPEC_VERSION = "final_int/strict-v1"


def load_tokenizer(path: str | None):
    """Our CharTokenizer (gpt_mini's) when `path` is None; otherwise the transformers
    tokenizer saved in that local directory. Never downloads: `local_files_only=True`."""
    if path is None:
        return CharTokenizer()
    if not Path(path).is_dir():
        raise FileNotFoundError(f"--tokenizer {path!r} is not a directory; pass a folder holding "
                                "tokenizer.json / tokenizer_config.json (e.g. one written by save_pretrained)")
    from transformers import AutoTokenizer  # imported here: it takes seconds and the default needs none of it

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def split(tokenizer: CharTokenizer | PreTrainedTokenizerBase, text: str) -> list[tuple[int, str]]:
    """(token id, the text that token stands for) for each token of `text`, with no
    special tokens added: the decisions a policy makes to write exactly this string."""
    if isinstance(tokenizer, CharTokenizer):
        ids = tokenizer.encode(text)
    else:
        ids = tokenizer.encode(text, add_special_tokens=False)
    # Decoding one id at a time shows the piece as text (a BPE token's "Ġ" becomes a space).
    return [(i, tokenizer.decode([i], skip_special_tokens=False)) for i in ids]


def show(piece: str) -> str:
    """A token's text with its whitespace made visible: space ␣, newline ⏎, tab ⇥."""
    return piece.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥")


def inspect(tokenizer: CharTokenizer | PreTrainedTokenizerBase, strings, expected: str,
            spec_version: str = SPEC_VERSION) -> list[dict]:
    """One row per string: its tokens and the scorer's verdict on it."""
    scorer = get_spec(spec_version)
    example = Example(prompt="", expected_answer=expected)
    rows = []
    for text in strings:
        pieces = split(tokenizer, text)
        result = scorer(example, text)
        rows.append({"text": text, "ids": [i for i, _ in pieces], "pieces": [p for _, p in pieces],
                     "n_tokens": len(pieces), "reward": result["reward"], "reason": result["details"]["reason"]})
    return rows


# --------------------------------------------------------------------------------------
# Plumbing: arguments, table, run directory, plot
# --------------------------------------------------------------------------------------


def _plot(path, rows) -> None:
    """Each string as a row of boxes, one per token, green if the scorer gave reward 1."""
    plt = pyplot()
    from matplotlib.patches import Rectangle  # after pyplot(): the backend is chosen first

    width = max(r["n_tokens"] for r in rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * width + 4), 0.8 * len(rows) + 1))
    for y, r in enumerate(reversed(rows)):
        color = "#b7e4b0" if r["reward"] > 0 else "#f4b6b6"
        for x, piece in enumerate(r["pieces"]):
            ax.add_patch(Rectangle((x, y + 0.1), 0.95, 0.8, facecolor=color, edgecolor="black"))
            ax.text(x + 0.475, y + 0.5, show(piece), ha="center", va="center", family="monospace", fontsize=10)
        ax.text(width + 0.3, y + 0.5, f"r={r['reward']:g}  {r['reason']}", va="center", fontsize=9)
    ax.set_xlim(0, width + 4)
    ax.set_ylim(0, len(rows))
    ax.axis("off")
    ax.set_title("one box per token (one decision of the policy); colour = strict scorer's reward")
    save_figure(fig, path)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = demo_parser("tokens", __doc__, seed_help="unused: nothing here is random; kept for a uniform CLI")
    p.add_argument("--tokenizer", default=None,
                   help="local transformers tokenizer directory (no downloads); default: gpt_mini's CharTokenizer")
    p.add_argument("strings", nargs="*", default=list(NEAR_MISSES),
                   help="strings to inspect; write a newline as \\n (default: the four near misses)")
    p.add_argument("--expected", default="323", help="the expected answer the scorer compares against")
    p.add_argument("--spec", default=SPEC_VERSION, help="scorer version, see posttrain.verifiers.final_int.SPECS")
    args = p.parse_args(argv)
    # A shell cannot easily pass a real newline, so "\n" typed as two characters means one.
    args.strings = [s.replace("\\n", "\n") for s in args.strings]
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer)
    console, run = start_run("tokens", args, fit_tables=True, tokenizer=args.tokenizer or "CharTokenizer",
                             spec_version=args.spec)

    rows = inspect(tokenizer, args.strings, args.expected, args.spec)
    name = args.tokenizer or "CharTokenizer (gpt_mini)"
    table = Table(title=escape(f"tokens vs the scorer  (tokenizer: {name}; spec: {args.spec}; expected {args.expected!r})"))
    table.add_column("string")
    table.add_column("tokens (␣ space, ⏎ newline)", no_wrap=True)  # the point of the demo: keep it on one line
    table.add_column("ids")
    table.add_column("#", justify="right")
    table.add_column("reward", justify="right")
    table.add_column("reason")
    for r in rows:
        tokens = " ".join(f"[{show(p)}]" for p in r["pieces"])
        style = "green" if r["reward"] > 0 else "red"
        table.add_row(escape(repr(r["text"])), escape(tokens), " ".join(map(str, r["ids"])), str(r["n_tokens"]),
                      f"[{style}]{r['reward']:g}[/{style}]", r["reason"])
    console.print(table)

    lines = ["string,n_tokens,pieces,ids,reward,reason\n"]
    for r in rows:
        fields = [repr(r["text"]), str(r["n_tokens"]), "|".join(show(p) for p in r["pieces"]),
                  " ".join(map(str, r["ids"])), f"{r['reward']:g}", r["reason"]]
        lines.append(",".join('"' + f.replace('"', '""') + '"' for f in fields) + "\n")  # RFC 4180 quoting
    (run.path / "tokens.csv").write_text("".join(lines))
    run.write_jsonl("samples.jsonl", rows)
    _plot(run.path / "tokens.png", rows)

    passed = sum(r["reward"] > 0 for r in rows)
    finish_run(console, run, "tokens", f"{passed} of {len(rows)} strings earn reward. A near miss "
               "is one character away (a space, a zero, a newline), yet a different sequence of token decisions, "
               "and scores 0: the scorer reads text, the optimiser reads these tokens.")
    return 0
