"""The sentiment_steering demo: its numbers, not just that it ran.

Claims checked: the reward model scores any string and reads sentiment the right way
round; distinct-n is worked by hand; the corpus is what its docstring says (printable
ASCII, balanced moods); PPO with no KL anchor raises VADER's reward of a pretrained
gpt_mini within a dozen steps while β = 1 keeps it near the start; the smaller β drifts
further (larger KL); a seed fixes every number; bad flags are argparse errors."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.teach.demos import run_demo
from posttrain.teach.demos import reviews
from posttrain.teach.demos import sentiment_measures as measures
from posttrain.teach.demos import sentiment_steering as demo
from posttrain.models.tokenizer import CharTokenizer


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# --------------------------------------------------------------------------------------
# the reward model and the diversity measures
# --------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80) | st.lists(st.sampled_from(
    ["not", "no", "but", "very", "kind of", "least", "never", "!", "?", "GREAT", "bad", ":)", "", " ", "\n",
     "isn't", "without", "doubt", "so", "too", "sort of", "\x00", "é"]), max_size=12).map(" ".join))
def test_reward_is_total_and_bounded_on_any_string(text):
    r = measures.vader_reward(text)
    assert isinstance(r, float) and math.isfinite(r) and -1.0 <= r <= 1.0
    result = measures.score(None, text)
    assert result["reward"] == r and set(result["details"]) == {"pos", "neu", "neg"}


def test_reward_reads_sentiment_the_right_way_round():
    assert measures.vader_reward("") == 0.0
    assert measures.vader_reward(" quiet at lunch.") == 0.0  # neutral words only
    good, bad = measures.vader_reward(" very good."), measures.vader_reward(" very bad.")
    assert good > 0.4 and bad < -0.4
    assert measures.vader_reward(" not good.") < 0 < measures.vader_reward(" good.")
    # VADER reads "!" as emphasis: the cheap lever a policy can pull for more reward
    assert measures.vader_reward(" great!!!") > measures.vader_reward(" great!") > measures.vader_reward(" great.")


def test_distinct_n_by_hand():
    texts = ["very good.", "very bad."]  # very good . | very bad .
    assert measures.distinct_n(texts, 1) == pytest.approx(4 / 6)  # very, good, bad, "."
    assert measures.distinct_n(texts, 2) == 1.0  # (very good) (good .) (very bad) (bad .)
    assert measures.distinct_n(["great!", "great!", "great!"], 2) == pytest.approx(1 / 3)
    assert measures.distinct_n(["Great", "great"], 1) == 0.5  # lowercased
    assert measures.distinct_n(["", "ok"], 2) == 0.0  # no bigram anywhere
    assert measures.words("Great, but slow!!") == ["great", ",", "but", "slow", "!", "!"]


def test_real_word_fraction():
    assert measures.real_word_fraction([" very good at lunch."]) == 1.0
    assert measures.real_word_fraction([" greael great"]) == 0.5
    assert measures.real_word_fraction(["", "!!"]) == 1.0  # no words, nothing misspelt


# --------------------------------------------------------------------------------------
# the corpus
# --------------------------------------------------------------------------------------


def test_corpus_is_deterministic_ascii_and_mood_balanced():
    corpus = reviews.reviews(2000)
    assert corpus == reviews.reviews(2000) and corpus != reviews.reviews(2000, seed=1)
    tok = CharTokenizer()
    for prompt, response in corpus:
        assert prompt in reviews.prompts()
        assert tok.unk_id not in tok.encode(prompt + response)  # every character is in the vocabulary
        assert response.startswith(" ") and response[-1] in ".!"
    scores = [measures.vader_reward(r) for _, r in corpus]
    mean = sum(scores) / len(scores)
    positive = sum(s > 0.05 for s in scores) / len(scores)
    negative = sum(s < -0.05 for s in scores) / len(scores)
    assert abs(mean) < 0.1  # starts near-neutral on average ...
    assert 0.25 < positive < 0.5 and 0.25 < negative < 0.5  # ... with room to move either way


# --------------------------------------------------------------------------------------
# PPO: reward up, KL up, as β shrinks
# --------------------------------------------------------------------------------------

SEED = 2
# A tiny budget: 200 pretraining steps give fluent text (~90% corpus words, measured), and
# 12 PPO steps at lr 1e-3 (the demo's default 3e-4 needs ~40) move β = 0 far. Measured
# with seeds 0-2 (sampler of 2026-11-25): β = 0 gains +0.40..+0.44 reward, β = 1
# +0.10..+0.21; the KL at β = 0 is 3.7-8.6x that at β = 1 (seed 2: 4.8x). At this budget
# the alignment tax (entropy, distinct-2) is not reliable: on seeds 1 and 2 both rose at
# β = 0 in 12 steps. The slow test below checks it on the demo's own settings.
ARGS = ["--seed", str(SEED), "--pretrain-steps", "200", "--steps", "12", "--lr", "1e-3", "--eval-samples", "2"]


@pytest.fixture(scope="module")
def pretrained():
    torch.set_num_threads(1)
    cfg = demo.parse_args(ARGS)
    tok = CharTokenizer()
    model = demo.pretrain(cfg, tok, log=lambda line: None)
    reference = demo.Reference(model)
    return cfg, tok, model, reference, demo.evaluate(model, reference, tok, cfg)


def test_pretrained_model_writes_real_words_near_neutral(pretrained):
    *_, before = pretrained
    assert before["real_words"] > 0.8
    assert abs(before["reward"]) < 0.15
    assert before["kl"] == pytest.approx(0.0, abs=1e-5)  # the reference is the model itself


def test_ppo_raises_reward_without_anchor_and_kl_grows_as_beta_shrinks(pretrained):
    cfg, tok, model, reference, before = pretrained
    after = {}
    for beta in (1.0, 0.0):
        rows, policy = demo.ppo_run(model, beta, tok, cfg, log=lambda line: None)
        assert len(rows) == cfg.steps and all(r["beta"] == beta for r in rows)
        after[beta] = demo.evaluate(policy, reference, tok, cfg)
    assert after[0.0]["reward"] > before["reward"] + 0.3  # measured −0.041 -> +0.361
    assert after[1.0]["reward"] < before["reward"] + 0.2  # the anchor holds (measured +0.109)
    assert after[0.0]["kl"] > 2 * after[1.0]["kl"]  # measured 17.2 vs 3.57 nats (3.7x or more on seeds 0-2)


@pytest.mark.slow
def test_the_alignment_tax_on_the_demos_own_settings(tmp_path):
    """The demo's defaults (β = 1, 0.1, 0): less anchor buys reward with variety. Measured
    (seed 0): reward +0.08 / +0.47 / +0.63 from +0.03, distinct-2 0.52 / 0.48 / 0.12,
    token entropy 0.56 / 0.54 / 0.19."""
    assert demo.main(["--out-dir", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    after = json.loads((run / "summary.json").read_text())["after"]
    zero, one = after["0"], after["1"]
    assert zero["reward"] > one["reward"] + 0.3
    assert zero["distinct_2"] < one["distinct_2"] - 0.2
    assert zero["entropy"] < one["entropy"] - 0.2


def test_ppo_run_is_deterministic_given_the_seed(pretrained):
    cfg, tok, model, *_ = pretrained
    short = dataclasses.replace(cfg, steps=2)
    first, _ = demo.ppo_run(model, 0.1, tok, short, log=lambda line: None)
    second, _ = demo.ppo_run(model, 0.1, tok, short, log=lambda line: None)
    assert first == second
    assert first[0]["kl"] == pytest.approx(0.0, abs=1e-5)  # step 1 samples from the reference itself


# --------------------------------------------------------------------------------------
# the command line and the run directory
# --------------------------------------------------------------------------------------


def test_run_directory_has_log_csv_png_and_summary(tmp_path, capsys):
    argv = ["--out-dir", str(tmp_path), "--seed", "3", "--pretrain-steps", "20", "--steps", "2", "--betas", "1,0",
            "--eval-samples", "1", "--max-new-tokens", "16"]
    assert run_demo("sentiment_steering", argv) == 0
    (run,) = tmp_path.iterdir()
    assert run.name.endswith("sentiment_steering")
    with open(run / "sentiment_steering.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(float(r["beta"]), int(r["step"])) for r in table] == [(1.0, 1), (1.0, 2), (0.0, 1), (0.0, 2)]
    assert (run / "sentiment_steering.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Conclusion" in (run / "sentiment_steering_log.txt").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["after"]) == {"1", "0"}
    assert json.loads((run / "config.json").read_text())["betas"] == "1,0"
    assert len((run / "samples.jsonl").read_text().splitlines()) == 3 * 40  # start + 2 β, 40 openings x 1
    assert "Conclusion" in capsys.readouterr().out


def test_full_fills_only_the_unset_settings():
    cfg = demo.parse_args(["--full", "--steps", "7"])
    assert cfg.steps == 7 and cfg.betas == demo.FULL["betas"] and cfg.pretrain_steps == demo.FULL["pretrain_steps"]
    assert demo.parse_args([]).betas == demo.DEFAULT["betas"]


@pytest.mark.parametrize("argv, message", [
    (["--betas", "0.1,x"], "comma-separated numbers"),
    (["--betas", "-1"], ">= 0"),
    (["--betas", "nan"], ">= 0"),
    (["--betas", "0,0.1,0"], "twice"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--lr", "0"], "--lr must be a positive number"),
    (["--max-new-tokens", "90"], "use at most"),
    (["--steps", "many"], "invalid int value"),
])
def test_bad_flags_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_help_lists_every_setting(capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo.parse_args(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(demo.Config):
        assert "--" + f.name.replace("_", "-") in out


def test_reviews_docstring_example_is_what_it_returns():
    assert reviews.reviews(2) == [("To be honest the room was", " great and the coffee was lovely as always!"),
                                  ("Overall the movie was", " bad and quite dull on Friday!")]
    assert len(reviews.prompts()) == 40 and len(set(reviews.prompts())) == 40
    with pytest.raises(ValueError, match="non-negative int"):
        reviews.reviews(-1)
