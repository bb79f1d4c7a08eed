"""GSM8K's own file, read as it is: rows {"question", "answer"}, the answer a worked solution
with calculator annotations that ends in `#### <int>` (Cobbe et al. 2021; the layout of
`openai/gsm8k`'s train.jsonl and test.jsonl, and of the fixture data/gsm8k_fixture.py writes):

    {"question": "48 apples fill 4 boxes. How many apples do 3 boxes hold?",
     "answer": "Each box holds 48/4 = <<48/4=12>>12 apples.\\n...\\n#### 36"}

becomes the problem {prompt: the question, expected_answer: "36", completion: the whole
answer}, so SFT imitates GSM8K's solutions and gsm8k/hash-v1 (verifiers/gsm8k.py) scores the
`####` line, exactly as the solutions are written. Other columns, a `split` or an `id`,
are read as envs/problem_rows.py reads them; a row already in our schema (a `prompt`) is
left as it is. `--env.heldout_path test.jsonl` holds out GSM8K's own test split.
"""

from __future__ import annotations

from posttrain.envs.dataset_files import Row
from posttrain.envs.jsonl_file import JsonlEnv
from posttrain.verifiers.gsm8k import ANSWER_PREFIX, parse_answer_integer
from posttrain.verifiers.contract import shown


def gsm8k_row_as_ours(row: Row) -> Row:
    """A GSM8K row as a row of ours (module docstring); ValueError naming the row when its
    answer has no `#### <int>` line."""
    record = dict(row.record)
    if "prompt" in record or "question" not in record:
        return row  # ours already, or missing its question: problem_rows says what is missing
    record["prompt"] = record.pop("question")
    answer = record.pop("answer", None)
    if not isinstance(answer, str):
        raise ValueError(f"{row.where}: a GSM8K row needs an 'answer' text ending in '#### <int>', got "
                         f"{shown(answer)}")
    final_line = answer.rstrip().rpartition("\n")[2]
    final = parse_answer_integer(final_line[len(ANSWER_PREFIX):]) if final_line.startswith(ANSWER_PREFIX) else None
    if final is None:
        raise ValueError(f"{row.where}: the 'answer' does not end with a '#### <int>' line (its last line is "
                         f"{shown(final_line)}); GSM8K's answers do: fix the row, or map your columns to ours with "
                         "--env.name jsonl --env.columns 'prompt=question,...'")
    record["expected_answer"], record["completion"] = str(final), answer
    return Row(row.where, record, row.split)


class Gsm8kEnv(JsonlEnv):
    """GSM8K-schema problems from `path`, scored by gsm8k/hash-v1 unless `spec_version` names
    another; `heldout_path` a held-out file of the same schema (GSM8K's test.jsonl)."""

    def __init__(self, path: str = "", spec_version: str | None = None, columns: str = "", heldout_path: str = ""):
        self._load("gsm8k", path, spec_version or "gsm8k/hash-v1", columns, heldout_path, row_as_ours=gsm8k_row_as_ours)
