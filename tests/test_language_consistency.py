"""R1's language-consistency reward (rewards/language.py) and the arithmetic task's second
language (env.arithmetic.words, verifiers/number_words.py): exact values on hand-written
completions, total on odd input, the term inside the reward stack, and the words task's
prompts, solutions and share."""

import pytest

from posttrain.config import EnvConfig, RLConfig
from posttrain.config.reward import RewardConfig
from posttrain.config.sections import ArithmeticConfig
from posttrain.envs import make_env
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.verifiers.number_words import digits_to_words, number_word, words_to_digits
from posttrain.pipelines.build import reward_stack
from posttrain.rewards.language import language_consistency, prompt_language, reasoning_of
from posttrain.types import Episode, Example

WORDS_PROMPT = "Q: six+six+four\n"
DIGITS_PROMPT = "Q: 6+6+4\n"


@pytest.mark.parametrize("prompt,completion,share", [
    (WORDS_PROMPT, "six+six=twelve,twelve+four=sixteen\nFinal: 16", 1.0),  # six words, all number words
    (WORDS_PROMPT, "six+six=12,12+4=sixteen\nFinal: 16", 0.5),  # six, six, sixteen of six words
    (WORDS_PROMPT, "six+six=12,12+four=sixteen\nFinal: 16", 4 / 6),
    (WORDS_PROMPT, "6+6=12,12+4=16\nFinal: 16", 0.0),
    (DIGITS_PROMPT, "6+6=12,12+4=16\nFinal: 16", 1.0),
    (DIGITS_PROMPT, "six+6=12,12+4=16\nFinal: 16", 5 / 6),
    (WORDS_PROMPT, "xq+six\nFinal: 16", 0.5),  # a word of neither language counts against the share
    (WORDS_PROMPT, "<think>six+six=twelve</think>\nFinal: 12", 1.0),  # the think block is the reasoning
    (WORDS_PROMPT, "six+six=twelve,twenty-six\nFinal: 12\nseven 7 7 7", 1.0),  # after Final: not reasoning
])
def test_the_share_of_reasoning_words_in_the_prompts_language(prompt, completion, share):
    assert language_consistency(prompt, completion) == pytest.approx(share)


@pytest.mark.parametrize("completion", ["", "Final: 16", "   \n", "+=,\nFinal: 3", "<think></think>Final: 1"])
def test_reasoning_without_words_scores_zero_so_skipping_it_never_pays_more(completion):
    assert language_consistency(WORDS_PROMPT, completion) == 0.0


@pytest.mark.parametrize("completion", ["\x00\x01", "é" * 500, "Final:", "<think>six", "</think>six<think>",
                                        "-" * 1000 + "six", "Final: 1\nFinal: 2", "twenty--six", "a-" * 300])
def test_odd_input_gives_a_share_in_zero_one_never_an_error(completion):
    assert 0.0 <= language_consistency(WORDS_PROMPT, completion) <= 1.0


def test_the_reasoning_and_the_prompts_language():
    assert reasoning_of("six+six=twelve\nFinal: 12") == "six+six=twelve\n"
    assert reasoning_of("<think>a</think>b<think>c</think>\nFinal: 1") == "a c"
    assert (prompt_language(WORDS_PROMPT), prompt_language(DIGITS_PROMPT), prompt_language("Q: \n")) == (
        "words", "digits", "digits")


def test_the_term_in_the_stack_is_summed_with_accuracy_and_logged_on_its_own():
    stack = reward_stack(RLConfig(reward=RewardConfig(terms="r1 + language")))
    env = ArithmeticEnv(level=2, words=1.0)
    example = env.fixed_set("train", 1)[0]
    first = example.prompt[3:].split("+")[0]  # the first term, as a word
    mixed = env.solution(example).replace(first, words_to_digits(first), 1)  # 1 word of 6 in digits
    scored = stack(example, mixed, env.score(example, mixed))
    share = language_consistency(example.prompt, mixed)
    assert share == 5 / 6 and scored["details"]["components"]["language"] == share
    assert scored["reward"] == pytest.approx(1.0 + 0.2 + share)  # accuracy + 0.2 × format + language
    episode = Episode(example, group_id=0, prompt_ids=[1], response_ids=[2], response_logp=[0.0], completion=mixed,
                      reward=scored["reward"], details=scored["details"])
    assert stack.term_means([episode])["reward/language"] == share
    assert "language(share of reasoning words in the prompt's language)" in stack.version


def test_numbers_in_words_both_ways():
    assert [number_word(n) for n in (0, 13, 20, 26, 100, 104, 999)] == [
        "zero", "thirteen", "twenty", "twenty-six", "one hundred", "one hundred four", "nine hundred ninety-nine"]
    assert all(words_to_digits(number_word(n)) == str(n) for n in range(1000))
    assert digits_to_words("6+6=12") == "six+six=twelve" and words_to_digits("six+six=twelve") == "6+6=12"
    with pytest.raises(ValueError, match="'xq' in 'six\\+xq' is not a number in words"):
        words_to_digits("six+xq")


def test_the_words_task_writes_prompts_in_words_and_that_share_of_solutions():
    env = make_env("arithmetic", **EnvConfig(arithmetic=ArithmeticConfig(level=2, words=0.5)).kwargs())
    examples = env.fixed_set("train", 400)
    in_words = 0
    for example in examples:
        solution = env.solution(example)
        assert prompt_language(example.prompt) == "words" and env.score(example, solution)["reward"] == 1.0
        in_words += language_consistency(example.prompt, solution) == 1.0
        assert language_consistency(example.prompt, solution) in (0.0, 1.0)  # each demonstration in one language
    assert 0.45 < in_words / len(examples) < 0.55
    # the same problems as the digits task, in the same splits
    assert [words_to_digits(e.prompt) for e in examples] == [e.prompt for e in ArithmeticEnv(level=2).fixed_set(
        "train", 400)]
    assert env.name == "arithmetic-L2-cot-words0.5"
    assert ArithmeticEnv(level=2).fixed_set("train", 1)[0].prompt[3].isdigit()  # words=0: the task as it was


@pytest.mark.parametrize("settings", [{"words": 1.5}, {"words": -0.1}, {"words": True}, {"words": 0.5, "level": 5}])
def test_a_words_share_that_cannot_work_is_refused_by_name(settings):
    with pytest.raises(ValueError, match="words must be a share in \\[0, 1\\]"):
        ArithmeticEnv(**settings)
