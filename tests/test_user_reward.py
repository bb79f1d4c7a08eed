"""Reward functions from Python (posttrain/rewards/user_function.py): each signature gives
the number worked out by hand, weights sum, the preset "accuracy" stays the scorer itself,
and every way a function can fail stops the run with one message naming the function and
the sample, through make_reward and through the command line."""

import json
import time
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.config import ConfigError, RLConfig, RewardConfig
from posttrain.envs import make_env
from posttrain.pipelines.build import make_reward
from posttrain.pipelines.checks import check_rl
from posttrain.rewards.user_function import RewardFunctionError
from posttrain.types import Example
from tests import user_rewards_example as funcs

M = "tests.user_rewards_example"
ENV = make_env("arithmetic")
SCORE = ENV.score  # one bound method: make_reward may hand back this very object
E = Example(prompt="Q: 2+3\n", expected_answer="5", id="x1", meta={"level": 1})
RIGHT = "2+3=5\nFinal: 5"  # 14 characters, right under final_int/cot-v1
WRONG = "Final: 6"  # 8 characters, wrong

TINY = [  # tests/test_pipeline.py's tiny model, without --threads (these run in the test process)
    "--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
    "--sft.num_examples", "16", "--sft.steps", "6", "--sft.batch_size", "8", "--sft.warmup_steps", "2",
    "--rl.prompts_per_step", "2", "--rl.samples_per_prompt", "2", "--rl.eval_every", "5", "--rl.dev_size", "8",
    "--heldout_size", "8", "--checkpoint_every", "2", "--rl.steps", "2",
]


def reward(spec: str, **reward_settings):
    return make_reward(RLConfig(reward=RewardConfig(terms=spec, **reward_settings)), SCORE)


@pytest.fixture(autouse=True)
def no_calls():
    funcs.CALLS.clear()


# --- presets unchanged ----------------------------------------------------------------------


def test_accuracy_alone_is_the_scorer_itself():
    assert make_reward(RLConfig(), SCORE) is SCORE  # the default: `make run` unchanged
    assert reward("accuracy") is SCORE
    assert reward("1*accuracy") is SCORE
    assert reward("2*accuracy") is not SCORE and reward("2*accuracy")(E, RIGHT)["reward"] == 2.0


def test_r1_is_what_it_was():
    r1 = reward("r1")
    out = r1(E, WRONG)  # wrong but formatted: 0 + 0.2 × 1
    assert out["reward"] == pytest.approx(0.2)
    assert out["details"]["reward_spec"] == "1*accuracy + 0.2*format(details.format_ok)"
    assert reward("0.5*r1")(E, WRONG)["reward"] == pytest.approx(0.1)  # a preset's terms scale together


# --- the three signatures -------------------------------------------------------------------


def test_trl_signature_gets_lists_of_one_and_its_value_is_used():
    out = reward(f"{M}:length_tenth")(E, RIGHT)
    assert out["reward"] == pytest.approx(1.4)  # 14 characters / 10
    assert out["details"]["components"] == {f"{M}:length_tenth": pytest.approx(1.4)}
    assert out["details"]["reason"] == "ok"  # the verifier's verdict stays in the details


def test_trl_function_without_kwargs_gets_only_the_columns_it_names():
    out = reward(f"{M}:mentions_answer")(E, RIGHT)
    assert out["reward"] == 1.0
    assert funcs.CALLS == [{"prompts": ["Q: 2+3\n"], "answer": ["5"], "level": [1]}]
    assert reward(f"{M}:mentions_answer")(E, "Final: 4")["reward"] == 0.0


def test_trl_function_gets_a_conversation_as_turns_as_trl_passes_it():
    from posttrain.types import PROMPT_MESSAGES

    turns = [{"role": "system", "content": "Add."}, {"role": "user", "content": "Q: 2+3"}]
    chat = Example(prompt="Q: 2+3", expected_answer="5", id="c1", meta={"level": 1, PROMPT_MESSAGES: turns})
    out = reward(f"{M}:mentions_answer")(chat, RIGHT)
    assert funcs.CALLS == [{"prompts": [turns], "answer": ["5"], "level": [1]}]
    # the completion arrives as one assistant turn: the function's `a in c` finds no str in a list
    assert out["reward"] == 0.0
    seen = []

    def conversational(prompts, completions, **columns):
        seen.append((prompts, completions, sorted(columns)))
        return [float(completions[0][0]["content"].endswith("Final: 5"))]

    import tests.user_rewards_example as module

    module.conversational = conversational
    try:
        assert reward(f"{M}:conversational")(chat, RIGHT)["reward"] == 1.0
    finally:
        del module.conversational
    assert seen == [([turns], [[{"role": "assistant", "content": RIGHT}]], ["answer", "expected_answer", "id",
                                                                            "level"])]


def test_verl_signature_score_and_details():
    out = reward(f"{M}:verl_contains")(E, WRONG + " or 5")
    assert out["reward"] == 1.0
    assert out["details"]["function_details"] == {f"{M}:verl_contains": {"pred": "r 5"}}
    call = funcs.CALLS[0]
    assert call["data_source"] == ENV.spec_version  # no meta["data_source"]: the verifier's spec
    assert call["extra_info"] == {"prompt": "Q: 2+3\n", "id": "x1", "level": 1}
    assert reward(f"{M}:verl_contains")(E, WRONG)["reward"] == 0.0


def test_posttrain_signature_dict_bool_and_int():
    out = reward(f"{M}:ends_with_newline_free")(E, WRONG)
    assert out["reward"] == 0.5
    assert out["details"]["function_details"] == {f"{M}:ends_with_newline_free": {"lines": 1}}
    assert reward(f"{M}:ends_with_newline_free")(E, RIGHT)["reward"] == 0.0
    assert reward(f"{M}:always_true")(E, WRONG)["reward"] == 1.0
    assert type(reward(f"{M}:always_one")(E, WRONG)["details"]["components"][f"{M}:always_one"]) is float


def test_async_function_runs_to_completion():
    assert reward(f"{M}:async_quarter")(E, WRONG)["reward"] == 0.25
    assert reward(f"{M}:async_quarter", timeout=0)(E, WRONG)["reward"] == 0.25  # in this thread too


def test_a_file_path_term(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text("def brevity(prompts, completions, **kw):\n    return [1 - len(c) / 100 for c in completions]\n")
    out = make_reward(RLConfig(reward=RewardConfig(terms=f"accuracy + 0.5*{path}:brevity")), ENV.score)(E, RIGHT)
    assert out["reward"] == pytest.approx(1 + 0.5 * (1 - 14 / 100))


# --- weights and the record -----------------------------------------------------------------


def test_weights_sum_and_every_term_is_logged():
    spec = f"accuracy + 0.5*{M}:length_tenth + -2*{M}:always_true"
    out = reward(spec)(E, RIGHT)  # 1 + 0.5 × 1.4 − 2 × 1
    assert out["reward"] == pytest.approx(-0.3)
    details = out["details"]
    assert details["components"] == {"accuracy": 1.0, f"{M}:length_tenth": pytest.approx(1.4),
                                     f"{M}:always_true": 1.0}
    assert details["weighted"] == {"accuracy": 1.0, f"{M}:length_tenth": pytest.approx(0.7),
                                   f"{M}:always_true": -2.0}
    assert details["reward_spec"] == f"1*accuracy + 0.5*{M}:length_tenth(trl) + -2*{M}:always_true(posttrain)"
    wrong = reward(spec)(E, WRONG)  # 0 + 0.5 × 0.8 − 2
    assert wrong["reward"] == pytest.approx(-1.6)
    assert reward("1e+0*accuracy + 1e-1*" + f"{M}:length_tenth")(E, WRONG)["reward"] == pytest.approx(0.08)


def test_length_penalty_still_stacks_on_a_function():
    out = reward(f"{M}:always_true", length_penalty=0.1, length_free=4)(E, WRONG)  # 1 − 0.1 × (8 − 4)
    assert out["reward"] == pytest.approx(0.6)


def test_only_user_functions_is_allowed_and_pass_is_still_the_verifiers():
    out = reward(f"{M}:always_true")(E, WRONG)
    assert out["reward"] == 1.0
    assert out["details"]["reason"] == "wrong_answer"  # pass@1 reads this, not the reward


def test_none_counts_zero_is_recorded_and_a_whole_step_of_none_warns():
    score = make_reward(RLConfig(reward=RewardConfig(terms=f"accuracy + {M}:not_applicable"), prompts_per_step=2,
                                 samples_per_prompt=2), ENV.score)
    out = score(E, RIGHT)
    assert out["reward"] == 1.0
    assert out["details"]["components"][f"{M}:not_applicable"] == 0.0
    assert out["details"]["not_applicable"] == [f"{M}:not_applicable"]
    score(E, RIGHT)
    score(E, RIGHT)
    with pytest.warns(UserWarning, match="returned None .* for 4 samples in a row"):
        score(E, RIGHT)  # the 4th in a row: a whole step (2 prompts × 2 samples)
    assert "not_applicable" not in reward(f"accuracy + {M}:length_tenth")(E, RIGHT)["details"]


# --- failures, through make_reward ----------------------------------------------------------

FAILURES = [  # (function, words its message must hold)
    ("raises", ["ZeroDivisionError", "division by zero", "user_rewards_example.py, line"]),
    ("hangs", ["did not return within rl.reward.timeout=0.3 s"]),
    ("wrong_count", ["returned 2 values for 1 completion"]),
    ("returns_nan", ["returned nan", "finite number"]),
    ("returns_string", ["returned a str ('1.0')", "finite number"]),
]


@pytest.mark.parametrize("name, needles", FAILURES)
def test_a_failing_function_names_itself_and_the_sample(name, needles):
    score = reward(f"accuracy + {M}:{name}", timeout=0.3)
    start = time.perf_counter()
    with pytest.raises(RewardFunctionError) as caught:
        score(E, RIGHT)
    assert time.perf_counter() - start < 2.5  # a hang is abandoned at the timeout, not waited out
    message = str(caught.value)
    for needle in [f"reward function {M}:{name}", "'Q: 2+3\\n'", repr(RIGHT), "--resume", *needles]:
        assert needle in message, (needle, message)


def test_after_a_timeout_the_next_call_is_not_held_up_by_the_hung_one():
    score = reward(f"{M}:hangs_on_request", timeout=0.3)
    with pytest.raises(RewardFunctionError, match="did not return within"):
        score(E, "hang")
    start = time.perf_counter()
    assert score(E, "fine")["reward"] == 1.0  # a fresh thread: the hung one is still asleep
    assert time.perf_counter() - start < 1.0


def test_a_missing_column_is_named():
    with pytest.raises(RewardFunctionError, match=r"needs the column\(s\) \['difficulty'\]"):
        reward(f"{M}:needs_a_column")(E, RIGHT)


def test_a_long_completion_is_truncated_in_the_message():
    with pytest.raises(RewardFunctionError) as caught:
        reward(f"{M}:raises")(E, "x" * 5000)
    assert len(str(caught.value)) < 800


# --- bad terms, before anything runs ----------------------------------------------------------

BAD_TERMS = [
    ("no_such_module_xyz:f", ["term 'no_such_module_xyz:f'", "no module 'no_such_module_xyz'", ".py:FUNCTION"]),
    (f"{M}:absent", [f"term '{M}:absent'", "has no 'absent'", "length_tenth"]),
    (f"{M}:NOT_A_FUNCTION", ["is a int (42), not a function", "TRL", "verl", "posttrain"]),
    (f"{M}:no_known_signature", ["(text, answer) match none", "completions", "solution_str"]),
    (f"accuracy + half*{M}:length_tenth", ["the weight 'half' is not a finite number", "0.5*"]),
    (f"accuracy + inf*{M}:length_tenth", ["the weight 'inf'"]),
    ("accuracy +", ["empty term"]),
    ("vibes", ["term 'vibes' is neither a preset (accuracy, call_cost, language, meta_verified, r1, rm, rubric, self_critique, tool_validity, transcript_rubric, used_tool_result)", "MODULE:FUNCTION"]),
    ("./nowhere.py:f", ["no such file './nowhere.py'"]),
    ("accuracy + r1", ["['accuracy'] appear more than once"]),
]


@pytest.mark.parametrize("spec, needles", BAD_TERMS)
def test_a_bad_term_is_a_config_error_naming_it(spec, needles):
    with pytest.raises(ConfigError) as caught:
        check_rl(RLConfig(reward=RewardConfig(terms=spec)))
    for needle in [f"rl.reward.terms={spec!r} is not allowed", *needles]:
        assert needle in str(caught.value), (needle, str(caught.value))


def test_a_file_that_fails_to_import_says_where(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import math\n\nx = math.nope\n")
    with pytest.raises(ConfigError, match=r"raised AttributeError.*broken.py, line 3"):
        check_rl(RLConfig(reward=RewardConfig(terms=f"{path}:f")))


def test_the_timeout_must_not_be_negative():
    with pytest.raises(ConfigError, match="rl.reward.timeout=-1"):
        RLConfig(reward=RewardConfig(timeout=-1)).validate()


# --- through the command line ----------------------------------------------------------------


def fails(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_cli_refuses_an_unimportable_term_before_a_run_directory_exists(capsys, tmp_path):
    err = fails(capsys, ["train", "--rl.reward.terms", "accuracy + 0.5*no_such_module_xyz:brevity", "--out_dir",
                         str(tmp_path / "runs")])
    assert "rl.reward.terms='accuracy + 0.5*no_such_module_xyz:brevity' is not allowed" in err
    assert "term 'no_such_module_xyz:brevity'" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name, needles", FAILURES)
def test_cli_run_stops_with_one_message(capsys, tmp_path, name, needles):
    err = fails(capsys, ["train", *TINY, "--rl.reward.terms", f"accuracy + {M}:{name}", "--rl.reward.timeout", "0.3",
                         "--out_dir", str(tmp_path)])
    assert err.startswith(f"posttrain train: error: reward function {M}:{name}")
    for needle in ["on the prompt 'Q: ", "and the completion ", "--resume", *needles]:
        assert needle in err, (needle, err)
    (run,) = tmp_path.iterdir()
    assert not (run / "samples.jsonl").exists() or not any(  # nothing was trained on the failed step
        json.loads(line)["stage"] == "rl" for line in (run / "samples.jsonl").read_text().splitlines())


def test_cli_run_logs_the_functions_term_in_samples(tmp_path, capsys):
    path = tmp_path / "my_rewards.py"
    path.write_text("def brevity(prompts, completions, **kw):\n"
                    "    return [max(0.0, 1 - len(c) / 100) for c in completions]\n")
    assert main(["train", *TINY, "--rl.reward.terms", f"accuracy + 0.5*{path}:brevity", "--out_dir",
                 str(tmp_path / "runs")]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    rl = [row for row in rows if row["stage"] == "rl"]
    assert len(rl) == 2 * 2 * 2  # steps × prompts × samples
    name = f"{path}:brevity"
    for row in rl:
        details = row["details"]
        raw = max(0.0, 1 - len(row["completion"]) / 100)
        assert details["components"][name] == pytest.approx(raw)
        assert details["weighted"][name] == pytest.approx(0.5 * raw)
        assert row["reward"] == pytest.approx(details["components"]["accuracy"] + 0.5 * raw)
        assert details["reward_spec"] == f"1*accuracy + 0.5*{name}(trl)"
    heldout = [json.loads(line) for line in (run / "eval_rl.jsonl").read_text().splitlines()]
    assert len(heldout) == 8
    for row in heldout:  # held-out pass@1 is the verifier's alone: no term of the training reward
        assert row["reward"] in (0.0, 1.0) and "components" not in row["details"]


def test_the_guides_example_gives_the_number_worked_by_hand(tmp_path):
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "your-task.md").read_text()
    section = guide[guide.index("## Your own reward function"):]
    code = section[section.index("```python\n") + len("```python\n"):section.index("```\n\n```bash")]
    (tmp_path / "my_rewards.py").write_text(code)
    score = make_reward(RLConfig(reward=RewardConfig(terms=f"accuracy + 0.1*{tmp_path}/my_rewards.py:steps_correct")), SCORE)
    example = Example(prompt="Q: 7+5+9\n", expected_answer="21")
    out = score(example, "7+5=12,12+9=22\nFinal: 22")  # wrong: 0 + 0.1 × (1 of 2 steps right)
    assert out["reward"] == pytest.approx(0.05)
    assert score(example, "7+5=12,12+9=21\nFinal: 21")["reward"] == pytest.approx(1.1)
    none = score(example, "Final: 21")  # no steps: the term does not apply
    assert none["reward"] == 1.0 and none["details"]["not_applicable"] == [f"{tmp_path}/my_rewards.py:steps_correct"]
