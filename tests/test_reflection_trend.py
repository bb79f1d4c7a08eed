"""R1-Zero's response length and reflection-word share per RL step (runs/reflection.py,
`posttrain doctor RUN --reflection true`), on a synthetic samples.jsonl with known numbers."""

import json

import pytest

from posttrain.cli import main
from posttrain.runs.reflection import has_reflection, reflection_trend

SAMPLES = [  # step 0: lengths 4 and 8, no reflection; step 1: lengths 10, 20, 30, one of three reflects
    {"stage": "rl", "step": 0, "completion": "1234"},
    {"stage": "rl", "step": 0, "completion": "Final: 5"},
    {"stage": "rl", "step": 1, "completion": "Wait, 7+5"},  # 9 characters: (9 + 20 + 31) / 3 = 20
    {"stage": "rl", "step": 1, "completion": "x" * 20},
    {"stage": "rl", "step": 1, "completion": "y" * 31},
    {"stage": "sft", "step": 0, "completion": "wait wait"},  # another stage: not counted
]


def test_each_steps_mean_length_and_reflection_share():
    assert reflection_trend(SAMPLES, "rl") == [
        {"step": 0, "samples": 2, "mean_length": 6.0, "reflection_share": 0.0},
        {"step": 1, "samples": 3, "mean_length": 20.0, "reflection_share": pytest.approx(1 / 3)},
    ]
    assert reflection_trend(SAMPLES, "grpo") == []


@pytest.mark.parametrize("text,found", [
    ("Wait, that is wrong", True), ("let me   check", True), ("LET ME see", True), ("re-evaluate 7+5", True),
    ("a mistake", True), ("Hmm.", True), ("double-check: 12", True),
    ("the waiter", False), ("checksum 12", False), ("letme", False), ("7+5=12\nFinal: 12", False), ("", False),
])
def test_reflection_words_are_whole_words_in_any_case(text, found):
    assert has_reflection(text) is found


def test_doctor_prints_the_trend_and_draws_it(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"stage": "rl", "step": s, "reward_mean": 0.5}) + "\n"
                                                    for s in (0, 1)))
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in SAMPLES))
    main(["doctor", str(tmp_path), "--reflection", "true"])
    printed = capsys.readouterr().out
    assert "rl: response length and reflection words (wait, check, verify, " in printed
    assert "     0        2                  6.0                    0.0%" in printed
    assert "     1        3                 20.0                   33.3%" in printed
    assert (tmp_path / "rl_reflection.png").stat().st_size > 1000
