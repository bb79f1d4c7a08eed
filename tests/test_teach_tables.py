"""The course's markdown tables: words left, numbers right, said in the delimiter row that
marimo honours (its stylesheet right-aligns every cell otherwise), and rows that would break
the table refused with the row and the fix."""

from __future__ import annotations

import pytest

from posttrain.teach.tables import column_sides, markdown_table, reads_as_number


@pytest.mark.parametrize("cell", ["0.250", "+0.25", "−1.3e-05", "1,024", "**0.83**", "**▶ 0.1**", "0.75 / 0.12",
                                  "1/8", "1.30×", "97%", "2.5 s", "nan", "`12`"])
def test_numbers_read_as_numbers(cell):
    assert reads_as_number(cell)


@pytest.mark.parametrize("cell", ["greedy", "best-of-4 (ORM)", "clipped · +0.00", "R1-Zero", "18.2 → 10.6", "3 of 4"])
def test_words_do_not(cell):
    assert not reads_as_number(cell)


def test_prose_columns_go_left_and_numeric_ones_right():
    table = markdown_table(["method", "accuracy", "vs greedy"],
                           [["greedy", "0.475", "+0.000"], ["best-of-4 (ORM)", "**0.725**", "+0.250"]])
    assert table == ("| method | accuracy | vs greedy |\n"
                     "|:---|---:|---:|\n"
                     "| greedy | 0.475 | +0.000 |\n"
                     "| best-of-4 (ORM) | **0.725** | +0.250 |\n")


def test_blank_cells_do_not_decide_a_column_and_an_all_blank_column_is_prose():
    assert column_sides(["a", "b", "c"], [["1", "—", ""], ["", "2", ""]]) == "rrl"


def test_cells_are_written_with_str_and_align_can_be_given():
    table = markdown_table(["K", "note"], [[4, 0.5]], align="rl")
    assert table.splitlines()[1:] == ["|---:|:---|", "| 4 | 0.5 |"]


def test_marimo_renders_the_delimiter_row_as_inline_alignment():
    """What the module relies on: python-markdown, as marimo calls it, writes the side into
    each cell's style attribute, which wins over marimo's `text-align: right` rule."""
    import marimo as mo

    html = mo.md(markdown_table(["method", "accuracy"], [["greedy", "0.475"]])).text
    assert '<td style="text-align: left;">greedy</td>' in html
    assert '<td style="text-align: right;">0.475</td>' in html


def test_a_row_of_the_wrong_width_names_itself():
    with pytest.raises(ValueError, match=r"row 1 has 1 cells for 2 columns \(\['a', 'b'\]\)"):
        markdown_table(["a", "b"], [["1", "2"], ["3"]])


def test_a_bare_pipe_is_refused_and_an_escaped_one_kept():
    with pytest.raises(ValueError, match=r"cell 'x \| y' in row 0 holds a bare '\|'"):
        markdown_table(["a"], [["x | y"]])
    assert "| x \\| y |" in markdown_table(["a"], [["x \\| y"]])


def test_align_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match=r"align='l': give one letter per column, 'l' \(left\) or 'r' \(right\), 2 in all"):
        markdown_table(["a", "b"], [["1", "2"]], align="l")
