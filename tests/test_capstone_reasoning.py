"""The reasoning-specialist capstone's task: reasoning-gym's aiw puzzles with a one-line chain
of thought read from the question (envs/reasoning_gym_tasks.py::aiw_steps), checked on
thousands of items against the item's own answer, which the writer never reads; the
pre-run check that says how many positions the prompt needs. The recipe itself is in
tests/test_recipes.py."""

import json
import re

import pytest

from posttrain.cli import main
from posttrain.envs import make_env
from posttrain.envs.reasoning_gym_tasks import aiw_steps

reasoning_gym = pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'posttrain[tasks]')")

SIBLINGS = {"task_type_weights": [1, 0, 0], "max_entities": 9}
FRIENDS = {"task_type_weights": [0, 1, 0]}


def counted_before(question: str, noun: str) -> int:
    """The number written just before `noun` ("5 sisters"): read by splitting words, not by
    the writer's patterns."""
    words = question.replace(".", " ").split()
    return int(next(words[k - 1] for k in range(1, len(words)) if " ".join(words[k:k + len(noun.split())]) == noun))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_siblings_chain_ends_in_the_items_own_answer(seed):
    """1,000 items a seed, both wordings (sisters counted first or second): the chain is
    "<her sisters> sisters + <her name> = <that + 1>", and that + 1 is the item's answer."""
    dataset = reasoning_gym.create_dataset("aiw", seed=seed, size=1000, **SIBLINGS)
    wordings = set()
    for entry in dataset:
        question = entry["question"]
        sisters, name = counted_before(question, "sisters"), question.split()[0]
        assert aiw_steps(entry) == [f"{sisters} sisters + {name} = {sisters + 1}"], question
        assert str(sisters + 1) == entry["answer"], question
        wordings.add(question.split(".")[0].split()[-1])  # "sisters" or "brothers": which count comes second
    assert wordings == {"sisters", "brothers"}


def test_the_friends_type_too():
    for entry in reasoning_gym.create_dataset("aiw", seed=0, size=300, **FRIENDS):
        female, name = counted_before(entry["question"], "female friends"), entry["question"].split()[0]
        assert aiw_steps(entry) == [f"{female} female friends + {name} = {female + 1}"]
        assert str(female + 1) == entry["answer"]


def test_the_demonstrations_earn_full_credit_and_the_writer_never_reads_the_answer():
    env = make_env("reasoning_gym:aiw", worked_steps=True, task_config=SIBLINGS, pool_size=3000,
                   spec_version="reasoning_gym/answer-tag-exact-v1")
    for example in env.fixed_set("heldout", 100):
        solution = env.solution(example)
        assert env.score(example, solution)["reward"] == 1.0
        assert re.fullmatch(r"\d sisters \+ [A-Z][a-z]+ = \d+\n<answer>\d+</answer>", solution), solution
    entry = env.fixed_set("train", 1)[0].meta["entry"]
    assert aiw_steps(dict(entry, answer="999")) == aiw_steps(entry)  # the answer is not where the chain comes from


def test_a_question_the_writer_cannot_read_is_refused_by_name():
    colleagues = reasoning_gym.create_dataset("aiw", seed=0, size=1, task_type_weights=[0, 0, 1])[0]
    with pytest.raises(ValueError, match=r"no step writer reads the question .* \(task type 'colleagues'\)"):
        aiw_steps(colleagues)
    reworded = {"question": "Susan has 5 sisters and 3 brothers. How many sisters does her brother have?",
                "metadata": {"task_type": "siblings"}}
    with pytest.raises(ValueError, match=r"task_type_weights\": \[1, 0, 0\]"):
        aiw_steps(reworded)


def test_a_prompt_longer_than_the_model_names_the_length_it_needs(capsys):
    args = ["run", "--env.name", "reasoning_gym:aiw", "--env.reasoning_gym.worked_steps", "true", "--env.reasoning_gym.task_config",
            json.dumps(SIBLINGS), "--env.reasoning_gym.pool_size", "3000", "--heldout_size", "50", "--rl.dev_size", "20",
            "--sft.num_examples", "20", "--dry_run", "true"]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert "model.max_seq_len=96 is not allowed: expected at least 187" in error
    assert "the longest prompt alone is 139 tokens" in error and "give --model.max_seq_len 187" in error
    assert main(args + ["--model.max_seq_len", "160"]) == 2  # the prompt fits, the completion does not
    assert "rl.sampling.max_new_tokens=48 is not allowed: expected at most 21" in capsys.readouterr().err
    assert main(args + ["--model.max_seq_len", "192"]) == 0


def test_the_chain_audit_finds_each_kind_of_mistake_by_hand():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "aiw_chain_audit.py"
    spec = importlib.util.spec_from_file_location("aiw_chain_audit", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    prompt = "Susan has 3 brothers and she also has 5 sisters. How many sisters does James's brother have?\n"

    def row(completion, correct):
        return {"prompt": prompt, "completion": completion, "details": {"correct": correct}}

    rows = [row("5 sisters + Susan = 6\n<answer>6</answer>", True),  # right everywhere
            row("3 sisters + Susan = 4\n<answer>4</answer>", False),  # read the brothers
            row("5 sisters + Mary = 7\n<answer>6</answer>", True),  # wrong name, wrong sum, answer not the sum
            row("<answer>5</answer>", False)]  # no chain
    assert bench.audit(rows) == {"pass@1": 2 / 4, "chain_parsed": 3 / 4, "count_right": 2 / 4,
                                 "count_is_brothers": 1 / 4, "name_right": 2 / 4, "sum_is_count+1": 2 / 4,
                                 "answer_is_sum": 2 / 4}
