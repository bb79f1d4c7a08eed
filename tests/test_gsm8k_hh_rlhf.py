"""GSM8K- and hh-rlhf-shaped data: the `####` verifier, the calculator annotations as steps,
the gsm8k environment reading GSM8K's own columns, the two bundled fixtures (byte-identical
to their generators, every answer checked), and hh-rlhf's dialogue texts read as turns."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from fractions import Fraction

import pytest

from posttrain.data import gsm8k_fixture, hh_rlhf_fixture
from posttrain.data.preference import load_preference_data
from posttrain.envs import make_env
from posttrain.types import Example
from posttrain.verifiers import get_verifier
from posttrain.verifiers.gsm8k import calculator_annotations, calculator_step_labels, evaluate

SPEC = get_verifier("gsm8k/hash-v1")
BOXES = Example("48 apples fill 4 boxes. How many apples do 3 boxes hold?", "36")


@pytest.mark.parametrize("completion, reason, reward", [
    ("Each box holds 48/4 = <<48/4=12>>12 apples.\n#### 36", "ok", 1.0),
    ("#### 36", "ok", 1.0),
    ("  ####  36  \n", "ok", 1.0),
    ("#### 35", "wrong_answer", 0.0),
    ("#### 36 apples", "malformed_int", 0.0),
    ("#### 36.0", "malformed_int", 0.0),
    ("#### 3,6", "malformed_int", 0.0),
    ("The answer is 36", "no_answer_line", 0.0),
    ("#### 36\nDone.", "answer_not_last", 0.0),
    ("#### 36\n#### 36", "multiple_answer_lines", 0.0),
    ("", "empty", 0.0),
    (b"#### 36", "not_text", 0.0),
    ("#### " + "9" * 5000, "malformed_int", 0.0),  # longer than int() reads: refused, not raised
])
def test_hash_spec_reads_the_last_line_only(completion, reason, reward):
    result = SPEC(BOXES, completion)
    assert (result["details"]["reason"], result["reward"]) == (reason, reward)


def test_hash_spec_compares_integers_with_thousands_commas():
    assert SPEC(Example("q", "1600"), "#### 1,600")["reward"] == 1.0
    assert SPEC(Example("q", "1,600"), "#### 1600")["reward"] == 1.0
    assert SPEC.check_example(Example("q", "3.5")) is not None and SPEC.check_example(Example("q", "-4")) is None


def test_annotations_hold_exactly_or_to_the_written_decimals():
    notes = calculator_annotations("a <<48/4=12>>12, b <<48/4=13>>13, c <<10/3=3.33>>3.33, d <<10/3=3.3333>>, "
                                   "e <<2**10=1024>>, f <<(3+4)*2=14>>, g <<5/0=1>>, h <<x*2=4>>, i <<1,000+1=1,001>>")
    assert [note.holds for note in notes] == [True, False, True, True, True, True, False, False, True]
    assert notes[0].value == Fraction(12) and notes[6].value is None and notes[7].value is None


def test_the_evaluator_refuses_what_is_not_plain_arithmetic_quickly():
    start = time.perf_counter()
    assert evaluate("__import__('os').system('true')") is None
    assert evaluate("9**9**9") is None  # an exponent past MAX_EXPONENT
    assert evaluate("(" * 150 + "1" + ")" * 150) == Fraction(1)
    assert evaluate("(" * 1000 + "1" + ")" * 1000) is None  # past the parser's nesting limit
    [exponent] = calculator_annotations("<<1=9e999999>>")  # a result with an exponent is not a number written
    assert not exponent.holds and exponent.value == Fraction(1)
    assert time.perf_counter() - start < 2.0


def test_step_labels_follow_the_first_error():
    slipped = ("Each box holds 48/4 = <<48/4=13>>13 apples.\nThree boxes hold 13*3 = <<13*3=39>>39 apples.\n#### 39")
    steps, labels = calculator_step_labels(BOXES, slipped)
    assert len(steps) == 3 and labels == [False, False, False]  # the second step holds, after a wrong one
    right = "Each box holds 48/4 = <<48/4=12>>12 apples.\nThree boxes hold 12*3 = <<12*3=36>>36 apples.\n#### 36"
    assert calculator_step_labels(BOXES, right)[1] == [True, True, True]
    assert calculator_step_labels(BOXES, right.replace("#### 36", "#### 37"))[1] == [True, True, False]


def test_the_shipped_fixtures_are_what_their_generators_write():
    assert gsm8k_fixture.main(["--check"]) == 0
    assert hh_rlhf_fixture.main(["--check"]) == 0


def test_gsm8k_env_reads_the_schema_as_published():
    paths = gsm8k_fixture.GSM8K_FIXTURE
    first = json.loads(paths["train"].read_text(encoding="utf-8").splitlines()[0])
    assert sorted(first) == ["answer", "question"]  # GSM8K's two columns, nothing else
    env = make_env("gsm8k", path=str(paths["train"]), heldout_path=str(paths["test"]))
    sizes = {split: len(rows) for split, rows in env.by_split.items()}
    assert sizes["heldout"] == 200 and sizes["train"] + sizes["dev"] == 600 and sizes["dev"] > 30
    example = next(e for e in env.by_split["train"] if e.prompt == first["question"])
    assert example.expected_answer == first["answer"].rsplit("#### ", 1)[1]
    assert env.solution(example) == first["answer"] and env.score(example, first["answer"])["reward"] == 1.0
    assert env.spec_version == "gsm8k/hash-v1"


def test_a_gsm8k_row_without_its_hash_line_is_named(tmp_path):
    source = tmp_path / "train.jsonl"
    source.write_text(json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n"
                      + json.dumps({"question": "3+3?", "answer": "It is 6."}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2: the 'answer' does not end with a '#### <int>' line"):
        make_env("gsm8k", path=str(source))


def test_hh_rlhf_dialogues_are_read_as_turns():
    pairs = load_preference_data(hh_rlhf_fixture.HH_RLHF_FIXTURE)
    assert len(pairs) == 600
    two_turn = pairs[hh_rlhf_fixture.TWO_TURN_EVERY - 1]
    turns = two_turn.meta["prompt_messages"]
    assert [turn["role"] for turn in turns] == ["user", "assistant", "user"]
    assert turns[2]["content"].startswith("Now ") and two_turn.chosen.endswith(two_turn.chosen.split("\nFinal: ")[1])
    assert two_turn.chosen.split("\n")[-1].startswith("Final: ") and two_turn.chosen != two_turn.rejected


def test_hh_rlhf_prompt_is_the_turns_not_the_shared_words(tmp_path):
    """Two answers that start alike ('It is') stay whole responses: the prompt ends at the
    last Human turn, not where the two texts first differ."""
    source = tmp_path / "pairs.jsonl"
    row = {"chosen": "\n\nHuman: What is 2+3?\n\nAssistant: It is 5.",
           "rejected": "\n\nHuman: What is 2+3?\n\nAssistant: It is 6."}
    source.write_text(json.dumps(row) + "\n", encoding="utf-8")
    [pair] = load_preference_data(source)
    assert (pair.chosen, pair.rejected) == ("It is 5.", "It is 6.")
    assert pair.meta["prompt_messages"] == [{"role": "user", "content": "What is 2+3?"}]
    row["chosen"] += "\n\nHuman: thanks"
    source.write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="last turn is not an Assistant turn"):
        load_preference_data(source)


def test_the_documented_gsm8k_command_passes_its_checks(tmp_path):
    paths = gsm8k_fixture.GSM8K_FIXTURE
    done = subprocess.run([sys.executable, "-m", "posttrain", "train", "--env.name", "gsm8k", "--env.path",
                           str(paths["train"]), "--env.heldout_path", str(paths["test"]), "--heldout_size", "200",
                           "--rl.dev_size", "40", "--model.max_seq_len", "400", "--rl.sampling.max_new_tokens", "256",
                           "--dry_run", "true"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "checked data: 200 held-out and 40 dev problems" in done.stdout
