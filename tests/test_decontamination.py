"""Dedup and decontamination of training prompts on hand-made prompts: what exact and
n-gram matching drop, and why (posttrain/data/decontamination.py)."""

import pytest

from posttrain.data.decontamination import PromptIndex, ngrams, normalise, screen

HELDOUT = [
    "Q: 7+5+9+3+1\n",
    "A farmer has 12 cows and buys 7 more. How many cows does the farmer have now?",
]


def reasons(verdicts):
    return [None if v is None else (v.against, v.index, v.kind) for v in verdicts]


def test_normalise_and_tokens():
    assert normalise("  Q:  7+5\n") == normalise("q: 7+5") == "q: 7+5"
    assert ngrams("Q: 7+5", 13) == {("q", ":", "7", "+", "5")}  # shorter than n: the whole prompt, one n-gram
    assert ngrams("a b c d", 2) == {("a", "b"), ("b", "c"), ("c", "d")}


def test_exact_matching_drops_held_out_prompts_and_duplicates_only():
    train = [
        "q:   7+5+9+3+1",  # the first held-out prompt, spelled differently: contaminated
        "Q: 7+5+9+3+2\n",  # a neighbour, not a copy: kept
        "Q: 1+1+1+1+1\n",
        "  Q: 1+1+1+1+1",  # a duplicate of the pool's third prompt
        "A farmer has 12 cows and buys 8 more. How many cows does the farmer have now?",  # one word differs
    ]
    assert reasons(screen(train, HELDOUT, "exact")) == [("heldout", 0, "exact"), None, None, ("pool", 2, "exact"),
                                                        None]


def test_ngram_matching_finds_the_reworded_copy_and_names_it():
    train = [
        "A farmer has 12 cows and buys 8 more. How many cows does the farmer have now?",
        "Tom has 3 apples. He eats one. How many are left?",
        "Tom has 3 apples. He eats one. How many apples are left now?",  # a near copy of the prompt before
        "Q: 7+5+9+3+2\n",
    ]
    verdicts = screen(train, HELDOUT, "ngram", n=4, min_overlap=0.5)
    assert reasons(verdicts) == [("heldout", 1, "ngram"), None, ("pool", 1, "ngram"), ("heldout", 0, "ngram")]
    # worked by hand: the farmer prompt has 19 tokens, so 16 4-grams; the 4 that hold the "8" are new
    assert verdicts[0].overlap == pytest.approx(12 / 16)
    # "q : 7 + 5 + 9 + 3 + 2" has 11 tokens, 8 4-grams; all but the last (which holds the "2") are
    # also 4-grams of "7+5+9+3+1": a neighbour with another answer, which is why n-gram matching is
    # for prose, and exact matching for a templated task
    assert verdicts[3].overlap == pytest.approx(7 / 8)
    assert verdicts[0].reason(HELDOUT[1]).startswith("matches a held-out or dev prompt (75% of its n-grams)")
    # a higher bar keeps the reworded farmer and still drops the arithmetic neighbour
    assert reasons(screen(train, HELDOUT, "ngram", n=4, min_overlap=0.8))[::3] == [None, ("heldout", 0, "ngram")]


def test_the_best_matching_prompt_is_named_and_ties_go_to_the_earliest():
    index = PromptIndex(2)
    index.add(0, "a b c x")
    index.add(1, "a b c d")
    index.add(2, "a b c d e")
    assert index.match("a b c d z", 0.1) == ("ngram", 1, 3 / 4)  # prompts 1 and 2 share 3 of 4; 1 is earlier
    assert index.match("A  B c d", None) == ("exact", 1, 1.0)
    assert index.match("q r s", 0.1) is None


@pytest.mark.parametrize("kwargs, message", [
    ({"match": "fuzzy"}, r"match must be one of \['exact', 'ngram'\], got 'fuzzy'"),
    ({"min_overlap": 0}, r"min_overlap must be in \(0, 1\], got 0"),
    ({"match": "ngram", "n": 0}, r"n \(tokens per n-gram\) must be a positive int, got 0"),
])
def test_bad_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        screen(["a"], ["b"], **kwargs)
