"""The bundled UltraFeedback-schema fixture (posttrain/data/feedback_fixture.py): the shipped
file is what the code builds, every row has UltraFeedback-binarised's columns and means what
its scores say, and `--rl.preference.pairs` reads it as it is."""

from __future__ import annotations

import json

import pytest

from posttrain.config import TrainConfig
from posttrain.config.files import from_dict
from posttrain.data.feedback_fixture import (
    COLUMNS,
    FEEDBACK_FIXTURE,
    FIXTURE_PAIRS,
    feedback_rows,
    main,
    step_score,
)
from posttrain.data.preference import load_preference_data
from posttrain.envs.arithmetic import ArithmeticEnv, Problem, split_of
from posttrain.pipelines.checks import check_config
from posttrain.types import Example

ROWS = [json.loads(line) for line in FEEDBACK_FIXTURE.read_text(encoding="utf-8").splitlines()]


def test_the_shipped_file_is_what_the_code_builds():
    assert main(["--check"]) == 0
    assert len(ROWS) == FIXTURE_PAIRS


def test_every_row_has_ultrafeedbacks_columns_and_means_its_scores():
    env = ArithmeticEnv(level=3)
    prompts = set()
    for row in ROWS:
        assert tuple(row) == COLUMNS
        prompt = row["prompt"]
        user = {"role": "user", "content": prompt}
        assert row["chosen"][0] == user and row["rejected"][0] == user
        assert [t["role"] for t in row["chosen"]] == [t["role"] for t in row["rejected"]] == ["user", "assistant"]
        example = Example(prompt, str(Problem.from_expression(prompt[3:-1]).running_sums()[-1]))
        assert env.score(example, row["chosen"][1]["content"])["reward"] == 1.0
        assert env.score(example, row["rejected"][1]["content"])["reward"] == 0.0
        assert row["score_chosen"] == 10.0 and 1.0 <= row["score_rejected"] < 10.0
        assert split_of(prompt[3:-1]) == "train"  # held-out problems stay unseen
        prompts.add(prompt)
    assert len(prompts) == FIXTURE_PAIRS  # one pair per prompt, as the binarised set has


def test_a_slip_is_carried_forward_and_scored_by_the_steps_before_it():
    problem = Problem((7, 5, 9, 3, 1), ("+",) * 4)
    example = Example("Q: 7+5+9+3+1\n", "25")

    class Fixed:  # the slip's random choices: step 2, +2
        def randrange(self, *_):
            return 2

        def choice(self, _):
            return 2

    assert problem.carried_slip(Fixed()) == "7+5=12,12+9=23,23+3=26,26+1=27\nFinal: 27"
    # steps: 7+5=12 right, then the slip, then everything after it labelled wrong (first-error rule)
    assert step_score(example, problem.carried_slip(Fixed())) == pytest.approx(1 + 9 * 1 / 5)
    assert step_score(example, "7+5=12,12+9=21,21+3=24,24+1=25\nFinal: 25") == 10.0
    assert feedback_rows(3, seed=5) == feedback_rows(3, seed=5) != feedback_rows(3, seed=6)


def test_rl_pairs_reads_the_fixture_as_it_is():
    pairs = load_preference_data(FEEDBACK_FIXTURE)
    assert len(pairs) == FIXTURE_PAIRS
    first, row = pairs[0], ROWS[0]
    assert first.prompt == row["prompt"]
    assert (first.chosen, first.rejected) == (row["chosen"][1]["content"], row["rejected"][1]["content"])
    assert first.meta == {"prompt_id": row["prompt_id"]}
    assert (first.score_chosen, first.score_rejected) == (10.0, row["score_rejected"])  # what gap weighting reads
    cfg = from_dict(TrainConfig, {"rl": {"algo": "dpo", "preference": {"pairs": str(FEEDBACK_FIXTURE)}}})
    check_config(cfg)  # the pre-run checks encode every pair against gpt_mini's context
    weighted = from_dict(TrainConfig, {"rl": {"algo": "dpo", "preference": {"pairs": str(FEEDBACK_FIXTURE)},
                                              "algo_params": {"gap_weighting": "linear"}}})
    check_config(weighted)  # its scores are what --dpo.gap_weighting weighs by: accepted, not refused as unscored


def test_a_conversation_that_answers_another_prompt_is_refused(tmp_path):
    row = dict(ROWS[0], prompt="Q: 1+1+1+1+1\n")
    (tmp_path / "bad.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="line 1.*'chosen' is a conversation whose turns before the response"):
        load_preference_data(tmp_path / "bad.jsonl")
    row = dict(ROWS[0], chosen=[ROWS[0]["chosen"][0], {"role": "user", "content": "hi"}])
    (tmp_path / "bad.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="must be one assistant turn"):
        load_preference_data(tmp_path / "bad.jsonl")
