"""The verifier contract, for every registered verifier: `score(example, completion)` with
an Example or a plain dict, an int or a str expected answer (the same reward either way),
and total on junk (reward 0.0 and a reason from the verifier's REASONS, never an
exception); the environments that reach each verifier, refusing at load the problems it
could never score; and `posttrain train` / `eval` end to end on math and code files."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.cli import main as posttrain
from posttrain.config import ConfigError
from posttrain.envs import ENVIRONMENTS, make_env
from posttrain.pipelines.checks import check_config
from posttrain.config.scoring import BonConfig, EvalConfig
from posttrain.types import Example
from posttrain.verifiers import (
    VERIFIERS,
    code,
    final_int,
    get_verifier,
    gsm8k,
    humaneval_program,
    math_answer,
    reasoning_gym_answer,
)
from posttrain.verifiers.contract import CONTRACT_REASONS, as_example

pytest.importorskip("math_verify")

MODULES = (final_int, math_answer, code, reasoning_gym_answer, humaneval_program, gsm8k)
REASONS_OF = {name: module.REASONS for module in MODULES for name in module.SPECS}
TESTS = {"tests": ["assert f(2) == 4", "assert f(-3) == -6"]}
# Per family: (expected answer as an int, a right completion, a wrong one, meta).
# The wrong code fails both tests, so the partial-credit spec gives it 0.0 as well.
CASES = {
    "final_int": (-6, "Final: -6", "Final: 6", {}),
    "hackable": (-6, "Final: -6", "Final: 6", {}),
    "math": (-6, "so \\boxed{-\\frac{12}{2}}", "\\boxed{6}", {}),
    "code": (0, "```python\ndef f(x):\n    return 2 * x\n```", "def f(x): return x + 1", TESTS),
    "reasoning_gym": (-6, "<answer>-6</answer>", "<answer>5</answer>",
                      {"entry": {"question": "Q", "answer": "-6", "metadata": {"source_dataset": "chain_sum"}}}),
    "gsm8k": (-6, "3-9 = <<3-9=-6>>-6\n#### -6", "#### 6", {}),
    "humaneval": (0, "```python\ndef f(x):\n    return 2 * x\n```", "def f(x): return x + 1",
                  {**TESTS, "header": 'def f(x):\n    """Twice x."""\n', "entry_point": "f"}),
}


def case(name):
    return CASES[name.split("/")[0]]


def test_the_registry_is_every_spec_of_every_verifier_module():
    assert set(VERIFIERS) == set().union(*(module.SPECS for module in MODULES))
    # no clash (final_int/think-v1 is the 14th; code/tests-v2, its partial twin and humaneval/tests-v2 the
    # next 3; gsm8k/hash-v1 the 18th)
    assert len(VERIFIERS) == sum(len(module.SPECS) for module in MODULES) == 18
    assert all(VERIFIERS[name].version == name for name in VERIFIERS)
    assert get_verifier("code/tests-v1") is code.SPECS["code/tests-v1"]
    with pytest.raises(ValueError, match=r"unknown verifier 'math/v9'; valid names: final_int/strict-v1, .*code/tests-v1"):
        get_verifier("math/v9")
    for reasons in REASONS_OF.values():  # the contract's codes mean one thing everywhere
        assert {k: reasons[k] for k in CONTRACT_REASONS} == CONTRACT_REASONS


@pytest.mark.parametrize("name", list(VERIFIERS))
def test_dict_or_example_and_int_or_str_give_the_same_reward(name):
    answer, right, wrong, meta = case(name)
    spec = VERIFIERS[name]
    forms = [Example("Q: f?\n", answer, id="q1", meta=meta), Example("Q: f?\n", str(answer), id="q1", meta=meta),
             {"prompt": "Q: f?\n", "expected_answer": answer, "meta": meta},
             {"prompt": "Q: f?\n", "expected_answer": str(answer), "id": 1, "meta": meta, "completion": "ignored"}]
    for completion, reward in ((right, 1.0), (wrong, 0.0)):
        results = [spec(example, completion) for example in forms]
        assert [r["reward"] for r in results] == [reward] * 4, [r["details"]["reason"] for r in results]
        assert {r["details"]["reason"] for r in results} == {"ok" if reward else "wrong_answer"}
        assert {r["details"]["spec_version"] for r in results} == {name}
    # the module-level score() takes the same two arguments and picks a default spec
    module = {"math": math_answer, "code": code, "reasoning_gym": reasoning_gym_answer,
              "humaneval": humaneval_program, "gsm8k": gsm8k}.get(name.split("/")[0], final_int)
    default = module.score(forms[2], right)
    assert default["reward"] == 1.0
    assert default["details"]["spec_version"] == {
        final_int: "final_int/cot-v1", math_answer: "math/boxed-or-final-v2", code: "code/tests-v2",
        reasoning_gym_answer: "reasoning_gym/answer-tag-v1", humaneval_program: "humaneval/tests-v2",
        gsm8k: "gsm8k/hash-v1"}[module]


def test_an_int_is_read_as_its_decimal_string_and_nothing_else_is_read():
    assert as_example({"prompt": "p", "expected_answer": -40})[0] == Example("p", "-40")
    assert as_example(Example("p", 10**30, id=3))[0] == Example("p", str(10**30), id="3")
    example = Example("p", "7", meta={"a": 1})
    assert as_example(example)[0] is example  # already canonical: returned as it is
    for answer, said in ((None, "got NoneType"), (2.0, 'quote it ("2.0")'), (True, "got bool"), ([4], "got list"),
                         (10**5000, "more digits than Python prints")):
        checked, problem = as_example({"prompt": "p", "expected_answer": answer})
        assert checked is None and said in problem
    assert "has no 'prompt' and no 'expected_answer'" in as_example({})[1]
    assert "must be an Example or a mapping, got str" in as_example("Q: 1+1")[1]
    assert "'meta' must be a mapping" in as_example({"prompt": "p", "expected_answer": 1, "meta": [1]})[1]


# --- totality: junk in, 0.0 and a reason out --------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=8),
                    st.binary(max_size=8))
nested = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                      max_leaves=8)
not_an_answer = nested.filter(lambda v: not isinstance(v, str) and not (isinstance(v, int) and not isinstance(v, bool)))
junk_examples = st.one_of(
    nested.filter(lambda v: not isinstance(v, dict)),  # not a mapping at all
    st.dictionaries(st.sampled_from(["prompt", "expected_answer", "id", "meta", "x"]), nested, max_size=4)
    .filter(lambda d: "prompt" not in d or "expected_answer" not in d),  # a key missing
    st.builds(lambda p, a: {"prompt": p, "expected_answer": a}, st.text(max_size=8), not_an_answer),
    st.builds(lambda p, a: {"prompt": p, "expected_answer": a}, nested.filter(lambda v: not isinstance(v, str)),
              st.integers()),
    st.builds(lambda a: Example("p", a), not_an_answer),
    st.builds(lambda m: Example("p", "1", meta=m), nested.filter(lambda v: v is not None and not isinstance(v, dict))),
)
junk_completions = nested.filter(lambda v: not isinstance(v, str))
completions = st.one_of(junk_completions, st.text(max_size=20))


@pytest.mark.parametrize("name", list(VERIFIERS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(example=junk_examples, completion=completions)
def test_a_junk_example_scores_zero_as_bad_example(name, example, completion):
    result = VERIFIERS[name](example, completion)
    assert (result["reward"], result["details"]["reason"]) == (0.0, "bad_example")
    assert result["details"]["reason"] in REASONS_OF[name] and result["details"]["error"]
    assert result["details"]["spec_version"] == name
    json.dumps(result)  # what samples.jsonl stores: plain data only


@pytest.mark.parametrize("name", list(VERIFIERS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(completion=junk_completions, as_dict=st.booleans())
def test_a_non_str_completion_scores_zero_as_not_text(name, completion, as_dict):
    answer, _, _, meta = case(name)  # an example that scores 1.0 with the right text (test above)
    example = {"prompt": "Q", "expected_answer": answer, "meta": meta} if as_dict else Example("Q", answer, meta=meta)
    result = VERIFIERS[name](example, completion)
    assert (result["reward"], result["details"]["reason"]) == (0.0, "not_text")
    assert result["details"]["reason"] in REASONS_OF[name]
    assert "decode the tokens" in result["details"]["error"]


def test_a_hostile_mapping_is_junk_too():
    class Hostile(dict):
        def get(self, key, default=None):
            raise RuntimeError("no")

    for name, spec in VERIFIERS.items():
        result = spec(Hostile(prompt="p", expected_answer="1"), "Final: 1")
        assert (result["reward"], result["details"]["reason"]) == (0.0, "bad_example"), name
        assert "RuntimeError" in result["details"]["error"]


# --- environments: every verifier reachable, bad problems refused at load -----------------


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


MATH_ROWS = [{"id": f"m{a}", "prompt": f"Half of {2 * a}?\n", "expected_answer": a,
              "meta": {"solution": f"\\boxed{{{a}}}"}} for a in range(40)]
CODE_ROWS = [{"id": f"c{k}", "prompt": f"f(x)=x+{k}\n", "expected_answer": "",
              "meta": {"tests": [f"assert f(1) == {1 + k}"], "solution": f"def f(x): return x+{k}"}} for k in range(40)]


def test_named_environments_default_to_their_verifier(tmp_path):
    assert issubclass(ENVIRONMENTS["math"], ENVIRONMENTS["jsonl"]) and issubclass(ENVIRONMENTS["code"], ENVIRONMENTS["jsonl"])
    math_path, code_path = write(tmp_path / "m.jsonl", MATH_ROWS), write(tmp_path / "c.jsonl", CODE_ROWS)
    cases = [(make_env("math", path=math_path), "math/boxed-or-final-v2"),
             (make_env("jsonl", path=math_path, spec_version="math/boxed-or-final-v1"), "math/boxed-or-final-v1"),
             (make_env("code", path=code_path), "code/tests-v2"),
             (make_env("code", path=code_path, spec_version="code/tests-partial-v1"), "code/tests-partial-v1")]
    for env, version in cases:
        assert env.spec_version == version
        example = env.fixed_set("heldout", 1)[0]
        assert env.score(example, env.solution(example))["reward"] == 1.0  # the file's own demos pass
        assert env.score(example, "no answer here")["reward"] == 0.0
    assert sum(len(rows) for rows in cases[0][0].by_split.values()) == 40
    with pytest.raises(ValueError, match=r"environment 'math' has no parameter\(s\) \['cot'\]"):
        make_env("math", path=math_path, cot=False)  # a multi-line answer must not stop at a newline
    with pytest.raises(ValueError, match="environment 'code' needs a file: pass --env.path"):
        make_env("code")
    with pytest.raises(ValueError, match="unknown verifier 'math/v9'"):
        make_env("jsonl", path=math_path, spec_version="math/v9")


@pytest.mark.parametrize("env,rows,line,said", [
    ("code", CODE_ROWS[:2] + [{"prompt": "p", "expected_answer": ""}], 3, r"meta\['tests'\] must be a str or a non-empty"),
    ("code", [{"prompt": "p", "expected_answer": "", "meta": {"tests": ["assert f(1) =="]}}], 1,
     r"meta\['tests'\]\[0\] does not compile"),
    ("jsonl", [{"prompt": "p", "expected_answer": 4}, {"prompt": "q", "expected_answer": "4.5"}], 2,
     "expected_answer '4.5' is not a canonical integer"),
    ("math", [{"prompt": "p", "expected_answer": " "}], 1, "expected_answer is empty"),
    ("math", [{"prompt": "p", "expected_answer": 0.5}], 1, r'quote it \("0.5"\)'),
])
def test_a_problem_the_verifier_can_never_score_is_refused_at_load(tmp_path, env, rows, line, said):
    path = write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=said) as error:
        make_env(env, path=path)
    assert f"bad.jsonl, line {line}: " in str(error.value)


# --- end to end: train and eval reach math and code ------------------------------------------

TINY = ["--sft.steps", "2", "--sft.num_examples", "8", "--sft.batch_size", "4", "--sft.warmup_steps", "1",
        "--rl.steps", "1", "--rl.prompts_per_step", "2", "--rl.samples_per_prompt", "2", "--rl.dev_size", "2",
        "--heldout_size", "2", "--model.dim", "32", "--model.n_layer", "1", "--model.n_head", "2",
        "--model.hidden_dim", "64", "--threads", "1"]


@pytest.mark.parametrize("env_flags,rows,version", [
    (["--env.name", "jsonl", "--env.spec_version", "math/boxed-or-final-v2"], MATH_ROWS, "math/boxed-or-final-v2"),
    (["--env.name", "code"], CODE_ROWS, "code/tests-v2"),
])
def test_train_then_eval_a_checkpoint_with_the_envs_verifier(tmp_path, env_flags, rows, version):
    path = write(tmp_path / "problems.jsonl", rows)
    assert posttrain(["train", *env_flags, "--env.path", path, *TINY, "--out_dir", str(tmp_path / "runs")]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_stage"] == "rl" and summary["rl"]["n"] == 2
    assert json.loads((run / "meta.json").read_text())["spec_version"] == version
    eval_rows = [json.loads(line) for line in (run / "eval_rl.jsonl").read_text().splitlines()]
    assert len(eval_rows) == 2 and {r["details"]["spec_version"] for r in eval_rows} == {version}
    # the tiny untrained model writes junk: real reasons of this verifier, never a contract refusal
    assert all(r["details"]["reason"] in REASONS_OF[version] and r["reward"] == 0.0 for r in eval_rows)
    assert not {r["details"]["reason"] for r in eval_rows} & {"bad_example", "bad_tests", "not_text"}

    checkpoint = run / "checkpoints" / "rl" / "step_000000"
    env_name = "code" if "code" in env_flags else "math"
    assert posttrain(["eval", "--checkpoint", str(checkpoint), "--env.name", env_name, "--env.path", path,
                      "--size", "3", "--out_dir", str(tmp_path / "eval")]) == 0
    (evaluated,) = (tmp_path / "eval").iterdir()
    assert json.loads((evaluated / "meta.json").read_text())["spec_version"] == version
    samples = [json.loads(line) for line in (evaluated / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 and not {s["details"]["reason"] for s in samples} & {"bad_example", "bad_tests"}


def test_eval_completions_with_any_verifier(tmp_path, capsys):
    rows = [{**row, "completion": row["meta"]["solution"] if i % 2 else "nothing"} for i, row in enumerate(MATH_ROWS[:6])]
    path = write(tmp_path / "math_completions.jsonl", rows)
    assert posttrain(["eval", "--completions", path, "--spec_version", "math/boxed-or-final-v1",
                      "--out_dir", str(tmp_path)]) == 0
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["n"], summary["pass_rate"], summary["reason_counts"]) == (6, 0.5, {"ok": 3, "no_answer": 3})
    code_rows = [{**CODE_ROWS[0], "completion": CODE_ROWS[0]["meta"]["solution"]},
                 {**CODE_ROWS[1], "completion": "def f(x): return x"}]
    assert posttrain(["eval", "--completions", write(tmp_path / "code.jsonl", code_rows), "--spec_version",
                      "code/tests-v1", "--out_dir", str(tmp_path / "code")]) == 0
    (run,) = (tmp_path / "code").iterdir()
    assert json.loads((run / "summary.json").read_text())["reason_counts"] == {"ok": 1, "wrong_answer": 1}
    # a record its verifier could never score is refused before anything is scored
    capsys.readouterr()
    assert posttrain(["eval", "--completions", write(tmp_path / "bad.jsonl", [{**code_rows[0], "meta": {}}]),
                      "--spec_version", "code/tests-v1", "--out_dir", str(tmp_path / "bad")]) == 2
    assert "record 'c0': meta['tests'] must be" in capsys.readouterr().err
    assert posttrain(["eval", "--completions", path, "--spec_version", "math/v9"]) == 2
    assert "spec_version='math/v9' is not allowed: expected one of [" in capsys.readouterr().err


def test_the_config_checks_accept_every_registered_verifier_and_name_a_wrong_one(tmp_path, capsys):
    for name in VERIFIERS:
        check_config(EvalConfig(completions="frozen", spec_version=name))
        check_config(BonConfig(spec_version=name, select_spec_version=name))
    with pytest.raises(ConfigError, match=r"select_spec_version='nope' is not allowed: expected one of \["):
        check_config(BonConfig(select_spec_version="nope"))
    path = write(tmp_path / "m.jsonl", MATH_ROWS)
    assert posttrain(["train", "--env.name", "jsonl", "--env.path", path, "--env.spec_version", "nope"]) == 2
    assert "env.spec_version='nope' is not allowed: expected '' (the environment's own verifier) or one of" in (
        capsys.readouterr().err)
