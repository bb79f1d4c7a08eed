"""The lessons' markdown tables put words on the left and numbers on the right.

marimo's stylesheet right-aligns every markdown table cell; only an explicit side in the
delimiter row (`:---` left, `---:` right) overrides it, as an inline style on each cell
(posttrain/teach/tables.py explains the mechanism). So:

- every delimiter cell in every lesson's source, prose table or code-built string, names
  its side: a bare `---` would bring back the right-aligned column of words;
- a lesson run renders code-built tables with `text-align: left` on a word cell and
  `text-align: right` on a number cell (lesson 19's time and memory tables, rows written
  in code under a prose header; lesson 04's tables, built with markdown_table).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "lessons").glob("*.py"))
# One delimiter cell: a pipe, then three or more dashes with an optional colon on either
# side. It matches prose rows (|:---|---:|) and code-built ones ("|---" * n) alike.
DELIMITER_CELL = re.compile(r"\|[ \t]*(:?)-{3,}(:?)")


def bare_delimiter_cells(text: str) -> list[tuple[int, str]]:
    """(line number, line) for each line holding a delimiter cell with no alignment colon."""
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1)
            if any(not (left or right) for left, right in DELIMITER_CELL.findall(line))]


def test_the_scan_finds_bare_cells_and_passes_aligned_ones():
    assert bare_delimiter_cells("    |:---|---:|\n") == []
    assert bare_delimiter_cells('head = "|:---" * 3 + "|"') == []
    assert bare_delimiter_cells("    |:---|---|\n") == [(1, "|:---|---|")]
    assert bare_delimiter_cells('x = 1\nhead += "|---" * n + "|\\n"') == [(2, 'head += "|---" * n + "|\\n"')]
    assert bare_delimiter_cells("| --- | --- |") == [(1, "| --- | --- |")]


def test_the_lessons_have_tables_to_check():
    # the scan must see the course's tables, or passing it says nothing
    aligned = sum(len(DELIMITER_CELL.findall(p.read_text(encoding="utf-8"))) for p in NOTEBOOKS)
    assert aligned > 150


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_delimiter_cell_names_its_side(path):
    bare = bare_delimiter_cells(path.read_text(encoding="utf-8"))
    assert not bare, (f"{path.name} has markdown delimiter cells with no alignment colon, which marimo shows "
                      f"right-aligned: {bare}. Write ':---' for a column of words and '---:' for numbers, or "
                      "build the table with posttrain.teach.tables.markdown_table")


@pytest.fixture
def restore_threads():
    """The lessons set torch to one thread; do not leak that into other tests."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _rendered_tables(name: str) -> list[str]:
    """The HTML of every table a lesson shows at its widget's defaults, run as tests/test_lessons.py runs it."""
    spec = importlib.util.spec_from_file_location(f"lesson_tables_{Path(name).stem}", ROOT / "lessons" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    outputs, _ = module.app.run()
    html = "".join(output.text for output in outputs if isinstance(getattr(output, "text", None), str))
    return re.findall(r"<table>.*?</table>", html, flags=re.DOTALL)


def _side(table: str, cell: str) -> str:
    """The text-align of the first <td> whose content starts with `cell`."""
    match = re.search(r'<td style="text-align: (\w+);">' + re.escape(cell), table)
    assert match, f"no cell starting {cell!r} with an inline text-align in {table[:400]}"
    return match.group(1)


def test_lesson_19_tables_put_roles_left_and_seconds_right(restore_threads):
    tables = _rendered_tables("19_system_topology.py")
    times = next(t for t in tables if "seconds per step" in t)
    assert _side(times, "rollout") == "left"
    rows = re.findall(r"<tr>\s*<td[^>]*>([^<]*)</td>\s*<td style=\"text-align: (\w+);\">([^<]*)</td>", times)
    assert rows and all(side == "right" and re.fullmatch(r"\d+\.\d\d s", value) for _, side, value in rows), rows


def test_lesson_04_markdown_table_puts_algorithms_left_and_counts_right(restore_threads):
    tables = _rendered_tables("04_algorithm_plugin.py")
    traits = next(t for t in tables if "metrics logged" in t)
    assert _side(traits, "<code>grpo</code>") == "left"
    grpo_row = re.search(r"<tr>\s*<td[^>]*><code>grpo</code></td>(.*?)</tr>", traits, flags=re.DOTALL).group(1)
    count = re.findall(r'<td style="text-align: (\w+);">(\d+)</td>', grpo_row)
    assert count and count[-1][0] == "right", grpo_row
    # the advantage table comes from markdown_table: row numbers and advantages right, nothing left
    advantages = next(t for t in tables if "<th" in t and "tokens" in t)
    assert "text-align: left" not in advantages and "text-align: right" in advantages
