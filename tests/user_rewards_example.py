"""Reward functions a user might write, one per signature and one per way to fail, for
tests/test_user_reward.py (imported as `tests.user_rewards_example:NAME`). Each returns a
number the tests can work out by hand."""

import time

CALLS = []  # what the column-reading functions were given, for the tests to inspect


# --- the three signatures -----------------------------------------------------------------


def length_tenth(prompts, completions, **kwargs):
    """TRL: a tenth of each completion's length in characters."""
    return [len(c) / 10 for c in completions]


def mentions_answer(prompts, completions, answer, level):
    """TRL without **kwargs: gets only the columns it names (answer; level from meta)."""
    CALLS.append({"prompts": prompts, "answer": answer, "level": level})
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


def needs_a_column(prompts, completions, difficulty):
    """TRL naming a column no example has."""
    return [1.0]


def verl_contains(data_source, solution_str, ground_truth, extra_info=None):
    """verl: 1 if the expected answer appears anywhere (a lenient check), with details."""
    CALLS.append({"data_source": data_source, "extra_info": extra_info})
    return {"score": 1.0 if ground_truth in solution_str else 0.0, "pred": solution_str[-3:]}


def ends_with_newline_free(example, completion):
    """posttrain: 0.5 when the completion has no newline, with a detail."""
    return {"reward": 0.5 if "\n" not in completion else 0.0, "details": {"lines": completion.count("\n") + 1}}


def always_true(example, completion):
    """posttrain returning a bool: True counts 1.0."""
    return True


def always_one(example, completion):
    """posttrain returning an int."""
    return 1


async def async_quarter(prompts, completions, **kwargs):
    """TRL, async: 0.25 each."""
    return [0.25 for _ in completions]


def not_applicable(prompts, completions, **kwargs):
    """TRL: does not apply to any sample."""
    return [None for _ in completions]


# --- ways to fail ---------------------------------------------------------------------------


def raises(prompts, completions, **kwargs):
    return [1 / 0]


def hangs(prompts, completions, **kwargs):
    time.sleep(3)  # longer than the tests' timeout; short enough that the abandoned thread ends soon
    return [1.0]


def wrong_count(prompts, completions, **kwargs):
    return [1.0 for _ in completions] + [0.0]


def returns_nan(example, completion):
    return float("nan")


def returns_string(data_source, solution_str, ground_truth, extra_info=None):
    return "1.0"


NOT_A_FUNCTION = 42


def no_known_signature(text, answer):
    return 1.0


def hangs_on_request(example, completion):
    """posttrain: hangs when the completion says so, else 1.0."""
    if completion == "hang":
        time.sleep(3)
    return 1.0
