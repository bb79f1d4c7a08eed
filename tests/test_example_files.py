"""Examples as JSONL files: a round trip, and every bad file refused by file, line and problem."""

import pytest

from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.envs.example_files import load_examples_jsonl, save_examples_jsonl
from posttrain.types import Example
from posttrain.verifiers.final_int import SPECS


def test_jsonl_round_trip(tmp_path):
    examples = ArithmeticEnv(level=5).sample("dev", 20, seed=0)
    examples.append(Example(prompt="Q: 1+1\n", expected_answer="2"))  # no id, no meta
    path = tmp_path / "dev.jsonl"
    save_examples_jsonl(examples, path)
    assert load_examples_jsonl(path) == examples
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "content,message",
    [
        ("", r"holds no examples"),
        ("\n  \n", r"holds no examples"),
        ('{"prompt": "Q: 1+1\\n", "expected_answer": "2"}\n{oops\n', r"line 2: not valid JSON"),
        ('[1, 2]\n', r"line 1: expected a JSON object, got list"),
        ('{"prompt": "Q: 1+1\\n"}\n', r"line 1: missing required field 'expected_answer'"),
        (
            '{"prompt": "Q: 1+1\\n", "expected_answer": 2.0}\n',
            r"line 1: 'expected_answer' must be a str or an int, got float 2.0; quote it",
        ),
        ('{"prompt": "Q", "expected_answer": true}\n', r"line 1: 'expected_answer' must be a str or an int, got bool"),
        ('{"prompt": null, "expected_answer": "2"}\n', r"line 1: 'prompt' must be a str, got NoneType"),
        (
            '{"prompt": "Q", "answer": "2", "expected_answer": "2"}\n',
            r"line 1: unknown field\(s\) \['answer'\]",
        ),
        ('{"prompt": "Q", "expected_answer": "2", "meta": 3}\n', r"line 1: 'meta' must be"),
    ],
)
def test_bad_jsonl_files_name_file_line_and_problem(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as error:
        load_examples_jsonl(path)
    assert "bad.jsonl" in str(error.value)


def test_an_int_expected_answer_loads_as_its_decimal_string(tmp_path):
    path = tmp_path / "ints.jsonl"
    path.write_text('{"prompt": "Q: 1+1\\n", "expected_answer": 2, "id": 7}\n{"prompt": "Q", "expected_answer": -40}\n')
    assert load_examples_jsonl(path) == [Example("Q: 1+1\n", "2", id="7"), Example("Q", "-40")]


def test_a_check_refuses_a_line_by_file_and_number(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text('{"prompt": "a", "expected_answer": "2"}\n\n{"prompt": "b", "expected_answer": "two"}\n')
    check = SPECS["final_int/cot-v1"].check_example
    with pytest.raises(ValueError, match=r"answers\.jsonl, line 3: expected_answer 'two' is not a canonical integer"):
        load_examples_jsonl(path, check=check)
    assert len(load_examples_jsonl(path)) == 2  # without a check, both load


def test_unreadable_jsonl_files_are_value_errors_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"missing\.jsonl: cannot read"):
        load_examples_jsonl(tmp_path / "missing.jsonl")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match=r"binary\.jsonl, line 1: not UTF-8 text \(0xff at byte 1 of the line"):
        load_examples_jsonl(binary)
