"""The course's tables: markdown that marimo shows with words to the left and numbers to the right.

    markdown_table(["method", "accuracy"], [["greedy", "0.400"], ["best-of-4", "0.550"]])

marimo's stylesheet right-aligns every cell of a markdown table (`.markdown table td
{text-align: right}`), which pushes a column of words against its right edge. The delimiter
row decides instead: python-markdown turns `:---` into `style="text-align: left;"` on each
cell and `---:` into right, and an inline style beats the stylesheet. So every column gets an
explicit side: a column whose cells all read as numbers goes right (digits line up), any
other column left.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

# what reads as a number once emphasis and the ▶ marker are stripped: +0.25, −1.3e-05, 12,
# 0.83 / 0.12, 1/8, 1.30×, 97%, 2.5 s, nan; an empty cell or a dash does not decide a column
_NUMBER = r"[+\-−]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:e[+\-]?\d+)?|nan|inf|-inf"
_NUMERIC_CELL = re.compile(rf"(?:{_NUMBER})\s*(?:%|×|x|s|ms)?(?:\s*/\s*(?:{_NUMBER}))?", re.IGNORECASE)
_DECORATION = re.compile(r"[*▶`\s]+")
_BLANK = {"", "—", "-", "–"}
_ALIGN = {"l": ":---", "r": "---:"}


def reads_as_number(cell: str) -> bool:
    """True when the cell is a number (with a sign, a unit such as % or s, or a ratio a / b),
    ignoring markdown bold, code ticks and the ▶ that marks the current setting."""
    return _NUMERIC_CELL.fullmatch(_DECORATION.sub(" ", cell).strip()) is not None


def column_sides(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """"l" or "r" per column: right when every non-blank body cell reads as a number."""
    sides = []
    for column in range(len(header)):
        cells = [row[column] for row in rows if _DECORATION.sub("", row[column]) not in _BLANK]
        sides.append("r" if cells and all(reads_as_number(cell) for cell in cells) else "l")
    return "".join(sides)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """A markdown table, one line per row and a trailing newline. Cells are written with
    str() (format numbers before passing them to choose their digits). `align` is one letter
    per column, "l" or "r"; without it numeric columns go right and the rest left."""
    body = [[str(cell) for cell in row] for row in rows]
    for number, row in enumerate(body):
        if len(row) != len(header):
            raise ValueError(f"row {number} has {len(row)} cells for {len(header)} columns ({list(header)}): "
                             "give every row one cell per header")
        for cell in row:
            if re.search(r"(?<!\\)\|", cell) or "\n" in cell:
                raise ValueError(f"cell {cell!r} in row {number} holds a bare '|' or a line break, which ends a "
                                 "markdown cell: write '\\|' (or &#124;) and keep the cell on one line")
    sides = align if align is not None else column_sides(header, body)
    if len(sides) != len(header) or set(sides) - set(_ALIGN):
        raise ValueError(f"align={align!r}: give one letter per column, 'l' (left) or 'r' (right), "
                         f"{len(header)} in all")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(_ALIGN[side] for side in sides) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"


__all__ = ["column_sides", "markdown_table", "reads_as_number"]
