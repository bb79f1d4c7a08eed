"""Rows shaped like MATH, MATH-500 and NuminaMath-CoT are read the way docs/guides/datasets.md
says: which column is the checked answer, which the SFT demonstration, the answer read out of a
whole solution's \\boxed{}, `level` a difficulty label only when it is a number, and one
--env.columns mapping for the training and the held-out file alike."""

from __future__ import annotations

import json

import pytest

from posttrain.data.curation import difficulty
from posttrain.envs import make_env


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def math500_row(i: int) -> dict:
    return {"problem": f"What is ${i}+{i}$?", "solution": f"We add: ${i}+{i}={2 * i}$, so $\\boxed{{{2 * i}}}$.",
            "answer": str(2 * i), "subject": "Prealgebra", "level": 1 + i % 5, "unique_id": f"test/prealgebra/{i}.json"}


def numina_row(i: int) -> dict:
    solution = f"${i}\\cdot 3 = {3 * i}$, so the answer is $\\boxed{{{3 * i}}}$."
    return {"source": "synthetic_math", "problem": f"Compute ${i}\\cdot 3$.", "solution": solution,
            "messages": [{"role": "user", "content": f"Compute ${i}\\cdot 3$."},
                         {"role": "assistant", "content": solution}]}


def every_example(env):
    return [example for rows in env.by_split.values() for example in rows]


def test_math500_answer_column_is_checked_and_its_solution_is_the_demonstration(tmp_path):
    path = write_rows(tmp_path / "math500.jsonl", [math500_row(i) for i in range(1, 21)])
    env = make_env("math", path=path, columns="prompt=problem,expected_answer=answer")
    example = next(e for e in every_example(env) if e.prompt == "What is $7+7$?")
    assert example.expected_answer == "14" and env.solution(example).endswith("$\\boxed{14}$.")
    assert example.meta["subject"] == "Prealgebra" and difficulty(example) == 3.0  # 1 + 7 % 5: a curriculum label
    assert env.score(example, "\\boxed{14}")["reward"] == 1.0 and env.score(example, "\\boxed{15}")["reward"] == 0.0
    with pytest.raises(ValueError, match="no column 'prompt'"):  # unmapped, its question column is not found
        make_env("math", path=path)


def test_numina_rows_read_as_they_are_with_the_answer_out_of_the_solutions_box(tmp_path):
    path = write_rows(tmp_path / "numina.jsonl", [numina_row(i) for i in range(1, 21)])
    env = make_env("math", path=path)
    example = next(e for e in every_example(env) if e.prompt == "Compute $1\\cdot 3$.")
    assert env.solution(example) == numina_row(1)["solution"]  # the assistant turn of `messages`
    right, wrong = env.score(example, "\\boxed{3}"), env.score(example, "\\boxed{4}")
    assert (right["reward"], wrong["reward"]) == (1.0, 0.0)
    assert right["details"]["expected_math"] == "3"  # read from the solution's \boxed{}, not the whole text
    two_boxes = dict(numina_row(2), solution="First $\\boxed{2}$, then $\\boxed{6}$.")
    two_boxes["messages"][1]["content"] = two_boxes["solution"]
    # two boxes read as a set: the row's own demonstration would not be paid, so loading names the row
    with pytest.raises(ValueError, match=r"two\.jsonl, line 1: .* scores 0, not 1, .*reason 'scalar_for_set'"):
        make_env("math", path=write_rows(tmp_path / "two.jsonl", [two_boxes, *map(numina_row, range(3, 12))]))


def test_math_level_strings_are_no_difficulty_and_one_mapping_serves_both_files(tmp_path):
    rows = [{"problem": f"What is ${i}+1$?", "level": f"Level {1 + i % 5}", "type": "Prealgebra",
             "solution": f"It is $\\boxed{{{i + 1}}}$."} for i in range(1, 21)]
    env = make_env("math", path=write_rows(tmp_path / "math.jsonl", rows), columns="prompt=problem")
    assert all(difficulty(e) is None for e in every_example(env))  # "Level 3" is not a number
    numina = write_rows(tmp_path / "numina.jsonl", [numina_row(i) for i in range(1, 21)])
    heldout = write_rows(tmp_path / "math500.jsonl", [math500_row(i) for i in range(1, 11)])
    with pytest.raises(ValueError, match=r"math500\.jsonl, line 1: no column 'prompt'"):
        make_env("math", path=numina, heldout_path=heldout)
