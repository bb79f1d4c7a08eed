"""Tests for preference data: JSONL round trips and errors that name file and line, pairs
built from verifier scores (ties dropped, one prompt per pair, deterministic), and the
bundled sentiment set with its lexicon scorer worked by hand."""

import json

import pytest

from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.types import PreferencePair, UnpairedExample
from posttrain.data.preference import load_preference_jsonl, save_preference_jsonl, unpaired_from_pairs
from posttrain.data.preference_rows import group_by_prompt, pairs_from_verifier
from posttrain.data.sentiment_pairs import lexicon_sentiment, sentiment_pairs
from posttrain.types import Episode, Example

# ------------------------------------------------------------------ JSONL


def test_pairs_and_unpaired_round_trip(tmp_path):
    pairs = [PreferencePair("Q\n", "yes", "no", {"source": "raters"}), PreferencePair("é\n", "ü", "\u2603")]
    save_preference_jsonl(pairs, tmp_path / "p.jsonl")
    assert load_preference_jsonl(tmp_path / "p.jsonl") == pairs
    unpaired = unpaired_from_pairs(pairs)
    assert [(u.completion, u.desirable) for u in unpaired] == [
        ("yes", True), ("no", False), ("ü", True), ("\u2603", False)
    ]
    save_preference_jsonl(unpaired, tmp_path / "u.jsonl")
    assert load_preference_jsonl(tmp_path / "u.jsonl") == unpaired
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def write_lines(path, *lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"})


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"prompt": "p", "chosen": "a"', "not valid JSON"),
        ('["p", "a", "b"]', "expected a JSON object, got list"),
        ('{"prompt": "p", "chosen": "a"}', r"no column 'rejected'; the row has columns \['chosen', 'prompt'\]"),
        ('{"prompt": "p", "chosen": "a", "rejected": 3}', "'rejected' must be a str or a conversation"),
        ('{"prompt": "p", "chosen": "a", "rejected": "a"}', "same text"),
        ('{"prompt": "p", "completion": "a", "desirable": true}', "this row is an unpaired example, the first row a pair"),
        ('{"prompt": "p", "chosen": "a", "rejected": "b", "meta": [1]}', "'meta' must be a JSON object"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, bad_line, message):
    path = write_lines(tmp_path / "pairs.jsonl", GOOD, "", bad_line)  # the bad record is on line 3
    with pytest.raises(ValueError, match=message) as err:
        load_preference_jsonl(path)
    assert f"{path}, line 3:" in str(err.value)


def test_unpaired_label_must_be_a_boolean(tmp_path):
    path = write_lines(tmp_path / "u.jsonl", '{"prompt": "p", "completion": "c", "desirable": 1}')
    with pytest.raises(ValueError, match=r"u.jsonl, line 1: 'desirable' must be a boolean \(true: desirable\), got int"):
        load_preference_jsonl(path)


def test_unreadable_or_empty_or_unknown_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_preference_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="holds no rows"):
        load_preference_jsonl(write_lines(tmp_path / "empty.jsonl", "", "  "))
    with pytest.raises(ValueError, match=r"kind.jsonl, line 1: cannot tell the record kind.*got columns \['answer', 'q'\]"):
        load_preference_jsonl(write_lines(tmp_path / "kind.jsonl", '{"q": 1, "answer": 2}'))


# ------------------------------------------------------------------ pairs from a verifier


def episode(example, completion, reward, finished=True):
    return Episode(example, 0, [], [], [], completion=completion, reward=reward, finished=finished)


def scored_group(env, example, completions):
    return [episode(example, c, env.score(example, c)["reward"]) for c in completions]


def test_pairs_from_verifier_pairs_each_correct_with_each_incorrect_and_drops_ties():
    env = ArithmeticEnv(level=1, cot=False)
    ex = env.fixed_set("train", 1)[0]
    right, wrong1, wrong2 = env.solution(ex), "Final: 99", "the answer is 3"
    group = scored_group(env, ex, [wrong1, right, wrong2, right])  # right twice: kept once
    pairs = pairs_from_verifier({ex.prompt: group})
    # 1 distinct correct × 2 incorrect = 2 pairs; the two wrongs tie (0 = 0) and give none
    assert [(p.chosen, p.rejected) for p in pairs] == [(right, wrong1), (right, wrong2)]
    assert all(p.prompt == ex.prompt and (p.score_chosen, p.score_rejected) == (1.0, 0.0) for p in pairs)
    # all correct or all wrong: every pair is a tie, nothing comes out
    assert pairs_from_verifier([scored_group(env, ex, [wrong1, wrong2])]) == []


def test_pairs_from_verifier_graded_rewards_and_caps():
    ex = Example("Q\n", "")
    group = [episode(ex, "mid", 0.5), episode(ex, "best", 1.0), episode(ex, "worst", 0.0), episode(ex, "mid2", 0.5)]
    pairs = pairs_from_verifier([group])
    # every strictly-better -> strictly-worse pair, listed by the chosen's then the rejected's position
    assert [(p.chosen, p.rejected) for p in pairs] == [
        ("mid", "worst"), ("best", "mid"), ("best", "worst"), ("best", "mid2"), ("mid2", "worst")
    ]
    assert len(pairs_from_verifier([group], max_pairs_per_prompt=2)) == 2
    # a truncated sample is skipped by default (its <eos> would be invented)
    cut = [episode(ex, "best", 1.0), episode(ex, "rambling...", 0.0, finished=False)]
    assert pairs_from_verifier([cut]) == []
    assert len(pairs_from_verifier([cut], drop_unfinished=False)) == 1


def test_best_vs_worst_keeps_one_pair_per_prompt_for_continuous_scores():
    ex = Example("Q\n", "")
    group = [episode(ex, "a", 0.31), episode(ex, "b", 0.90), episode(ex, "c", -0.20), episode(ex, "d", 0.90),
             episode(ex, "e", -0.20)]
    (pair,) = pairs_from_verifier([group], best_vs_worst=True)
    assert (pair.chosen, pair.rejected) == ("b", "c")  # of equal scores, the first
    assert (pair.score_chosen, pair.score_rejected) == (0.90, -0.20)
    assert pairs_from_verifier([[episode(ex, "a", 0.5), episode(ex, "b", 0.5)]], best_vs_worst=True) == []  # a tie


def test_pairs_from_verifier_only_pairs_within_a_prompt_and_is_deterministic():
    env = ArithmeticEnv(level=2, cot=False)
    a, b = env.fixed_set("train", 2)
    flat = [episode(a, env.solution(a), 1.0), episode(b, "Final: -1", 0.0),  # different prompts: no pair
            episode(b, env.solution(b), 1.0), episode(a, "Final: -1", 0.0)]
    groups = group_by_prompt(flat)
    assert list(groups) == [a.prompt, b.prompt]
    pairs = pairs_from_verifier(groups)
    assert [(p.prompt, p.chosen) for p in pairs] == [(a.prompt, env.solution(a)), (b.prompt, env.solution(b))]
    assert pairs_from_verifier(group_by_prompt(flat)) == pairs  # same input, same output
    with pytest.raises(ValueError, match="mixes prompts"):
        pairs_from_verifier([flat])


# ------------------------------------------------------------------ the bundled sentiment set


@pytest.mark.parametrize(
    "text, score",
    [
        ("The soup was good.", 1.5),
        ("The soup was very good.", 2.25),  # 1.5 · 1.5
        ("The soup was not good.", -0.75),  # 1.5 · −0.5
        ("Great room, but rude staff.", 0.0),  # 2 − 2
        ("not, good", 1.5),  # the comma ends the negation's clause
        ("", 0.0),
        ("\x00\ud800 ☃ GOOD!!", 1.5),  # any str, case-insensitive
    ],
)
def test_lexicon_sentiment_by_hand(text, score):
    assert lexicon_sentiment(text) == pytest.approx(score)


def test_sentiment_pairs_are_ranked_deterministic_and_split():
    train = sentiment_pairs(200, seed=0)
    assert train == sentiment_pairs(200, seed=0)
    for p in train:
        assert lexicon_sentiment(p.chosen) >= lexicon_sentiment(p.rejected) + 1.0  # min_gap
        assert p.prompt.startswith("Review the ") and p.chosen.startswith("The ")
    heldout = sentiment_pairs(100, seed=0, split="heldout")
    assert not {(p.chosen, p.rejected) for p in train} & {(p.chosen, p.rejected) for p in heldout}
    with pytest.raises(ValueError, match="split"):
        sentiment_pairs(1, split="test")


def test_user_data_format_example_loads(tmp_path):
    # the example lines of the module docstring are valid records
    path = write_lines(
        tmp_path / "mine.jsonl",
        '{"prompt": "Review the hotel:\\n", "chosen": "The hotel was lovely.", '
        '"rejected": "The hotel was awful.", "meta": {"source": "raters"}}',
    )
    (pair,) = load_preference_jsonl(path)
    assert pair == PreferencePair("Review the hotel:\n", "The hotel was lovely.", "The hotel was awful.",
                                  {"source": "raters"})
    path = write_lines(tmp_path / "mine_u.jsonl",
                       '{"prompt": "Review the hotel:\\n", "completion": "The hotel was awful.", "desirable": false}')
    assert load_preference_jsonl(path) == [UnpairedExample("Review the hotel:\n", "The hotel was awful.", False)]
