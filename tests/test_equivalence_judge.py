"""Kimi k1.5's answer-equivalence check at toy scale: the rule's verdicts on forms written by
hand, the two-stage policy (the rule decides wherever it parses), a judge trained at a tiny
size beating chance on held-out rows, and bad inputs that never crash."""

from __future__ import annotations

import pytest
import torch

from posttrain.models.tokenizer import CharTokenizer
from posttrain.rewards.equivalence_judge import (EquivalenceChecker, judge_text, save_equivalence_judge,
                                                 train_equivalence_judge)
from posttrain.rewards.process_reward_model import StepRewardScorer
from posttrain.rewards.proxy import load_reward_scorer
from posttrain.types import Example
from posttrain.verifiers.answer_forms import (FORMS, RULE_FORMS, equivalence_pairs, last_final_line,
                                              read_final_line, split_references)


@pytest.mark.parametrize("line, value", [
    ("Final: 42", "42"), ("Final: -7", "-7"), ("Final: 0", "0"),
    ("Final: forty-two", "42"), ("Final: seven", "7"), ("Final: one hundred four", "104"),
    # the same value in forms the rule refuses: the judge's share
    ("Final: 42.0", None), ("Final: +42", None), ("Final: 42 apples", None), ("Final:  42", None),
    ("Final: = 42", None), ("Final: 42.", None), ("Final: forty two", None), ("Final: Forty-two", None),
    ("Final: 4 2", None), ("Final: 042", None), ("final: 42", None), ("42", None), ("", None),
])
def test_the_rule_reads_digits_and_number_words_and_nothing_else(line, value):
    assert read_final_line(line)[1] == value


def test_the_rule_names_why_it_could_not_parse():
    assert read_final_line("Final: 42.0") == ("malformed_int", None)
    assert read_final_line("Final: 42 apples") == ("extra_text", None)
    assert read_final_line("Final: +42") == ("plus_sign", None)


def test_the_last_final_line_is_the_answer():
    assert last_final_line("6+6=12,12+4=16\nFinal: 15\nFinal: sixteen\n") == "Final: sixteen"
    assert last_final_line("no answer here\n\n") == "no answer here"
    assert last_final_line("") == ""


def test_pairs_are_seeded_balanced_and_labelled_as_written():
    rows = equivalence_pairs(2000, seed=3)
    assert rows == equivalence_pairs(2000, seed=3) and rows != equivalence_pairs(2000, seed=4)
    assert sum(r.equivalent for r in rows) == 1000  # alternating right and wrong
    assert {r.form for r in rows if r.equivalent} == set(FORMS)
    # where the rule parses, its value agrees with the label made by construction, row for row
    parsed = [(read_final_line(r.line)[1], r) for r in rows]
    assert all((v == str(r.reference)) == r.equivalent for v, r in parsed if v is not None)
    # the rule parses the two rule forms of right rows, and of the others only words_spaced where the
    # value has no hyphen to replace ("seven" is "seven" either way)
    parsed_right = {r.form for v, r in parsed if v is not None and r.equivalent}
    assert parsed_right == set(RULE_FORMS) | {"words_spaced"}
    assert all("-" not in FORMS["words"](r.reference, None) for v, r in parsed  # type: ignore[arg-type]
               if v is not None and r.equivalent and r.form == "words_spaced")
    assert 0.15 < sum(v is not None for v, _ in parsed) / len(rows) < 0.30  # 2 of 11 forms, plus wrong rows'


def test_heldout_references_are_never_training_references():
    train, heldout = split_references("train"), split_references("heldout")
    assert (len(train), len(heldout), set(train) & set(heldout), set(train) | set(heldout)) == (80, 20, set(),
                                                                                                 set(range(100)))
    assert {r.reference for r in equivalence_pairs(500, seed=0, split="heldout")} <= set(heldout)
    with pytest.raises(ValueError, match="split='test'"):
        split_references("test")


class AlwaysPays:
    """A judge that pays every answer it sees: the worst judge for wrong answers."""

    kind = "orm"

    def __init__(self, probability: float = 1.0) -> None:
        self.probability = probability
        self.seen: list[str] = []

    def score_outcomes(self, prompts, completions):
        self.seen += completions
        return [self.probability] * len(prompts)


def example(answer: str = "42") -> Example:
    return Example(prompt="Q: 40+2\n", expected_answer=answer)


def test_the_rule_decides_wherever_it_parses_even_against_a_judge_that_pays_everything():
    judge = AlwaysPays()
    checker = EquivalenceChecker(judge)  # type: ignore[arg-type]
    assert checker(example(), "40+2=42\nFinal: 43")["reward"] == 0.0
    assert checker(example(), "Final: forty-three")["details"]["source"] == "rule"
    assert checker(example(), "Final: forty-two")["reward"] == 1.0
    # across every generated wrong row the rule parses, none is paid
    rows = [r for r in equivalence_pairs(3000, seed=5) if not r.equivalent and read_final_line(r.line)[1] is not None]
    assert len(rows) > 200
    verdicts = checker.judge_lines([r.reference for r in rows], [r.line for r in rows])
    assert [v.reward for v in verdicts] == [0.0] * len(rows) and {v.source for v in verdicts} == {"rule"}
    assert judge.seen == []  # the judge was never asked
    # it is asked only about what the rule cannot read, and sees the text after 'Final:'
    result = checker(example(), "Final: 42.0")
    assert (result["reward"], result["details"]["source"], judge.seen) == (1.0, "judge", [" 42.0"])
    # no Final line, or nothing after it: no answer to judge, nothing paid
    assert checker(example(), "I think it is 42")["reward"] == 0.0
    assert checker(example(), "Final:   ")["details"]["source"] == "none"


def test_the_threshold_is_where_the_judge_pays():
    assert EquivalenceChecker(AlwaysPays(0.6), threshold=0.7)(example(), "Final: 42.0")["reward"] == 0.0  # type: ignore[arg-type]
    assert EquivalenceChecker(AlwaysPays(0.6), threshold=0.5)(example(), "Final: 42.0")["reward"] == 1.0  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threshold=1.0"):
        EquivalenceChecker(AlwaysPays(), threshold=1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("completion", ["", " \n\t", "Final: " + "9" * 1_000_000, "Final: " + "x" * 1_000_000,
                                        "Final: ٤٢", "Final: \ud800", "Final: 4\x002", "\n" * 10_000, "Final: 😀"])
def test_bad_completions_never_crash(completion):
    result = EquivalenceChecker(AlwaysPays(0.0))(example(), completion)  # type: ignore[arg-type]
    assert result["reward"] == 0.0 and result["details"]["spec_version"] == "equivalence/rule-then-judge-v1"


@pytest.mark.parametrize("bad_example, completion, reason", [
    ({"prompt": "Q"}, "Final: 1", "bad_example"), (example("3.5"), "Final: 3.5", "bad_example"),
    (example("forty"), "Final: 40", None), (example(), b"Final: 42", "not_text"), (None, None, "bad_example"),
])
def test_bad_examples_score_zero_with_a_reason(bad_example, completion, reason):
    result = EquivalenceChecker(AlwaysPays())(bad_example, completion)  # type: ignore[arg-type]
    if reason is None:  # a reference in number words is still an integer: 40
        assert result["reward"] == 1.0
    else:
        assert (result["reward"], result["details"]["reason"]) == (0.0, reason)


def test_a_tiny_judge_beats_chance_on_heldout_rows_and_loads_as_rl_rm_path(tmp_path):
    # ~10 s on one core: 300 steps on 4,000 rows, one seed. Chance is 50% (the rows are balanced);
    # measured 63.3% on these held-out references at these settings (67.5% at the command's defaults,
    # 2,000 steps on 16,000 rows), so 55% leaves room for another torch build's arithmetic
    torch.set_num_threads(1)
    tokenizer = CharTokenizer()
    model, history = train_equivalence_judge(equivalence_pairs(4000, seed=0), steps=300, seed=0, tokenizer=tokenizer)
    assert history[-1]["loss"] < history[0]["loss"]
    heldout = equivalence_pairs(1000, seed=1, split="heldout")
    scorer = StepRewardScorer(model, tokenizer, "orm", "newline")
    texts = [judge_text(r.reference, r.line) for r in heldout]
    probabilities = scorer.score_outcomes([p for p, _ in texts], [a for _, a in texts])
    accuracy = sum((q >= 0.5) == r.equivalent for q, r in zip(probabilities, heldout)) / len(heldout)
    assert accuracy >= 0.55, accuracy
    # saved, it is what rl.rm.path loads: the two-stage checker, the rule still deciding
    save_equivalence_judge(model, tmp_path / "judge", tokenizer, {"note": "test"})
    checker = load_reward_scorer([tmp_path / "judge"])
    assert isinstance(checker, EquivalenceChecker)
    assert checker.score(example(), "Final: 41")["reward"] == 0.0
    assert checker.score(example(), "Final: forty-two")["details"]["source"] == "rule"
    assert checker.score(example(), "Final: 42 cats")["details"]["source"] == "judge"


def test_the_command_answers_help_and_refuses_bad_values_before_torch_loads(tmp_path):
    import json
    import os
    import subprocess
    import sys

    settings = tmp_path / "judge.toml"
    settings.write_text("pairs = 200\nthreshold = 0.0\n")  # --config is read as the training commands read it
    code = ("import contextlib, io, json, sys\n"
            "from posttrain.cli import main\n"
            "answers = []\n"
            "for argv in (['equivalence', '--help'], ['equivalence', '--steps', '0'],"
            " ['equivalence', '--threshold', '1.5'], ['equivalence', '--config', sys.argv[1]]):\n"
            "    out, err = io.StringIO(), io.StringIO()\n"
            "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):\n"
            "        status = main(argv)\n"
            "    answers.append([status, out.getvalue() + err.getvalue(), 'torch' in sys.modules])\n"
            "print(json.dumps(answers))\n")
    done = subprocess.run([sys.executable, "-c", code, str(settings)], capture_output=True, text=True, check=True,
                          env={**os.environ, "COLUMNS": "200"})
    (help_status, help_text, _), (steps_status, steps_error, _), (threshold_status, threshold_error, _), \
        (file_status, file_error, _) = answers = json.loads(done.stdout)
    assert [torch_loaded for *_, torch_loaded in answers] == [False, False, False, False]
    assert help_status == 0 and "usage: posttrain equivalence" in help_text and "--threshold" in help_text
    assert steps_status == 2 and "steps=0 is not allowed: expected a positive integer" in steps_error
    assert threshold_status == 2 and "threshold=1.5 is not allowed" in threshold_error
    assert file_status == 2 and "threshold=0.0 is not allowed" in file_error


def test_kimis_equivalence_variant_is_a_command_in_its_header_that_passes_the_dry_run(tmp_path, capsys):
    import re
    from pathlib import Path

    from posttrain.cli import main
    from posttrain.models.gpt_mini import GPTMini
    from posttrain.rewards.equivalence_judge import judge_config
    from posttrain.rewards.reward_model import RewardModel

    path = Path(__file__).resolve().parents[1] / "recipes" / "kimi_k15.toml"
    variant = re.search(r"^#\s+posttrain run --config recipes/kimi_k15\.toml (--rl\.rm\.path runs/equivalence_judge .*)$",
                        path.read_text(encoding="utf-8"), re.M)
    assert variant, "kimi_k15.toml's header gives the equivalence judge's variant"
    tokenizer = CharTokenizer()
    judge = tmp_path / "equivalence_judge"
    save_equivalence_judge(RewardModel(GPTMini(judge_config(tokenizer.vocab_size))), judge, tokenizer)  # untrained
    argv = variant.group(1).replace("runs/equivalence_judge", str(judge)).split()
    assert main(["run", "--config", str(path), *argv, "--dry_run", "true", "--out_dir", str(tmp_path / "runs")]) == 0
    assert "posttrain run: every check passed" in capsys.readouterr().out
