"""Steps and their labels (verifiers/steps.py) and Monte-Carlo step labels
(rewards/monte_carlo_labels.py), against chains worked by hand."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.config import SamplingParams
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.rewards.monte_carlo_labels import monte_carlo_step_labels, prefix_texts
from posttrain.roles.engines import RolloutEngine
from posttrain.types import Example
from posttrain.verifiers.steps import (
    arithmetic_step_labels,
    check_arithmetic_steps,
    join_steps,
    split_steps,
    step_separators,
)

# 7+5+9+3: running sums 7, 12, 21, 24
EXAMPLE = Example(prompt="Q: 7+5+9+3\n", expected_answer="24")


def verdicts(completion: str, example: Example = EXAMPLE) -> list[tuple[bool, bool, bool]]:
    return [(v.arithmetic_holds, v.follows_problem, v.label)
            for v in check_arithmetic_steps(example, split_steps(completion))]


def test_split_steps_on_the_chain_format():
    assert split_steps("7+5=12,12+9=21,21+3=24\nFinal: 24") == ["7+5=12", "12+9=21", "21+3=24", "Final: 24"]
    assert split_steps("  7+5=12 , 12+9=21\n\nFinal: 21\n") == ["7+5=12", "12+9=21", "Final: 21"]
    assert split_steps("Final: 3") == ["Final: 3"]
    # no Final line: every piece is a step; a Final that is not last is just a piece
    assert split_steps("7+5=12,12+9") == ["7+5=12", "12+9"]
    assert split_steps("Final: 3\nmore") == ["Final: 3", "more"]
    assert split_steps("") == [] and split_steps(" \n,, \n") == []
    assert split_steps("hello") == ["hello"]


def test_join_inverts_split_and_separators_match_the_text():
    text = "7+5=12,12+9=21,21+3=24\nFinal: 24"
    steps = split_steps(text)
    assert join_steps(steps) == text
    assert step_separators(steps) == [",", ",", "\n", ""]
    assert "".join(prefix_texts(steps, step_separators(steps))[-1]) == text


def test_correct_chain_every_step_labelled_true():
    assert verdicts("7+5=12,12+9=21,21+3=24\nFinal: 24") == [(True, True, True)] * 4


def test_a_wrong_middle_step_and_everything_after_it_is_labelled_false():
    # 12+9=20 is wrong arithmetic; 20+3=23 is right arithmetic on the right term, from the
    # wrong sum: it holds and follows (as written) but cannot reach 24, so its label is False
    assert verdicts("7+5=12,12+9=20,20+3=23\nFinal: 23") == [
        (True, True, True), (False, True, False), (True, True, False), (True, True, False)]


def test_right_arithmetic_on_the_wrong_term_holds_but_does_not_follow():
    # "12+8=20": true arithmetic, but the problem's next term is 9
    assert verdicts("7+5=12,12+8=20,20+3=23\nFinal: 23") == [
        (True, True, True), (True, False, False), (True, True, False), (True, True, False)]
    # "1+1=2" holds anywhere and follows nothing
    assert verdicts("1+1=2") == [(True, False, False)]


def test_final_line_verdicts():
    # a Final that disagrees with the chain's last sum does not hold
    assert verdicts("7+5=12,12+9=21,21+3=24\nFinal: 25")[-1] == (False, True, False)
    # a chain that stops early: the Final holds (it repeats 21) but does not follow (a term is missing)
    assert verdicts("7+5=12,12+9=21\nFinal: 21")[-1] == (True, False, False)
    # no chain at all: the Final is compared with the first term
    assert verdicts("Final: 24") == [(False, False, False)]
    one_term = Example(prompt="Q: 5\n", expected_answer="5")
    assert verdicts("Final: 5", one_term) == [(True, True, True)]


def test_minus_signs_and_malformed_steps():
    example = Example(prompt="Q: 3-5+4\n", expected_answer="2")
    assert verdicts("3-5=-2,-2+4=2\nFinal: 2", example) == [(True, True, True)] * 3
    assert verdicts("3-5=2,2+4=6\nFinal: 6", example) == [(False, True, False), (True, True, False),
                                                          (True, True, False)]
    # a malformed step is wrong on all counts, and so is everything after it; it did none of
    # the problem's operations, so "21+3=24" is checked against the next one (12+9) and the
    # Final finds a term not covered
    assert verdicts("7+5=12,twelve,21+3=24\nFinal: 24") == [
        (True, True, True), (False, False, False), (True, False, False), (True, False, False)]
    # steps beyond the problem's terms do not follow
    assert verdicts("7+5=12,12+9=21,21+3=24,24+0=24\nFinal: 24")[3] == (True, False, False)


def test_labels_from_the_environment_examples():
    env = ArithmeticEnv(level=5)
    for example in env.fixed_set("dev", 30, seed=1):
        steps, labels = arithmetic_step_labels(example, env.solution(example))
        assert len(steps) == 5 and all(labels), (example.prompt, steps, labels)


def test_a_non_arithmetic_example_is_refused_with_advice():
    try:
        check_arithmetic_steps(Example(prompt="What is 2+2?", expected_answer="4"), ["2+2=4"])
    except ValueError as error:
        assert "monte_carlo_step_labels" in str(error)
    else:
        raise AssertionError("expected a ValueError")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789+-=,\n Final:x٣")), max_size=60) | st.text(max_size=60))
def test_split_and_check_never_raise(text):
    steps = split_steps(text)
    assert all(step and step == step.strip(" \t\n\r\f\v") for step in steps)  # ASCII whitespace, as final_int
    result = check_arithmetic_steps(EXAMPLE, steps)
    assert len(result) == len(steps)
    # a label is True only while every earlier one is
    labels = [v.label for v in result]
    assert labels == sorted(labels, reverse=True)


# --- Monte-Carlo labels ------------------------------------------------------------------


def test_monte_carlo_labels_with_a_deterministic_check():
    tokenizer = CharTokenizer()
    torch.manual_seed(0)
    model = GPTMini(GPTMiniConfig(vocab_size=tokenizer.vocab_size, dim=32, n_layer=1, n_head=2, hidden_dim=64,
                                  max_seq_len=64))
    engine = RolloutEngine(model, tokenizer, SamplingParams(temperature=1.0, max_new_tokens=8))
    calls = []
    original = engine.continue_rows
    engine.continue_rows = lambda *a, **k: calls.append(len(a[0])) or original(*a, **k)

    # the stub verifier: right iff the text so far contains the step "good"; what the random
    # policy writes after the prefix cannot change that, so every label is exact
    def score(example, completion):
        return {"reward": float("good" in completion.split("\n")), "details": {}}

    examples = [Example(prompt="Q: a\n", expected_answer=""), Example(prompt="Q: b\n", expected_answer="")]
    step_lists = [["bad", "good", "x"], ["good", "y"]]
    labels = monte_carlo_step_labels(engine, examples, step_lists, score, n_rollouts=4, max_new_tokens=8,
                                     generator=torch.Generator().manual_seed(0))
    assert calls == [(2 + 1) * 4]  # every prefix but each last step, 4 rollouts each, in one call
    assert labels[0].soft == [0.0, 1.0, 1.0] and labels[0].hard == [False, True, True]
    assert labels[1].soft == [1.0, 1.0] and labels[1].hard == [True, True]
    # tokens: each rollout's own length, at most what its prefix leaves of the cap of 8, counted exactly
    assert 2 * 4 <= labels[0].tokens <= 4 * 4 + 4 * 1 and 4 <= labels[1].tokens <= 4 * 3
    assert labels[0].tokens + labels[1].tokens == sum(
        len(row.token_ids) for row in _replay(engine, original, examples, step_lists))


def _replay(engine, original, examples, step_lists):
    """The same rollouts again (same seed): their lengths are what the labels counted."""
    from posttrain.roles.engines.contract import example_prompt_ids
    from posttrain.verifiers.steps import newline_separators

    contexts, budgets = [], []
    for example, steps in zip(examples, step_lists):
        texts = prefix_texts(steps, newline_separators(steps))
        contexts += [example_prompt_ids(engine.tokenizer, example) + engine.tokenizer.encode(t)
                     for t in texts[:-1] for _ in range(4)]
        # a completion's cap of 8 less each prefix ("bad\n" leaves 4, "bad\ngood\n" 1 at least, "good\n" 3)
        budgets += [max(1, 8 - len(t)) for t in texts[:-1] for _ in range(4)]
    assert budgets == [4] * 4 + [1] * 4 + [3] * 4
    return original(contexts, budgets, generator=torch.Generator().manual_seed(0))


def test_monte_carlo_labels_on_arithmetic_mix_right_and_wrong():
    """A soft label is a fraction of n_rollouts: with a check that passes only continuations
    starting with '1', labels take values k/n and hard = soft > 0."""
    tokenizer = CharTokenizer()
    torch.manual_seed(1)
    model = GPTMini(GPTMiniConfig(vocab_size=tokenizer.vocab_size, dim=32, n_layer=1, n_head=2, hidden_dim=64,
                                  max_seq_len=64))
    engine = RolloutEngine(model, tokenizer, SamplingParams(temperature=1.0, max_new_tokens=4))
    example = Example(prompt="Q: 1+2\n", expected_answer="3")
    env = ArithmeticEnv(level=1)
    labels = monte_carlo_step_labels(engine, [example], [["1+2=3", "Final: 3"]], env.score, n_rollouts=5,
                                     max_new_tokens=4, separators=step_separators)
    assert labels[0].soft[-1] == 1.0  # the last step: the verifier's verdict on the whole completion
    assert labels[0].soft[0] in {k / 5 for k in range(6)}
    assert labels[0].hard == [v > 0 for v in labels[0].soft]
